"""Moving executions to another code version, one or many: each is checked
(its recorded history replayed against the target version's code, when
this process carries it) and moved only if it is still as checked. Every
refusal is a CommandError with a stable code, and nothing changes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.commands.errors import (
    API,
    UNSTORABLE_TEXT,
    CommandError,
    Wording,
    check_execution_id,
    execution_not_found,
)
from app.logs import operator_action
from app.registry import ID_RE, WorkflowDefinition
from app.replay import replay
from app.schema import TERMINAL_STATUSES
from app.store.versions import ANY_VERSION, MAX_CANDIDATES, Moved, Seen

PASSED, SKIPPED = "passed", "skipped"
MAX_VERSION = 200
DEFAULT_LIMIT = 100
MOVABLE_STATUSES = ("admitted", "running", "suspended", "parked")

# `await check(definition, history, workflows)` -> a report with ok, divergence,
# replayed (app.replay.replay's interface).
ReplayCheck = Callable[[WorkflowDefinition, dict, Mapping[str, WorkflowDefinition] | None],
                       Awaitable[Any]]


async def replay_check(definition: WorkflowDefinition, history: dict,
                       workflows: Mapping[str, WorkflowDefinition] | None) -> Any:
    return await replay(definition, history, dict(workflows) if workflows else None)


@dataclass(frozen=True)
class MoveDone:
    """One execution moved (or, in a dry run, that would move)."""

    moved: Moved
    check: str  # "passed" / "skipped"
    replayed: int | None  # recorded steps the check replayed; None when skipped


@dataclass(frozen=True)
class Refused:
    execution_id: str
    code: str
    message: str
    divergence: dict[str, Any] | None = None


@dataclass(frozen=True)
class BulkMoved:
    moved: list[str]
    refused: list[Refused]
    matched: int
    more: bool
    dry_run: bool
    done: list[MoveDone] = field(default_factory=list)


def check_version(to: Any, where: str = "to") -> None:
    """A version is a string of 1-200 characters Postgres can store, or None
    (unversioned)."""
    if to is None:
        return
    if not isinstance(to, str) or not 1 <= len(to) <= MAX_VERSION or UNSTORABLE_TEXT.search(to):
        raise CommandError(422, "INVALID_REQUEST",
                           f"{where}: a code version is 1-{MAX_VERSION} characters (the "
                           "version= of @workflow), or null for unversioned; fix it and send "
                           "it again")


def _label(version: str | None) -> str:
    return "unversioned" if version is None else f"version {version!r}"


def _unavailable(seen: Seen, to: str | None,
                 workflows: Mapping[str, WorkflowDefinition] | None) -> CommandError:
    definition = (workflows or {}).get(seen.workflow_id)
    carried = ("does not carry workflow " f"{seen.workflow_id!r}" if definition is None
               else f"carries {_label(definition.version)} of {seen.workflow_id!r}")
    return CommandError(409, "REPLAY_CHECK_UNAVAILABLE", (
        f"this API process {carried}, not {_label(to)}, so it cannot check that "
        f"{seen.execution_id!r}'s history fits the target code; run `fencepost replay "
        f"--workflows MODULE --execution {seen.execution_id}` with the target code, then "
        'repeat this request with "force": true'),
        carried=None if definition is None else definition.version)


async def _check(store, seen: Seen, to: str | None,
                 workflows: Mapping[str, WorkflowDefinition] | None,
                 check: ReplayCheck, wording: Wording) -> int:
    """Replay the history against the target code; the steps it replayed,
    or the refusal."""
    definition = (workflows or {}).get(seen.workflow_id)
    if definition is None or definition.version != to:
        raise _unavailable(seen, to, workflows)
    history = await store.exports.export(seen.execution_id)
    if history is None:
        raise execution_not_found(seen.execution_id, wording)
    try:
        report = await check(definition, history, workflows)
    except Exception as exc:  # the author's code or the document: a refusal, never a 500
        raise CommandError(409, "REPLAY_CHECK_FAILED", (
            f"the replay check of {seen.execution_id!r} could not run: "
            f"{type(exc).__name__}: {exc}; run `fencepost replay --execution "
            f"{seen.execution_id}` to see why, or repeat with \"force\": true")) from None
    if not report.ok:
        divergence = report.divergence or {}
        raise CommandError(409, "REPLAY_DIVERGES", (
            f"{_label(to)} of {seen.workflow_id!r} does not fit the recorded history of "
            f"{seen.execution_id!r}: {divergence.get('message', 'it diverges')}; nothing was "
            "moved. Deploy code that fits (ctx.patched keeps old histories on their path) or "
            "leave it on its version"), divergence=report.divergence)
    return int(report.replayed)


def _refuse_state(seen: Seen) -> None:
    if seen.status in TERMINAL_STATUSES:
        raise CommandError(409, "EXECUTION_ENDED", (
            f"execution {seen.execution_id!r} already ended ({seen.status}); its code "
            "version no longer matters (redrive it to run it again)"), status=seen.status)
    if seen.status == "running":
        raise running(seen.execution_id)


def running(execution_id: str) -> CommandError:
    return CommandError(409, "EXECUTION_RUNNING", (
        f"execution {execution_id!r} is running (a worker holds it, or its expired lease "
        "has not been ended yet); retry when its delivery ends (at its next sleep or wait, "
        "or once the lease is taken over)"), status="running")


def changed(execution_id: str) -> CommandError:
    return CommandError(409, "EXECUTION_CHANGED", (
        f"execution {execution_id!r} changed while its history was checked (a delivery or "
        "an operator decision came in between); nothing was moved: send the request again"))


async def _move_seen(store, seen: Seen, to: str | None, *, by: str, force: bool,
                     reason: str | None, workflows: Mapping[str, WorkflowDefinition] | None,
                     check: ReplayCheck, dry_run: bool, wording: Wording) -> MoveDone:
    _refuse_state(seen)
    replayed = None if force else await _check(store, seen, to, workflows, check, wording)
    verdict = SKIPPED if force else PASSED
    if dry_run:
        return MoveDone(Moved(seen.execution_id, seen.code_version, to, seen.status,
                              seen.status == "parked"
                              and seen.parked_reason == "nondeterminism"), verdict, replayed)
    # Checked: moved only if nothing happened since `seen` was read.
    answer, moved = await store.versions.move(seen.execution_id, to, by=by, check=verdict,
                                              reason=reason, seen=None if force else seen)
    operator_action("move-version", by=by, result=answer, execution_id=seen.execution_id,
                    to=to, check=verdict)
    if answer == "not_found":
        raise execution_not_found(seen.execution_id, wording)
    if answer == "ended":
        raise CommandError(409, "EXECUTION_ENDED",
                           f"execution {seen.execution_id!r} ended; nothing was moved")
    if answer == "running":
        raise running(seen.execution_id)
    if answer == "changed":
        raise changed(seen.execution_id)
    assert moved is not None
    return MoveDone(moved, verdict, replayed)


async def move_version(store, execution_id: str, to: str | None, *, by: str,
                       force: bool = False, reason: str | None = None,
                       workflows: Mapping[str, WorkflowDefinition] | None = None,
                       check: ReplayCheck = replay_check, wording: Wording = API) -> MoveDone:
    """Move one execution to code version `to` (None: unversioned), after
    the replay check passes (`force`: without it)."""
    check_execution_id(execution_id, wording)
    check_version(to)
    seen = await store.versions.target(execution_id)
    if seen is None:
        raise execution_not_found(execution_id, wording)
    return await _move_seen(store, seen, to, by=by, force=force, reason=reason,
                            workflows=workflows, check=check, dry_run=False, wording=wording)


def check_filter(workflow_id: Any, statuses: Sequence[str] | None, ids: Sequence[str] | None,
                 limit: int) -> None:
    def refuse(message: str) -> CommandError:
        return CommandError(422, "INVALID_REQUEST", f"{message}; fix it and send it again")

    if not isinstance(workflow_id, str) or not ID_RE.match(workflow_id):
        raise refuse("filter.workflowId: required, the workflow whose executions move "
                     "(1-200 characters from A-Z a-z 0-9 . _ : -)")
    for s in statuses or ():
        if s not in MOVABLE_STATUSES:
            raise refuse(f"filter.status: {s!r} is not one of {', '.join(MOVABLE_STATUSES)} "
                         "(an ended execution is not moved)")
    if statuses is not None and not statuses:
        raise refuse("filter.status: give at least one status, or leave it out")
    if ids is not None and not 1 <= len(ids) <= MAX_CANDIDATES:
        raise refuse(f"filter.ids: 1 to {MAX_CANDIDATES} execution IDs, or leave it out")
    if not isinstance(limit, int) or isinstance(limit, bool) or \
            not 1 <= limit <= MAX_CANDIDATES:
        raise refuse(f"limit: 1 to {MAX_CANDIDATES}")


async def move_versions(store, to: str | None, *, workflow_id: str, by: str,
                        from_version: object = ANY_VERSION,
                        statuses: Sequence[str] | None = None, ids: Sequence[str] | None = None,
                        limit: int = DEFAULT_LIMIT, force: bool = False, dry_run: bool = False,
                        reason: str | None = None,
                        workflows: Mapping[str, WorkflowDefinition] | None = None,
                        check: ReplayCheck = replay_check) -> BulkMoved:
    """Move up to `limit` unended executions of `workflow_id` (admitted
    under `from_version`, in `statuses`, among `ids`), each checked and
    moved as `move_version` does; a refusal of one does not stop the rest.
    `dry_run`: check each, move none (`moved` lists those that would move).
    `more`: executions beyond `limit` match too (refused ones keep matching)."""
    check_version(to)
    if from_version is not ANY_VERSION:
        check_version(from_version, "filter.fromVersion")
    check_filter(workflow_id, statuses, ids, limit)
    if ids is not None and any(UNSTORABLE_TEXT.search(i) for i in ids):
        ids = [i for i in ids if not UNSTORABLE_TEXT.search(i)]  # no stored ID has one
    found, matched = await store.versions.candidates(
        workflow_id, from_version=from_version, statuses=list(statuses) if statuses else None,
        ids=list(ids) if ids is not None else None, limit=limit)
    result = BulkMoved([], [], matched, matched > len(found), dry_run)
    for seen in found:
        try:
            done = await _move_seen(store, seen, to, by=by, force=force, reason=reason,
                                    workflows=workflows, check=check, dry_run=dry_run,
                                    wording=API)
        except CommandError as exc:
            result.refused.append(Refused(seen.execution_id, exc.code, exc.message,
                                          exc.extra.get("divergence")))
        else:
            result.moved.append(seen.execution_id)
            result.done.append(done)
    operator_action("move-versions", by=by, result=f"{len(result.moved)} moved, "
                    f"{len(result.refused)} refused", workflow_id=workflow_id, to=to,
                    dry_run=dry_run)
    return result
