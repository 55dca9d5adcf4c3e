"""docs/sdk.md keeps in step with what app.sdk exports."""

from __future__ import annotations

import re
from pathlib import Path

import app.sdk

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def test_every_exported_name_is_described():
    text = REFERENCE.read_text()
    named = set(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)", text))
    missing = [name for name in app.sdk.__all__ if name not in named]
    assert not missing, f"docs/sdk.md does not describe {missing}; add them"


def test_every_retry_policy_field_and_context_method_is_described():
    import dataclasses
    import inspect

    text = REFERENCE.read_text()
    fields = [f.name for f in dataclasses.fields(app.sdk.RetryPolicy)]
    methods = [name for name, _ in inspect.getmembers(app.sdk.WorkflowContext, inspect.iscoroutinefunction)
               if not name.startswith("_")]
    assert methods, "WorkflowContext has public methods"
    missing = [f for f in fields if f"`{f}`" not in text]
    missing += [m for m in methods if f"ctx.{m}(" not in text]
    assert not missing, f"docs/sdk.md does not describe {missing}"


def test_workflow_parameters_are_described():
    import inspect

    from app.registry import workflow

    text = REFERENCE.read_text()
    params = [p for p in inspect.signature(workflow).parameters if p != "workflow_id"]
    missing = [p for p in params if f"| `{p}` |" not in text]
    assert not missing, f"docs/sdk.md's @workflow table lacks {missing}"
