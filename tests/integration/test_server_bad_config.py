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
