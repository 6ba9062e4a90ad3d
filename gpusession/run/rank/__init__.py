"""What runs inside a rank process: the user's API there (gs.context, prepare_model, ...),
the rank's own start (child.py), its process group and rendezvous store."""
