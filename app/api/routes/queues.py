"""Queues: list, read, change (run-time settings that win over the declared
ones, until reset), pause, resume.

A queue's settings on the wire are camelCase: concurrency, perKeyConcurrency,
rateLimit {limit, periodSeconds, perKey}, holdWhileSuspended, paused; a null
limit is no limit. Stored, they are app.queues.SETTINGS (snake_case).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from pydantic.alias_generators import to_camel

from app.api.auth import Operator, StrictReader, actor
from app.api.common import (
    AUTH_ERRORS,
    ERRORS,
    STRICT_QUERY,
    UNKNOWN_QUERY,
    Responses,
    _body_schema,
    _json,
    refusal,
)
from app.api.deps import SettingsDep, StoreDep
from app.api.models import JSON_INTEGER
from app.commands import queues as commands
from app.commands.errors import CommandError, invalid
from app.queues import MAX_LIMIT, MAX_RATE_PERIOD, MIN_RATE_PERIOD
from app.store.records import QueueCounts, QueueSettings

router = APIRouter(prefix="/v1/queues", tags=["queues"], responses=AUTH_ERRORS)

NOT_FOUND: Responses = {404: refusal("QUEUE_NOT_FOUND"), 503: ERRORS[503]}
INVALID: Responses = {
    422: refusal("INVALID_QUEUE_SETTINGS / INVALID_EXECUTION_EVENT: a setting is malformed or "
                 "out of range, a field unknown, or the queue name not one a queue can have / "
                 "a body JSON cannot hold exactly (NaN, NUL, duplicate keys, too deep)"),
}

# Wire setting -> the stored fields it stands for.
FIELDS: dict[str, tuple[str, ...]] = {
    "concurrency": ("concurrency",),
    "perKeyConcurrency": ("per_key_concurrency",),
    "rateLimit": ("rate_limit", "rate_period", "rate_per_key"),
    "holdWhileSuspended": ("hold_while_suspended",),
    "paused": ("paused",),
}
Setting = Literal["concurrency", "perKeyConcurrency", "rateLimit", "holdWhileSuspended", "paused"]


def _unset_is_absent(schema: dict[str, Any]) -> None:
    # An omitted setting is left as it is: no default to state.
    schema.pop("default", None)


def _flag(schema: dict[str, Any]) -> None:
    # true or false when given (null is refused as INVALID_QUEUE_SETTINGS);
    # omitted, left as it is.
    schema.pop("default", None)
    schema.pop("anyOf", None)
    schema["type"] = "boolean"


Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT), JSON_INTEGER]


class RateLimit(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    limit: Limit = Field(description="Most starts (first claims) per period.")
    period_seconds: float = Field(ge=MIN_RATE_PERIOD, le=MAX_RATE_PERIOD, strict=True,
                                  description="The period, in seconds.")
    per_key: StrictBool = Field(False, description="Count starts per concurrency key, not "
                                "per queue.")


class QueueChange(BaseModel):
    """Each setting given becomes the queue's run-time setting (null: no
    limit); `reset` drops run-time settings, so the declared ones apply."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")

    concurrency: Limit | None = Field(
        None, json_schema_extra=_unset_is_absent,
        description="Most executions of the queue holding a slot at once; null: no limit.")
    per_key_concurrency: Limit | None = Field(
        None, json_schema_extra=_unset_is_absent,
        description="Most per concurrency key at once; null: no limit.")
    rate_limit: RateLimit | None = Field(
        None, json_schema_extra=_unset_is_absent, description="null: no rate limit.")
    hold_while_suspended: StrictBool | None = Field(
        None, json_schema_extra=_flag,
        description="A suspended execution (sleeping, waiting for a signal) keeps its slot.")
    paused: StrictBool | None = Field(
        None, json_schema_extra=_flag, description="Nothing of the queue is claimed.")
    reset: list[Setting] = Field(
        default_factory=list, max_length=len(FIELDS),
        description="Settings whose run-time value is dropped (the declared one applies).")


class RateLimitView(BaseModel):
    limit: int
    periodSeconds: float  # noqa: N815 - wire names
    perKey: bool  # noqa: N815


class SettingsView(BaseModel):
    concurrency: int | None
    perKeyConcurrency: int | None  # noqa: N815
    rateLimit: RateLimitView | None  # noqa: N815
    holdWhileSuspended: bool  # noqa: N815
    paused: bool


class CountsView(BaseModel):
    running: int = Field(description="Executions holding a slot: running with a live lease, "
                         "and suspended ones when holdWhileSuspended.")
    due: int = Field(description="Executions due and not yet claimed.")
    startsInPeriod: int | None = Field(  # noqa: N815
        description="Starts within the rate limit's period; null without a rate limit.")


class ChangeView(BaseModel):
    at: datetime
    actor: str | None = Field(description="Who: a token's name, or `code` for a changed "
                              "declaration.")
    change: dict[str, Any] = Field(description="{set: settings, reset: [setting]}, or "
                                   "{declared: settings}.")


class QueueView(BaseModel):
    name: str
    declared: dict[str, Any] = Field(description="The settings its code declares ({} when none "
                                     "does).")
    override: dict[str, Any] = Field(description="The run-time settings, which win.")
    effective: SettingsView
    counts: CountsView
    updatedAt: datetime  # noqa: N815


class QueueDetail(QueueView):
    changes: list[ChangeView] = Field(description=f"The newest {commands.CHANGES_SHOWN} "
                                      "changes, newest first.")


class QueueList(BaseModel):
    queues: list[QueueView]


def wire_settings(stored: dict[str, Any]) -> dict[str, Any]:
    """Stored settings (all or some) as the wire has them."""
    out: dict[str, Any] = {}
    for name, fields in FIELDS.items():
        if name == "rateLimit":
            if "rate_limit" in stored:
                out[name] = None if stored["rate_limit"] is None else {
                    "limit": stored["rate_limit"], "periodSeconds": stored.get("rate_period"),
                    "perKey": bool(stored.get("rate_per_key", False))}
        elif fields[0] in stored:
            out[name] = stored[fields[0]]
    return out


def _wire_change(change: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, value in change.items():
        if kind == "reset" and isinstance(value, list):
            out[kind] = [name for name, fields in FIELDS.items() if set(fields) & set(value)]
        elif isinstance(value, dict):
            out[kind] = wire_settings(value)
        else:
            out[kind] = value
    return out


def queue_view(row: QueueSettings, counts: QueueCounts) -> dict[str, Any]:
    return {
        "name": row["name"],
        "declared": wire_settings(row["declared"]),
        "override": wire_settings(row["override"]),
        "effective": wire_settings({k: v for k, v in row.items() if k in FIELDS_STORED}),
        "counts": {"running": counts["running"], "due": counts["due"],
                   "startsInPeriod": counts["starts_in_period"]},
        "updatedAt": row["updated_at"],
    }


FIELDS_STORED = tuple(f for fields in FIELDS.values() for f in fields)


def detail_view(read: dict[str, Any]) -> dict[str, Any]:
    return {**queue_view(read["queue"], read["counts"]),
            "changes": [{"at": c["at"], "actor": c["actor"], "change": _wire_change(c["change"])}
                        for c in read["changes"]]}


def stored_change(req: QueueChange) -> tuple[dict[str, Any], list[str]]:
    """The settings given (stored form) and the stored fields to reset."""
    settings: dict[str, Any] = {}
    given = req.model_fields_set
    if "concurrency" in given:
        settings["concurrency"] = req.concurrency
    if "per_key_concurrency" in given:
        settings["per_key_concurrency"] = req.per_key_concurrency
    if "rate_limit" in given:
        rate = req.rate_limit
        settings.update(rate_limit=rate.limit if rate else None,
                        rate_period=rate.period_seconds if rate else None,
                        rate_per_key=rate.per_key if rate else False)
    for flag in ("hold_while_suspended", "paused"):
        if flag in given:
            settings[flag] = getattr(req, flag)
    reset = sorted({f for name in req.reset for f in FIELDS[name]})
    return settings, reset


@router.get(
    "",
    response_model=QueueList,
    summary="List queues (by name) with their settings and what runs and waits on each",
    responses={**UNKNOWN_QUERY, 503: ERRORS[503]},
    dependencies=[STRICT_QUERY],
)
async def list_queues(store: StoreDep, principal: StrictReader):
    rows = await store.queues.list()
    counts = await store.queues.counts()
    empty: QueueCounts = {"running": 0, "due": 0, "starts_in_period": None}
    return {"queues": [queue_view(r, counts.get(r["name"], empty)) for r in rows]}


@router.get(
    "/{name}",
    response_model=QueueDetail,
    summary="Read one queue: declared, run-time and effective settings, counts, recent changes",
    responses=NOT_FOUND,
)
async def get_queue(name: str, store: StoreDep, principal: StrictReader):
    return detail_view(await commands.read_queue(store, name))


@router.put(
    "/{name}",
    response_model=QueueDetail,
    summary="Change a queue's run-time settings (they win over the declared ones) or reset "
    "them; creates a queue nobody declared",
    openapi_extra=_body_schema(QueueChange),
    responses={**ERRORS, **INVALID},
)
async def change_queue(name: str, request: Request, store: StoreDep, settings: SettingsDep,
                       principal: Operator):
    body = await _json(request, settings)
    if not isinstance(body, dict):
        raise CommandError(
            422, "INVALID_QUEUE_SETTINGS",
            "the body must be a JSON object with any of concurrency, perKeyConcurrency, "
            "rateLimit, holdWhileSuspended, paused, reset",
        )
    try:
        req = QueueChange.model_validate(body)
    except ValidationError as exc:
        raise invalid(exc, "INVALID_QUEUE_SETTINGS") from None
    stored, reset = stored_change(req)
    await commands.change_queue(store, name, stored, reset, actor(principal, None))
    return detail_view(await commands.read_queue(store, name))


@router.post(
    "/{name}/pause",
    response_model=QueueDetail,
    summary="Pause: nothing of the queue is claimed until resumed (what runs goes on)",
    responses=NOT_FOUND,
)
async def pause_queue(name: str, store: StoreDep, principal: Operator):
    await commands.pause(store, name, actor(principal, None))
    return detail_view(await commands.read_queue(store, name))


@router.post(
    "/{name}/resume",
    response_model=QueueDetail,
    summary="Resume: the queue's due executions are claimed again, within its limits",
    responses=NOT_FOUND,
)
async def resume_queue(name: str, store: StoreDep, principal: Operator):
    await commands.resume(store, name, actor(principal, None))
    return detail_view(await commands.read_queue(store, name))

