"""Sphinx configuration of gpusession's documentation (`scripts/docs` builds it with -W -n).

The pages are MyST Markdown; the example notebooks (examples/*.ipynb, linked into docs/examples/)
are executed by myst-nb at build time on the embedded default cluster (logical GPUs on a CPU
machine). docs/_ext/gpusession_docs.py renders the CLI, the magics' flags and the Jupyter server's
traits from the code itself, so those references cannot drift.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

project = "gpusession"
author = "the gpusession authors"
copyright = "2026, the gpusession authors"
release = version = "0.1.0"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.graphviz",
    "sphinx.ext.intersphinx",
    "gpusession_docs",
]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints", "jupyter_execute"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]

# The examples run top to bottom in a real kernel at every build: what the pages show is what
# the code does today. They share the local head scripts/docs starts (4 logical GPUs), which
# outlives each kernel as `gpusession lab`'s does.
nb_execution_mode = os.environ.get("GPUSESSION_DOCS_EXECUTE", "force")
nb_execution_timeout = int(os.environ.get("GPUSESSION_DOCS_CELL_TIMEOUT", "300"))
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "none"

graphviz_output_format = "svg"

# No network where the docs build: intersphinx has no inventories to fetch, and no external link
# is checked (internal references and anchors are: -W -n turns a broken one into an error).
intersphinx_mapping: dict = {}

html_theme = "pydata_sphinx_theme"
html_title = "gpusession"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_depth": 3,
    "header_links_before_dropdown": 8,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
nitpicky = True
nitpick_ignore_regex = [
    # third-party classes named in docstrings: no inventories to resolve them against (no network)
    (r"py:class", r"(torch|ray|optuna|traitlets|argparse|concurrent|collections|typing)\..*"),
]
