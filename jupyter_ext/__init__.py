"""gpusession's Jupyter server extension (extension name `gpusession`; see jupyter_ext.app)."""
