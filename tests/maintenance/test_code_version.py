"""Each execution records the code version it was admitted under."""

from app.registry import load_workflows
from tests.support.asgi import asgi_client


async def test_admission_records_the_workflows_code_version(settings):
    async with asgi_client(settings, load_workflows(["tests.maintenance.flows"])) as c:
        for workflow_id, eid in (("mnt-versioned", "v1"), ("mnt-ok", "plain")):
            r = await c.post("/v1/executions",
                             json={"workflowId": workflow_id, "executionId": eid})
            assert r.status_code == 201, r.text
        assert (await c.get("/v1/executions/v1")).json()["codeVersion"] == "2026-11-29.1"
        assert (await c.get("/v1/executions/plain")).json()["codeVersion"] is None
