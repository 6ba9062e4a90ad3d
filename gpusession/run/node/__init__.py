"""What runs on a node for every rank there: the node host, the warm parent (zygote)
that forks the ranks, the worker actor that relays for them, scratch directories."""
