"""Starting and stopping bulk operations, called directly against Postgres."""

from __future__ import annotations

from app.commands import DASHBOARD
from app.commands.operations import start_operation, stop_operation
from tests.commands.test_executions import refused
from tests.support.admission import admit


def _start(store, spec, action: str = "cancel", max_matched: int = 100, **kw):
    return start_operation(store, action, spec, "alice", options={}, reason=None,
                           max_matched=max_matched, **kw)


async def test_an_unknown_action_is_an_invalid_request(store) -> None:
    await refused(_start(store, {"status": "admitted"}, action="explode"),
                  422, "INVALID_REQUEST")


async def test_an_empty_filter_is_an_invalid_request(store) -> None:
    await refused(_start(store, {}), 422, "INVALID_REQUEST")


async def test_a_filter_matching_too_many_is_refused(store) -> None:
    for eid in ("m1", "m2"):
        await admit(store, "cmd-wait", eid)
    e = await refused(_start(store, {"workflowId": "cmd-wait"}, max_matched=1),
                      422, "TOO_MANY_MATCHED")
    assert "(e.g. admittedFrom / admittedTo)" in e.message
    e = await refused(_start(store, {"workflowId": "cmd-wait"}, max_matched=1,
                             wording=DASHBOARD), 422, "TOO_MANY_MATCHED")
    assert "(e.g. admitted from / to)" in e.message


async def test_stopping_a_missing_operation_is_not_found(store) -> None:
    await refused(stop_operation(store, "op-0000000000000000", "alice"),
                  404, "OPERATION_NOT_FOUND")
    await refused(stop_operation(store, "not an id", "alice"), 404, "OPERATION_NOT_FOUND")


async def test_stopping_a_stopped_operation_is_finished(store) -> None:
    await admit(store, "cmd-wait", "o1")
    record = await _start(store, {"executionIds": ["o1"]})
    await stop_operation(store, record["operation_id"], "alice")
    e = await refused(stop_operation(store, record["operation_id"], "alice"),
                      409, "OPERATION_FINISHED")
    assert e.extra == {"status": "cancelled"}
