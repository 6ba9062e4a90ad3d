"""The broker's configuration: explicit values win, then the head node's environment, then what
the ledger remembers from an earlier start, then defaults."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields

from ...errors import InvalidRequest
from ..storage.books import PolicySettings
from ..storage.ledger import Ledger
from ..policy.model import Priority, Quota
from .reconcile import Timeouts

ENV_PREFIX = "GPUSESSION_"


@dataclass(frozen=True)
class BrokerConfig:
    db_path: str | None = None  # None: $GPUSESSION_DB_PATH, else this cluster's directory (statedir.py)
    default_quota: dict | None = None  # {"max_gpus": 2, "gpu_hours": null, "max_priority": "normal"}
    allow_borrowing: bool | None = None
    preemption_grace_s: float | None = None
    require_signed_identity: bool | None = None
    revoke_grace_s: float | None = None
    claim_timeout_s: float | None = None
    heartbeat_timeout_s: float | None = None
    version_override: str | None = None  # tests only: pretend to be another version
    protocol_override: int | None = None  # tests only: pretend to speak another protocol

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


POLICY_KEYS = ("default_quota", "allow_borrowing", "preemption_grace_s", "require_signed_identity",
               "revoke_grace_s", "claim_timeout_s", "heartbeat_timeout_s")
DEFAULTS = {
    "default_quota": {"max_gpus": None, "gpu_hours": None, "max_priority": "normal"},
    "allow_borrowing": True,
    "preemption_grace_s": 30.0,
    "require_signed_identity": False,
    "revoke_grace_s": 5.0,
    "claim_timeout_s": 15.0,
    "heartbeat_timeout_s": 5.0,
}


def explicit_db_path(config: BrokerConfig) -> str | None:
    """The ledger path an admin chose (config, else $GPUSESSION_DB_PATH); None: the cluster's own
    directory under $GPUSESSION_HOME (statedir.py)."""
    return config.db_path or os.environ.get(ENV_PREFIX + "DB_PATH") or None


def _from_env(key: str):
    raw = os.environ.get(ENV_PREFIX + key.upper())
    if raw is None or raw == "":
        return None
    return json.loads(raw) if key == "default_quota" else _scalar(raw)


def _scalar(raw: str):
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    return float(raw)


def resolve(config: BrokerConfig, ledger: Ledger) -> dict:
    """Effective policy values; values that came from config or env are remembered in the ledger."""
    values = {}
    for key in POLICY_KEYS:
        given = getattr(config, key)
        if given is None:
            given = _from_env(key)
        if given is not None:
            ledger.set_setting(key, given)
            values[key] = given
        else:
            values[key] = ledger.setting(key, DEFAULTS[key])
    return values


def quota_from_dict(data: dict) -> Quota:
    return Quota(
        max_gpus=None if data.get("max_gpus") is None else float(data["max_gpus"]),
        gpu_hours=None if data.get("gpu_hours") is None else float(data["gpu_hours"]),
        max_priority=Priority.parse(data.get("max_priority") or "normal", field_name="max_priority"),
    )


def policy_settings(values: dict) -> PolicySettings:
    return PolicySettings(
        default_quota=quota_from_dict(values["default_quota"]),
        allow_borrowing=bool(values["allow_borrowing"]),
        preemption_grace_s=float(values["preemption_grace_s"]),
    )


def timeouts(values: dict) -> Timeouts:
    return Timeouts(claim_s=float(values["claim_timeout_s"]), heartbeat_s=float(values["heartbeat_timeout_s"]))


QUOTA_FIELDS = ("max_gpus", "gpu_hours", "max_priority")


def parse_quota_update(update: dict, base: Quota) -> Quota:
    """Apply an admin's quota change to `base`; a bad field raises InvalidRequest naming it."""
    if not isinstance(update, dict):
        raise InvalidRequest("quota must be an object such as {\"max_gpus\": 2}.")
    unknown = sorted(set(update) - set(QUOTA_FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown quota field {unknown[0]!r}; the fields are {', '.join(QUOTA_FIELDS)}.")
    values = {"max_gpus": base.max_gpus, "gpu_hours": base.gpu_hours, "max_priority": base.max_priority}
    for key in ("max_gpus", "gpu_hours"):
        if key in update:
            values[key] = _non_negative(update[key], key)
    if "max_priority" in update:
        try:
            values["max_priority"] = Priority.parse(update["max_priority"], field_name="max_priority")
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
    return Quota(**values)


def _non_negative(value, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{key} must be a number >= 0 or null (no limit); got {value!r}.")
    if not value >= 0 or value == float("inf"):
        raise InvalidRequest(f"{key} must be a number >= 0 or null (no limit); got {value!r}.")
    return float(value)
