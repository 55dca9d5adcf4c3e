"""Every request body takes its fields' JSON types as the schema states them,
never a look-alike: a number is not a boolean (0 for false), a boolean or a
string is not a count (false for 0; 2.0 is, as in JSON), a number is not a
string, and a time is a date and time with its offset, never a number or
digits read as a Unix time."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from app.api.models import AdmitRequest, WakeRequest
from app.api.routes.bulk import BulkResolution, OperationFilter, OperationRequest
from app.api.routes.operations import ActorBody, Resolution, StepError
from app.api.routes.redrive import ForkRequest, RedriveRequest
from app.api.routes.schedules import ScheduleRequest

SCHEDULE = {"scheduleId": "s", "workflowId": "w", "cron": "0 2 * * *", "timezone": "UTC"}
BULK = {"action": "cancel", "filter": {"workflowId": "w"}}

# model -> (a valid body, [the same body with one field given a look-alike type])
CASES: dict[type[BaseModel], tuple[dict[str, Any], list[dict[str, Any]]]] = {
    AdmitRequest: ({"workflowId": "w", "timeoutSeconds": 60}, [
        {"workflowId": 5}, {"workflowId": "w", "executionId": 7},
        {"workflowId": "w", "timeoutSeconds": True}, {"workflowId": "w", "timeoutSeconds": "60"},
        {"workflowId": "w", "deadline": 0}, {"workflowId": "w", "deadline": "1767225600"},
        {"workflowId": "w", "ifExists": True}]),
    WakeRequest: ({"at": "2026-01-01T00:00:00Z"}, [
        {"at": 0}, {"at": "0"}, {"at": "2026-01-01"}, {"at": "2026-01-01T00:00:00"}]),
    OperationRequest: ({**BULK, "dryRun": True}, [
        {**BULK, "dryRun": 0}, {**BULK, "dryRun": 1}, {**BULK, "dryRun": "true"},
        {**BULK, "reason": 5}, {**BULK, "by": 5}, {**BULK, "fromStep": 5},
        {**BULK, "timeoutSeconds": True}]),
    OperationFilter: ({"minUnacknowledgedDeliveries": 2, "admittedFrom": "2026-01-01T00:00:00Z"},
                      [{"minUnacknowledgedDeliveries": False},
                       {"minUnacknowledgedDeliveries": True},
                       {"minUnacknowledgedDeliveries": "2"},
                       {"minUnacknowledgedDeliveries": 2.5},
                       {"workflowId": 5}, {"executionIds": [5]},
                       {"admittedFrom": 0}, {"admittedTo": "1767225600"}]),
    BulkResolution: ({"action": "fail", "error": {"name": "E"}}, [
        {"action": 1}, {"action": "fail", "error": {"name": 5}}]),
    RedriveRequest: ({"fromStep": "s", "timeoutSeconds": 60}, [
        {"fromStep": 5}, {"timeoutSeconds": True}, {"timeoutSeconds": "60"},
        {"deadline": 0}, {"reason": 5}, {"by": 5}]),
    ForkRequest: ({"fromStep": "s"}, [
        {"fromStep": 5}, {"fromStep": "s", "executionId": 5}, {"fromStep": "s", "by": True}]),
    ActorBody: ({"by": "alice"}, [{"by": 5}, {"by": True}]),
    StepError: ({"name": "E", "message": "m"}, [
        {"name": 5}, {"name": "E", "message": 5}, {"name": True}]),
    Resolution: ({"action": "retry", "by": "alice"}, [
        {"action": 1}, {"action": "retry", "by": 5}]),
    ScheduleRequest: ({**SCHEDULE, "catchUp": 3}, [
        {**SCHEDULE, "catchUp": True}, {**SCHEDULE, "catchUp": "3"},
        {**SCHEDULE, "scheduleId": 5},
        {**SCHEDULE, "cron": 5}, {**SCHEDULE, "timezone": 0}]),
}


@pytest.mark.parametrize("model", list(CASES), ids=lambda m: m.__name__)
def test_a_request_body_refuses_look_alike_types(model: type[BaseModel]) -> None:
    valid, loose = CASES[model]
    model.model_validate(valid)
    # JSON has no other integer than a number: 2.0 is 2 (and 2.5 is refused)
    if model is OperationFilter:
        assert OperationFilter.model_validate(
            {"minUnacknowledgedDeliveries": 2.0}).min_unacknowledged_deliveries == 2
    if model is ScheduleRequest:
        assert ScheduleRequest.model_validate({**SCHEDULE, "catchUp": 3.0}).catch_up == 3
        with pytest.raises(ValidationError):
            ScheduleRequest.model_validate({**SCHEDULE, "catchUp": 2.5})
    accepted = []
    for body in loose:
        try:
            model.model_validate(body)
        except ValidationError:
            continue
        accepted.append(body)
    assert not accepted, (model.__name__, accepted)
