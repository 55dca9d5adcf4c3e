"""A module a person might put beside the examples in `fencepost dev`."""

from app.sdk import WorkflowContext, workflow


@workflow("dev-hello")
async def dev_hello(ctx: WorkflowContext, params: dict) -> dict:
    return {"hello": params.get("name", "world")}
