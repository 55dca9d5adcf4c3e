"""Small helpers shared by the operator tests."""

from __future__ import annotations

from typing import Any

import httpx

from app.store import Admitted, ExecutionStore
from tests.operator.procs import wait_for

__all__ = ["wait_for", "admit", "admit_api", "record", "wait_status", "kinds", "events_of",
           "assert_error", "event_count"]


async def admit(store: ExecutionStore, workflow_id: str, eid: str, params: Any = None,
                **kw: Any) -> str:
    answer = await store.admit(workflow_id=workflow_id, params={} if params is None else params,
                               execution_id=eid, **kw)
    assert isinstance(answer, Admitted), answer
    return eid


async def admit_api(api: httpx.AsyncClient, workflow_id: str, eid: str, params: Any = None,
                    **extra: Any) -> httpx.Response:
    body = {"workflowId": workflow_id, "executionId": eid,
            "params": {} if params is None else params, **extra}
    return await api.post("/v1/executions", json=body)


async def record(api: httpx.AsyncClient, eid: str) -> dict:
    r = await api.get(f"/v1/executions/{eid}")
    assert r.status_code == 200, r.text
    return r.json()


async def wait_status(store: ExecutionStore, eid: str, *statuses: str,
                      timeout: float = 10.0) -> dict:
    """The (healed) record once its status is one of `statuses`."""
    last: dict = {}

    async def check():
        rec = await store.get(eid)
        last["rec"] = rec
        return rec if rec is not None and rec["status"] in statuses else None

    try:
        return await wait_for(check, timeout=timeout, what=f"{eid} in {statuses}")
    except AssertionError as exc:
        rec = last.get("rec") or {}
        raise AssertionError(f"{exc}; last status {rec.get('status')!r}, "
                             f"outcome {rec.get('outcome')!r}") from None


async def kinds(store: ExecutionStore, eid: str) -> list[str]:
    return [e["kind"] for e in await store.events(eid)]


async def events_of(store: ExecutionStore, eid: str, kind: str) -> list[dict]:
    return [e for e in await store.events(eid) if e["kind"] == kind]


async def event_count(store: ExecutionStore) -> int:
    return await store.pool.fetchval("SELECT count(*) FROM execution_events")


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"], body
    return body["error"]
