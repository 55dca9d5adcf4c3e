"""Admitting executions in tests: through the store (asserting it was admitted,
not found already there) or through the API (the request body, the response)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from app.store import Admitted


async def admit(store: Any, workflow_id: str, execution_id: str | None = None,
                params: Any = None, **kw: Any) -> str:
    """Admit a new execution through the store and return its id."""
    answer = await store.admissions.admit(workflow_id=workflow_id, params={} if params is None else params,
                               execution_id=execution_id, **kw)
    assert isinstance(answer, Admitted), answer
    return answer.execution_id


def admitting(workflow_id: str, params: Any = None) -> Callable[..., Awaitable[str]]:
    """`admit` for a module whose executions share a workflow and params:
    `admit(store, execution_id, **kw)`; `params` may be a function of the id,
    and `workflow_id=` / `params=` given to a call win."""
    async def admit_one(store: Any, execution_id: str | None = None, **kw: Any) -> str:
        if "params" not in kw:
            kw["params"] = params(execution_id) if callable(params) else params
        return await admit(store, kw.pop("workflow_id", workflow_id), execution_id, **kw)

    return admit_one


def admission_body(workflow_id: str, execution_id: str | None = None, params: Any = None,
                   **extra: Any) -> dict:
    """The JSON body of POST /v1/executions (no executionId when none is given)."""
    body: dict[str, Any] = {"workflowId": workflow_id, "params": {} if params is None else params}
    if execution_id is not None:
        body["executionId"] = execution_id
    return {**body, **extra}


async def admit_api(api: httpx.AsyncClient, workflow_id: str, execution_id: str | None = None,
                    params: Any = None, *, headers: dict[str, str] | None = None,
                    **extra: Any) -> httpx.Response:
    """POST /v1/executions; the response, whatever its status."""
    return await api.post("/v1/executions", headers=headers,
                          json=admission_body(workflow_id, execution_id, params, **extra))


async def admit_via_api(api: httpx.AsyncClient, execution_id: str | None = None, *,
                        workflow_id: str = "wf", params: Any = None,
                        context: dict | None = None) -> dict:
    """POST /v1/executions, asserting 201 Created; the answer's JSON."""
    extra = {} if context is None else {"context": context}
    r = await admit_api(api, workflow_id, execution_id, params, **extra)
    assert r.status_code == 201, r.text
    return r.json()
