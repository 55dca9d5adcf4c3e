"""The one refusal shape every operator command raises, and the words each
caller uses to say what to do next.

A refusal carries the HTTP status, the stable code and a sentence: the fact
(the same wherever the command runs) and then a hint naming where to go
next, worded for the caller (the API names its routes, the dashboard its
pages). The API answers it as `{"error": {"code", "message", ...extra}}`,
the dashboard renders it as its error page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


class CommandError(Exception):
    """A refusal: `http_status`, stable `code`, `message`; `headers` (e.g.
    Retry-After) and `extra` fields travel with it into the error body."""

    def __init__(self, http_status: int, code: str, message: str, *,
                 headers: dict | None = None, **extra: Any):
        super().__init__(message)
        self.http_status = http_status
        self.code = code
        self.message = message
        self.headers = headers
        self.extra = extra


@dataclass(frozen=True)
class Wording:
    """The hints a refusal ends with; None: the fact alone."""

    not_found: str = "check the ID, or admit it with POST /v1/executions"
    resolve_instead: str = "an outcome-unknown step is settled with POST .../steps/{key}/resolve"
    step_keys: str | None = ("the keys it has are listed by GET /v1/executions/{id}/steps "
                             "(a key is percent-encoded in the path)")
    see_steps: str | None = "see GET /v1/executions/{id}/steps"
    recorded_steps: str = "see GET /v1/executions/{id}/steps"
    needs_from_step: str = "give fromStep to run it again from that step on"
    other_fork_id: str = "fork under another executionId, or omit it"
    time_filters: str = "admittedFrom / admittedTo"
    plain_json: str = "send plain JSON"
    the_result: str = "result"


API = Wording()

DASHBOARD = Wording(
    not_found="check the ID",
    resolve_instead="an outcome-unknown step is settled by resolving it",
    step_keys=None,
    see_steps=None,
    recorded_steps="choose one of the steps its page lists",
    needs_from_step=("choose the step to run it again from (that step and every step "
                     "recorded after it run again)"),
    other_fork_id="fork under another ID, or leave it empty for a generated one",
    time_filters="admitted from / to",
    plain_json="give plain JSON",
    the_result="the result",
)


def sentence(fact: str, hint: str | None) -> str:
    return f"{fact}; {hint}" if hint else fact


# Postgres text cannot hold NUL (nor lone surrogates, which do not encode as
# UTF-8): no stored row has such an ID, and sending one to Postgres would
# fail with a DataError instead of answering.
UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


def execution_not_found(execution_id: str, wording: Wording = API) -> CommandError:
    return CommandError(404, "EXECUTION_NOT_FOUND", sentence(
        f"no execution with ID {execution_id!r}", wording.not_found))


def check_execution_id(execution_id: str, wording: Wording = API) -> None:
    """An ID no stored execution can have is not found, without a query."""
    if UNSTORABLE_TEXT.search(execution_id):
        raise execution_not_found(execution_id, wording)


def invalid(exc: ValidationError, code: str = "INVALID_REQUEST",
            prefix: str | None = None) -> CommandError:
    """A pydantic validation failure as a 422 naming the first problem; all
    of them in `details`."""
    head = [prefix] if prefix else []
    problems = [
        {"loc": head + [str(p) for p in e["loc"]], "message": e["msg"]} for e in exc.errors()
    ]
    first = problems[0]
    where = ".".join(first["loc"]) or "body"
    return CommandError(
        422, code, f"{where}: {first['message']}; fix it and send the request again",
        details=problems,
    )
