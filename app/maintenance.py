"""Maintenance with a leader: one worker at a time runs each maintenance role.

Roles (one lease each, see app/store/leadership.py):

* `sweeps`: the expired-lease reaper, retention and the bulk operation
  runner, which act on every execution whoever runs them;
* `schedules <workflows>`: the scheduler of one set of workflows (a worker
  can only admit slots of workflows it runs, so workers running different
  sets elect a scheduler per set).

`Leadership.hold` takes the role's lease when it is free or expired and renews
it every third of its ttl, on the database clock. A service sweeps only after
`Leadership.leading()` has confirmed, in the database, that this worker's term
still stands: a worker that was paused (SIGSTOP) past the expiry keeps its
connections but finds its term over at its next check and stops sweeping,
while another worker has taken the role. Every sweep is itself a conditional
statement, so the one a worker may finish right after being paused mid-sweep
repeats nothing.

Claim-time takeover of expired execution leases is not a maintenance role: it
stays with every worker's claimer.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable

from app.dberrors import is_infrastructure
from app.logs import Fields
from app.metrics import METRICS
from app.store.leadership import MaintenanceLease, MaintenanceLeases

log = logging.getLogger("fencepost.maintenance")

SWEEPS = "sweeps"


def schedules_role(workflow_ids: list[str]) -> str:
    """The scheduler's role for this set of workflows (hashed when long)."""
    names = ",".join(sorted(workflow_ids))
    if len(names) > 100:
        names = "sha256:" + hashlib.sha256(names.encode()).hexdigest()[:16]
    return f"schedules {names}"


class Leadership:
    """This worker's claim on one maintenance role."""

    def __init__(self, store: MaintenanceLeases, role: str, holder: str, ttl_seconds: float):
        if ttl_seconds <= 0:
            raise ValueError("the maintenance lease ttl must be positive")
        self.store = store
        self.role = role
        self.holder = holder
        self.ttl_seconds = ttl_seconds
        self.renew_seconds = ttl_seconds / 3
        self.lease: MaintenanceLease | None = None
        self.log = Fields(log, {"worker_id": holder, "role": role})
        self._report()

    def _report(self) -> None:
        """The leader gauge follows `self.lease` (this worker's last known
        term): set wherever the term is taken, found over or released."""
        METRICS.maintenance_leader.labels(self.role).set(1 if self.lease is not None else 0)

    async def attempt(self) -> bool:
        """Take or renew the role's lease; whether this worker holds it now."""
        lease = await self.store.acquire(self.role, self.holder, self.ttl_seconds)
        previous, self.lease = self.lease, lease
        self._report()
        if lease is not None and (previous is None or previous.token != lease.token):
            self.log.info("maintenance role %r taken (token %d): this worker runs it",
                          self.role, lease.token)
        elif lease is None and previous is not None:
            self._lost(previous)
        return lease is not None

    async def leading(self) -> bool:
        """Whether this worker's term still stands, checked in the database
        (a paused worker's in-memory lease may be long expired)."""
        lease = self.lease
        if lease is None:
            return False
        if await self.store.holds(lease):
            return True
        if self.lease is lease:
            self.lease = None
            self._report()
            self._lost(lease)
        return False

    def _lost(self, lease: MaintenanceLease) -> None:
        self.log.info("maintenance role %r lost (token %d ended): this worker stops running it",
                      self.role, lease.token)

    async def hold(self, stop: asyncio.Event) -> None:
        """Until `stop`: renew (or take) the lease every third of its ttl,
        riding out database outages; at the end, release it so that another
        worker takes the role at once."""
        while not stop.is_set():
            try:
                await self.attempt()
            except Exception as exc:
                if not is_infrastructure(exc):
                    raise
                self.log.warning("maintenance lease %r: renewal failed (%s)", self.role, exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.renew_seconds)
            except TimeoutError:
                pass

    async def release(self) -> None:
        lease, self.lease = self.lease, None
        self._report()
        if lease is not None and await self.store.release(lease):
            self.log.info("maintenance role %r released (token %d)", self.role, lease.token)


async def every(interval: float, stop: asyncio.Event, sweep: Callable[[], Awaitable[object]],
                leadership: Leadership | None = None) -> None:
    """Run `sweep` every `interval` seconds until `stop`; with `leadership`,
    only while this worker leads the role (checked before each sweep). A
    worker that does not lead looks again every renewal interval, so a role
    taken over is swept within one renewal of the takeover."""
    while not stop.is_set():
        wait = interval
        if leadership is None or await leadership.leading():
            await sweep()
        else:
            wait = min(interval, leadership.renew_seconds)
        try:
            await asyncio.wait_for(stop.wait(), timeout=wait)
        except TimeoutError:
            pass
