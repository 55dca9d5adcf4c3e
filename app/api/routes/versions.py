"""The HTTP routes that move executions to another code version: one by ID,
or many by filter (carried out in this request: the API process loads the
workflow code, so it runs the replay check itself). The decisions are
app/commands/versions.py's."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from app.api.auth import Operator, actor
from app.api.common import (
    ERRORS,
    FORBIDDEN,
    UNAUTHENTICATED,
    _body_schema,
    _check_path_id,
    _invalid,
    _json,
)
from app.api.common import refusal as documented
from app.api.deps import SettingsDep, StoreDep
from app.api.models import EXECUTION_ID_PATTERN, ID_PATTERN, JSON_INTEGER, Camel, Status
from app.commands import versions as commands
from app.store.versions import ANY_VERSION, MAX_CANDIDATES

router = APIRouter(tags=["versions"], responses={**UNAUTHENTICATED, **FORBIDDEN})
# The bulk form's own path: any /v1/executions/<word> is also the URL of the
# execution of that ID (GET /v1/executions/{id}), so it lives beside them.
BULK_PATH = "/v1/version-moves"

VERSION = Field(min_length=1, max_length=commands.MAX_VERSION,
                description="A code version (the version= of @workflow); null: unversioned "
                "(runs on any worker carrying the workflow).")
FORCE = Field(False, strict=True, description="Move without the replay check (for a target "
              "version this API process does not carry: check it with `fencepost replay` "
              "first). A worker still parks an execution whose code does not fit "
              "(nondeterminism).")
REASON = Field(None, max_length=2000, description="Why (kept in the event).")
BY = Field(None, max_length=200, description="Who (kept in the event).")
Movable = Literal[commands.MOVABLE_STATUSES]  # type: ignore[valid-type]


class MoveRequest(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    to: str | None = VERSION
    force: bool = FORCE
    reason: str | None = REASON
    by: str | None = BY


class VersionMove(Camel):
    execution_id: str
    from_version: str | None = Field(alias="from", description="Its version before the move.")
    to: str | None
    check: Literal["passed", "skipped"] = Field(description="passed: the replay check "
                                                "passed; skipped: force.")
    status: Status
    resumed: bool = Field(description="It was parked for nondeterminism and is due again.")
    replayed: int | None = Field(description="Recorded steps the check replayed.")


class MoveFilter(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    workflow_id: str = Field(pattern=ID_PATTERN, description="The workflow whose executions "
                             "move (required).")
    from_version: str | None = Field(None, min_length=1, max_length=commands.MAX_VERSION,
                                     description="Only those admitted under this version "
                                     "(null: unversioned ones); left out: any version.")
    status: list[Movable] | None = Field(None, min_length=1, max_length=4,
                                         description="Only those in these statuses.")
    ids: list[Annotated[str, Field(pattern=EXECUTION_ID_PATTERN)]] | None = Field(
        None, min_length=1, max_length=MAX_CANDIDATES, description="Only these executions.")


class BulkMoveRequest(Camel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    to: str | None = VERSION
    filter: MoveFilter
    limit: Annotated[int, Field(ge=1, le=MAX_CANDIDATES), JSON_INTEGER] = Field(
        commands.DEFAULT_LIMIT, description="At most this many are checked and moved, oldest "
        "admission first.")
    force: bool = FORCE
    dry_run: bool = Field(False, strict=True, description="Check each, move none: `moved` "
                          "lists those that would move.")
    reason: str | None = REASON
    by: str | None = BY


class MoveRefusal(Camel):
    execution_id: str
    code: str
    message: str
    divergence: dict | None = Field(None, description="For REPLAY_DIVERGES: where the code "
                                    "and the history first disagree (position, recorded, "
                                    "asked, message); else null.")


class BulkMove(Camel):
    moved: list[str] = Field(description="Moved (dry run: would move), in the order taken.")
    refused: list[MoveRefusal] = Field(description="Not moved, each with the code and message "
                                       "a single move would have answered.")
    matched: int = Field(description="Unended executions the filter matches in all.")
    more: bool = Field(description="More match than `limit` took: send it again for the next "
                       "(refused ones keep matching; narrow the filter to skip them).")
    dry_run: bool


def _move_view(done: commands.MoveDone) -> dict:
    m = done.moved
    return {"executionId": m.execution_id, "from": m.from_version, "to": m.to_version,
            "check": done.check, "status": m.status, "resumed": m.resumed,
            "replayed": done.replayed}


@router.post(
    BULK_PATH,
    response_model=BulkMove,
    operation_id="moveExecutionsVersion",
    summary="Move the unended executions of a workflow a filter matches to another code "
    "version, each checked and moved as the single move does (in this request)",
    openapi_extra=_body_schema(BulkMoveRequest),
    responses={**ERRORS,
               422: documented("INVALID_REQUEST / INVALID_EXECUTION_EVENT: a malformed "
                               "request (filter.workflowId is required)")},
)
async def move_versions(request: Request, store: StoreDep, settings: SettingsDep,
                        principal: Operator):
    raw = await _json(request, settings)
    try:
        body = BulkMoveRequest.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(exc, "INVALID_REQUEST") from None
    f = body.filter
    done = await commands.move_versions(
        store, body.to, workflow_id=f.workflow_id, by=actor(principal, body.by),
        from_version=f.from_version if "from_version" in f.model_fields_set else ANY_VERSION,
        statuses=f.status, ids=f.ids, limit=body.limit, force=body.force,
        dry_run=body.dry_run, reason=body.reason, workflows=request.app.state.workflows)
    return {"moved": done.moved,
            "refused": [{"executionId": r.execution_id, "code": r.code, "message": r.message,
                         "divergence": r.divergence} for r in done.refused],
            "matched": done.matched, "more": done.more, "dryRun": done.dry_run}


@router.post(
    "/v1/executions/{execution_id}/version",
    response_model=VersionMove,
    operation_id="moveExecutionVersion",
    summary="Move an execution to another code version: its history is replayed against "
    "that version's code first (when this API process carries it); an execution parked for "
    "nondeterminism becomes due again",
    openapi_extra=_body_schema(MoveRequest),
    responses={**ERRORS,
               404: documented("EXECUTION_NOT_FOUND"),
               409: documented("REPLAY_DIVERGES / REPLAY_CHECK_UNAVAILABLE / "
                               "EXECUTION_RUNNING / EXECUTION_ENDED: the history does not fit "
                               "the target code (`divergence` says where) / this API does not "
                               "carry the target version (check with `fencepost replay`, then "
                               "force) / a delivery holds it (retry when it ends) / it ended. "
                               "Two more answer a race or a fault, not the request: "
                               "EXECUTION_CHANGED (a delivery or an operator decision came "
                               "between the check and the move: send it again) and "
                               "REPLAY_CHECK_FAILED (the check could not run on the history: "
                               "run `fencepost replay` to see why)")},
)
async def move_version(execution_id: str, request: Request, store: StoreDep,
                       settings: SettingsDep, principal: Operator):
    _check_path_id(execution_id)
    raw = await _json(request, settings)
    try:
        body = MoveRequest.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(exc, "INVALID_REQUEST") from None
    done = await commands.move_version(
        store, execution_id, body.to, by=actor(principal, body.by), force=body.force,
        reason=body.reason, workflows=request.app.state.workflows)
    return _move_view(done)
