"""Store objects bound to one caller transaction (`store.transaction()`,
`store.run_in_transaction`): their statements commit together or roll back
together; a refused fenced write inside it rolls back only its savepoint."""

from __future__ import annotations

import pytest

from app.store import Admitted, ExecutionStore, LeaseLost


async def admit(store, eid: str) -> None:
    assert isinstance(await store.admissions.admit(workflow_id="wf", params={},
                                                   execution_id=eid), Admitted)


async def token_names(store: ExecutionStore) -> list[str]:
    return [t["name"] for t in await store.tokens.list_tokens()]


async def test_two_objects_writes_commit_together(store):
    async with store.transaction() as tx:
        await admit(tx, "tx-1")
        await tx.tokens.create_token("t1", name="ci", role="operate", secret_sha256="0" * 64)
        # Inside: each sees the other's uncommitted write; outside, nobody does.
        assert (await tx.history.get("tx-1"))["status"] == "admitted"
        assert await store.history.get("tx-1") is None
        assert await token_names(store) == []
    assert (await store.history.get("tx-1"))["status"] == "admitted"
    assert await token_names(store) == ["ci"]


async def test_two_objects_writes_roll_back_together(store):
    with pytest.raises(RuntimeError, match="caller gives up"):
        async with store.transaction() as tx:
            await admit(tx, "tx-2")
            await tx.tokens.create_token("t2", name="ci", role="operate", secret_sha256="0" * 64)
            raise RuntimeError("caller gives up")
    assert await store.history.get("tx-2") is None
    assert await store.history.events("tx-2") == []
    assert await token_names(store) == []


async def test_run_in_transaction_binds_every_object_to_one_transaction(store):
    async def work(tx) -> str:
        await admit(tx, "tx-3")
        answer, _ = await tx.operator.request_cancel("tx-3", "ops")
        return answer

    assert await store.run_in_transaction(work) == "cancelled"
    assert (await store.history.get("tx-3"))["status"] == "cancelled"
    with pytest.raises(ZeroDivisionError):
        await store.run_in_transaction(lambda tx: _admit_then_fail(tx, "tx-4"))
    assert await store.history.get("tx-4") is None


async def _admit_then_fail(tx, eid: str) -> None:
    await admit(tx, eid)
    1 / 0  # noqa: B018


async def test_a_refused_write_in_a_caller_transaction_rolls_back_only_itself(store, clock):
    await admit(store, "tx-5")
    [a] = await store.leases.claim_due(1, 30, "worker-A")
    await clock.expire_lease("tx-5")
    [b] = await store.leases.claim_due(1, 30, "worker-B")
    async with store.transaction() as tx:
        await admit(tx, "tx-6")
        with pytest.raises(LeaseLost):
            await tx.leases.release(a.lease)
        # The transaction goes on: the admission and the rejection both commit.
    assert (await store.history.get("tx-6"))["status"] == "admitted"
    rejected = [e for e in await store.history.events("tx-5")
                if e["kind"] == "fenced_write_rejected"]
    assert [e["token"] for e in rejected] == [a.lease.token]
    assert (await store.history.get("tx-5"))["token"] == b.lease.token
