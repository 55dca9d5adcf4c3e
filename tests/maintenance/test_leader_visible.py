"""Who leads, as operators see it: GET /v1/workers names the maintenance
roles each worker holds an unexpired lease on (`maintenanceRoles`, documented
in the OpenAPI schema), and a worker's fencepost_maintenance_leader{role}
gauge is 1 while its Leadership holds the role, 0 otherwise."""

from __future__ import annotations

import re

import pytest

from app.maintenance import SWEEPS, Leadership, schedules_role
from app.metrics import METRICS
from app.settings import Settings
from app.store import ExecutionStore
from tests.support.asgi import asgi_client
from tests.support.waiting import wait_until

NO_AUTH = {"auth": "disabled"} if "auth" in Settings.model_fields else {}


@pytest.fixture
def store_settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, lease_seconds=30, **NO_AUTH)


async def test_the_workers_list_names_the_roles_each_worker_holds_now(
        store: ExecutionStore, store_settings: Settings):
    for name in ("A", "B", "C"):
        await store.workers.register_worker(name, host="h", pid=1, workflows=["a"],
                                            concurrency=1)
    leases = store.maintenance
    sweeps = await leases.acquire(SWEEPS, "A", 30)
    assert sweeps is not None
    assert await leases.acquire(schedules_role(["a"]), "A", 30) is not None
    assert await leases.acquire(schedules_role(["b"]), "B", 30) is not None
    expired = await leases.acquire(schedules_role(["c"]), "C", 0.1)
    assert expired is not None
    await wait_until(lambda: _not(leases.holds(expired)), timeout=10, what="C's term to end")

    async with asgi_client(store_settings) as api:
        async def roles() -> dict[str, list[str]]:
            listed = (await api.get("/v1/workers")).raise_for_status().json()["workers"]
            return {w["workerId"]: w["maintenanceRoles"] for w in listed}

        # An expired term is no role; roles are listed by name.
        assert await roles() == {"A": ["schedules a", SWEEPS], "B": ["schedules b"], "C": []}
        await leases.release(sweeps)
        assert await roles() == {"A": ["schedules a"], "B": ["schedules b"], "C": []}

        # The dashboard's workers page says the same, in a column of its own.
        page = (await api.get("/ui/workers")).raise_for_status().text
        rows = {m[0]: m[1] for m in re.findall(
            r"<td><code>(\w)</code></td>.*?<td class=\"roles\">(.*?)</td>", page, re.S)}
        assert rows == {"A": '<span class="role">schedules a</span> ',
                        "B": '<span class="role">schedules b</span> ', "C": ""}

        schema = (await api.get("/openapi.json")).json()
        ok = schema["paths"]["/v1/workers"]["get"]["responses"]["200"]["content"]
        ref = ok["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        item = schema["components"]["schemas"][ref]["properties"]["workers"]["items"]["$ref"]
        field = schema["components"]["schemas"][item.rsplit("/", 1)[-1]]["properties"][
            "maintenanceRoles"]
        assert field["type"] == "array" and "sweeps" in field["description"]


async def _not(value) -> bool:
    return not await value


def _gauge(role: str) -> float | None:
    return METRICS.registry.get_sample_value("fencepost_maintenance_leader", {"role": role})


async def test_the_leader_gauge_follows_the_term(store: ExecutionStore):
    role = "gauge-test"  # a role of this test's own: the registry is the process's
    a = Leadership(store.maintenance, role, "A", 1.0)
    assert _gauge(role) == 0  # known from the start, before any attempt
    assert await a.attempt() and _gauge(role) == 1
    await a.release()
    assert _gauge(role) == 0
    assert await a.attempt() and _gauge(role) == 1
    # Its term expires and another worker takes the role: the next check in
    # the database (before a sweep) finds it over.
    assert await store.maintenance.acquire(role, "B", 30) is None  # A's term stands
    await wait_until(lambda: store.maintenance.acquire(role, "B", 30), timeout=10,
                     what="B taking the role over once A's 1 s term expires")
    assert not await a.leading() and _gauge(role) == 0
    assert not await a.attempt() and _gauge(role) == 0
