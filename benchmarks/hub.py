"""From `gpusession hub` started to a user's first `%%gpu 2` result through the Hub (the cluster
service, JupyterHub, the Hub's login form, the spawn of the user's server as their Unix account,
a kernel, the first call), against the same first result in `gpusession lab` started by hand
(JupyterLab, its embedded cluster, a kernel, the first call): what a shared server costs a user
over a personal one, from a cold start.

    sudo .venv/bin/python benchmarks/hub.py [--samples 6]      (root: it makes a test account)

Needs `scripts/setup --hub` (GPUSESSION_HUB_PREFIX honoured). Samples alternate (lab, hub, lab,
...), each side from a cold start with fresh state directories; the same two cells run on each
side over the kernel's websocket. Result: benchmarks/results/hub.json; the last line is the ratio
hub / lab (goal <= 1.5).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from _cluster import in_turn  # noqa: E402
from _results import Row, spread, write  # noqa: E402

from gpusession.hub.plan import DEFAULT_PREFIX, HubLayout  # noqa: E402
from tests.hub.client import HubUser  # noqa: E402
from tests.hub.conftest import _add_account, _free_port, _remove_everything, stop_hub, wait_for_line  # noqa: E402

PREFIX = Path(os.environ.get("GPUSESSION_HUB_PREFIX", DEFAULT_PREFIX))
SETUP = "%load_ext gpusession\nimport gpusession as gs"
FIRST_GPU = "%%gpu 2\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)"
CHECK = "print(t.item())"


class LabUser(HubUser):
    """The kernel client of tests/hub, pointed at a plain JupyterLab with its token."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(url, "", "")
        self.token = token

    def server_path(self, user: str | None = None) -> str:
        return ""  # JupyterLab's own root: no Hub in front of it


def first_result(user: HubUser) -> None:
    for code in (SETUP, FIRST_GPU):
        ran = user.run(code)
        assert ran.error is None, ran
    checked = user.run(CHECK)
    assert checked.stdout.strip() == "2.0", checked  # 1 + 1 over the 2 ranks: the call really ran


def hub_sample() -> float:
    prefix = f"gsb{os.getpid() % 100000}"
    names = [f"{prefix}u", f"{prefix}s"]
    state = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    os.chmod(state, 0o755)
    layout = HubLayout(PREFIX, state / "state", names[1])
    proc = None
    try:
        password = _add_account(names[0])
        port = _free_port()
        output = state / "hub-output.txt"
        started = time.monotonic()
        with open(output, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gpusession.cli", "hub", "--ip", "127.0.0.1", "--port",
                                     str(port), "--prefix", str(PREFIX), "--state-dir", str(layout.state),
                                     "--service-user", layout.service_user], cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT)
        wait_for_line(output, "gpusession hub: ready:", proc, 600)
        user = HubUser(f"http://127.0.0.1:{port}", names[0], password)
        user.start_server()  # the Hub's login form, then the spawn, as in tests/hub
        first_result(user)
        return time.monotonic() - started
    finally:
        if proc is not None:
            stop_hub(proc)
        _remove_everything(prefix, names, state, layout)


def lab_sample() -> float:
    home = Path(tempfile.mkdtemp(prefix="gsb-lab-"))
    port = _free_port()
    output = home / "lab-output.txt"
    env = {**os.environ, "GPUSESSION_HOME": str(home / ".gpusession")}
    env.pop("RAY_ADDRESS", None)
    started = time.monotonic()
    with open(output, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpusession.cli", "lab", "--no-browser", "--ip", "127.0.0.1",
                                 "--port", str(port), "--notebook-dir", str(home)], cwd=home, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for_lab(output, proc)  # a kernel started earlier waits for the cluster
        token = re.search(r"token=([0-9a-f]+)", output.read_text()).group(1)
        first_result(LabUser(f"http://127.0.0.1:{port}", token))
        return time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: JupyterLab, its kernels, then the cluster
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)  # the lab's notebook folder and its gpusession home


def wait_for_lab(output: Path, proc: subprocess.Popen, timeout_s: float = 600.0) -> None:
    """Until `gpusession lab` says its cluster is ready; a cluster that failed ends the sample."""
    deadline = time.monotonic() + timeout_s
    while "cluster ready:" not in output.read_text():
        said = output.read_text()
        if "could not start its cluster" in said or proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"gpusession lab did not get its cluster:\n{said[-2000:]}")
        time.sleep(0.25)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=6, help="of each side, alternated (the first flipped each time)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("benchmarks/hub.py makes a Unix account for the Hub's user and runs `gpusession hub`: run it as root")
        return 2
    loadavg = os.getloadavg()
    hub, lab = [], []
    def take(side: str, samples: list, sample) -> None:
        samples.append(sample())
        print(f"{side} sample {len(samples)}: {samples[-1]:.1f} s", flush=True)

    for round_ in range(args.samples):
        in_turn(round_, lambda: take("lab", lab, lab_sample), lambda: take("hub", hub, hub_sample))
    row = Row(measure="start to a user's first %%gpu 2 result, cold", unit="s", gpusession_samples=hub,
              alternative="gpusession lab started by hand", alternative_samples=lab,
              configured="hub: `gpusession hub` (4 logical GPUs), login through the Hub's form, the server spawned "
                         "as the user's Unix account; lab: `gpusession lab --no-browser` (4 logical GPUs); both: a "
                         "kernel over the websocket, %load_ext then a %%gpu 2 all_reduce cell; samples alternated, "
                         "the first flipped each time",
              goal="<= 1.5")
    path = write("hub", [row], loadavg_before=loadavg)
    print(f"hub {spread(hub)} s; lab {spread(lab)} s; written to {path}")
    ratio = row.as_json()["ratio"]
    print(f"ratio hub / lab: {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
