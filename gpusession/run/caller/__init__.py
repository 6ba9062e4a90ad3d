"""The caller's side of a run: the lease (ask the broker, hold the placement group,
release), the run controller and its follower, the warm worker pool; held by a
kernel, or by the gateway for a hub kernel."""
