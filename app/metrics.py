"""Prometheus metrics, kept at their own levels:

* lease churn (claims, renewals, lease expiries, leases lost),
* fencing (fenced writes rejected),
* delivery health (unacknowledged deliveries, delivery outcomes, durations),
* evidence (late observations of stale holders, integrity conflicts among them),
* operator attention (executions waiting for a decision on an outcome-unknown
  step, parked executions, executions with integrity conflicts),
* queue (executions by status, oldest due age).

Worker-side counters live in this process's registry and are served on
`fencepost worker --metrics-port`. Database-wide gauges are read when the
API's `/metrics` is scraped, over unfinished rows, each counted as reads
report it (the healed view: an expired lease as the reaper will leave it).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from app.store import ExecutionStore

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class ProcessMetrics:
    """Counters of one worker process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.claims = Counter("fencepost_claims", "Leases taken by claim_due.", registry=r)
        self.renewals = Counter("fencepost_renewals", "Leases renewed.", registry=r)
        self.leases_lost = Counter(
            "fencepost_leases_lost", "Leases found lost (renewal or fenced write).", registry=r
        )
        self.lease_expiries = Counter(
            "fencepost_lease_expiries",
            "Leases that expired unacknowledged, ended by this process: by its reaper, or "
            "taken over by one of its claims (claim_due on an expired lease).",
            registry=r,
        )
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
        self.deliveries = Counter(
            "fencepost_deliveries", "Deliveries by how they ended.", ["outcome"], registry=r
        )
        self.delivery_seconds = Histogram(
            "fencepost_delivery_duration_seconds", "Claim to end of delivery.",
            buckets=DURATION_BUCKETS, registry=r,
        )
        self.step_seconds = Histogram(
            "fencepost_step_duration_seconds", "Step function run time (all attempts).",
            buckets=DURATION_BUCKETS, registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


# One per process: the worker's dispatcher and the SDK count into it.
METRICS = ProcessMetrics()


class _Snapshot:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


async def render_database_metrics(store: ExecutionStore) -> bytes:
    """Gauges read from the database at scrape time."""
    snap = await store.metrics_snapshot()
    by_status = GaugeMetricFamily(
        "fencepost_executions", "Unfinished executions by status.", labels=["status"]
    )
    for status in ("admitted", "running", "suspended", "parked"):
        by_status.add_metric([status], snap["by_status"].get(status, 0))
    parked = GaugeMetricFamily(
        "fencepost_parked_executions", "Parked executions by reason.", labels=["reason"]
    )
    for reason in ("outcome_unknown", "poison"):
        parked.add_metric([reason], snap["parked"].get(reason, 0))
    families = [
        by_status,
        parked,
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
                          "How long the longest-waiting due execution has waited.",
                          value=snap["oldest_due_age"]),
    ]
    registry = CollectorRegistry()
    registry.register(_Snapshot(families))
    return generate_latest(registry)
