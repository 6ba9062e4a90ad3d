"""The broker itself: the Ray actor, its methods (admin, progress, relocate, resize),
authorization, reconciling with Ray's view, settings."""
