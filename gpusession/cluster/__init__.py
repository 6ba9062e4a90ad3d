"""Connecting to Ray: the cluster, the local head, the client's lease, Ray's private APIs."""
