"""Prometheus metrics: one metric per question on-call asks (README, "Metrics").

Counters and histograms live in each process's registry (`METRICS`): the
worker serves them on `fencepost worker --metrics-port`, the API with its
`/metrics`. Each is counted where the event is written, once: a lease
takeover by the claim or the reaper that ends it, a terminal transition by
the worker, the reaper or the API that writes it. Labelled counters are
created at zero for every value their labels can take (rate() sees the first
event after a restart), and no `_created` series are exported.

Database-wide gauges are read when the API's `/metrics` is scraped, over
unfinished rows, each counted as reads report it (the healed view: an
expired lease as the reaper will leave it), `waiting_executions` by
app/blocked.py's one rule. When the database does not answer,
`fencepost_database_up` is 0 and the process metrics are still served.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import prometheus_client
from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from app.blocked import REASONS
from app.version import VERSION

# no `_created` twin for any counter or histogram (prometheus_client leaves it unannotated)
disable_created_metrics()  # type: ignore[no-untyped-call]

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 86400)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# How a delivery ended, as the worker's `_finish` names it.
DELIVERY_OUTCOMES = ("completed", "failed", "suspended", "cancelled", "timed_out", "retry",
                     "park", "stopped")
TERMINAL = ("completed", "failed", "cancelled", "timed_out")
PARK_REASONS = ("poison", "outcome_unknown", "nondeterminism")
TAKEOVER_BY = ("claim", "reaper")
MAINTENANCE_TASKS = ("reaper", "retention", "scheduler")
WAITING_REASONS = tuple(r for r in REASONS if r != "none")


class _KeptChildren:
    """labels() answering from a plain dict of the children already made,
    by the label values as given: prometheus_client re-checks the values,
    turns them into strings and takes a lock on every call, which the
    worker and the API pay on every delivery, step and request. The first
    call for a label set (and any call with keyword labels or values that
    cannot be a dict key) goes to prometheus_client, which makes the child."""

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Any:
        kept: dict[tuple[Any, ...], Any] | None = self.__dict__.get("_kept")
        if kept is None:
            kept = self.__dict__["_kept"] = {}
        if labelkwargs:
            return super().labels(*labelvalues, **labelkwargs)  # type: ignore[misc]
        try:
            return kept[labelvalues]
        except KeyError:
            child = kept[labelvalues] = super().labels(*labelvalues)  # type: ignore[misc]
            return child
        except TypeError:  # unhashable values: prometheus_client's own lookup
            return super().labels(*labelvalues)  # type: ignore[misc]

    def remove(self, *labelvalues: Any) -> None:
        self.__dict__.pop("_kept", None)  # a removed child is never answered again
        super().remove(*labelvalues)  # type: ignore[misc]

    def clear(self) -> None:
        self.__dict__.pop("_kept", None)
        super().clear()  # type: ignore[misc]


class Counter(_KeptChildren, prometheus_client.Counter):
    pass


class Gauge(_KeptChildren, prometheus_client.Gauge):
    pass


class Histogram(_KeptChildren, prometheus_client.Histogram):
    pass


class ProcessMetrics:
    """Counters, histograms and gauges of one process (API or worker)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(PROCESS_COLLECTOR)
        r.register(PLATFORM_COLLECTOR)
        Gauge("fencepost_build_info", "This build: always 1, labelled with the version.",
              ["version"], registry=r).labels(VERSION).set(1)
        # -- lease churn
        self.claims = Counter("fencepost_claims", "Leases taken by claim_due.", ["workflow"],
                              registry=r)
        self.queue_starts = Counter(
            "fencepost_queue_starts", "Starts (first claims of an execution) by queue: what a "
            "queue's rate limit counts.", ["queue"], registry=r)
        self.renewals = Counter("fencepost_renewals", "Leases renewed.", registry=r)
        self.leases_lost = Counter(
            "fencepost_leases_lost", "Leases found lost (renewal or fenced write).", registry=r
        )
        self.lease_takeovers = Counter(
            "fencepost_lease_takeovers",
            "Leases that expired unacknowledged (a crashed or paused holder) and were ended: "
            "taken over by a claim (by=claim) or ended by the reaper (by=reaper). Each "
            "expired lease is ended once, by one of them, so each counts once.",
            ["by"], registry=r,
        )
        # -- fencing and evidence
        self.fenced_writes_rejected = Counter(
            "fencepost_fenced_writes_rejected",
            "Step writes and acknowledgements refused because the token was stale.", registry=r,
        )
        self.unacknowledged_deliveries = Counter(
            "fencepost_unacknowledged_deliveries",
            "Deliveries this process ended without an acknowledgement (release).", registry=r,
        )
        self.late_observations = Counter(
            "fencepost_late_observations",
            "Results a stale holder saw after its lease was lost, kept as a late observation "
            "(evidence, never applied).", registry=r,
        )
        self.integrity_conflicts = Counter(
            "fencepost_integrity_conflicts",
            "Late observations that differ from what was recorded for the same step or "
            "outcome (an integrity conflict; the recorded value stands).", registry=r,
        )
        # -- deliveries
        self.deliveries = Counter(
            "fencepost_deliveries", "Deliveries by how they ended (the worker's report).",
            ["workflow", "outcome"], registry=r,
        )
        self.delivery_seconds = Histogram(
            "fencepost_delivery_duration_seconds", "Claim to end of delivery.", ["workflow"],
            buckets=DURATION_BUCKETS, registry=r,
        )
        self.step_seconds = Histogram(
            "fencepost_step_duration_seconds", "Step function run time (each attempt).",
            ["workflow"], buckets=DURATION_BUCKETS, registry=r,
        )
        self.first_claim_seconds = Histogram(
            "fencepost_admission_to_first_claim_seconds",
            "Admission to the first claim of an execution (database clock).", ["workflow"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.end_to_end_seconds = Histogram(
            "fencepost_end_to_end_duration_seconds",
            "Admission to the terminal acknowledgement written by a worker (database clock).",
            ["workflow"], buckets=LATENCY_BUCKETS, registry=r,
        )
        # -- terminal transitions, whoever writes them
        self.terminal = Counter(
            "fencepost_terminal_transitions",
            "Executions that ended, by status, counted by the process that wrote the end "
            "(worker acknowledgement, reaper, deadline sweep, API cancel).",
            ["status"], registry=r,
        )
        self.parks = Counter(
            "fencepost_parks", "Executions parked for an operator, by reason.", ["reason"],
            registry=r,
        )
        # -- worker capacity
        self.in_flight = Gauge("fencepost_worker_in_flight_deliveries",
                               "Deliveries this worker is running now.", registry=r)
        self.capacity = Gauge("fencepost_worker_capacity",
                              "Most deliveries this worker runs at once (--concurrency).",
                              registry=r)
        # -- maintenance
        self.schedule_slots = Counter(
            "fencepost_schedule_slots", "Schedule slots admitted (fired) or skipped (missed "
            "beyond the catch-up bound).", ["result"], registry=r,
        )
        self.pruned = Counter("fencepost_retention_pruned_executions",
                              "Terminal executions deleted by retention.", registry=r)
        self.maintenance_success = Gauge(
            "fencepost_maintenance_last_success_timestamp_seconds",
            "Unix time of the last pass of each maintenance task that finished without error.",
            ["task"], registry=r,
        )
        self.maintenance_leader = Gauge(
            "fencepost_maintenance_leader",
            "1 while this worker holds the maintenance role's lease (it runs that role: "
            "sweeps, or the schedules of a set of workflows), 0 otherwise.",
            ["role"], registry=r,
        )
        # -- HTTP (API)
        self.http_requests = Counter(
            "fencepost_http_requests", "HTTP requests answered, by route template, method and "
            "status.", ["route", "method", "status"], registry=r,
        )
        self.http_seconds = Histogram(
            "fencepost_http_request_duration_seconds", "Time to answer, by route template and "
            "method.", ["route", "method"], buckets=HTTP_BUCKETS, registry=r,
        )
        for by in TAKEOVER_BY:
            self.lease_takeovers.labels(by)
        for status in TERMINAL:
            self.terminal.labels(status)
        for reason in PARK_REASONS:
            self.parks.labels(reason)
        for result in ("fired", "skipped"):
            self.schedule_slots.labels(result)

    # -- pre-initialisation of the labels only the caller knows

    def init_workflows(self, workflows: Iterable[str]) -> None:
        for wf in workflows:
            self.claims.labels(wf)
            self.delivery_seconds.labels(wf)
            self.step_seconds.labels(wf)
            self.first_claim_seconds.labels(wf)
            self.end_to_end_seconds.labels(wf)
            for outcome in DELIVERY_OUTCOMES:
                self.deliveries.labels(wf, outcome)

    def init_queues(self, queues: Iterable[str]) -> None:
        for queue in queues:
            self.queue_starts.labels(queue)

    def init_route(self, route: str, method: str, statuses: Iterable[int | str]) -> None:
        self.http_seconds.labels(route, method)
        for status in statuses:
            self.http_requests.labels(route, method, str(status))

    # -- events counted in one place each

    def ended(self, statuses: Iterable[str], park_reason: str = "poison") -> None:
        """Executions a committed write just moved to `statuses` (terminal, or
        parked for `park_reason`); called by the store once per write."""
        for status in statuses:
            if status in TERMINAL:
                self.terminal.labels(status).inc()
            elif status == "parked":
                self.parks.labels(park_reason).inc()

    def claimed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """A committed claim's rows (workflow_id, how, token, since_admitted,
        queue, starts: a first claim)."""
        for row in rows:
            self.claims.labels(row["workflow_id"]).inc()
            if row.get("starts"):
                self.queue_starts.labels(row["queue"]).inc()
            if row["how"] == "expired":
                self.lease_takeovers.labels("claim").inc()
            if row["token"] == 1:
                self.first_claim_seconds.labels(row["workflow_id"]).observe(
                    max(0.0, float(row["since_admitted"])))

    def maintained(self, task: str) -> None:
        self.maintenance_success.labels(task).set(time.time())

    def render(self) -> bytes:
        return generate_latest(self.registry)


# One per process: the worker's dispatcher, the SDK, the reaper and the API count into it.
METRICS = ProcessMetrics()


class _Snapshot:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def database_families(snap: dict[str, Any] | None) -> list[Metric]:
    """Gauges read from the database at scrape time; `snap` None: it did not answer."""
    up = GaugeMetricFamily("fencepost_database_up",
                           "1 when this scrape's database read succeeded, else 0.",
                           value=0 if snap is None else 1)
    if snap is None:
        return [up]
    by_status = GaugeMetricFamily(
        "fencepost_executions", "Unfinished executions by status and workflow (every status "
        "of every workflow present, 0 included).", labels=["status", "workflow"]
    )
    workflows = sorted({wf for _, wf in snap["waiting"]} | set(snap.get("workflows", ())))
    for wf in workflows:
        for status in ("admitted", "running", "suspended", "parked"):
            by_status.add_metric([status, wf], snap["by_status_workflow"].get((status, wf), 0))
    parked = GaugeMetricFamily(
        "fencepost_parked_executions", "Parked executions by reason.", labels=["reason"]
    )
    for reason in PARK_REASONS:
        parked.add_metric([reason], snap["parked"].get(reason, 0))
    waiting = GaugeMetricFamily(
        "fencepost_waiting_executions",
        "Unfinished executions by why they are not moving (blockedBy.reason, the API's rule) "
        "and workflow; every reason of every workflow present, 0 included.",
        labels=["reason", "workflow"])
    counts = snap["waiting"]
    for wf in workflows:
        for reason in WAITING_REASONS:
            waiting.add_metric([reason, wf], counts.get((reason, wf), 0))
    oldest_by_reason = GaugeMetricFamily(
        "fencepost_oldest_waiting_age_seconds",
        "Per blockedBy reason, how long the longest-waiting execution has been in it (since "
        "due for due and no-worker, since its last change otherwise); 0 when none.",
        labels=["reason"])
    for reason in WAITING_REASONS:
        oldest_by_reason.add_metric([reason], snap["oldest_by_reason"].get(reason, 0.0))
    queue_families = _queue_families(snap.get("queues", {}))
    return [
        up,
        *queue_families,
        by_status,
        parked,
        waiting,
        oldest_by_reason,
        GaugeMetricFamily("fencepost_outcome_unknown_steps",
                          "Steps whose outcome is unknown in executions parked awaiting an "
                          "operator's decision (one per execution); resolved or ended "
                          "executions do not count.",
                          value=snap["outcome_unknown"]),
        GaugeMetricFamily("fencepost_executions_with_integrity_conflicts",
                          "Executions with at least one integrity conflict (a late "
                          "observation that differs from what was recorded).",
                          value=snap["integrity_conflicts"]),
        GaugeMetricFamily("fencepost_executions_with_unacknowledged_deliveries",
                          "Unfinished executions whose last delivery ended unacknowledged.",
                          value=snap["unacknowledged_executions"]),
        GaugeMetricFamily("fencepost_unacknowledged_deliveries_current",
                          "Sum of unacknowledgedDeliveries over unfinished executions.",
                          value=snap["unacknowledged_sum"]),
        GaugeMetricFamily("fencepost_oldest_due_age_seconds",
                          "How long the longest-waiting execution that is due and waits for a "
                          "worker (blockedBy due, no-worker or no-worker-for-version) has "
                          "waited; executions in a redelivery delay, sleeping or waiting do "
                          "not count.",
                          value=max(snap["oldest_by_reason"].get(reason, 0.0)
                                    for reason in ("due", "no-worker", "no-worker-for-version"))),
        GaugeMetricFamily("fencepost_live_workers",
                          "Workers that heartbeated recently and have not stopped.",
                          value=snap["live_workers"]),
        GaugeMetricFamily("fencepost_live_worker_capacity",
                          "Sum of the live workers' concurrency.",
                          value=snap["live_capacity"]),
    ]


# A queue's configured limits, by the `kind` label of fencepost_queue_limit.
QUEUE_LIMIT_KINDS = ("concurrency", "per_key_concurrency", "rate_limit", "rate_period_seconds")


def _queue_families(queues: Mapping[str, Mapping[str, Any]]) -> list[Metric]:
    """Per queue, read as the claim counts (app/blocked.py's queue state)."""
    running = GaugeMetricFamily(
        "fencepost_queue_running", "Executions of the queue holding a slot now: running with "
        "an unexpired lease, and suspended ones when the queue holds slots while suspended.",
        labels=["queue"])
    due = GaugeMetricFamily(
        "fencepost_queue_due", "Executions of the queue that are due (waiting to be claimed: "
        "blockedBy due, no-worker, queue-paused, concurrency-limit or rate-limited).",
        labels=["queue"])
    limited = GaugeMetricFamily(
        "fencepost_queue_limited", "Due executions of the queue that its limits or a pause "
        "hold back (blockedBy queue-paused, concurrency-limit or rate-limited).",
        labels=["queue"])
    limit = GaugeMetricFamily(
        "fencepost_queue_limit", "The queue's effective limits (declared in code, or set at "
        "run time): concurrency, per_key_concurrency, rate_limit (starts per period), "
        "rate_period_seconds; absent when the queue has no such limit.",
        labels=["queue", "kind"])
    for name in sorted(queues):
        q = queues[name]
        running.add_metric([name], q["running"])
        due.add_metric([name], q["due"])
        limited.add_metric([name], q["limited"])
        for kind in QUEUE_LIMIT_KINDS:
            if q["limits"].get(kind) is not None:
                limit.add_metric([name, kind], q["limits"][kind])
    return [running, due, limited, limit]


def render_with_database(snap: dict[str, Any] | None) -> bytes:
    """This process's metrics and the database gauges, as one exposition."""
    registry = CollectorRegistry()
    registry.register(_Snapshot(database_families(snap)))
    return METRICS.render() + generate_latest(registry)
