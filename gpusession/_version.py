"""The package's version, in a module of its own at the bottom of the tree: the broker client,
the broker and the node host compare it without importing the package's public API (which
would import jupyter_ext and the rest back)."""
__version__ = "0.1.0"
