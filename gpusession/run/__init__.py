"""One call of a function on leased GPUs, start to end: the warm per-node parent (zygote) that
forks a fresh process per rank per attempt, the rank process itself (child), the worker actor
that relays between them and the caller (worker), the typed messages they exchange, the pure
failure policy, and the controller that runs attempts until the run ends."""
