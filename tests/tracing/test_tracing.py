"""Issue 14 item 5: one trace from the request that admitted an execution to
every step that ran it. In process with an in-memory exporter (admission ->
delivery -> three step spans, correctly parented); and under real worker
processes exporting to their console, across a redelivery after a SIGKILL."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app import tracing
from app.registry import load_workflows
from app.store import ExecutionStore
from tests.support.asgi import asgi_client
from tests.support.harness import (
    LEASE_SECONDS,
    Harness,
    opened,
    steps_spec,
)
from tests.support.timing import quick_settings
from tests.support.waiting import wait_status
from tests.support.workers import InProcessWorkers

pytestmark = pytest.mark.timeout(90)

WORKFLOWS = load_workflows(["tests.worker_processes.flows"])
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.PROVIDER = provider
    try:
        yield exporter
    finally:
        tracing.PROVIDER = None


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


async def test_admission_delivery_and_steps_are_one_trace(database_url, pool, spans,
                                                         tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ACC_MARK_DIR", str(tmp_path))  # where the step function leaves marks
    settings = quick_settings(database_url, auth="disabled", workflows="")
    store = ExecutionStore.from_settings(pool, settings)
    workers = InProcessWorkers(settings, WORKFLOWS)
    try:
        async with asgi_client(settings, WORKFLOWS) as api:
            r = await api.post("/v1/executions", headers={
                "traceparent": f"00-{TRACE}-{CALLER}-01"}, json={
                "workflowId": "acc-steps", "executionId": "traced-1",
                "params": steps_spec("one", "two", "three")})
            assert r.status_code == 201, r.text
            await workers.start()
            await wait_status(store, "traced-1", "completed")
    finally:
        await workers.stop_all()

    finished = spans.get_finished_spans()
    for s in sorted(finished, key=lambda s: s.start_time):
        print(f"span {s.name!r} trace {_hex(s.context.trace_id, 32)} "
              f"id {_hex(s.context.span_id, 16)} parent "
              f"{_hex(s.parent.span_id, 16) if s.parent else None}")
    by_name = {s.name: s for s in finished}
    admit, delivery = by_name["fencepost admit"], by_name["fencepost delivery"]
    steps = [by_name[f"fencepost step {k}"] for k in ("one", "two", "three")]
    assert {_hex(s.context.trace_id, 32) for s in [admit, delivery, *steps]} == {TRACE}
    assert _hex(admit.parent.span_id, 16) == CALLER
    assert delivery.parent.span_id == admit.context.span_id
    assert all(s.parent.span_id == delivery.context.span_id for s in steps)
    assert delivery.attributes["fencepost.execution_id"] == "traced-1"
    assert delivery.attributes["fencepost.token"] == 1
    assert steps[0].attributes["fencepost.step_key"] == "one"
    stored = await pool.fetchval(
        "SELECT traceparent FROM executions WHERE execution_id = 'traced-1'")
    assert stored.startswith(f"00-{TRACE}-{_hex(admit.context.span_id, 16)}-")


async def test_a_malformed_traceparent_is_ignored_and_a_new_trace_begins(
        database_url, pool, spans) -> None:
    settings = quick_settings(database_url, auth="disabled", workflows="")
    async with asgi_client(settings, WORKFLOWS) as api:
        r = await api.post("/v1/executions", headers={"traceparent": "00-nonsense"}, json={
            "workflowId": "acc-steps", "executionId": "traced-2", "params": steps_spec("one")})
        assert r.status_code == 201, r.text
    [admit] = spans.get_finished_spans()
    assert admit.parent is None
    assert (await pool.fetchval("SELECT traceparent FROM executions")).startswith(
        f"00-{_hex(admit.context.trace_id, 32)}-{_hex(admit.context.span_id, 16)}-")


# --------------------------------------------------------- real worker processes


class TracedHarness(Harness):
    worker_prefix = "traced-worker"


@pytest_asyncio.fixture
async def harness(database_url, tmp_path, request) -> AsyncIterator[Harness]:
    async with opened(TracedHarness(database_url, tmp_path / "h"), request) as h:
        yield h


def exported(h: Harness) -> list[dict]:
    """Spans the workers printed (OTEL_TRACES_EXPORTER=console: one JSON line each)."""
    out = []
    for w in h.workers:
        for line in w.log().splitlines():
            if line.startswith('{"name": "fencepost'):
                out.append(json.loads(line))
    return out


async def test_the_trace_continues_across_a_redelivery_after_a_sigkill(harness) -> None:
    h = harness
    console = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "fencepost-test"}
    a = await h.start_worker("A", settings=console)
    await h.store.admissions.admit(workflow_id="acc-steps", execution_id="traced-3",
                        params=steps_spec("one", "two", "three", two={"block_first": 60}),
                        traceparent=f"00-{TRACE}-{CALLER}-01")
    await h.wait_for(lambda: h.started("traced-3", "two", pid=a.pid), timeout=10,
                     what="A inside step two")
    a.signal(signal.SIGKILL)
    b = await h.start_worker("B", settings=console)
    await h.wait_for(lambda: h.has_status("traced-3", "completed"), timeout=LEASE_SECONDS + 20,
                     what="B completes it")

    found = exported(h)
    assert {s["context"]["trace_id"] for s in found} == {f"0x{TRACE}"}, found
    deliveries = {s["attributes"]["fencepost.worker_id"]: s for s in found
                  if s["name"] == "fencepost delivery"}
    # A's delivery span never ended (SIGKILL), B's did; both are children of the admission.
    assert set(deliveries) == {b.worker_id}, deliveries
    assert deliveries[b.worker_id]["parent_id"] == f"0x{CALLER}"
    assert deliveries[b.worker_id]["attributes"]["fencepost.token"] == 2
    steps = {(s["name"], s["resource"]["attributes"].get("service.name"), s["parent_id"])
             for s in found if s["name"].startswith("fencepost step")}
    b_delivery = deliveries[b.worker_id]["context"]["span_id"]
    # A ran one (its span ended before the kill); B ran two and three (one replayed: no span).
    assert ("fencepost step two", "fencepost-test", b_delivery) in steps, steps
    assert ("fencepost step three", "fencepost-test", b_delivery) in steps, steps
    one = [s for s in found if s["name"] == "fencepost step one"]
    assert len(one) == 1 and one[0]["parent_id"] != b_delivery, one
    print("spans exported by the workers:", sorted((s["name"], s["parent_id"]) for s in found))
