"""The API and the dashboard act through the same commands: the same
decision is logged the same way whichever surface made it."""

from __future__ import annotations

import logging

import httpx

from app.store import Admitted, ExecutionStore
from tests.commands.conftest import form


def operator_lines(caplog) -> list[tuple[str, str, str, str]]:
    return [(r.action, r.by, r.execution_id, r.result) for r in caplog.records
            if getattr(r, "kind", None) == "operator_action"]


async def test_a_terminate_from_the_dashboard_is_logged_like_one_from_the_api(
        store: ExecutionStore, api: httpx.AsyncClient, caplog) -> None:
    caplog.set_level(logging.INFO)
    for eid in ("by-api", "by-ui"):
        assert isinstance(await store.admissions.admit(workflow_id="cmd-wait", params={},
                                            execution_id=eid), Admitted)
    r = await api.post("/v1/executions/by-api/terminate", json={"by": "anonymous"})
    assert r.status_code == 202, r.text
    r = await api.post("/ui/executions/by-ui/terminate", data=form())
    assert r.status_code == 303, r.text[:300]
    assert operator_lines(caplog) == [("terminate", "anonymous", "by-api", "cancelled"),
                                      ("terminate", "anonymous", "by-ui", "cancelled")]
