"""A rank's messages to its worker actor travel as checked JSON plus raw bytes (run/wire.py): every
kind comes back as it was sent, and nothing else is taken, a pickle least of all."""
from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy
import pytest

from gpusession.run.comm_options import CommOptions, CommReport, validate_comm_options
from gpusession.run import messages as m
from gpusession.run import wire

SENT = [
    m.Output((("stdout", "step 1\n"), ("stderr", "warning\n"))),
    m.Report({"step": 3, "loss": 0.25, "name": "run-a", "nan": None}),
    m.Started(1795.5, "host-1", "192.0.2.2", 4242),
    m.CheckpointSaved(2),
    m.CheckpointData(b"\x80\x05state", (3, None)),
    m.WatchesCheckpoints(),
    m.Result(True),
    m.Pickled(b"\x80\x05result-bytes"),
    m.RankError(1, "host-1", "ValueError", "bad", "Traceback ...", 1795.5, ("builtins.ValueError",)),
    m.StoreServing(port=29500, error=""),
]


def round_trip(message, *, comm=None):
    header, data = wire.encode(message)
    return wire.decode(header, lambda: data, comm=comm)


@pytest.mark.parametrize("message", SENT, ids=lambda message: type(message).__name__)
def test_every_message_a_rank_sends_comes_back_equal(message):
    assert round_trip(message) == message


def test_the_table_checks_every_field_of_every_message_a_rank_sends():
    for kind, (cls, checks, carries_bytes) in wire.RANK_MESSAGES.items():
        # a Communication carries rank 0's counts; the options are the caller's own
        expected = (wire.field_names(CommReport) - {"options"} if cls is m.Communication
                    else wire.field_names(cls) - {"data"})
        assert set(checks) == expected, f"{kind}: checked {sorted(checks)}, has {sorted(expected)}"
        assert carries_bytes == ("data" in wire.field_names(cls))


def test_a_communication_report_carries_the_counts_and_takes_the_options_from_the_caller():
    options = validate_comm_options(grad_compression="fp16")
    sent = m.Communication(CommReport(options=CommOptions(), applied=True, steps=5, bytes_last_step=10,
                                      fp32_bytes_per_step=20, scaled_steps=0))
    back = round_trip(sent, comm=options)
    assert back.report == CommReport(options=options, applied=True, steps=5, bytes_last_step=10,
                                     fp32_bytes_per_step=20, scaled_steps=0)


def test_reported_numpy_numbers_arrive_as_numbers_and_other_objects_as_their_repr():
    back = round_trip(m.Report({"loss": numpy.float32(0.5), "step": numpy.int64(7), "nan": math.nan,
                                "shape": (2, 3), "obj": object}))
    assert back.metrics["loss"] == 0.5 and back.metrics["step"] == 7 and math.isnan(back.metrics["nan"])
    assert back.metrics["shape"] == [2, 3] and back.metrics["obj"] == repr(object)


class Evil:
    """Unpickling it would create a file: what a hostile rank would send to run code in the actor."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_from_a_rank_is_refused_without_being_unpickled(tmp_path):
    marker = tmp_path / "ran-in-the-actor"
    with pytest.raises(wire.WireError, match="not a message"):
        wire.decode(pickle.dumps(Evil(marker)), lambda: b"")
    assert not marker.exists()


@pytest.mark.parametrize("header, problem", [
    ({"kind": "Launch", "spec": {}}, "unknown kind 'Launch'"),
    ({"no": "kind"}, "without a kind"),
    ({"kind": "Result"}, "needs the fields"),
    ({"kind": "Result", "has_value": True, "nbytes": 0, "extra": 1}, "needs the fields"),
    ({"kind": "Result", "has_value": "yes", "nbytes": 0}, "true or false"),
    ({"kind": "Result", "has_value": True, "nbytes": 1.5}, "whole number"),
    ({"kind": "Started", "at": True, "host": "h", "address": "a", "pid": 1}, "expected a number"),
    ({"kind": "Output", "chunks": [["stdout"]]}, "pairs"),
    ({"kind": "Report", "metrics": [1, 2]}, "must be an object"),
    ({"kind": "RankError", "rank": 1.5, "host": "h", "type": "t", "message": "m", "traceback": "",
      "at": 1, "mro": []}, "whole number"),
])
def test_anything_but_a_rank_message_is_refused_naming_what_is_wrong(header, problem):
    with pytest.raises(wire.WireError, match=problem):
        wire.decode(json.dumps(header).encode(), lambda: b"")


def test_a_header_over_the_limit_is_refused_before_it_is_parsed():
    with pytest.raises(wire.WireError, match="over the"):
        wire.decode(b" " * (wire.MAX_HEADER_BYTES + 1), lambda: b"")


def test_only_messages_a_rank_sends_can_be_encoded():
    with pytest.raises(TypeError, match="not a message a rank sends"):
        wire.encode(m.CheckpointAck())
