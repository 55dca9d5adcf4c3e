"""Issue 16 item 1: what code version each worker carries of each workflow
is visible (GET /v1/workers, the workers page); a worker registered without
versions carries each workflow unversioned."""

from __future__ import annotations

import httpx
import pytest

from app.store import ExecutionStore

pytestmark = pytest.mark.timeout(60)


async def test_each_workers_versions_are_listed_and_shown(
        store: ExecutionStore, api: httpx.AsyncClient) -> None:
    await store.workers.register_worker("w-v2", host="t", pid=1, workflows=["op-a", "op-b"],
                                        concurrency=1, versions={"op-a": "v2", "op-b": None})
    await store.workers.register_worker("w-plain", host="t", pid=2, workflows=["op-a"],
                                        concurrency=1)
    listed = (await api.get("/v1/workers")).json()["workers"]
    assert {w["workerId"]: w["versions"] for w in listed} == {
        "w-v2": {"op-a": "v2", "op-b": None}, "w-plain": {}}
    page = await api.get("/ui/workers")
    assert page.status_code == 200, page.text
    assert page.text.count("version <code>v2</code>") == 1
    assert page.text.count(">unversioned</span>") == 2  # op-b on w-v2, op-a on w-plain
