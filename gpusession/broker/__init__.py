"""The broker: one detached Ray actor that grants leases all-or-nothing, keeps the ledger and
enforces quotas, priorities and preemption. policy/ (pure decisions), protocol/ (what travels
between a caller and the broker), storage/ (the ledger), http/ (the status endpoint), service/ (the
actor), and client.py on top: the caller's handle, which starts the broker."""
