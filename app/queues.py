"""Queues: what flow control a workflow's executions are under.

A queue's settings are declared in code (`Queue(...)`, named by
`@workflow(queue=...)`) and may be changed at run time by an operator; the
run-time value of a setting wins over the declared one until it is reset.
The limits are enforced by the claim (app/store/leases.py, with the counting
function of revision 0008); this module only names and checks them.

The settings, as stored (snake_case keys of `queues.declared` / `.override`):
  concurrency          most executions of the queue holding a slot at once
  per_key_concurrency  most holding a slot at once per concurrency key
  rate_limit, rate_period
                       most starts (first claims) per `rate_period` seconds
  rate_per_key         the rate limit counts per concurrency key, not per queue
  hold_while_suspended a suspended execution keeps its slot
  paused               nothing of the queue is claimed
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

DEFAULT_QUEUE = "default"
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
# Bounds that keep a typo from meaning "unlimited" in practice or overflowing.
MAX_LIMIT = 1_000_000
MAX_RATE_PERIOD = 86_400.0 * 31
# The database keeps microseconds: a shorter period would round to none.
MIN_RATE_PERIOD = 0.001

SETTINGS = ("concurrency", "per_key_concurrency", "rate_limit", "rate_period", "rate_per_key",
            "hold_while_suspended", "paused")


class QueueSettingsError(ValueError):
    """Settings that cannot be stored: the message says which and why."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise QueueSettingsError(
            f"queue name {name!r} must be 1-200 characters from A-Z a-z 0-9 . _ : -")
    return name


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings, checked: limits are positive integers or None (no
    limit), a rate limit comes with its period, flags are booleans."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise QueueSettingsError(f"unknown queue settings: {', '.join(sorted(unknown))}")
    for key in ("concurrency", "per_key_concurrency", "rate_limit"):
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_LIMIT):
            raise QueueSettingsError(
                f"{key} must be an integer from 1 to {MAX_LIMIT}, or null for no limit "
                "(to stop a queue, pause it)")
    period = settings.get("rate_period")
    if period is not None and (isinstance(period, bool) or not isinstance(period, (int, float))
                               or not MIN_RATE_PERIOD <= period <= MAX_RATE_PERIOD):
        raise QueueSettingsError(
            f"rate_period must be a number of seconds from {MIN_RATE_PERIOD:g} to "
            f"{MAX_RATE_PERIOD:g}")
    if "rate_limit" in settings or "rate_period" in settings:
        if (settings.get("rate_limit") is None) != (settings.get("rate_period") is None):
            raise QueueSettingsError("rate_limit and rate_period go together: give both, "
                                     "or null for both to remove the rate limit")
    for key in ("rate_per_key", "hold_while_suspended", "paused"):
        if key in settings and not isinstance(settings[key], bool):
            raise QueueSettingsError(f"{key} must be true or false")
    return {k: (float(v) if k == "rate_period" and v is not None else v)
            for k, v in settings.items()}


@dataclass(frozen=True)
class Queue:
    """A queue as code declares it, e.g.
    `Queue("payments", concurrency=5, rate_limit=(100, 60))`:
    at most 5 running at once and 100 starts per 60 seconds."""

    name: str
    concurrency: int | None = None
    per_key_concurrency: int | None = None
    # (starts, period in seconds)
    rate_limit: tuple[int, float] | None = None
    rate_per_key: bool = False
    hold_while_suspended: bool = False

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.rate_limit is not None and (
                not isinstance(self.rate_limit, tuple) or len(self.rate_limit) != 2):
            raise QueueSettingsError(
                f"rate_limit= of queue {self.name!r} must be (starts, period_seconds)")
        check_settings(self.settings())

    def settings(self) -> dict[str, Any]:
        """The declared settings, in the stored form."""
        limit, period = self.rate_limit if self.rate_limit is not None else (None, None)
        return {"concurrency": self.concurrency, "per_key_concurrency": self.per_key_concurrency,
                "rate_limit": limit, "rate_period": period, "rate_per_key": self.rate_per_key,
                "hold_while_suspended": self.hold_while_suspended}
