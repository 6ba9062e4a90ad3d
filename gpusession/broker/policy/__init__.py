"""PURE: the broker's policy: the model, placement, the scheduler, preemption,
elastic offers, lease states."""
