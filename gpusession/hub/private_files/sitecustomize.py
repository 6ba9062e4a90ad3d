"""Imported by every Python process of the hub's service account (the hub puts this folder on
its PYTHONPATH): Ray's worker processes (the worker actors, the broker) create files only their
account may read. (The ranks are not among them: root's launcher starts them as their users.)

The service starts Ray with umask 077 (hub/run.py, hub/node.py: users reach the gateway, never
Ray); its workers set the private mask here as well, whatever mask their raylet passed on, so
checkpoints, scratch files and the ledger are readable by no user, and their temporary files go in
the account's own 0700 directory, not a /tmp folder another account may have made first.
(/proc/self/cmdline: sys.argv is not set yet when this runs.)
"""
import os

try:
    with open("/proc/self/cmdline", "rb") as _cmdline:
        if b"default_worker.py" in _cmdline.read():
            os.umask(0o077)
            _private_tmp = os.path.join(os.environ.get("GPUSESSION_HOME", ""), "tmp")
            if os.path.isdir(_private_tmp):
                os.environ["TMPDIR"] = _private_tmp
except OSError:
    pass
