"""Which code ships by value, and that doing so is safe from several threads."""
from __future__ import annotations

import sys
import threading
import traceback
import types

import cloudpickle

from gpusession.run.shipping import dumps, local_modules, pickled_by_value


def test_a_module_in_the_callers_directory_is_local_and_an_installed_one_is_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "notebook_helpers.py").write_text("def f():\n    return 7\n")
    import notebook_helpers

    try:
        names = {m.__name__ for m in local_modules()}
        assert "notebook_helpers" in names
        assert not names & {"cloudpickle", "json", "gpusession", "pytest"}
        payload = dumps(notebook_helpers.f)
    finally:
        sys.modules.pop("notebook_helpers", None)
    (tmp_path / "notebook_helpers.py").unlink()  # a worker elsewhere has no such file
    assert cloudpickle.loads(payload)() == 7  # it travelled as code, not as an import by name


def test_a_users_module_named_like_a_standard_one_is_still_local(tmp_path, monkeypatch):
    """Standard modules are told apart by name without a path check each (a rank pickles its
    result in ~1 ms): a file of the user's that shadows one (here `colorsys`) still ships as code."""
    import colorsys  # the standard one, from the standard library's folder

    monkeypatch.chdir(tmp_path)
    assert colorsys.__name__ not in {m.__name__ for m in local_modules()}
    (tmp_path / "colorsys.py").write_text("def f():\n    return 8\n")
    shadow = types.ModuleType("colorsys")
    shadow.__file__ = str(tmp_path / "colorsys.py")
    monkeypatch.setitem(sys.modules, "colorsys", shadow)
    assert "colorsys" in {m.__name__ for m in local_modules()}


def test_a_registration_the_user_made_stays_after_gpusession_pickles():
    module = types.ModuleType("users_own_registration")
    sys.modules[module.__name__] = module
    try:
        cloudpickle.register_pickle_by_value(module)
        with pickled_by_value([module]):
            pass
        assert module.__name__ in cloudpickle.list_registry_pickle_by_value()
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        sys.modules.pop(module.__name__)


def test_calls_pickling_from_several_threads_do_not_undo_each_others_registrations():
    module = types.ModuleType("shared_between_threads")
    exec("def f():\n    return 1\n", module.__dict__)
    sys.modules[module.__name__] = module
    errors: list[BaseException] = []

    def pickle_many() -> None:
        try:
            for _ in range(100):
                with pickled_by_value([module]):
                    assert cloudpickle.loads(cloudpickle.dumps(module.f))() == 1
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=pickle_many) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.modules.pop(module.__name__)
    assert errors == []
    assert module.__name__ not in cloudpickle.list_registry_pickle_by_value()


def test_a_virtualenv_inside_the_project_directory_is_a_library_not_user_code(tmp_path):
    import os
    import torch

    from gpusession.run.shipping import is_user_file

    project = (os.path.dirname(os.path.dirname(torch.__file__)),)  # a root that contains the venv
    assert not is_user_file(torch.__file__, project)
    (tmp_path / "mine.py").write_text("")
    assert is_user_file(str(tmp_path / "mine.py"), (str(tmp_path) + os.sep,))


def test_a_shipped_function_keeps_its_file_so_a_workers_traceback_shows_the_source_line(tmp_path, monkeypatch):
    # cloudpickle 3.1.3 writes "<dynamic-code>" for every code object's file; a rank's traceback
    # then names no file and shows no line of the user's code.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "train_helpers.py"
    source.write_text("def outer():\n    def inner():\n        raise ValueError('bad batch 17')\n    inner()\n")
    import train_helpers

    try:
        payload = dumps(train_helpers.outer)  # by value: the module is beside the caller
    finally:
        sys.modules.pop("train_helpers", None)
    try:
        cloudpickle.loads(payload)()
    except ValueError as exc:
        text = "".join(traceback.format_exception(exc))
    assert f'File "{source}", line 3, in inner' in text
    assert "raise ValueError('bad batch 17')" in text
