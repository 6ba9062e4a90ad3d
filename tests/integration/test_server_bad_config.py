"""A server whose c.GPUSession config is bad refuses to load gpusession (saying why), keeps
serving everything else, and still shuts down cleanly."""
from __future__ import annotations

import pytest
from pytest_jupyter.jupyter_server import *  # jp_serverapp, jp_fetch and the fixtures they need
from tornado.httpclient import HTTPClientError
from traitlets.config import Config


@pytest.fixture
def jp_server_config():
    return Config({"ServerApp": {"jpserver_extensions": {"gpusession": True}},
                   "GPUSession": {"ray_address": "local", "local_gpus": -1}})


def test_bad_config_keeps_gpusession_off_and_the_server_still_shuts_down(jp_serverapp, jp_fetch, jp_asyncio_loop):
    with pytest.raises(HTTPClientError) as failure:
        jp_asyncio_loop.run_until_complete(jp_fetch("gpusession", "api", "cluster"))
    assert failure.value.code == 404
    assert jp_asyncio_loop.run_until_complete(jp_fetch("api", "status")).code == 200
    jp_asyncio_loop.run_until_complete(jp_serverapp._cleanup())  # stops every extension, gpusession included


def test_jupyter_lists_the_gpusession_extension_as_enabled_and_valid(tmp_path):
    """What `pip install` (or scripts/setup for an editable install) promises."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_")}
    listing = subprocess.run([sys.executable, "-m", "jupyter", "server", "extension", "list"], cwd=str(tmp_path),
                             env=env, capture_output=True, text=True, timeout=120)
    text = listing.stdout + listing.stderr
    assert "gpusession \x1b[32menabled" in text or "gpusession enabled" in text, text
    assert "gpusession 0.1.0 \x1b[32mOK" in text or "gpusession 0.1.0 OK" in text, text
