"""The gateway's bytes of calls per account (gateway/intake.py): the admin's size, the count across
an account's connections, a refused call read to its end and answered, over a real socket pair."""
from __future__ import annotations

import socket
import threading

import pytest

from gpusession.errors import QuotaExceeded
from gpusession.gateway.chunks import gather, send_chunked
from gpusession.gateway.frames import Connection
from gpusession.gateway.intake import CallBytes, default_limit, size_of

MiB = 2**20


@pytest.mark.parametrize("text, size", [("8G", 8 * 2**30), ("512M", 512 * MiB), ("1.5T", int(1.5 * 2**40)),
                                        ("4194304", 4 * MiB), ("2GiB", 2 * 2**30), ("16 mb", 16 * MiB),
                                        (2**30, 2**30)])
def test_an_admins_size_reads_as_bytes_with_binary_units(text, size):
    assert size_of(text) == size


@pytest.mark.parametrize("text", ["", "eight", "8X", "-1G", "8 G B", True, None, "1K"])
def test_a_size_that_is_not_one_or_under_a_mib_is_refused_naming_the_option(text):
    with pytest.raises(ValueError, match="--call-bytes-per-user"):
        size_of(text)


def test_the_default_limit_is_a_quarter_of_the_machines_memory():
    with open("/proc/meminfo") as meminfo:
        total_kib = int(meminfo.readline().split()[1])
    assert abs(default_limit() - total_kib * 1024 // 4) <= 2**20  # /proc/meminfo rounds to a KiB


def test_an_accounts_calls_count_together_across_its_connections_and_apart_from_other_accounts():
    books = CallBytes(limit=10 * MiB)
    first, second, other = books.intake("ann"), books.intake("ann"), books.intake("bob")
    assert first.admit(6 * MiB) and first.refusal() is None
    assert not second.admit(5 * MiB)  # ann holds 6 of her 10
    assert other.admit(9 * MiB) and other.refusal() is None  # bob's count is his own
    refused = second.refusal()
    assert isinstance(refused, QuotaExceeded)
    assert "5.0 MiB" in str(refused) and "10.0 MiB" in str(refused) and "6.0 MiB of it held now" in str(refused)
    assert "--call-bytes-per-user" in str(refused) and "Nothing was leased" in str(refused)
    with first.share([bytes(2 * MiB), bytes(4 * MiB)]) as share:  # the call: its pickle and one array
        share.shipped(4 * MiB)  # its array went into the object store
        assert books.held("ann") == 2 * MiB
    assert books.held("ann") == 0 and first.held == 0  # its pickle, given back when the run ended
    assert second.admit(5 * MiB) and second.refusal() is None


def test_once_a_frame_of_a_call_is_refused_every_later_frame_of_it_is_too_and_its_admitted_ones_go_back():
    books = CallBytes(limit=10 * MiB)
    intake = books.intake("ann")
    assert intake.admit(4 * MiB)
    assert not intake.admit(8 * MiB)
    assert not intake.admit(1)  # would fit, but belongs to the refused call
    refused = intake.refusal()
    assert "12.0 MiB" in str(refused) and books.held("ann") == 0 and intake.held == 0
    assert intake.admit(8 * MiB) and intake.refusal() is None  # the next call is counted afresh
    intake.close()
    assert books.held("ann") == 0


def test_no_limit_admits_everything_and_still_counts():
    books = CallBytes(limit=None)
    intake = books.intake("ann")
    assert intake.admit(2**40) and intake.refusal() is None and books.held("ann") == 2**40
    intake.close()
    assert books.held("ann") == 0


def test_a_refused_frame_is_read_to_its_end_so_the_next_message_arrives_whole():
    left, right = socket.socketpair()
    sender, receiver = Connection(left), Connection(right)
    books = CallBytes(limit=3 * MiB)
    intake = books.intake("ann")
    receiver.admit = intake.admit
    frames = [b"p" * 1000, b"a" * (2 * MiB), b"b" * (2 * MiB), b"c" * 10]
    thread = threading.Thread(target=lambda: (send_chunked(sender, "run", frames, name="f"), sender.send("stop")))
    thread.start()
    got = gather(receiver, receiver.receive())
    assert got.payload == [frames[0], frames[1], b"", b""]  # the third went over: it and the rest read and dropped
    refused = intake.refusal()
    assert "4.0 MiB" in str(refused) and books.held("ann") == 0
    assert receiver.receive().kind == "stop"  # the stream is still in step
    thread.join()
    sender.close(), receiver.close()


def test_the_hubs_gateway_process_refuses_a_bad_size_naming_its_option_before_it_serves():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gpusession.gateway.main", "--call-bytes-per-user", "lots",
                           "/nonexistent/gateway.sock", "/nonexistent/ledger.db"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--call-bytes-per-user 'lots'" in done.stderr, done.stderr
