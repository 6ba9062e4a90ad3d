"""The `gpusession` command: its parsers and subcommands (`python -m gpusession.cli` runs it)."""
