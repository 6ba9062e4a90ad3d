"""A rank runs the user's code; its worker actor is the service's. What the rank writes into its
pipe is never unpickled by the actor (run/wire.py): a rank that writes a pickle there, as a
hostile user would to run code in the actor, fails its own call and nothing of it runs."""
from __future__ import annotations

import pytest

import gpusession as gs


def test_a_rank_that_writes_a_pickle_into_its_pipe_fails_and_the_actor_never_unpickles_it(cluster, quiet, tmp_path):
    marker = tmp_path / "ran-in-the-worker-actor"

    @gs.distributed(gpus=1, max_failures=0)
    def hostile(path):
        import pickle
        import time

        from gpusession.run.rank import context

        class Evil:
            def __reduce__(self):
                return (open, (path, "w"))  # unpickling it creates the file

        context._current.channel.conn.send_bytes(pickle.dumps(Evil()))
        time.sleep(120)  # the actor ends this rank; the call does not wait for this

    with pytest.raises(gs.WorkerFailed) as failure:
        hostile(str(marker))
    assert failure.value.remote_type == "ProtocolError"
    assert "not one of its messages" in failure.value.remote_message
    assert not marker.exists(), "the worker actor unpickled what the rank sent"


def test_reports_output_checkpoints_and_results_still_reach_the_caller_through_the_checked_pipe(cluster, quiet):
    @gs.distributed(gpus=2)
    def train():
        import numpy

        ctx = gs.context()
        print(f"rank {ctx.rank} here")
        state = gs.load_checkpoint() or {"step": 0}
        gs.report(step=1, loss=numpy.float32(0.5), note="first")
        gs.save_checkpoint({"step": 1, "weights": numpy.arange(4)})
        return {"rank": ctx.rank, "resumed_from": state["step"]}

    assert train() == {"rank": 0, "resumed_from": 0}
    info = train.last_run
    assert info.history == [{"step": 1, "loss": 0.5, "note": "first"}]
    assert info.checkpoint["step"] == 1 and list(info.checkpoint["weights"]) == [0, 1, 2, 3]
