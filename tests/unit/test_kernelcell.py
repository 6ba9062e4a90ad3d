"""How a lease names the notebook it was asked from."""
from __future__ import annotations

from gpusession.kernelcell import notebook_path


def test_a_lease_names_its_notebook_relative_to_the_servers_root():
    assert notebook_path("/srv/notes/work/train.ipynb", "/srv/notes") == "work/train.ipynb"
    assert notebook_path("/srv/notes/work/train.ipynb", "/srv/notes/") == "work/train.ipynb"
    assert notebook_path("/elsewhere/a.ipynb", "/srv/notes") == "/elsewhere/a.ipynb"
    assert notebook_path(None, "/srv/notes") is None and notebook_path("a.ipynb", None) == "a.ipynb"
