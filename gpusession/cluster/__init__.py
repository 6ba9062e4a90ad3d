"""Ray plumbing: joining the cluster, the local head, node liveness, Ray's private APIs. Knows nothing
of leases or runs (the caller's lease is run/caller/lease.py)."""
