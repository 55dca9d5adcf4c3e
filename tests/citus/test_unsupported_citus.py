"""An operation the cluster refuses as not supported is answered 501 with a
stable code and changes nothing; never a 500. No route sends such a statement
any more (the last, the bulk operations' preview and create, were rewritten;
the test clock's family statements, app/testing.py, are not behind a route),
so the preview here sends the statement it used to: a subquery in a select
list, which Citus cannot push down (docs/citus.md). The refusal is the
cluster's own."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from app.settings import Settings
from tests.support.admission import admit_via_api
from tests.support.asgi import asgi_client

pytestmark = pytest.mark.citus

REFUSED = """
SELECT count(*) AS matched,
       (SELECT coalesce(array_agg(execution_id), '{}') FROM (
            SELECT execution_id FROM executions WHERE workflow_id = $1
            ORDER BY admitted_at, execution_id LIMIT 10) s) AS sample
FROM executions WHERE workflow_id = $1
"""


async def test_a_statement_citus_refuses_is_501_not_supported_and_changes_nothing(
        settings: Settings, pool: asyncpg.Pool) -> None:
    async with asgi_client(settings.model_copy(update={"workflows": ""}),
                           raise_app_exceptions=False) as api:
        await admit_via_api(api, "unsupported-1")
        store = api.app.state.store  # type: ignore[attr-defined]

        async def preview(spec: dict[str, Any]) -> tuple[int, list[str]]:
            row = await store.pool.fetchrow(REFUSED, spec["workflowId"])
            return row["matched"], list(row["sample"])

        store.operations.preview_operation = preview
        before = await pool.fetchval("SELECT count(*) FROM execution_events")
        r = await api.post("/v1/operations", json={
            "action": "cancel", "filter": {"workflowId": "wf"}, "dryRun": True})
        assert r.status_code == 501, r.text
        error = r.json()["error"]
        assert error["code"] == "NOT_SUPPORTED_BY_DATABASE", error
        assert "docs/citus.md" in error["message"], error
        assert await pool.fetchval("SELECT count(*) FROM execution_events") == before
        assert await pool.fetchval("SELECT count(*) FROM operations") == 0
