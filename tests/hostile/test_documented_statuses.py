"""Every documented status is reachable: for each operation of the published
OpenAPI schema, each documented response status (and each error code its
description names, e.g. `409 EXECUTION_ID_CONFLICT`) is produced by at least
one crafted request to the real app on a real database, and every crafted
request is answered with a status the operation documents.

503 DATABASE_UNAVAILABLE is produced the way an overloaded or locked database
produces it: another session holds every table in ACCESS EXCLUSIVE mode and
the app's statement timeout (0.3 s here) cancels what waits on it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.api import auth
from app.api.app import create_app
from app.registry import load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from tests.hostile.conftest import Seeded, hostile_settings, make_tokens, seed
from tests.support.admission import admit
from tests.support.responses import assert_error

STATEMENT_TIMEOUT = 0.3
BODY_TIMEOUT = 0.2
BOUND_SECONDS = 5.0
WORKFLOWS = load_workflows(["tests.hostile.flows"])

# An execution ID no probe creates.
GHOST = "no-such-execution"


def documented_codes(description: str) -> list[str]:
    """`CODE[ / CODE | or CODE][: prose]` -> the codes; none for prose such as
    'Successful Response'."""
    head = description.split(":", 1)[0]
    parts = re.split(r"\s*(?:/|\bor\b)\s*", head.strip())
    return [p for p in parts if re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*", p)
            and len(p) > 3]


@dataclass
class Probe:
    method: str
    path: str  # the schema's template
    status: int
    code: str | None
    role: str | None = "operate"
    ids: dict = field(default_factory=dict)  # path parameters
    kw: dict = field(default_factory=dict)  # httpx request arguments

    def url(self) -> str:
        return self.path.format(**self.ids)


JSON = {"content-type": "application/json"}
TOO_LARGE = {"content": b'{"x":"' + b"y" * 300_000 + b'"}', "headers": JSON}
MALFORMED = {"content": b"{", "headers": JSON}
TEXT = {"content": b"{}", "headers": {"content-type": "text/plain"}}
NAN = {"content": b'{"at": NaN, "by": NaN}', "headers": JSON}


async def _held_back_body():
    yield b'{"at": '
    await asyncio.sleep(BODY_TIMEOUT * 5)  # the rest comes after the body timeout
    yield b"null}"


def held() -> dict:
    """A body whose second half is held back past FENCEPOST_BODY_TIMEOUT_SECONDS
    (a fresh one per probe: a stream is read once)."""
    return {"content": _held_back_body(), "headers": JSON}


def probes(s: Seeded) -> list[Probe]:
    P = Probe
    ex, one = "/v1/executions", "/v1/executions/{execution_id}"
    wakes, signal = f"{one}/wakes", f"{one}/signals/{{name}}"
    cancel, resume = f"{one}/cancel", f"{one}/resume"
    terminate = f"{one}/terminate"
    ops, op_one = "/v1/operations", "/v1/operations/{operation_id}"
    op_cancel = f"{op_one}/cancel"
    no_op = {"operation_id": "op-0000000000000000"}
    seeded_op = {"operation_id": SEEDED_OPERATION}
    redrive, fork = f"{one}/redrive", f"{one}/fork"
    resolve = f"{one}/steps/{{step_key}}/resolve"
    pending, ghost = {"execution_id": s.pending}, {"execution_id": GHOST}
    done = {"execution_id": s.completed}
    refund = {"workflowId": "hostile-refund", "params": {"order_id": "o-1", "amount_cents": 5}}
    out = [
        P("GET", "/healthz", 200, None, None),
        P("GET", "/readyz", 200, None, None),
        # Admission
        P("POST", ex, 201, None, "trigger", kw={"json": refund}),
        P("POST", ex, 401, "UNAUTHENTICATED", None, kw={"json": refund}),
        P("POST", ex, 403, "FORBIDDEN", "read", kw={"json": refund}),
        P("POST", ex, 400, "MALFORMED_JSON", "trigger", kw=MALFORMED),
        P("POST", ex, 413, "PAYLOAD_TOO_LARGE", "trigger", kw=TOO_LARGE),
        P("POST", ex, 408, "REQUEST_TIMEOUT", "trigger", kw=held()),
        P("POST", ex, 415, "UNSUPPORTED_MEDIA_TYPE", "trigger", kw=TEXT),
        P("POST", ex, 422, "INVALID_REQUEST", "trigger",
          kw={"json": {"workflowId": "not a valid id"}}),
        P("POST", ex, 422, "INVALID_EXECUTION_EVENT", "trigger", kw=NAN),
        P("POST", ex, 422, "DEADLINE_IN_THE_PAST", "trigger",
          kw={"json": {**refund, "deadline": "2001-01-01T00:00:00Z"}}),
        P("POST", ex, 422, "INVALID_PARAMS", "trigger",
          kw={"json": {**refund, "params": {"order_id": "o", "amount_cents": 0}}}),
        P("POST", ex, 404, "WORKFLOW_NOT_FOUND", "trigger",
          kw={"json": {"workflowId": "no-such-flow"}}),
        P("POST", ex, 422, "RESERVED_EXECUTION_ID", "trigger",
          kw={"json": {**refund, "executionId": "parent~child"}}),
        P("POST", ex, 422, "INVALID_CONCURRENCY_KEY", "trigger",
          kw={"json": {"workflowId": "hostile-keyed", "params": {"customer": ["a"]}}}),
        P("POST", ex, 409, "EXECUTION_ID_CONFLICT", "trigger",
          kw={"json": {**refund, "executionId": "taken"}}),  # admitted in setup
        P("POST", ex, 200, None, "trigger",  # the same start again, answered with the record
          kw={"json": {**TAKEN, "ifExists": "return"}}),
        # Quotas: one admission and one signal a minute for this token.
        P("POST", ex, 201, None, "limited", kw={"json": refund}),
        P("POST", ex, 429, "RATE_LIMITED", "limited", kw={"json": refund}),
        P("POST", signal, 404, "EXECUTION_NOT_FOUND", "limited", {**ghost, "name": "go"}),
        P("POST", signal, 429, "RATE_LIMITED", "limited", {**ghost, "name": "go"}),
        # Listing
        P("GET", ex, 200, None, "read"),
        P("GET", ex, 401, "UNAUTHENTICATED", None),
        P("GET", ex, 422, "INVALID_REQUEST", "read", kw={"params": {"limit": 0}}),
        P("GET", ex, 422, "INVALID_CURSOR", "read", kw={"params": {"cursor": "bm90IGEgY3Vyc29y"}}),
        P("GET", ex, 422, "UNKNOWN_QUERY_PARAMETER", "read", kw={"params": {"blockedby": "due"}}),
        # One execution and its history
        P("GET", one, 200, None, "read", pending),
        P("GET", one, 401, "UNAUTHENTICATED", None, pending),
        P("GET", one, 404, "EXECUTION_NOT_FOUND", "read", ghost),
        P("GET", one, 422, "INVALID_REQUEST", "read", pending, {"params": {"waitSeconds": 61}}),
    ]
    for tail, bad_query in (("/events", {"after": -1}), ("/steps", {"includeValues": "maybe"}),
                            ("/late-observations", {"after": -1}), ("/history", {})):
        history = {"execution_id": s.with_history}
        out += [
            P("GET", one + tail, 200, None, "read", history),
            P("GET", one + tail, 401, "UNAUTHENTICATED", None, history),
            P("GET", one + tail, 404, "EXECUTION_NOT_FOUND", "read", ghost),
        ]
        if bad_query:
            out.append(P("GET", one + tail, 422, "INVALID_REQUEST", "read", history,
                         kw={"params": bad_query}))
        out.append(P("GET", one + tail, 422, "UNKNOWN_QUERY_PARAMETER", "read", history,
                     kw={"params": {"nope": "1"}}))
    out.append(P("GET", one + "/steps", 422, "INVALID_CURSOR", "read",
                 {"execution_id": s.with_history}, kw={"params": {"cursor": "bm90IGEgY3Vyc29y"}}))

    def body_errors(path: str, ids: dict, role: str = "operate") -> list[Probe]:
        return [
            P("POST", path, 401, "UNAUTHENTICATED", None, ids),
            P("POST", path, 403, "FORBIDDEN", "read", ids),
            P("POST", path, 400, "MALFORMED_JSON", role, ids, MALFORMED),
            P("POST", path, 413, "PAYLOAD_TOO_LARGE", role, ids, TOO_LARGE),
            P("POST", path, 408, "REQUEST_TIMEOUT", role, ids, held()),
            P("POST", path, 415, "UNSUPPORTED_MEDIA_TYPE", role, ids, TEXT),
            P("POST", path, 422, "INVALID_EXECUTION_EVENT", role, ids, NAN),
        ]

    sig = {**pending, "name": "go"}
    mv, moves = f"{one}/version", "/v1/version-moves"
    to_9_forced = {"json": {"to": "9", "force": True}}
    unknown = {"execution_id": s.unknown, "step_key": s.unknown_step}
    out += [
        P("POST", wakes, 200, None, "trigger", {"execution_id": "mine"}),
        P("POST", wakes, 404, "EXECUTION_NOT_FOUND", "trigger", pending),  # not its own
        P("POST", wakes, 422, "INVALID_REQUEST", "operate", pending, {"json": {"at": "soon"}}),
        *body_errors(wakes, pending),
        P("POST", signal, 202, None, "operate", sig, {"json": {"any": ["json"]}}),
        P("POST", signal, 404, "EXECUTION_NOT_FOUND", "operate", {**ghost, "name": "go"}),
        P("POST", signal, 409, "EXECUTION_TERMINAL", "operate", {**done, "name": "go"}),
        P("POST", signal, 429, "TOO_MANY_PENDING_SIGNALS", "operate",
          {"execution_id": "full", "name": "go"}),  # 1000 pending, stored in setup
        P("POST", signal, 422, "INVALID_REQUEST", "operate", {**pending, "name": "not ok"}),
        *body_errors(signal, sig),
        P("POST", cancel, 202, None, "operate", {"execution_id": "to-cancel"}),
        P("POST", cancel, 404, "EXECUTION_NOT_FOUND", "operate", ghost),
        P("POST", cancel, 409, "EXECUTION_TERMINAL", "operate", done),
        P("POST", cancel, 422, "INVALID_REQUEST", "operate", pending, {"json": {"by": 5}}),
        *body_errors(cancel, pending),
        P("POST", terminate, 202, None, "operate", {"execution_id": "to-terminate"}),
        P("POST", terminate, 404, "EXECUTION_NOT_FOUND", "operate", ghost),
        P("POST", terminate, 409, "EXECUTION_TERMINAL", "operate", done),
        P("POST", terminate, 422, "INVALID_REQUEST", "operate", pending, {"json": {"by": 5}}),
        *body_errors(terminate, pending),
        P("POST", redrive, 202, None, "operate", {"execution_id": "to-redrive"},
          {"json": {"reason": "fixed"}}),
        P("POST", redrive, 404, "EXECUTION_NOT_FOUND", "operate", ghost),
        P("POST", redrive, 422, "STEP_NOT_FOUND", "operate", done, {"json": {"fromStep": "nope"}}),
        P("POST", redrive, 409, "EXECUTION_NOT_ENDED", "operate", pending),
        P("POST", redrive, 409, "REDRIVE_NEEDS_FROM_STEP", "operate", done),
        P("POST", redrive, 422, "INVALID_REQUEST", "operate", pending, {"json": {"fromStep": 5}}),
        P("POST", redrive, 422, "DEADLINE_IN_THE_PAST", "operate", done,
          {"json": {"deadline": "2001-01-01T00:00:00Z"}}),
        *body_errors(redrive, pending),
        P("POST", fork, 201, None, "operate", {"execution_id": s.with_history},
          {"json": {"fromStep": "first"}}),
        P("POST", fork, 404, "EXECUTION_NOT_FOUND", "operate", ghost,
          {"json": {"fromStep": "first"}}),
        P("POST", fork, 422, "STEP_NOT_FOUND", "operate", pending, {"json": {"fromStep": "nope"}}),
        P("POST", fork, 409, "EXECUTION_ID_CONFLICT", "operate", {"execution_id": s.with_history},
          {"json": {"fromStep": "first", "executionId": "taken"}}),
        P("POST", fork, 422, "INVALID_REQUEST", "operate", pending, {"json": {}}),
        P("POST", fork, 422, "INVALID_PARAMS", "operate", {"execution_id": "taken"},
          {"json": {"fromStep": "first", "params": {"order_id": "o", "amount_cents": 0}}}),
        P("POST", fork, 422, "RESERVED_EXECUTION_ID", "operate", pending,
          {"json": {"fromStep": "first", "executionId": "a~b"}}),
        *body_errors(fork, pending),
        # Bulk operations (operate): a dry run, a start, its progress, stopping it.
        P("POST", ops, 200, None, "operate", kw={"json": {**BULK, "dryRun": True}}),
        P("POST", ops, 202, None, "operate", kw={"json": BULK}),
        P("POST", ops, 422, "INVALID_REQUEST", "operate",
          kw={"json": {"action": "cancel", "filter": {}}}),
        P("POST", ops, 422, "TOO_MANY_MATCHED", "operate",  # FENCEPOST_MAX_OPERATION_EXECUTIONS
          kw={"json": {"action": "cancel", "filter": {"minUnacknowledgedDeliveries": 0}}}),
        P("POST", ops, 401, "UNAUTHENTICATED", None, kw={"json": BULK}),
        P("POST", ops, 403, "FORBIDDEN", "read", kw={"json": BULK}),
        P("POST", ops, 400, "MALFORMED_JSON", "operate", kw=MALFORMED),
        P("POST", ops, 413, "PAYLOAD_TOO_LARGE", "operate", kw=TOO_LARGE),
        P("POST", ops, 408, "REQUEST_TIMEOUT", "operate", kw=held()),
        P("POST", ops, 415, "UNSUPPORTED_MEDIA_TYPE", "operate", kw=TEXT),
        P("POST", ops, 422, "INVALID_EXECUTION_EVENT", "operate", kw=NAN),
        P("GET", op_one, 200, None, "operate", seeded_op),
        P("GET", op_one, 404, "OPERATION_NOT_FOUND", "operate", no_op),
        P("GET", op_one, 401, "UNAUTHENTICATED", None, no_op),
        P("GET", op_one, 403, "FORBIDDEN", "read", no_op),
        P("POST", op_cancel, 202, None, "operate", seeded_op),
        P("POST", op_cancel, 409, "OPERATION_FINISHED", "operate", seeded_op),  # just stopped
        P("POST", op_cancel, 404, "OPERATION_NOT_FOUND", "operate", no_op),
        *body_errors(op_cancel, no_op),
        P("POST", op_cancel, 422, "INVALID_REQUEST", "operate", no_op, {"json": {"by": 5}}),
        P("POST", resolve, 200, None, "operate", unknown,
          {"json": {"action": "succeed", "result": {"ok": True}}}),
        P("POST", resolve, 404, "EXECUTION_NOT_FOUND", "operate",
          {**ghost, "step_key": "charge"}, {"json": {"action": "retry"}}),
        P("POST", resolve, 404, "STEP_NOT_FOUND", "operate",
          {**pending, "step_key": "charge"}, {"json": {"action": "retry"}}),
        P("POST", resolve, 409, "STEP_NOT_OUTCOME_UNKNOWN", "operate",
          {"execution_id": s.with_history, "step_key": "first"}, {"json": {"action": "retry"}}),
        P("POST", resolve, 422, "INVALID_RESOLUTION", "operate",
          {**pending, "step_key": "charge"}, {"json": {"action": "fail"}}),
        P("POST", resolve, 422, "INVALID_REQUEST", "operate",
          {**pending, "step_key": "k" * 1001}, {"json": {"action": "retry"}}),
        *body_errors(resolve, {**pending, "step_key": "charge"}),
        P("POST", resume, 200, None, "operate", {"execution_id": s.poison}),
        P("POST", resume, 404, "EXECUTION_NOT_FOUND", "operate", ghost),
        P("POST", resume, 409, "EXECUTION_NOT_PARKED", "operate", pending),
        P("POST", resume, 422, "INVALID_REQUEST", "operate", pending, {"json": {"by": 5}}),
        *body_errors(resume, pending),
        # Moving executions to another code version: the API carries no
        # seed-wf (the check cannot run: force), hostile-versioned's version 2.
        P("POST", mv, 200, None, "operate", pending, to_9_forced),
        P("POST", mv, 404, "EXECUTION_NOT_FOUND", "operate", ghost, to_9_forced),
        P("POST", mv, 409, "REPLAY_CHECK_UNAVAILABLE", "operate", pending,
          {"json": {"to": "9"}}),
        P("POST", mv, 409, "EXECUTION_RUNNING", "operate", {"execution_id": s.running},
          to_9_forced),
        P("POST", mv, 409, "EXECUTION_ENDED", "operate", done, to_9_forced),
        P("POST", mv, 409, "REPLAY_DIVERGES", "operate", {"execution_id": DIVERGENT},
          {"json": {"to": "2"}}),
        P("POST", mv, 422, "INVALID_REQUEST", "operate", pending, {"json": {"to": ""}}),
        *body_errors(mv, pending),
        P("POST", moves, 200, None, "operate",
          kw={"json": {"to": "9", "force": True, "filter": {"workflowId": "seed-wf"}}}),
        P("POST", moves, 422, "INVALID_REQUEST", "operate",
          kw={"json": {"to": "9", "filter": {}}}),
        *body_errors(moves, {}),
        P("GET", "/v1/workers", 200, None, "read"),
        P("GET", "/v1/workers", 401, "UNAUTHENTICATED", None),
        P("GET", "/v1/workers", 403, "FORBIDDEN", "trigger"),
        P("GET", "/v1/workers", 422, "UNKNOWN_QUERY_PARAMETER", "read",
          kw={"params": {"alive": "true"}}),
        P("GET", "/metrics", 200, None, "read"),
        P("GET", "/metrics", 401, "UNAUTHENTICATED", None),
        P("GET", "/metrics", 403, "FORBIDDEN", "trigger"),
    ]
    return out


# An operation stored in setup (matching nothing), to read and to stop.
SEEDED_OPERATION = "op-00000000000000aa"
# A bulk cancel of one execution nobody else uses (to-bulk, inserted in setup).
BULK = {"action": "cancel", "filter": {"executionIds": ["to-bulk"]}, "reason": "probe"}

# Recorded `reserve` at position 0 under version "1" of hostile-versioned,
# whose version "2" asks for `check` there (seeded in setup).
DIVERGENT = "diverges-at-0"


async def seed_divergent(pool: asyncpg.Pool, s: Settings) -> None:
    store = ExecutionStore.from_settings(pool, s)
    await admit(store, "hostile-versioned", DIVERGENT, code_version="1")
    [d] = await store.leases.claim_due(1, 30, "seed-worker", ["hostile-versioned"])
    await store.steps.write_step(d.lease, "reserve", value="reserve", function_name="_plain",
                                 position=0)
    await store.leases.acknowledge(d.lease, "suspended")


# Admitted by the trigger token in setup.
TAKEN = {"workflowId": "hostile-refund", "executionId": "taken",
         "params": {"order_id": "o", "amount_cents": 1}}

SCHEDULE = {"scheduleId": "nightly", "workflowId": "hostile-refund", "cron": "0 2 * * *",
            "timezone": "Europe/Warsaw", "params": {"order_id": "o-1", "amount_cents": 5}}


def schedule_probes() -> list[Probe]:
    """Schedules (operate writes, read reads); `doomed` is created in setup."""
    P = Probe
    sch, one = "/v1/schedules", "/v1/schedules/{schedule_id}"
    events, pause, resume = f"{one}/events", f"{one}/pause", f"{one}/resume"
    nightly, ghost = {"schedule_id": "nightly"}, {"schedule_id": "no-such-schedule"}
    out = [
        P("POST", sch, 201, None, "operate", kw={"json": SCHEDULE}),
        P("POST", sch, 401, "UNAUTHENTICATED", None, kw={"json": SCHEDULE}),
        P("POST", sch, 403, "FORBIDDEN", "read", kw={"json": SCHEDULE}),
        P("POST", sch, 400, "MALFORMED_JSON", "operate", kw=MALFORMED),
        P("POST", sch, 413, "PAYLOAD_TOO_LARGE", "operate", kw=TOO_LARGE),
        P("POST", sch, 408, "REQUEST_TIMEOUT", "operate", kw=held()),
        P("POST", sch, 415, "UNSUPPORTED_MEDIA_TYPE", "operate", kw=TEXT),
        P("POST", sch, 422, "INVALID_SCHEDULE", "operate",
          kw={"json": {**SCHEDULE, "scheduleId": "other", "cron": "61 * * * *"}}),
        P("POST", sch, 422, "INVALID_PARAMS", "operate",
          kw={"json": {**SCHEDULE, "scheduleId": "other", "params": {"amount_cents": 0}}}),
        P("POST", sch, 422, "INVALID_EXECUTION_EVENT", "operate", kw=NAN),
        P("POST", sch, 404, "WORKFLOW_NOT_FOUND", "operate",
          kw={"json": {**SCHEDULE, "scheduleId": "other", "workflowId": "no-such-flow"}}),
        P("POST", sch, 409, "SCHEDULE_EXISTS", "operate", kw={"json": SCHEDULE}),
        P("GET", sch, 200, None, "read"),
        P("GET", sch, 401, "UNAUTHENTICATED", None),
        P("GET", sch, 403, "FORBIDDEN", "trigger"),
        P("GET", sch, 422, "INVALID_REQUEST", "read", kw={"params": {"limit": 0}}),
        P("GET", sch, 422, "UNKNOWN_QUERY_PARAMETER", "read", kw={"params": {"nope": "1"}}),
    ]
    for path in (one, events):
        out += [
            P("GET", path, 200, None, "read", nightly),
            P("GET", path, 401, "UNAUTHENTICATED", None, nightly),
            P("GET", path, 403, "FORBIDDEN", "trigger", nightly),
            P("GET", path, 404, "SCHEDULE_NOT_FOUND", "read", ghost),
        ]
    out.append(P("GET", events, 422, "INVALID_REQUEST", "read", nightly,
                 kw={"params": {"limit": 0}}))
    out.append(P("GET", events, 422, "UNKNOWN_QUERY_PARAMETER", "read", nightly,
                 kw={"params": {"nope": "1"}}))
    for path in (pause, resume):
        out += [
            P("POST", path, 200, None, "operate", nightly),
            P("POST", path, 401, "UNAUTHENTICATED", None, nightly),
            P("POST", path, 403, "FORBIDDEN", "read", nightly),
            P("POST", path, 404, "SCHEDULE_NOT_FOUND", "operate", ghost),
        ]
    doomed = {"schedule_id": "doomed"}
    out += [
        P("DELETE", one, 204, None, "operate", doomed),
        P("DELETE", one, 401, "UNAUTHENTICATED", None, doomed),
        P("DELETE", one, 403, "FORBIDDEN", "read", doomed),
        P("DELETE", one, 404, "SCHEDULE_NOT_FOUND", "operate", doomed),  # deleted just above
    ]
    return out


def queue_probes() -> list[Probe]:
    """Queues (operate writes, read reads); `hostile-queue` is the keyed
    workflow's, declared when the API starts."""
    P = Probe
    qs, one = "/v1/queues", "/v1/queues/{name}"
    pause, resume = f"{one}/pause", f"{one}/resume"
    known, ghost = {"name": "hostile-queue"}, {"name": "no-such-queue"}
    change = {"json": {"concurrency": 2, "reset": ["rateLimit"]}}
    out = [
        P("GET", qs, 200, None, "read"),
        P("GET", qs, 401, "UNAUTHENTICATED", None),
        P("GET", qs, 403, "FORBIDDEN", "trigger"),
        P("GET", qs, 422, "UNKNOWN_QUERY_PARAMETER", "read", kw={"params": {"nope": "1"}}),
        P("GET", one, 200, None, "read", known),
        P("GET", one, 401, "UNAUTHENTICATED", None, known),
        P("GET", one, 403, "FORBIDDEN", "trigger", known),
        P("GET", one, 404, "QUEUE_NOT_FOUND", "read", ghost),
        P("PUT", one, 200, None, "operate", known, change),
        P("PUT", one, 401, "UNAUTHENTICATED", None, known, change),
        P("PUT", one, 403, "FORBIDDEN", "read", known, change),
        P("PUT", one, 400, "MALFORMED_JSON", "operate", known, MALFORMED),
        P("PUT", one, 413, "PAYLOAD_TOO_LARGE", "operate", known, TOO_LARGE),
        P("PUT", one, 408, "REQUEST_TIMEOUT", "operate", known, held()),
        P("PUT", one, 415, "UNSUPPORTED_MEDIA_TYPE", "operate", known, TEXT),
        P("PUT", one, 422, "INVALID_QUEUE_SETTINGS", "operate", known,
          {"json": {"concurrency": 0}}),
        P("PUT", one, 422, "INVALID_EXECUTION_EVENT", "operate", known, NAN),
    ]
    for path in (pause, resume):
        out += [
            P("POST", path, 200, None, "operate", known),
            P("POST", path, 401, "UNAUTHENTICATED", None, known),
            P("POST", path, 403, "FORBIDDEN", "read", known),
            P("POST", path, 404, "QUEUE_NOT_FOUND", "operate", ghost),
        ]
    return out


@dataclass
class Crafted:
    api: httpx.AsyncClient
    tokens: dict[str, str]
    seeded: Seeded
    openapi: dict
    app: object = None


@pytest_asyncio.fixture
async def crafted(pool: asyncpg.Pool, settings: Settings) -> AsyncIterator[Crafted]:
    s = hostile_settings(settings, statement_timeout_seconds=STATEMENT_TIMEOUT,
                         max_operation_executions=3,
                         body_timeout_seconds=BODY_TIMEOUT)
    seeded = await seed(pool, s)
    await seed_divergent(pool, s)
    tokens = await make_tokens(pool, s)
    app = create_app(s, workflows=WORKFLOWS)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://fencepost.test",
                                     timeout=30) as api:
            yield Crafted(api, tokens, seeded, app.openapi(), app)


async def send(c: Crafted, probe: Probe) -> httpx.Response:
    kw = dict(probe.kw)
    hdrs = dict(kw.pop("headers", {}))
    if probe.role:
        hdrs["Authorization"] = f"Bearer {c.tokens[probe.role]}"
    return await c.api.request(probe.method, probe.url(), headers=hdrs, **kw)


def check(c: Crafted, probe: Probe, r: httpx.Response, produced: dict,
          problems: list) -> None:
    """Record what `r` produced; collect (not raise) what is wrong with it."""
    try:
        _check(c, probe, r, produced)
    except (AssertionError, KeyError, ValueError) as exc:
        problems.append(f"{probe.method} {probe.url()[:80]} -> {r.status_code}: {exc}"[:300])


def _check(c: Crafted, probe: Probe, r: httpx.Response, produced: dict) -> None:
    where = (probe.method, probe.path, probe.status, probe.code, probe.ids)
    documented = c.openapi["paths"][probe.path][probe.method.lower()]["responses"]
    assert str(r.status_code) in documented, (where, "undocumented", r.status_code, r.text)
    assert r.status_code == probe.status, (where, r.status_code, r.text)
    code = None
    if r.status_code >= 400:
        code = assert_error(r, probe.status)["code"]
        assert code == probe.code, (where, r.text)
        named = documented_codes(documented[str(r.status_code)].get("description", ""))
        assert not named or code in named, (where, "code not in the description", named)
        if r.status_code == 401:
            assert r.headers["www-authenticate"] == "Bearer"
        if code == "DATABASE_UNAVAILABLE":
            assert int(r.headers["retry-after"]) > 0
    produced.setdefault((probe.method, probe.path, str(r.status_code)), set()).add(code)


@pytest.mark.timeout(120)
async def test_every_documented_status_is_reachable(crafted: Crafted, pool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    c = crafted
    # The locked scrape below must find its token in the cache; under load the
    # lock can wait longer than the cache's 5 s (CI once answered 503 there).
    monkeypatch.setattr(auth, "AUTH_CACHE_SECONDS", 600.0)
    taken = TAKEN
    headers = {"Authorization": f"Bearer {c.tokens['trigger']}"}
    assert (await c.api.post("/v1/executions", json=taken, headers=headers)).status_code == 201
    mine = {**taken, "executionId": "mine"}
    assert (await c.api.post("/v1/executions", json=mine, headers=headers)).status_code == 201
    await pool.execute(
        "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, status, "
        "due_at) "
        "VALUES ('to-cancel', fencepost_bucket('to-cancel'), 'x', '{}', '{}', 'admitted', now()), "
        "('to-terminate', fencepost_bucket('to-terminate'), 'x', '{}', '{}', 'admitted', now()), "
        "('to-bulk', fencepost_bucket('to-bulk'), 'x', '{}', '{}', 'admitted', now())")
    await pool.execute(
        "INSERT INTO operations (operation_id, action, filter, created_by, status, matched) "
        "VALUES ($1, 'cancel', '{\"workflowId\": \"none\"}', 'setup', 'running', 0)",
        SEEDED_OPERATION)
    await pool.execute(
        "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, status, "
        "outcome) VALUES ('to-redrive', fencepost_bucket('to-redrive'), 'x', '{}', '{}', "
        """'failed', '{"error": {"name": "E"}}')""")
    await pool.execute(
        "INSERT INTO executions (execution_id, bucket, workflow_id, params, context, status, "
        "due_at) VALUES ('full', fencepost_bucket('full'), 'x', '{}', '{}', 'admitted', now())")
    await pool.execute(
        "INSERT INTO signals (execution_id, bucket, name, payload) "
        "SELECT 'full', fencepost_bucket('full'), 'go', 'null' FROM generate_series(1, $1)",
        Settings().max_pending_signals)

    produced: dict[tuple, set] = {}
    problems: list[str] = []
    all_probes = probes(c.seeded)
    if "/v1/schedules" in c.openapi["paths"]:
        doomed = {**SCHEDULE, "scheduleId": "doomed"}
        headers = {"Authorization": f"Bearer {c.tokens['operate']}"}
        r = await c.api.post("/v1/schedules", json=doomed, headers=headers)
        assert r.status_code == 201, r.text
        all_probes += schedule_probes()
    if "/v1/queues" in c.openapi["paths"]:
        all_probes += queue_probes()
    # Every operation: a head over FENCEPOST_MAX_HEADER_BYTES (a long query) is 431.
    for path, operations in c.openapi["paths"].items():
        ids = {name: "x1" for name in re.findall(r"\{(\w+)\}", path)}
        all_probes += [Probe(method.upper(), path, 431, "REQUEST_HEADER_FIELDS_TOO_LARGE",
                             "operate", ids, {"params": {"pad": "p" * 20_000}})
                       for method in operations]
    for probe in all_probes:
        check(c, probe, await send(c, probe), produced, problems)

    # The schema is behind this build: /readyz says so.
    revision = await pool.fetchval("SELECT version_num FROM alembic_version")
    await pool.execute("UPDATE alembic_version SET version_num = 'an-old-revision'")
    try:
        r = await c.api.get("/readyz")
        check(c, Probe("GET", "/readyz", 503, "SCHEMA_OUT_OF_DATE", None), r, produced,
              problems)
    finally:
        await pool.execute("UPDATE alembic_version SET version_num = $1", revision)

    # Every operation that reads the database, with every table locked: 503
    # within the statement timeout (plus scheduling), never a hang or a 500.
    # (Not the quota token's: it is over its quota by now, refused before any query.)
    successes = [p for p in all_probes
                 if p.status < 300 and p.path != "/healthz" and p.role != "limited"]
    tables = [r["tablename"] for r in await pool.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    assert (await send(c, Probe("GET", "/metrics", 200, None, "read"))).status_code == 200
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
        # /metrics reports the database as down rather than failing the scrape
        # (its token verified moments ago, from the cache); it answers 503
        # only when the token itself cannot be verified.
        scrape = Probe("GET", "/metrics", 200, None, "read")
        r = await send(c, scrape)
        check(c, scrape, r, produced, problems)
        assert "fencepost_database_up 0.0" in r.text, r.text[-500:]
        c.app.state.verifier._cache.clear()
        locked = Probe("GET", "/metrics", 503, "DATABASE_UNAVAILABLE", "read")
        check(c, locked, await send(c, locked), produced, problems)
        for ok in successes:
            if ok.path == "/metrics":
                continue  # above
            locked = Probe(ok.method, ok.path, 503, "DATABASE_UNAVAILABLE", ok.role, ok.ids, ok.kw)
            started = time.perf_counter()
            r = await send(c, locked)
            assert time.perf_counter() - started < BOUND_SECONDS, locked
            check(c, locked, r, produced, problems)
    assert (await c.api.get("/readyz")).status_code == 200

    missing = []
    for path, operations in c.openapi["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                key = (method.upper(), path, status)
                if key not in produced:
                    missing.append((*key, "never produced"))
                    continue
                for code in documented_codes(response.get("description", "")):
                    if code not in produced[key]:
                        missing.append((*key, code))
    assert not problems and not missing, (
        "wrong answers:\n" + "\n".join(problems)
        + "\ndocumented but not reachable:\n" + "\n".join(map(str, missing)))


def test_documented_codes_parser() -> None:
    assert documented_codes("Successful Response") == []
    assert documented_codes("metrics") == []
    assert documented_codes("UNAUTHENTICATED: no valid API token") == ["UNAUTHENTICATED"]
    assert documented_codes("INVALID_EXECUTION_EVENT / INVALID_PARAMS") == [
        "INVALID_EXECUTION_EVENT", "INVALID_PARAMS"]
    assert documented_codes("DATABASE_UNAVAILABLE or SCHEMA_OUT_OF_DATE") == [
        "DATABASE_UNAVAILABLE", "SCHEMA_OUT_OF_DATE"]
