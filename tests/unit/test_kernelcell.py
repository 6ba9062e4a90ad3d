"""How a lease names the notebook it was asked from."""
from __future__ import annotations

import contextvars

from gpusession.run.caller.kernelcell import asking_in_background, mark_background, notebook_path


def test_a_lease_names_its_notebook_relative_to_the_servers_root():
    assert notebook_path("/srv/notes/runs/train.ipynb", "/srv/notes") == "runs/train.ipynb"
    assert notebook_path("/srv/notes/runs/train.ipynb", "/srv/notes/") == "runs/train.ipynb"
    assert notebook_path("/elsewhere/a.ipynb", "/srv/notes") == "/elsewhere/a.ipynb"
    assert notebook_path(None, "/srv/notes") is None and notebook_path("a.ipynb", None) == "a.ipynb"


def test_a_background_runs_thread_marks_only_its_own_copy_of_the_callers_context():
    def in_the_runs_thread() -> bool:
        mark_background()
        return asking_in_background()

    assert contextvars.copy_context().run(in_the_runs_thread) is True
    assert asking_in_background() is False  # the caller (the notebook's blocking cells) is not marked
