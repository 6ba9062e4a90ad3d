"""One call of a function on leased GPUs, start to end. Here, what every side of a run shares: the
typed messages, the rank's spec, the pure failure policy, the end reasons, shipping and
communication options. Below, by where the code runs: rank/ (the rank process and what user code
calls there), node/ (the node host, the warm parent that forks the ranks, the worker actor that
relays for them) and caller/ (the lease and the controller that runs attempts until the run ends,
held by a kernel or by the gateway)."""
