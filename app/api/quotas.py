"""Per-token quotas: admissions and signals per minute, 429 `RATE_LIMITED`
with `Retry-After` once a token has used its share.

Off unless configured for a token (`fencepost tokens create|quota
--admissions-per-minute N --signals-per-minute N`; NULL in `api_tokens` is no
limit). Cheap by construction: nothing is written per request. Each API
process keeps one token bucket per (token, kind) in memory, holding its share
of the limit (limit / FENCEPOST_API_PROCESSES), and re-reads the limits from
Postgres with one plain SELECT at most every FENCEPOST_QUOTA_REFRESH_SECONDS,
in the background (the requests that notice a stale snapshot go on with it).
So 32 clients sharing one token take no lock on its row and add no commit;
a limit set or changed applies within the refresh interval.

A bucket holds up to the per-minute limit (a burst of a full minute's worth)
and refills at limit/60 per second: over any window of T seconds a token is
answered at most limit * (1 + T/60) times per process share.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, Request

from app.api.auth import Principal, Trigger, Waker
from app.api.errors import ApiError
from app.api.models import ErrorBody

log = logging.getLogger("fencepost.api")

Kind = Literal["admissions", "signals"]
_KIND_INDEX = {"admissions": 0, "signals": 1}
_WHAT = {"admissions": "admit executions", "signals": "send signals"}
# {token_id: (admissions_per_minute, signals_per_minute)}, None where unlimited.
Limits = dict[str, tuple[int | None, int | None]]

# FastAPI's `responses=` entry for the routes that enforce a quota.
RATE_LIMITED: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorBody,
          "description": "RATE_LIMITED: the token's quota is used up; retry after Retry-After seconds"},
}


class Bucket:
    """A token bucket: `capacity` units, refilled at `rate` units per second."""

    __slots__ = ("capacity", "rate", "level", "stamp")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity = capacity
        self.rate = rate
        self.level = capacity
        self.stamp = now

    def resize(self, capacity: float, rate: float) -> None:
        self.capacity, self.rate = capacity, rate
        self.level = min(self.level, capacity)

    def take(self, now: float) -> float:
        """Take one unit: 0.0 if there was one, else the seconds until there is."""
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= 1.0:
            self.level -= 1.0
            return 0.0
        return (1.0 - self.level) / self.rate


class QuotaLimiter:
    """One per API process (app.state.quotas)."""

    def __init__(self, load: Callable[[], Awaitable[Limits]], *, refresh_seconds: float = 5.0, processes: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self.refresh_seconds = refresh_seconds
        self.processes = processes
        self._clock = clock
        self._limits: Limits = {}
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._loaded_at: float | None = None
        self._refresh: asyncio.Future[None] | None = None
        self.refreshes = 0  # snapshots read from Postgres (tests and diagnostics)

    def _share(self, per_minute: int) -> tuple[float, float]:
        share = per_minute / self.processes
        return max(1.0, share), share / 60.0

    def _apply(self, limits: Limits) -> None:
        now = self._clock()
        self._limits = limits
        for key in list(self._buckets):
            token_id, kind = key
            per_minute = limits.get(token_id, (None, None))[_KIND_INDEX[kind]]
            if per_minute is None:
                del self._buckets[key]
            else:
                self._buckets[key].resize(*self._share(per_minute))
        self._loaded_at = now
        self.refreshes += 1

    async def refresh(self) -> None:
        """Read the snapshot now; concurrent callers share one read."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._read())
        await asyncio.shield(self._refresh)

    async def _read(self) -> None:
        self._apply(await self._load())

    def _refresh_in_background(self) -> None:
        if self._refresh is not None and not self._refresh.done():
            return
        self._refresh = asyncio.ensure_future(self._read())
        self._refresh.add_done_callback(_log_failure)

    async def check(self, token_id: str | None, kind: Kind) -> float:
        """0.0 if the request may go ahead (and is counted), else the seconds
        after which it may be retried."""
        if token_id is None:  # authentication disabled: no token, no quota
            return 0.0
        if self._loaded_at is None:
            await self.refresh()  # the process's first quota-checked request
        elif self._clock() - self._loaded_at >= self.refresh_seconds:
            self._refresh_in_background()
        limits = self._limits.get(token_id)
        per_minute = None if limits is None else limits[_KIND_INDEX[kind]]
        if per_minute is None:
            return 0.0
        now = self._clock()
        bucket = self._buckets.get((token_id, kind))
        if bucket is None:
            bucket = self._buckets[(token_id, kind)] = Bucket(*self._share(per_minute), now)
        return bucket.take(now)

    def limit(self, token_id: str, kind: Kind) -> int | None:
        limits = self._limits.get(token_id)
        return None if limits is None else limits[_KIND_INDEX[kind]]


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        # The previous snapshot stays in force; the next request tries again.
        exc = future.exception()
        log.warning("could not refresh token quotas: %s: %s", type(exc).__name__, exc)


def limiter(request: Request) -> QuotaLimiter:
    state = request.app.state
    found = getattr(state, "quotas", None)
    if found is None:
        settings = state.settings
        found = state.quotas = QuotaLimiter(
            state.store.tokens.token_quotas,
            refresh_seconds=settings.quota_refresh_seconds,
            processes=settings.api_processes,
        )
    return found


async def enforce(request: Request, principal: Principal, kind: Kind) -> None:
    quotas = limiter(request)
    token_id = principal.token_id
    wait = await quotas.check(token_id, kind)
    if wait > 0 and token_id is not None:  # only a token has a quota to wait for
        seconds = max(1, math.ceil(wait))
        per_minute = quotas.limit(token_id, kind)
        raise ApiError(
            429, "RATE_LIMITED",
            f"token {principal.name!r} may {_WHAT[kind]} {per_minute} times per minute and has "
            f"used that up; retry after {seconds} seconds, or ask an operator to raise it "
            f"(`fencepost tokens quota {token_id} --{kind}-per-minute N`)",
            headers={"Retry-After": str(seconds)},
        )


async def admission_quota(request: Request, principal: Trigger) -> None:
    await enforce(request, principal, "admissions")


async def signal_quota(request: Request, principal: Waker) -> None:
    await enforce(request, principal, "signals")


# For a route: a parameter `_quota: AdmissionQuota` (or SignalQuota), and
# `**RATE_LIMITED` in its documented responses.
AdmissionQuota = Annotated[None, Depends(admission_quota)]
SignalQuota = Annotated[None, Depends(signal_quota)]
