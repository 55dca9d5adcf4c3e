"""Workflow registration and loading.

`@workflow(...)` adds a definition to the process-wide registry when its module
is imported; `load_workflows(modules)` imports the modules named by
`FENCEPOST_WORKFLOWS` / `--workflows` and returns what they registered. API and
workers load the same modules, so admission can refuse unknown workflows and
validate params against the same model the worker will use.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app import cron
from app.queues import DEFAULT_QUEUE, Queue, QueueSettingsError

ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
# IDs fencepost derives (children `{parent}~{key}`, schedule slots
# `{scheduleId}~{YYYY-MM-DDTHH:MMZ}`) join their parts with `~`, which is
# outside the client ID alphabet above: admission refuses it from clients
# (422 RESERVED_EXECUTION_ID), so no client can take a derived ID first.
SYSTEM_ID_SEPARATOR = "~"
# A slot ID is the schedule ID + 18 characters, within the 200 of an ID.
SCHEDULE_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,182}$")
# Roles a workflow may require of a signal's sender (`signals=`).
SIGNAL_ROLES = ("trigger", "operate")


@dataclass(frozen=True)
class WorkflowDefinition:
    workflow_id: str
    fn: Callable[..., Awaitable[Any]]
    params_model: type[BaseModel] | None
    module: str
    # Default deadline, counted from admission, when the caller gives none.
    timeout_seconds: float | None = None
    # A code-defined schedule (cron expression and IANA time zone); its
    # schedule ID is the workflow ID. Slots are admitted with params {}.
    schedule: str | None = None
    timezone: str | None = None
    # Recorded on each execution admitted under it (`codeVersion`), so an
    # operator can tell which code a stuck or failed execution started with.
    version: str | None = None
    # Default bound of each step attempt (seconds); `ctx.step(timeout=)` overrides.
    step_timeout: float | None = None
    # Seconds the code may run its cleanup (`except Cancelled:`, `finally:`)
    # after a cancel request or the deadline; None: the worker's
    # FENCEPOST_CANCEL_GRACE_SECONDS. 0: no cleanup delivery at all.
    cancel_grace: float | None = None
    # Signal name -> the roles that may send it (any of them); signals not
    # named here may be sent by any token allowed to signal the execution.
    signal_roles: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Flow control: the queue its executions are admitted to, and how the
    # concurrency key of one is found from its params (JSON, as admitted):
    # a top-level field's name, or a function returning a string or None.
    queue: Queue = Queue(DEFAULT_QUEUE)
    concurrency_key: str | Callable[[Any], Any] | None = None

    def key_of(self, raw_params: Any) -> str | None:
        """The concurrency key of an execution with these params (None: no
        key, so no per-key limit applies to it)."""
        if self.concurrency_key is None:
            return None
        if isinstance(self.concurrency_key, str):
            value = raw_params.get(self.concurrency_key) if isinstance(raw_params, dict) else None
        else:
            try:
                value = self.concurrency_key(raw_params)
            except Exception as exc:  # the author's function: any failure is theirs to fix
                raise ValueError(f"the concurrency_key function of {self.workflow_id!r} raised "
                                 f"{type(exc).__name__}: {exc}") from None
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"the concurrency key of {self.workflow_id!r} must be a string or "
                             f"an integer, not {type(value).__name__}")
        key = str(value)
        if not 1 <= len(key) <= 200:
            raise ValueError(f"the concurrency key of {self.workflow_id!r} must be 1-200 "
                             "characters")
        return key

    def may_signal(self, name: str, roles: frozenset[str] | set[str]) -> bool:
        """Whether a sender holding `roles` may send signal `name`."""
        required = self.signal_roles.get(name)
        return required is None or bool(required & set(roles))

    def parse_params(self, raw: Any) -> Any:
        """The value handed to workflow code: a model instance when declared."""
        if self.params_model is None:
            return raw
        return self.params_model.model_validate(raw)


_registry: dict[str, WorkflowDefinition] = {}
# Queues declared by registered workflows, by name: one declaration per name.
_queues: dict[str, Queue] = {}

# A cleanup window longer than a day is a mistake, not a policy.
MAX_CANCEL_GRACE = 86400.0


class WorkflowRegistrationError(ValueError):
    pass


# A workflow's async function `(ctx, params) -> JSON value`, returned unchanged by @workflow.
WorkflowFunction = TypeVar("WorkflowFunction", bound=Callable[..., Awaitable[Any]])


def workflow(workflow_id: str, *, params: type[BaseModel] | None = None,
             timeout: float | timedelta | None = None, schedule: str | None = None,
             timezone: str | None = None, version: str | None = None,
             step_timeout: float | timedelta | None = None,
             cancel_grace: float | timedelta | None = None,
             signals: Mapping[str, str | Iterable[str]] | None = None,
             queue: str | Queue | None = None,
             concurrency_key: str | Callable[[Any], Any] | None = None,
             ) -> Callable[[WorkflowFunction], WorkflowFunction]:
    """Register an async function `(ctx, params) -> JSON value` as `workflow_id`.
    `timeout`: the default deadline, from admission, for its executions.
    `step_timeout`: the default bound of each step attempt (StepTimeout past it).
    `cancel_grace`: how long cleanup code may run once a cancel is requested or
    the deadline passes (default: the worker's FENCEPOST_CANCEL_GRACE_SECONDS;
    0: none, the execution ends at once).
    `schedule`: a five-field cron expression (see app.cron) evaluated in
    `timezone` (IANA name, default UTC); workers running this workflow admit
    each slot once, as `{workflow_id}~{slot in UTC}`, with params {}.
    `signals`: who may send a signal, by name: {"approval": "operate"} lets
    only operate tokens (and the dashboard's operators) send `approval`; others
    get 403 FORBIDDEN and nothing is stored. A role or a list of roles from
    "trigger", "operate".
    `queue`: the queue (a `Queue`, or the name of one whose limits are set at
    run time) its executions are admitted to; default "default", unlimited.
    `concurrency_key`: how an execution's concurrency key is found from its
    params (as admitted, JSON): a top-level field's name, or a function of the
    params returning a string (or None: no key). The API and the workers load
    the same modules, so each computes it the same way; an admission's
    `concurrencyKey` wins over it."""
    if not ID_RE.match(workflow_id):
        raise WorkflowRegistrationError(
            f"workflow ID {workflow_id!r} must be 1-200 characters from A-Z a-z 0-9 . _ : -"
        )
    if params is not None and not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise WorkflowRegistrationError(f"params= of {workflow_id!r} must be a pydantic model class")

    timeout_seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise WorkflowRegistrationError(f"timeout= of {workflow_id!r} must be positive")

    step_timeout_seconds = (
        step_timeout.total_seconds() if isinstance(step_timeout, timedelta) else step_timeout
    )
    if step_timeout_seconds is not None and not step_timeout_seconds > 0:
        raise WorkflowRegistrationError(f"step_timeout= of {workflow_id!r} must be positive")

    cancel_grace_seconds = (
        cancel_grace.total_seconds() if isinstance(cancel_grace, timedelta) else cancel_grace
    )
    if cancel_grace_seconds is not None and not 0 <= cancel_grace_seconds <= MAX_CANCEL_GRACE:
        raise WorkflowRegistrationError(
            f"cancel_grace= of {workflow_id!r} must be between 0 and {MAX_CANCEL_GRACE:g} seconds")

    signal_roles = _signal_roles(workflow_id, signals)
    try:
        declared = queue if isinstance(queue, Queue) else Queue(queue or DEFAULT_QUEUE)
    except QueueSettingsError as exc:
        raise WorkflowRegistrationError(f"queue= of {workflow_id!r}: {exc}") from None
    if concurrency_key is not None and not (isinstance(concurrency_key, str)
                                            or callable(concurrency_key)):
        raise WorkflowRegistrationError(
            f"concurrency_key= of {workflow_id!r} must be a params field name or a function")

    if schedule is not None or timezone is not None:
        _check_schedule(workflow_id, params, schedule, timezone)
        timezone = timezone or "UTC"

    def register(fn: WorkflowFunction) -> WorkflowFunction:
        candidate: object = fn  # checked as an object: fn keeps its own type for the return
        if not inspect.iscoroutinefunction(candidate):
            raise WorkflowRegistrationError(f"workflow {workflow_id!r} must be an async function")
        existing = _registry.get(workflow_id)
        if existing is not None and (existing.module, existing.fn.__qualname__) != (
            fn.__module__,
            fn.__qualname__,
        ):
            raise WorkflowRegistrationError(
                f"workflow {workflow_id!r} is registered twice "
                f"({existing.module}.{existing.fn.__qualname__} and {fn.__module__}.{fn.__qualname__})"
            )
        if isinstance(queue, Queue):
            other = _queues.get(queue.name)
            if other is not None and other != queue:
                raise WorkflowRegistrationError(
                    f"queue {queue.name!r} is declared twice with different settings "
                    f"({other} and {queue}): declare it once and name it in both workflows")
            _queues[queue.name] = queue
        _registry[workflow_id] = WorkflowDefinition(
            workflow_id, fn, params, fn.__module__, timeout_seconds,
            schedule=schedule, timezone=timezone, version=version,
            step_timeout=step_timeout_seconds, signal_roles=signal_roles,
            cancel_grace=cancel_grace_seconds, queue=declared, concurrency_key=concurrency_key,
        )
        return fn

    return register


def _signal_roles(workflow_id: str, signals: Mapping[str, str | Iterable[str]] | None
                  ) -> dict[str, frozenset[str]]:
    if signals is None:
        return {}
    if not isinstance(signals, Mapping):
        raise WorkflowRegistrationError(
            f"signals= of {workflow_id!r} must map signal names to roles, "
            'for example {"approval": "operate"}'
        )
    out = {}
    for name, roles in signals.items():
        if not isinstance(name, str) or not ID_RE.match(name):
            raise WorkflowRegistrationError(
                f"signals= of {workflow_id!r}: signal name {name!r} must be 1-200 characters "
                "from A-Z a-z 0-9 . _ : -"
            )
        wanted = frozenset([roles] if isinstance(roles, str) else roles)
        if not wanted or not wanted <= set(SIGNAL_ROLES):
            raise WorkflowRegistrationError(
                f"signals= of {workflow_id!r}: signal {name!r} needs one or more roles from "
                f"{', '.join(SIGNAL_ROLES)} (got {roles!r})"
            )
        out[name] = wanted
    return out


def _check_schedule(workflow_id: str, params: type[BaseModel] | None, schedule: str | None,
                    timezone: str | None) -> None:
    if schedule is None:
        raise WorkflowRegistrationError(
            f"timezone= of {workflow_id!r} needs schedule= (a cron expression)"
        )
    if not SCHEDULE_ID_RE.match(workflow_id):
        raise WorkflowRegistrationError(
            f"workflow {workflow_id!r} has a schedule, so its ID (the schedule ID) must be at "
            "most 182 characters"
        )
    try:
        cron.parse(schedule)
    except cron.CronError as exc:
        raise WorkflowRegistrationError(
            f"schedule= of {workflow_id!r}: {exc}"
        ) from None
    if timezone is not None:
        try:
            cron.zone(timezone)
        except cron.TimezoneError as exc:
            raise WorkflowRegistrationError(f"timezone= of {workflow_id!r}: {exc}") from None
    if params is not None:
        try:
            params.model_validate({})
        except ValidationError:
            raise WorkflowRegistrationError(
                f"workflow {workflow_id!r} has a schedule, and scheduled executions are admitted "
                f"with params {{}}, which its params model {params.__name__} refuses; give "
                "every field a default"
            ) from None


def load_workflows(modules: list[str]) -> dict[str, WorkflowDefinition]:
    """Import each module (registering its workflows) and return the workflows
    those modules define."""
    wanted = set()
    for name in modules:
        module = importlib.import_module(name)
        wanted.add(module.__name__)
    return {wid: d for wid, d in _registry.items() if d.module in wanted or _defined_under(d, wanted)}


def _defined_under(definition: WorkflowDefinition, modules: set[str]) -> bool:
    return any(definition.module.startswith(m + ".") for m in modules)


def declared_queues(definitions: Mapping[str, WorkflowDefinition]) -> list[Queue]:
    """The queues these workflows declare with settings (a queue named only
    by a string declares nothing: its settings come from run time)."""
    found: dict[str, Queue] = {}
    for d in definitions.values():
        if d.queue.name in _queues:
            found[d.queue.name] = _queues[d.queue.name]
    return [found[name] for name in sorted(found)]
