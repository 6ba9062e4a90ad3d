"""Inside a rank, `import ray` works and anything that would connect to Ray fails at once
(run in a fresh interpreter: the guard changes the process's ray module)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    from gpusession.run.rank import ray_guard
    ray_guard.install()
    import ray, ray.util  # importing (also submodules) still works
    for name, call in (("get_runtime_context", lambda: ray.get_runtime_context().get_node_id()),
                       ("put", lambda: ray.put(1)), ("init", lambda: ray.init())):
        try:
            call()
            print(name, "connected")
        except ray_guard.RayInRank as exc:
            print(name, "refused:", "gs.context()" in str(exc))
""")


def test_ray_calls_in_a_rank_are_refused_naming_gs_context():
    # An address that answers nothing: without the guard, these calls would try to connect to it.
    env = {"RAY_ADDRESS": "127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["get_runtime_context refused: True", "put refused: True",
                                           "init refused: True"]
