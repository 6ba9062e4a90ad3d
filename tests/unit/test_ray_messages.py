"""Ray's messages about its own processes leave the cells (rayprivate.send_cluster_messages_to)."""
from __future__ import annotations

from gpusession.cluster import rayprivate


def test_rays_error_listener_prints_through_the_hook_we_replace_and_lines_go_to_the_writer():
    from ray._private import worker

    # the listener thread looks the printer up by module name at each message: replacing it reaches it
    assert "print_to_stdstream" in worker.listen_error_messages.__code__.co_names
    original = worker.print_to_stdstream
    seen: list[str] = []
    try:
        rayprivate.send_cluster_messages_to(seen.append)
        worker.print_to_stdstream({"lines": ["WARNING: 8 PYTHON worker processes have been started"],
                                   "pid": "raylet", "is_err": False}, ignore_prefix=False)
    finally:
        worker.print_to_stdstream = original
    assert seen == ["(raylet) WARNING: 8 PYTHON worker processes have been started"]
