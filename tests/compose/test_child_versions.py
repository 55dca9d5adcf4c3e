"""Children record the code version they are started under, and route by it:
a child's codeVersion is the child workflow's own version in the parent's
code (not the parent's version), and a worker carrying another version of
the child's workflow never claims it. A child whose workflow the parent's
code does not carry is unversioned: any worker carrying it runs it.

Each worker runs in-process with its own registry: the definitions of
tests/compose/versionflows.py at the versions that worker's code carries."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.registry import WorkflowDefinition, load_workflows
from app.settings import Settings
from app.worker import Worker
from tests.compose import versionflows
from tests.support.admission import admit
from tests.support.history import events_of
from tests.support.waiting import wait_status, wait_until
from tests.support.workers import InProcessWorkers

DEFINED = load_workflows(["tests.compose.versionflows"])


def code(**versions: str | None) -> dict[str, WorkflowDefinition]:
    """A worker's registry: each named workflow (`ver_cmp_parent` for
    ver-cmp-parent) at the given version."""
    out = {}
    for name, version in versions.items():
        wid = name.replace("_", "-")
        out[wid] = dataclasses.replace(DEFINED[wid], version=version)
    return out


@pytest_asyncio.fixture
async def running(cmp_settings: Settings, store) -> AsyncIterator[InProcessWorkers]:
    versionflows.reset()

    def open_gates() -> None:
        for event in versionflows.GATES.values():
            event.set()

    workers = InProcessWorkers(cmp_settings, {}, before_stop=open_gates)
    try:
        yield workers
    finally:
        await workers.stop_all()


async def claimers(store, execution_id: str) -> list[str]:
    return [e["detail"]["owner"] for e in await events_of(store, execution_id, "claimed")]


async def more_rounds(workers: InProcessWorkers, worker: Worker, n: int = 3) -> None:
    """Return once `worker` has looked for due executions `n` more times."""
    start = workers.rounds[worker]
    await wait_until(lambda: workers.rounds[worker] >= start + n, timeout=10,
                     what=f"{n} more claim rounds of {worker.worker_id}")


@pytest.mark.citus
async def test_a_child_records_its_own_workflows_version_in_the_parents_code(store, running):
    w = await running.start(workflows=code(ver_cmp_parent="p7", ver_cmp_child="c3"))
    parent = await admit(store, "ver-cmp-parent", "child-version", {}, code_version="p7")

    record = await wait_status(store, parent, "completed")

    child_id = record["outcome"]["result"]["child"]
    child = await store.history.get(child_id)
    assert (child["workflow_id"], child["code_version"]) == ("ver-cmp-child", "c3")
    assert record["code_version"] == "p7"
    assert await claimers(store, child_id) == [w.worker_id]


@pytest.mark.citus
async def test_a_v2_only_child_is_not_claimed_by_a_v1_worker(store, running):
    # v1 runs both workflows at version 1; v2 (one slot) both at version 2.
    v1 = await running.start(workflows=code(ver_cmp_parent="1", ver_cmp_child="1"))
    v2 = await running.start(concurrency=1,
                             workflows=code(ver_cmp_parent="2", ver_cmp_child="2"))
    parent = await admit(store, "ver-cmp-parent", "v2-parent", {"hold": True},
                         code_version="2")
    child_id = f"{parent}~child"

    # v2's only slot is held by the parent (inside step `hold`) while the
    # child, started under version 2, is due: v1 looks and never takes it.
    await wait_until(lambda: store.history.get(child_id), what="the child admitted")
    assert (await store.history.get(child_id))["code_version"] == "2"
    await more_rounds(running, v1)
    child = await store.history.get(child_id)
    assert child["status"] == "admitted" and await claimers(store, child_id) == []

    versionflows.gate(parent).set()
    record = await wait_status(store, parent, "completed")

    assert record["outcome"]["result"]["result"] == {"child": child_id}
    assert await claimers(store, child_id) == [v2.worker_id]
    assert set(await claimers(store, parent)) == {v2.worker_id}


@pytest.mark.citus
async def test_a_child_the_parents_code_does_not_carry_is_run_by_any_worker_carrying_it(
        store, running):
    w = await running.start(workflows=code(ver_cmp_parent="1"))
    parent = await admit(store, "ver-cmp-parent", "elsewhere-parent",
                         {"child": "ver-cmp-elsewhere"}, code_version="1")
    child_id = f"{parent}~child"
    await wait_status(store, parent, "suspended")
    assert (await store.history.get(child_id))["code_version"] is None

    other = await running.start(workflows=code(ver_cmp_elsewhere="9"))
    record = await wait_status(store, parent, "completed")

    assert record["outcome"]["result"]["result"] == {"elsewhere": child_id}
    assert await claimers(store, child_id) == [other.worker_id]
    assert w.worker_id in await claimers(store, parent)
