"""The broker: one detached Ray actor that grants leases all-or-nothing, keeps the ledger and
enforces quotas, priorities and preemption (service.py); pure decisions in policy.py."""
