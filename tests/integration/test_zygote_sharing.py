"""The node's warm parent serves several worker actors at once (real processes, no Ray): each
connection gets its own children and their exits, a connection that closes takes its own
children with it and nobody else's, and the owner closing ends the parent and its socket."""
from __future__ import annotations

import os
import signal
import subprocess

import psutil

from gpusession.run.node.zygote import Zygote

from ..conftest import process_running, wait_for

START_S = 180.0  # imports torch; a loaded 2-core machine is slow


def test_one_warm_parent_serves_several_actors_each_keeping_its_own_children(tmp_path):
    path = str(tmp_path / "zygote.sock")
    owner = Zygote.start(path)
    try:
        owner.wait_ready(START_S)
        first, second = Zygote.connect(path, 10.0), Zygote.connect(path, 10.0)
        first.wait_ready(10.0)
        second.wait_ready(10.0)
        assert first.pid == second.pid == owner.pid == owner.process.pid

        mine, my_pipe = first.fork()
        theirs, their_pipe = second.fork()
        assert psutil.Process(mine).ppid() == psutil.Process(theirs).ppid() == owner.pid

        their_pipe.close()  # a rank whose actor hangs up before the launch exits with an error code
        assert second.exit_status(theirs, 30.0) == (71, None)
        assert first.exit_status(theirs, 0.5) is None  # told to the actor that asked for it only

        first.close()  # that actor died: its rank dies too, the warm parent stays for the others
        wait_for(lambda: not process_running(mine), timeout=10, message="the closed connection's child gone")
        assert owner.alive() and second.alive()
        again, pipe = second.fork()
        pipe.close()
        assert second.exit_status(again, 30.0) == (71, None)
    finally:
        owner.close()
    assert owner.process.returncode is not None
    wait_for(lambda: not os.path.exists(path), timeout=10, message="the socket removed with its parent")


def test_a_kill_reaches_only_a_rank_of_that_actor_still_running_never_a_process_that_got_its_pid(tmp_path):
    """Linux hands a reaped process's pid to the next new process once the counter wraps (pid_max
    is 32768 here), so a kill by pid from anyone but the parent may hit a stranger: a whole Ray
    node, when the stranger leads its process group. The actor asks the warm parent, which kills
    only a child of that actor it has not reaped."""
    path = str(tmp_path / "zygote.sock")
    owner = Zygote.start(path)
    stranger = subprocess.Popen(["sleep", "120"], start_new_session=True)  # leads its own group, like `ray start`
    try:
        owner.wait_ready(START_S)
        other = Zygote.connect(path, 10.0)
        other.wait_ready(10.0)
        ended, pipe = owner.fork()
        pipe.close()
        assert owner.exit_status(ended, 30.0) == (71, None)  # reaped: its pid is free for anyone now
        owner.kill(ended)
        owner.kill(stranger.pid)  # what a late kill of a reused pid amounts to
        running, pipe = owner.fork()
        other.kill(running)  # another actor's rank
        assert owner.exit_status(running, 1.0) is None and process_running(running)
        owner.kill(running)
        assert owner.exit_status(running, 30.0) == (None, signal.SIGKILL)
        pipe.close()
        assert stranger.poll() is None and process_running(stranger.pid)
    finally:
        stranger.kill()
        stranger.wait()
        owner.close()
