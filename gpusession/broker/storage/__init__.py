"""The broker's storage: the ledger (SQLite), its journal, the books, the state
directory and its secrets."""
