"""A rank is a plain process, not a Ray worker: Ray's API inside it fails at once saying what to
use instead; gs.context() names the rank's host, IP and Ray node; an ObjectRef argument is fetched
by the caller before the call."""
from __future__ import annotations

import pytest
import ray

import gpusession as gs

# Without the guard the same call waited ~70 s per attempt for Ray's node info, then failed.
FAST_S = 10.0  # from the function's start (all ranks running) to its error; the guard itself takes
# milliseconds, the rest is margin for a loaded 2-core machine (load average ~30 seen)


@pytest.mark.slow
def test_ray_inside_a_rank_fails_within_10_s_of_the_functions_start_naming_what_to_use(cluster, quiet):
    @gs.distributed(gpus=1, max_failures=0)
    def asks_ray():
        import ray as ray_in_rank

        return ray_in_rank.get_runtime_context().get_node_id()

    with pytest.raises(gs.WorkerFailed) as failure:
        asks_ray()
    took = asks_ray.last_run.run_s  # the function's span: it began, called Ray, and failed
    assert failure.value.remote_type == "RayInRank"
    assert "not a Ray worker" in failure.value.remote_message and "gs.context()" in failure.value.remote_message
    assert 0 < took < FAST_S, f"the function ran {took:.1f} s from its start to the error (bound {FAST_S:.0f} s)"


@pytest.mark.slow
def test_context_names_the_ranks_host_ip_and_ray_node(cluster, quiet):
    @gs.distributed(gpus=1)
    def where():
        ctx = gs.context()
        return ctx.host, ctx.address, ctx.node_id

    host, address, node_id = where()
    nodes = {node["NodeID"]: node for node in ray.nodes() if node["Alive"]}
    assert node_id in nodes and nodes[node_id]["NodeManagerAddress"] == address
    assert host


@pytest.mark.slow
def test_an_object_ref_argument_reaches_the_rank_as_its_value(cluster, quiet):
    @gs.distributed(gpus=1)
    def add_one(value, *, also):
        return value + also + 1

    assert add_one(ray.put(40), also=ray.put(1)) == 42


def test_an_object_ref_inside_a_list_is_refused_naming_the_argument():
    from gpusession.run.shipping import resolve_object_refs

    ray_ref = ray.ObjectRef(b"\0" * 28)  # never fetched: refused before anything asks Ray for it
    with pytest.raises(TypeError, match="holds a Ray ObjectRef inside argument 0.*ray.get"):
        resolve_object_refs(([ray_ref],), {})
