"""Whose Unix account a rank runs as, and what to tell a user whose rank could not read a file.

Under `gpusession hub` the ranks run as the cluster's service account, not as the user whose
notebook called them (Ray starts every worker as the account that started Ray). A rank's
PermissionError on the user's own file is then expected, and the bare errno says nothing of why.
"""
from __future__ import annotations

import getpass


def this_account() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry (some containers)
        return ""


def permission_hint(rank_account: str, caller_account: str) -> str:
    """PURE: the sentence a rank's PermissionError gains, or "" when the rank runs as its caller
    (then the error is the user's own and needs no explanation from us)."""
    if not rank_account or not caller_account or rank_account == caller_account:
        return ""
    return (f" (the ranks run as the Unix account {rank_account!r}, not as {caller_account!r}: read the file in "
            f"the notebook and use its name in the cell, or make it readable by {rank_account!r}; see README "
            "\"What a user's code runs as\")")
