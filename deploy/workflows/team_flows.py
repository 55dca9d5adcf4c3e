"""An example of a team's own workflow module, deployed without rebuilding the image.

docker-compose.yml mounts this folder read-only at /srv/fencepost/workflows, which
the image puts on PYTHONPATH, and names the module in FENCEPOST_WORKFLOWS
(`app.examples,team_flows`). The API and every worker load the same modules, so the
API can refuse unknown workflows and validate params before admitting them.

    curl -s -X POST localhost:8000/v1/executions -H 'content-type: application/json' \\
         -H "authorization: Bearer $TOKEN" \\
         -d '{"workflowId": "welcome-customer", "params": {"customer_id": 7, "email": "ann@example.com"}}'
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from app.sdk import WorkflowContext, workflow


class Welcome(BaseModel):
    customer_id: int = Field(gt=0)
    email: str = Field(min_length=3, max_length=320)
    follow_up_after_seconds: float = Field(60.0, ge=0, le=30 * 86400)


def send_email(email: str, template: str, idempotency_key: str) -> dict:
    """Stands in for a call to the team's mail provider (which deduplicates by key)."""
    return {"to": email, "template": template, "messageId": f"msg_{idempotency_key}"}


@workflow("welcome-customer", params=Welcome)
async def welcome_customer(ctx: WorkflowContext, p: Welcome) -> dict:
    first = await ctx.step(
        "send-welcome", send_email, p.email, "welcome",
        idempotency_key=f"{ctx.execution_id}:send-welcome",
    )
    await ctx.sleep("wait-before-follow-up", timedelta(seconds=p.follow_up_after_seconds))
    second = await ctx.step(
        "send-follow-up", send_email, p.email, "follow-up",
        idempotency_key=f"{ctx.execution_id}:send-follow-up",
    )
    return {"customerId": p.customer_id, "messages": [first["messageId"], second["messageId"]]}
