"""The package's shape as a user meets it: `import gpusession` is cheap, and every public name is
what the README says it is (a function stays a function after any submodule is imported)."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import gpusession
from gpusession.api import lease_api as lease_module
from gpusession.run.rank import context as context_module
from gpusession.api import distributed as distributed_module

from ..conftest import ROOT


def test_import_gpusession_imports_neither_ray_nor_torch():
    probe = "import sys, gpusession; print('ray' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_no_public_name_is_also_a_submodule():
    submodules = {info.name for info in pkgutil.iter_modules(gpusession.__path__)}
    assert not set(gpusession.__all__) & submodules


def test_the_public_functions_stay_functions_after_their_modules_are_imported():
    # the modules are imported above, as any test or user code may do
    assert gpusession.context is context_module.context and callable(gpusession.context)
    assert gpusession.distributed is distributed_module.distributed
    assert gpusession.lease is lease_module.lease
    assert set(gpusession.__all__) <= set(dir(gpusession))
