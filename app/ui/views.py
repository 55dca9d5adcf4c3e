"""What the templates show, computed in Python: times in words, `blockedBy`
in plain words, JSON values with large ones collapsed, event kinds, and the
activity chart's geometry. Nothing here is HTML: the templates escape it all."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.blocked import REASONS

# ------------------------------------------------------------------- times


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: datetime | None) -> str:
    return value.astimezone(UTC).isoformat() if value is not None else ""


def duration_words(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 1:
        return "less than a second"
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m} min {s} s" if s and m < 10 else f"{m} min"
    if seconds < 86400:
        h, rest = divmod(int(seconds), 3600)
        return f"{h} h {rest // 60} min" if rest >= 60 else f"{h} h"
    d, rest = divmod(int(seconds), 86400)
    return f"{d} d {rest // 3600} h" if rest >= 3600 else f"{d} d"


def relative(value: datetime | None, now: datetime) -> str:
    """'in 4 min' / '12 s ago', against the database's clock."""
    if value is None:
        return ""
    delta = (value - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    words = duration_words(delta)
    return f"in {words}" if delta > 0 else f"{words} ago"


# --------------------------------------------------------------- blockedBy

# The reasons of app/blocked.py (its RULES, in their order), for the filter
# and the list (short words).
BLOCKED_REASONS: dict[str, str] = {
    "due": "due: waiting for a free worker",
    "leased": "leased: a worker is running it",
    "lease-expired": "lease expired: awaiting takeover",
    "redelivery-delay": "redelivery delay after an unacknowledged delivery",
    "waiting-for-child": "waiting for a child execution to end",
    "waiting-for-signal": "waiting for a signal",
    "sleeping": "sleeping on a durable timer",
    "delayed-start": "admitted to start later",
    "parked": "parked: needs an operator",
    "queue-paused": "its queue is paused",
    "concurrency-limit": "held back: its queue's concurrency limit is full",
    "rate-limited": "held back: its queue's rate limit is spent",
    "no-worker": "no live worker runs its workflow",
    "no-worker-for-version": "no live worker carries its code version",
    "none": "nothing: it has ended",
}
assert set(BLOCKED_REASONS) == set(REASONS), "every reason of app/blocked.py has its words"


@dataclass(frozen=True)
class Blocked:
    reason: str  # a key of BLOCKED_REASONS
    headline: str
    detail: str
    todo: str
    at: datetime | None = None  # the time it waits for (or waits since)
    at_label: str = ""
    short: str = ""  # for the listing


def explain_blocked(blocked: dict | None, rec: dict) -> Blocked:
    """`blocked`: app.blocked.blocked_by(rec, live); `rec`: the healed record."""
    if blocked is None:
        return Blocked("none", f"Nothing: it has ended ({rec['status'].replace('_', ' ')}).",
                       "A finished execution keeps its outcome; nothing will run again.",
                       "Nothing to do.", short="—")
    reason = blocked["reason"]
    if reason == "parked":
        step = blocked.get("step")
        if blocked.get("parkedReason") == "outcome_unknown":
            return Blocked(
                reason, f"Parked: the outcome of step “{step}” is unknown.",
                "A delivery called out to another system for this step and never learned "
                "whether the call took effect. No worker will touch the execution until an "
                "operator decides how the step ended.",
                "Check the other system (the idempotency key is below), then resolve the step: "
                "retry it, record it as succeeded, or record it as failed.",
                short=f"parked: outcome of “{step}” unknown")
        if blocked.get("parkedReason") == "nondeterminism":
            return Blocked(
                reason, f"Parked: its code no longer fits its history at step “{step}”.",
                "Replaying the recorded steps, the workflow code asked for something other "
                "than what the history recorded at the same place (a step added, removed, "
                "renamed or moved without ctx.patched), so no worker continues it: going on "
                "would run steps out of order.",
                "Deploy code that fits its history under its code version (guard the "
                "change with ctx.patched), then resume it; or move it to a code version "
                "whose code fits (fencepost executions move-version checks the history "
                "first); otherwise cancel or terminate it.",
                short=f"parked: code diverged at “{step}”")
        return Blocked(
            reason, f"Parked as poison after {rec['unacknowledged_deliveries']} deliveries "
            "that ended without an acknowledgement.",
            "Every delivery crashed, was stopped or lost its lease before it finished, so "
            "fencepost stopped redelivering it.",
            "Find the cause in the events and the worker logs, fix it, then resume. One more "
            "unacknowledged delivery parks it again.", short="parked as poison")
    if reason == "leased":
        owner = blocked.get("owner") or "a worker"
        cancel = (" A cancel was requested: the holder stops at its next step."
                  if blocked.get("cancelRequested") else "")
        return Blocked(reason, f"Running: worker {owner} holds its lease.",
                       "The holder renews the lease while it works; if it stops renewing, "
                       "another worker takes over after the lease expires." + cancel,
                       "Wait.", blocked.get("until"), "lease expires", f"leased by {owner}")
    if reason == "lease-expired":
        return Blocked(reason, "Its lease expired: the holder stopped renewing.",
                       "The delivery counts as unacknowledged. Another worker takes it over "
                       "once the redelivery delay has passed.",
                       "Check the holder (see the workers page and the events).",
                       blocked.get("until"), "claimable again", "lease expired")
    if reason == "redelivery-delay":
        return Blocked(reason, "Waiting out the redelivery delay.",
                       "The last delivery ended without an acknowledgement (a crash, a stop, "
                       "a retry or a lost lease); the delay grows with each one.",
                       "Look at the events and the worker logs.",
                       blocked.get("until"), "claimable again", "redelivery delay")
    if reason == "delayed-start":
        return Blocked(reason, "Admitted to start later.",
                       "It was admitted with a start time (startAt or delaySeconds) and has "
                       "not run yet; it becomes due then.",
                       "Wait, or wake it now to start it at once.", blocked.get("until"),
                       "starts", "delayed start")
    if reason == "sleeping":
        step = blocked.get("step")
        what = f"on the durable timer of step “{step}”" if step else "until its next wake"
        return Blocked(reason, f"Sleeping {what}.",
                       "No worker holds it; it becomes due when the timer fires.",
                       "Wait, or wake it now.", blocked.get("until"), "wakes", "sleeping")
    if reason == "waiting-for-signal":
        name = blocked.get("signal")
        until = blocked.get("until")
        return Blocked(reason, f"Waiting for the signal “{name}”.",
                       "It continues when the signal arrives"
                       + (", or when the wait times out." if until else "."),
                       f"Send the signal: POST /v1/executions/{rec['execution_id']}/signals/{name}.",
                       until, "wait times out", f"waiting for signal “{name}”")
    if reason == "waiting-for-child":
        child = blocked.get("child")
        return Blocked(reason, f"Waiting for the child execution “{child}” to end.",
                       "It started a child workflow and waits for it; the child's end (completed, "
                       "failed, cancelled or timed out) makes it due again at once. No worker "
                       "holds it meanwhile.",
                       "Look at the child execution: it is the one that has to move.",
                       short=f"waiting for child “{child}”")
    if reason == "queue-paused":
        queue = blocked.get("queue")
        return Blocked(reason, f"Due, but its queue “{queue}” is paused.",
                       "No worker claims anything from a paused queue; what runs already "
                       "continues.",
                       "Resume the queue (Queues page) when it should run again.",
                       rec.get("due_at"), "due since", f"queue “{queue}” paused")
    if reason == "concurrency-limit":
        key = blocked.get("key")
        limit, running = blocked.get("limit"), blocked.get("running")
        whose = _whose(blocked)
        what = "per-key concurrency limit" if key is not None else "concurrency limit"
        return Blocked(reason, f"Due, but the {what} of {whose} is full "
                       f"({running} of {limit} running).",
                       "It is claimed as soon as one of those executions ends or suspends "
                       "(unless the queue holds slots while suspended).",
                       "Wait for a slot, or raise the limit on the Queues page.",
                       rec.get("due_at"), "due since",
                       f"concurrency limit: {whose} ({running}/{limit})")
    if reason == "rate-limited":
        whose = _whose(blocked)
        return Blocked(reason, f"Due, but the rate limit of {whose} is spent.",
                       "Its first start waits until the oldest start counted in the rate "
                       "period leaves it.",
                       "Wait, or raise the rate limit on the Queues page.",
                       blocked.get("until"), "may start", f"rate limited: {whose}")
    if reason == "no-worker":
        return Blocked(reason, f"Due, but no live worker runs workflow “{blocked.get('workflowId')}”.",
                       "Workers advertise the workflows they run; none alive advertises this one.",
                       "Start a worker with this workflow (FENCEPOST_WORKFLOWS).",
                       blocked.get("since"), "due since", "no live worker")
    if reason == "no-worker-for-version":
        workflow, version = blocked.get("workflowId"), blocked.get("version")
        return Blocked(reason, f"Waiting for a worker with version “{version}” of workflow "
                       f"“{workflow}”.",
                       "It was admitted under that code version, and a worker runs only the "
                       "executions admitted under the version it carries (its history may "
                       "replay differently under another). Live workers run this workflow, "
                       "but none carries this version.",
                       f"Start a worker with version “{version}” of this workflow (see the "
                       "workers page for the versions each carries).",
                       blocked.get("since"), "waiting since", f"no worker with version “{version}”")
    return Blocked("due", "Due: waiting for a free worker.",
                   "It will be claimed by the next worker with free capacity.",
                   "Add workers or concurrency if this lasts.", blocked.get("since"), "due since",
                   "due")


# -------------------------------------------------------------- JSON values

SHORT_CHARS = 120
SHOWN_CHARS = 100_000


@dataclass(frozen=True)
class JsonView:
    compact: str  # one line, possibly cut
    full: str  # indented, possibly cut
    big: bool  # collapse it
    size: int  # characters of the compact form
    cut: bool  # `full` was cut at SHOWN_CHARS


def json_view(value: Any) -> JsonView:
    compact = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    big = len(compact) > SHORT_CHARS
    full = json.dumps(value, ensure_ascii=False, indent=2, default=str) if big else compact
    cut = len(full) > SHOWN_CHARS
    return JsonView(
        compact=compact[:SHORT_CHARS] + ("…" if big else ""),
        full=full[:SHOWN_CHARS],
        big=big,
        size=len(compact),
        cut=cut,
    )


# ------------------------------------------------------------------ events

EVENT_WORDS: dict[str, str] = {
    "admitted": "admitted",
    "claimed": "claimed: a delivery started",
    "acknowledged": "delivery acknowledged",
    "released": "delivery ended without acknowledgement",
    "lease_expired": "lease expired: the holder stopped renewing",
    "renewal_lost": "a holder's renewal was refused",
    "fenced_write_rejected": "a stale holder's write was rejected",
    "step_recorded": "step recorded",
    "wake_requested": "wake requested",
    "signal_received": "signal received",
    "signal_consumed": "signal consumed",
    "effect_started": "external call attempted",
    "effect_attempted": "external call attempted again",
    "parked": "parked",
    "resolved": "step resolved by an operator",
    "resumed": "resumed by an operator",
    "cancel_requested": "cancel requested",
    "cancelled": "cancelled",
    "timed_out": "timed out: the deadline passed",
    "integrity_conflict": "integrity conflict: a stale holder saw a different result",
    "redriven": "redriven: reopened under the same ID",
    "forked": "forked: a new execution copies its steps",
    "version_moved": "moved to another code version by an operator",
}


def event_words(kind: str) -> str:
    return EVENT_WORDS.get(kind, kind.replace("_", " "))


# ------------------------------------------------------------------- chart

SERIES = (
    ("completed", "completions"),
    ("failed", "failures (failed or timed out)"),
    ("unacknowledged", "unacknowledged deliveries"),
)


@dataclass(frozen=True)
class ChartPoint:
    x: float
    label: str  # the minute, for the hover title
    values: dict[str, int]
    ys: dict[str, float]


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    top: int
    plot_w: float
    plot_h: float
    slot: float
    y_ticks: list[tuple[float, int]]  # (y, value)
    x_ticks: list[tuple[float, str]]  # (x, HH:MM)
    lines: list[tuple[str, str, str]]  # (series key, label, polyline points)
    points: list[ChartPoint]
    totals: dict[str, int]
    rows: list[dict]


def _nice_scale(value: int) -> tuple[int, int]:
    """(top of the y axis, tick step): the lowest top of 3 to 6 ticks of
    1, 2 or 5 times a power of ten that reaches `value`."""
    if value <= 0:
        return 4, 1
    best: tuple[int, int] | None = None
    for exponent in range(0, 19):
        for base in (1, 2, 5):
            step = base * 10**exponent
            for n in (3, 4, 5, 6):
                if n * step >= value and (best is None or n * step < best[0]):
                    best = (n * step, step)
        if 10**exponent > value:
            break
    assert best is not None
    return best


def activity_chart(rows: list[dict], *, width: int = 1080, height: int = 240) -> Chart:
    left, right, top, bottom = 40, 12, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(len(rows), 1)
    slot = plot_w / n
    peak = max([r[key] for r in rows for key, _ in SERIES] or [0])
    y_max, y_step = _nice_scale(peak)

    def y(v: int) -> float:
        return round(top + plot_h - (v / y_max) * plot_h, 1)

    points = []
    for i, r in enumerate(rows):
        x = round(left + slot * (i + 0.5), 1)
        minute = r["minute"].astimezone(UTC).strftime("%H:%M")
        values = {key: int(r[key]) for key, _ in SERIES}
        points.append(ChartPoint(x, minute, values, {k: y(v) for k, v in values.items()}))
    lines = []
    for key, label in SERIES:
        coords = " ".join(f"{p.x},{p.ys[key]}" for p in points)
        lines.append((key, label, coords))
    y_ticks = [(y(v), v) for v in range(0, y_max + 1, y_step)]
    x_ticks = [(p.x, p.label) for i, p in enumerate(points) if (len(points) - 1 - i) % 10 == 0]
    totals = {key: sum(p.values[key] for p in points) for key, _ in SERIES}
    return Chart(width, height, left, top, plot_w, plot_h, slot, y_ticks, x_ticks, lines,
                 points, totals, rows)


def _whose(blocked: dict[str, Any]) -> str:
    """The queue a queue reason names, or its key within the queue."""
    queue, key = blocked.get("queue"), blocked.get("key")
    return f"key “{key}” of queue “{queue}”" if key is not None else f"queue “{queue}”"
