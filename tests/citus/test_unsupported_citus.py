"""An operation the cluster still refuses is answered 501 with a stable code
and changes nothing; never a 500. (The bulk operations' preview counts and
samples matches with a subquery in its select list, which Citus cannot push
down: docs/citus.md lists it.)"""

from __future__ import annotations

import asyncpg
import pytest

from app.settings import Settings
from tests.support.admission import admit_via_api
from tests.support.asgi import asgi_client

pytestmark = pytest.mark.citus


async def test_a_statement_citus_refuses_is_501_not_supported_and_changes_nothing(
        settings: Settings, pool: asyncpg.Pool) -> None:
    async with asgi_client(settings.model_copy(update={"workflows": ""}),
                           raise_app_exceptions=False) as api:
        await admit_via_api(api, "unsupported-1")
        before = await pool.fetchval("SELECT count(*) FROM execution_events")
        r = await api.post("/v1/operations", json={
            "action": "cancel", "filter": {"workflowId": "wf"}, "dryRun": True})
        assert r.status_code == 501, r.text
        error = r.json()["error"]
        assert error["code"] == "NOT_SUPPORTED_BY_DATABASE", error
        assert "docs/citus.md" in error["message"], error
        assert await pool.fetchval("SELECT count(*) FROM execution_events") == before
        assert await pool.fetchval("SELECT count(*) FROM operations") == 0
