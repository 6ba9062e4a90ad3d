"""The "before" side of benchmarks/before_gateway.py: gpusession as it was at the commit before the
gateway (issue 28), installed in a venv of its own, with a Ray head of its own, called the way a hub
kernel called it then (a Ray driver with RAY_ADDRESS).

The venv is made once per commit under ~/.cache/gpusession-bench/before-<commit> and reused: the
commit's tree (`git archive`) on the venv's path, and its dependencies from this checkout's venv
through a .pth line (constraints.txt differs only by the hub's idle culler since then, which
the before side does not import). Its processes run in a folder of their own, never this checkout,
so `import gpusession` finds the old code.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "gpusession-bench"

_HEAD = """
import logging, sys
import ray
from gpusession.cluster.raycluster import init_local_head
from gpusession.broker import client

init_local_head(num_gpus=int(sys.argv[1]), num_cpus=int(sys.argv[1]), include_dashboard=False,
                logging_level=logging.ERROR, log_to_driver=False)
client.broker()
print("READY", ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


# The scripts this side shares with today's name today's modules; at the commit before the gateway
# some sat elsewhere (issue 30's moves came later): each is named as it was there.
MOVED_SINCE = {"from gpusession.observe import events": "from gpusession import events"}


def as_before(script: str) -> str:
    for today, then in MOVED_SINCE.items():
        script = script.replace(today, then)
    return script


def commit_of(revision: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                          capture_output=True, text=True, check=True).stdout.strip()


class BeforeInstall:
    """The venv of one commit: `python` runs that commit's gpusession."""

    def __init__(self, commit: str) -> None:
        self.commit = commit
        self.folder = CACHE / f"before-{commit[:12]}"
        self.python = str(self.folder / "venv" / "bin" / "python")

    def ensure(self) -> "BeforeInstall":
        if (self.folder / "ready").exists():
            return self
        if self.folder.exists():  # a half-made one of an earlier, interrupted run: this path is ours
            shutil.rmtree(self.folder)
        source = self.folder / "src"
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", self.commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(self.folder / "venv")], check=True)
        purelib = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        # The commit's tree first, then the dependencies: this checkout's venv (the .pth files there,
        # this checkout's editable gpusession among them, are not read from a path added this way).
        # gpusession is pure Python, so its tree on the path is its install.
        Path(purelib, "00-gpusession-before.pth").write_text(f"{source}\n")
        Path(purelib, "zz-gpusession-bench-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        found = subprocess.run([self.python, "-c", "import gpusession, ray, torch; print(gpusession.__file__)"],
                               capture_output=True, text=True, check=True, cwd=str(self.folder)).stdout.strip()
        if not found.startswith(str(self.folder)):
            raise SystemExit(f"the before venv imports gpusession from {found}, not its own install")
        (self.folder / "ready").write_text(self.commit + "\n")
        return self


class BeforeCluster:
    """A Ray head of the before code (4 logical GPUs, its broker started) in a process of its own,
    with a private GPUSESSION_HOME; `env()` is what a kernel of that time was given."""

    def __init__(self, install: BeforeInstall, gpus: int) -> None:
        self.install = install
        self.home = tempfile.mkdtemp(prefix="gs-bench-before-home-")
        self.workdir = tempfile.mkdtemp(prefix="gs-bench-before-cwd-")
        # the before code's temporary files (its ranks' /tmp/gpusession-scratch, which it never
        # removed, Ray's session folder) go in a folder of this run's, removed with it (short: Ray's
        # sockets live under it)
        self.tmp = tempfile.mkdtemp(prefix="gsb-before-")
        env = self._base_env()
        self.head = subprocess.Popen([install.python, "-c", _HEAD, str(gpus)], env=env, cwd=self.workdir,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.head.stdout.readline().split()
        if not line or line[0] != "READY":
            self.head.kill()
            raise SystemExit(f"the before head did not start (exit status {self.head.poll()}): {line!r}")
        self.gcs_address = line[1]

    def _base_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "GPUSESSION_")) and k != "PYTHONPATH"}
        env["GPUSESSION_HOME"] = self.home
        env["TMPDIR"] = self.tmp
        return env

    def env(self) -> dict:
        """A hub kernel's environment before the gateway: the Ray address (and, on the hub, its token)."""
        return dict(self._base_env(), RAY_ADDRESS=self.gcs_address)

    def stop(self) -> None:
        self.head.stdin.close()
        try:
            self.head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.head.kill()
            self.head.wait()
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


class BeforeKernel:
    """A long-lived process of the before code that makes the warm call each time it is told to
    (the same script as the gateway side's, benchmarks/_gateway_side.py), timed inside it."""

    def __init__(self, cluster: BeforeCluster, script: str) -> None:
        self.proc = subprocess.Popen([cluster.install.python, "-c", as_before(script)], env=cluster.env(),
                                     cwd=cluster.workdir,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.proc.kill()
            raise SystemExit(f"the before kernel did not start (exit status {self.proc.poll()}): {line!r}")

    def call(self) -> float:
        self.proc.stdin.write("call\n")
        self.proc.stdin.flush()
        seconds, _ray_imported = self.proc.stdout.readline().split()
        return float(seconds)

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
