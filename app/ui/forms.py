"""What the dashboard reads from a query or a form: the listing's filters,
a resolution, a redrive, a fork, a bulk operation. Each parser answers the
values and the problems (shown on the page again, 422), never raises."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import Request

from app.api.ids import check_client_execution_id
from app.api.json_body import BodyError, parse_json
from app.api.models import EXECUTION_ID_PATTERN
from app.commands import CommandError
from app.commands.errors import UNSTORABLE_TEXT
from app.commands.executions import RESOLUTIONS
from app.commands.redrive import check_params
from app.registry import ID_RE
from app.schema import STATUSES
from app.store.bulk import ACTIONS as BULK_ACTIONS
from app.store.ui import UI_SORTS
from app.ui import views

PAGE_SIZES = (25, 50, 100, 200)
MAX_PAGE = 10_000
REDRIVE_MAX_SECONDS = 10 * 365 * 86400
MAX_EXECUTION_IDS = 10_000
EXECUTION_ID = re.compile(EXECUTION_ID_PATTERN)


# ---------------------------------------------------------------- fields


def parse_time(name: str, value: str, problems: list[str]) -> datetime | None:
    try:
        at = datetime.fromisoformat(value)
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)  # the form's times are UTC
        return at.astimezone(UTC)
    except (ValueError, OverflowError):
        problems.append(f"{name}: give a time like 2026-01-31T14:00 (UTC) or with an offset")
        return None


def whole_number(name: str, value: str, low: int, high: int, problems: list[str]) -> int | None:
    if not re.fullmatch(r"\d{1,10}", value) or not low <= int(value) <= high:
        problems.append(f"{name}: give a whole number from {low} to {high}")
        return None
    return int(value)


def text_field(name: str, value: str, limit: int, problems: list[str]) -> str | None:
    value = value.strip()
    if UNSTORABLE_TEXT.search(value):
        problems.append(f"{name}: cannot hold NUL characters")
    elif len(value) > limit:
        problems.append(f"{name}: at most {limit} characters")
    return value or None


def step_field(value: str, problems: list[str]) -> str | None:
    value = value.strip()
    if value and not ID_RE.fullmatch(value):
        problems.append("fromStep: a recorded step's key (1 to 200 characters from "
                        "A-Z a-z 0-9 . _ : -)")
        return None
    return value or None


def _choice(name: str, value: str, choices, problems: list[str]) -> str | None:
    if value in choices:
        return value
    problems.append(f"{name}: one of {', '.join(choices)}")
    return None


def form_time(value: datetime | None, raw: str | None) -> str:
    """What a datetime-local input can show again."""
    if value is None:
        return raw or ""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def _json_field(text: str, request: Request) -> Any:
    return parse_json(text.encode(), max_depth=request.app.state.settings.max_json_depth)


# --------------------------------------------------------------- listing


@dataclass
class Filters:
    status: str | None = None
    workflow_id: str | None = None
    min_unacked: int | None = None
    blocked_by: str | None = None
    admitted_from: datetime | None = None
    admitted_to: datetime | None = None
    sort: str = "admitted-desc"
    page: int = 1
    limit: int = 50
    refresh: int | None = None
    raw: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def url(self, **changes: Any) -> str:
        """This listing's URL with some parameters changed (None: removed)."""
        params = {k: v for k, v in self.raw.items() if v != ""}
        for key, value in changes.items():
            if value is None:
                params.pop(key, None)
            else:
                params[key] = str(value)
        if changes.keys() - {"page"}:
            params.pop("page", None)  # a new filter starts on page 1
        return "/ui" + ("?" + urlencode(params) if params else "")


FILTER_KEYS = ("status", "workflowId", "minUnacknowledgedDeliveries", "blockedBy",
               "admittedFrom", "admittedTo", "sort", "page", "limit", "refresh")


def filters(request: Request) -> Filters:
    q = request.query_params
    raw = {k: q.get(k, "").strip() for k in FILTER_KEYS if q.get(k, "").strip()}
    f = Filters(raw=raw)
    p = f.problems
    if v := raw.get("status"):
        f.status = _choice("status", v, STATUSES, p)
    if v := raw.get("workflowId"):
        if ID_RE.match(v):
            f.workflow_id = v
        else:
            p.append("workflowId: 1 to 200 characters from A-Z a-z 0-9 . _ : -")
    if v := raw.get("minUnacknowledgedDeliveries"):
        f.min_unacked = whole_number("minUnacknowledgedDeliveries", v, 0, 2**31 - 1, p)
    if v := raw.get("blockedBy"):
        f.blocked_by = _choice("blockedBy", v, views.BLOCKED_REASONS, p)
    if v := raw.get("admittedFrom"):
        f.admitted_from = parse_time("admittedFrom", v, p)
    if v := raw.get("admittedTo"):
        f.admitted_to = parse_time("admittedTo", v, p)
    if v := raw.get("sort"):
        f.sort = _choice("sort", v, UI_SORTS, p) or f.sort
    if v := raw.get("page"):
        f.page = whole_number("page", v, 1, MAX_PAGE, p) or 1
    if v := raw.get("limit"):
        if v in {str(n) for n in PAGE_SIZES}:
            f.limit = int(v)
        else:
            p.append(f"limit: one of {', '.join(map(str, PAGE_SIZES))}")
    if v := raw.get("refresh"):
        if v in ("5", "15", "60"):
            f.refresh = int(v)
        else:
            p.append("refresh: 5, 15 or 60 seconds")
    return f


# ------------------------------------------------------------ resolution


@dataclass
class Resolution:
    step: str
    action: str
    result_text: str
    error_name: str
    error_message: str
    result: Any = None
    problems: list[str] = field(default_factory=list)

    @property
    def error(self) -> dict[str, str] | None:
        if self.action != "fail":
            return None
        return {"name": self.error_name, "message": self.error_message}


def resolution(form: dict[str, str], request: Request) -> Resolution:
    res = Resolution(
        step=form.get("step", ""), action=form.get("action", ""),
        result_text=form.get("result", ""), error_name=form.get("errorName", "").strip(),
        error_message=form.get("errorMessage", ""),
    )
    p = res.problems
    if res.action not in RESOLUTIONS:
        p.append("choose how the step ended: retry, succeed or fail")
    if res.action == "succeed":
        if not res.result_text.strip():
            p.append("result: give the step's result as JSON (null, a number, \"text\", {...})")
        else:
            try:
                res.result = _json_field(res.result_text, request)
            except BodyError as exc:
                p.append(f"result: {exc.message}")
    if UNSTORABLE_TEXT.search(res.error_name + res.error_message):
        p.append("error: the name and message cannot hold NUL characters")
    if res.action == "fail":
        if not 1 <= len(res.error_name) <= 200:
            p.append("error name: 1 to 200 characters (for example PaymentDeclined)")
        if len(res.error_message) > 10000:
            p.append("error message: at most 10000 characters")
    if UNSTORABLE_TEXT.search(res.step):
        p.append("step: not a step of this execution")
    return res


# -------------------------------------------------------- redrive, fork


@dataclass
class RedriveForm:
    from_step: str | None = None
    reason: str | None = None
    timeout_seconds: int | None = None
    problems: list[str] = field(default_factory=list)


def redrive_form(form: dict[str, str]) -> RedriveForm:
    r = RedriveForm()
    r.from_step = step_field(form.get("fromStep", ""), r.problems)
    r.reason = text_field("reason", form.get("reason", ""), 2000, r.problems)
    if raw := form.get("timeoutSeconds", "").strip():
        r.timeout_seconds = whole_number("timeoutSeconds", raw, 1, REDRIVE_MAX_SECONDS,
                                         r.problems)
    return r


@dataclass
class ForkForm:
    from_step: str = ""
    new_id: str = ""
    params_text: str = ""
    params: Any = None
    problems: list[str] = field(default_factory=list)


def fork_form(form: dict[str, str], request: Request, row: dict) -> ForkForm:
    f = ForkForm(from_step=form.get("fromStep", "").strip(),
                 new_id=form.get("executionId", "").strip(), params_text=form.get("params", ""))
    p = f.problems
    if not f.from_step:
        p.append("fromStep: choose the step to run again from")
    else:
        step_field(f.from_step, p)
    if f.new_id:
        try:
            check_client_execution_id(f.new_id)
        except CommandError as exc:
            p.append(f"{exc.code}: {exc.message}")
        else:
            if not ID_RE.fullmatch(f.new_id):
                p.append("executionId: 1 to 200 characters from A-Z a-z 0-9 . _ : - "
                         "(or leave it empty for a generated one)")
    if f.params_text.strip():
        try:
            f.params = _json_field(f.params_text, request)
        except BodyError as exc:
            p.append(f"INVALID_PARAMS: params: {exc.message}; give JSON such as "
                     '{"amount": 100}, or leave it empty to keep the source\'s params')
    workflows = request.app.state.workflows
    if (workflows or {}).get(row["workflow_id"]) is not None and not p:
        # New params are checked against the workflow's model, as the API does.
        try:
            check_params(workflows, row["workflow_id"],
                         f.params if f.params is not None else row["params"])
        except CommandError as exc:
            p.append(f"{exc.code}: {exc.message}")
    return f


# ------------------------------------------------------------------ bulk


@dataclass
class BulkForm:
    raw: dict[str, str] = field(default_factory=dict)
    action: str = "cancel"
    spec: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    problems: list[str] = field(default_factory=list)


BULK_FIELDS = ("action", "workflowId", "status", "admittedFrom", "admittedTo",
               "minUnacknowledgedDeliveries", "executionIds", "reason", "fromStep",
               "timeoutSeconds")


def bulk_form(form: dict[str, str]) -> BulkForm:
    """The action, its filter (the API's shape) and options, or problems."""
    raw = {k: form.get(k, "").strip() for k in BULK_FIELDS}
    b = BulkForm(raw=raw, action=raw["action"])
    p = b.problems
    if b.action not in BULK_ACTIONS:
        p.append(f"action: one of {', '.join(BULK_ACTIONS)}")
    if v := raw["workflowId"]:
        if ID_RE.fullmatch(v):
            b.spec["workflowId"] = v
        else:
            p.append("workflow: 1 to 200 characters from A-Z a-z 0-9 . _ : -")
    if v := raw["status"]:
        if v in STATUSES:
            b.spec["status"] = v
        else:
            p.append(f"status: one of {', '.join(STATUSES)}")
    for name in ("admittedFrom", "admittedTo"):
        if (v := raw[name]) and (at := parse_time(name, v, p)) is not None:
            b.spec[name] = at.isoformat()
    if v := raw["minUnacknowledgedDeliveries"]:
        if (n := whole_number("minUnacknowledgedDeliveries", v, 0, 2**31 - 1, p)) is not None:
            b.spec["minUnacknowledgedDeliveries"] = n
    if v := raw["executionIds"]:
        ids = list(dict.fromkeys(re.split(r"[\s,]+", v.strip())))
        bad = [i for i in ids if not EXECUTION_ID.fullmatch(i)]
        if bad:
            p.append(f"execution IDs: {bad[0][:100]!r} is not an execution ID")
        elif len(ids) > MAX_EXECUTION_IDS:
            p.append(f"execution IDs: at most {MAX_EXECUTION_IDS}; start several operations")
        else:
            b.spec["executionIds"] = ids
            raw["executionIds"] = " ".join(ids)
    if not b.spec and not p:
        p.append("filter: give at least one condition (workflow, status, admitted from / to, "
                 "unacknowledged deliveries, or execution IDs)")
    b.reason = text_field("reason", raw["reason"], 2000, p)
    if b.action == "redrive":
        if step := step_field(raw["fromStep"], p):
            b.options["fromStep"] = step
        if v := raw["timeoutSeconds"]:
            if (n := whole_number("timeoutSeconds", v, 1, REDRIVE_MAX_SECONDS, p)) is not None:
                b.options["timeoutSeconds"] = n
    if b.action == "resolve":
        b.options = {"resolution": {"action": "retry", "result": None, "error": None}}
    return b
