"""The JupyterLab extension ships prebuilt (users install no Node): the committed bundle must be
the one its sources build, and its sources must target the JupyterLab version the project pins."""
from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys

from ..conftest import ROOT

HASH = runpy.run_path(str(ROOT / "scripts" / "labextension_hash.py"))


def test_the_committed_bundle_was_built_from_the_committed_sources():
    recorded = HASH["RECORD"].read_text().strip()
    assert recorded == HASH["sources_hash"](), (
        "jupyter_ext/labextension/ is stale against labextension/ (sources changed since the bundle was "
        "built): run scripts/build-labextension and commit its output")


def test_the_bundle_is_a_prebuilt_extension_with_its_entry_point():
    built = json.loads((ROOT / "jupyter_ext" / "labextension" / "package.json").read_text())
    entry = built["jupyterlab"]["_build"]["load"]
    assert built["name"] == "gpusession-lab" and (ROOT / "jupyter_ext" / "labextension" / entry).is_file()


def test_the_extension_pins_the_jupyterlab_the_project_pins():
    lab = re.search(r'"jupyterlab==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    sources = json.loads((ROOT / "labextension" / "package.json").read_text())
    assert sources["dependencies"]["@jupyterlab/application"] == lab
    locked = json.loads((ROOT / "labextension" / "package-lock.json").read_text())["packages"]
    assert locked["node_modules/@jupyterlab/application"]["version"] == lab
    every = {**sources["dependencies"], **sources["devDependencies"]}
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", version) for version in every.values()), every


def test_jupyterlab_lists_the_extension_scripts_setup_installed_as_enabled():
    listed = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True,
                            text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)  # its colours
    assert re.search(r"gpusession-lab v0\.1\.0 enabled\s+OK", text), text
