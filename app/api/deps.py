"""Typed dependencies: what a route may ask the lifespan for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import Depends, Request

from app.blocked import Live, blocked_by
from app.settings import Settings
from app.store import ExecutionStore
from app.store.records import HealedExecution


# async: FastAPI runs sync dependencies in a thread pool, a cost on every request.
async def _store(request: Request) -> ExecutionStore:
    return request.app.state.store


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


StoreDep = Annotated[ExecutionStore, Depends(_store)]
SettingsDep = Annotated[Settings, Depends(_settings)]


async def live_workflows(store: ExecutionStore, settings: Settings,
                         rows: Sequence[HealedExecution]) -> Live | None:
    """Workflows some live worker runs (one that has heartbeated within three
    renewal intervals; workers heartbeat at every renewal) and the code
    versions carried of them, as a Live that also knows what each queue and
    key holds now; read only when a row is due or its lease expired: the
    cases in which blockedBy tells `due` from `no-worker`, from
    `no-worker-for-version` and from what its queue holds back (queue-paused,
    concurrency-limit, rate-limited), and a takeover from a queue that has
    no room for it or no worker carrying its version."""
    if not any((blocked_by(r, None) or {}).get("reason") in ("due", "lease-expired")
               for r in rows):
        return None
    return await store.history.live_workflow_ids(3 * settings.renew_seconds + 1)
