"""Whose Unix account the caller is: the account its ranks run as (RankSpec.caller_account).

In one-user setups a rank runs as the account of the process that started the node's warm
parent, which is the caller's. Under `gpusession hub` the node's launcher (gpusession/launcher/,
run as root) starts each rank as this account: a rank reads what its user may read, and what it
writes is the user's.
"""
from __future__ import annotations

import getpass


def this_account() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry (some containers)
        return ""
