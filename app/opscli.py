"""The operator CLI over HTTP: `fencepost executions ...`, `fencepost workers`,
`fencepost operations ...` (and `fencepost queues ...`, app/queuescli.py).

It speaks only the public HTTP API, through app.client.Client, like any other
caller: FENCEPOST_URL (default http://127.0.0.1:8000) and FENCEPOST_TOKEN,
overridden by --url / --token. A readable table (or a `key: value` block for one
record) by default; --json prints the API's JSON.

Exit codes: 0 done; 1 the API said no (`error: CODE: message` on stderr);
2 usage (argparse, bad JSON in an argument) or configuration (no service at the
URL, a URL that is not http(s)).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from app.client import ANY_VERSION, Client, FencepostError
from app.schema import STATUSES

DEFAULT_URL = "http://127.0.0.1:8000"
# The CLI's own environment (a caller's, not server settings: app.settings has neither).
URL_VARIABLE, TOKEN_VARIABLE = "FENCEPOST_URL", "FENCEPOST_TOKEN"
EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
ACTIONS = ("cancel", "redrive", "resume", "resolve")
# What a version move may select (an ended execution is not moved).
MOVABLE_STATUSES = ("admitted", "running", "suspended", "parked")
MAX_PAGE = 500  # the API's largest page of executions
NOT_GIVEN = object()  # an option's default where JSON null is a value someone may give


class ConfigError(Exception):
    """Bad configuration or no service: exit 2, one line naming FENCEPOST_URL."""


class UsageError(Exception):
    """Options that do not go together (argparse cannot say so): exit 2."""


# ------------------------------------------------------------- arguments


def json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None


def failure_arg(text: str) -> dict[str, str]:
    name, sep, message = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"give NAME:MESSAGE, for example "
                                         f"CardDeclined:'the bank said no'; got {text!r}")
    return {"name": name.strip(), "message": message.strip()}


def ids_arg(text: str) -> list[str]:
    ids = [i.strip() for i in text.split(",") if i.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("give execution IDs separated by commas")
    return ids


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"give a number of seconds above 0; got {text!r}")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection and output")
    g.add_argument("--url", help=f"the API's base URL (default: $FENCEPOST_URL, else {DEFAULT_URL})")
    g.add_argument("--token", help="bearer token (default: $FENCEPOST_TOKEN)")
    g.add_argument("--json", action="store_true", help="print the API's JSON")


def _sub(group: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_: str,
         run: Callable[[Client, argparse.Namespace], Any]) -> argparse.ArgumentParser:
    p = group.add_parser(name, help=help_, description=help_)
    _common(p)
    p.set_defaults(_ops=run)
    return p


def _group(p: argparse.ArgumentParser,
           name: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    sub = p.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")
    sub.required = True
    return sub


# ------------------------------------------------------------ executions


def configure_executions(p: argparse.ArgumentParser) -> None:
    sub = _group(p, "executions")

    s = _sub(sub, "list", "executions, newest first", cmd_list)
    s.add_argument("--status", choices=STATUSES)
    s.add_argument("--workflow", metavar="WORKFLOW_ID")
    s.add_argument("--limit", type=int, default=50, metavar="N",
                   help="at most N (default 50; the API allows 1 to 500)")
    s.add_argument("--all", action="store_true", help="every match, page after page")

    s = _sub(sub, "get", "one execution's record", cmd_get)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("--wait", type=float, metavar="SECONDS",
                   help="answer as soon as it ends, or after SECONDS (up to 60)")

    s = _sub(sub, "events", "its history, oldest first", cmd_events)
    s.add_argument("execution_id", metavar="ID")

    s = _sub(sub, "steps", "its recorded, in-doubt and superseded steps", cmd_steps)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("--values", action="store_true", help="with results and errors")

    s = _sub(sub, "start", "admit an execution", cmd_start)
    s.add_argument("workflow_id", metavar="WORKFLOW")
    s.add_argument("--id", dest="new_id", metavar="ID", help="its ID (default: the server picks)")
    s.add_argument("--params", type=json_arg, default={}, metavar="JSON")
    s.add_argument("--if-exists", choices=("error", "return"), default="error",
                   help="return: the same admission made before answers its record (exit 0)")
    s.add_argument("--priority", type=int, metavar="N",
                   help="order among its queue's due executions, lower first (default 0)")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--start-at", metavar="TIME",
                      help="first due then (date and time with offset, e.g. 2026-01-01T00:00:00Z)")
    when.add_argument("--delay", type=float, metavar="SECONDS",
                      help="first due this many seconds from now")
    s.add_argument("--concurrency-key", metavar="KEY",
                   help="the key per-key limits count it under (default: the workflow's)")

    s = _sub(sub, "signal", "send a signal (payload: JSON, default null)", cmd_signal)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("name", metavar="NAME")
    s.add_argument("payload", type=json_arg, nargs="?", default=None, metavar="PAYLOAD_JSON")

    s = _sub(sub, "cancel", "request cancellation (its cleanup code runs)", cmd_cancel)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("--by", metavar="WHO", help="who decided (kept in the event)")

    s = _sub(sub, "terminate", "cancel at once, no cleanup code run", cmd_terminate)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("--by", metavar="WHO")

    s = _sub(sub, "redrive", "reopen an ended execution under the same ID", cmd_redrive)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("--from-step", metavar="KEY",
                   help="run again from this step on (needed for a completed execution)")
    s.add_argument("--timeout", type=positive_float, metavar="SECONDS",
                   help="its new deadline, from now (default: none)")
    s.add_argument("--reason", metavar="TEXT")

    s = _sub(sub, "fork", "a new execution with the steps recorded before --from-step", cmd_fork)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("--from-step", required=True, metavar="KEY")
    s.add_argument("--id", dest="new_id", metavar="NEW", help="the fork's ID")
    s.add_argument("--params", type=json_arg, metavar="JSON", help="default: the source's")

    s = _sub(sub, "resolve", "settle a step whose outcome is unknown", cmd_resolve)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("step", metavar="STEP")
    how = s.add_mutually_exclusive_group(required=True)
    how.add_argument("--succeed", type=json_arg, metavar="JSON",
                     help="it happened: record JSON as the step's result")
    how.add_argument("--fail", type=failure_arg, metavar="NAME:MESSAGE",
                     help="it did not: record this error as the step's failure")
    how.add_argument("--retry", action="store_true",
                     help="call it once more with the same idempotency key")
    s.add_argument("--by", metavar="WHO")

    s = _sub(sub, "resume", "make an execution parked as poison or for nondeterminism due "
             "again", cmd_resume)
    s.add_argument("execution_id", metavar="ID")
    s.add_argument("--by", metavar="WHO")

    s = _sub(sub, "move-version", "move an execution to another code version (its history is "
             "replayed against that code first)", cmd_move_version)
    s.add_argument("execution_id", metavar="ID")
    _target_version(s)

    s = _sub(sub, "move-versions", "move a workflow's unended executions to another code "
             "version, each checked first", cmd_move_versions)
    s.add_argument("--workflow", required=True, metavar="WORKFLOW_ID")
    _target_version(s)
    source = s.add_mutually_exclusive_group()
    source.add_argument("--from-version", metavar="VERSION",
                        help="only executions admitted under VERSION (default: any version)")
    source.add_argument("--from-unversioned", action="store_true",
                        help="only executions admitted unversioned")
    s.add_argument("--status", action="append", choices=MOVABLE_STATUSES,
                   help="only executions in this status (repeat for several)")
    s.add_argument("--ids", type=ids_arg, metavar="ID,ID,...", help="only these executions")
    s.add_argument("--limit", type=int, metavar="N",
                   help="at most N, oldest admission first (default 100, at most 1000)")
    s.add_argument("--dry-run", action="store_true",
                   help="check each, move none (moved lists those that would move)")


def _target_version(s: argparse.ArgumentParser) -> None:
    to = s.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", metavar="VERSION", help="the code version to move to")
    to.add_argument("--unversioned", action="store_true",
                    help="move to unversioned (runs on any worker carrying the workflow)")
    s.add_argument("--force", action="store_true",
                   help="move without the replay check (check with `fencepost replay` first)")
    s.add_argument("--reason", metavar="TEXT", help="why (kept in the event)")


def _path(*parts: str) -> str:
    return "/v1/executions" + "".join("/" + quote(p, safe="") for p in parts)


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def cmd_list(fp: Client, args: argparse.Namespace) -> Any:
    query = _body(status=args.status, workflowId=args.workflow)
    page: dict[str, Any]  # the API's page: {"executions": [...], "nextCursor": ...}
    if args.all:
        executions = list(fp.list(**query, limit=MAX_PAGE))
        page = {"executions": executions, "nextCursor": None}
    else:
        page = fp._call("GET", "/v1/executions", params={**query, "limit": args.limit}).json()
    if args.json:
        return page
    table(page["executions"], [("EXECUTION ID", "executionId"), ("WORKFLOW", "workflowId"),
                               ("STATUS", "status"), ("ADMITTED", "admittedAt"),
                               ("UPDATED", "updatedAt"), ("BLOCKED BY", _blocked)])
    if page.get("nextCursor"):
        print(f"(more than {args.limit}: --limit N or --all)", file=sys.stderr)
    return None


def cmd_get(fp: Client, args: argparse.Namespace) -> Any:
    return fp.get(args.execution_id, wait_seconds=args.wait)


def cmd_events(fp: Client, args: argparse.Namespace) -> Any:
    events = fp.events(args.execution_id)
    if args.json:
        return {"events": events, "nextAfter": None}
    table(events, [("EVENT", "eventId"), ("AT", "at"), ("KIND", "kind"), ("TOKEN", "token"),
                   ("DETAIL", "detail")])
    return None


def cmd_steps(fp: Client, args: argparse.Namespace) -> Any:
    steps: list[dict[str, Any]] = []
    query: dict[str, Any] = {"limit": 1000, "includeValues": args.values}
    while True:
        page = fp._call("GET", _path(args.execution_id, "steps"), params=query).json()
        steps.extend(page["steps"])
        if not page.get("nextCursor"):
            break
        query["cursor"] = page["nextCursor"]
    if args.json:
        return {"steps": steps, "nextCursor": None}
    # A step a redrive took out of the record has status "superseded".
    columns = [("STEP", "stepKey"), ("STATUS", "status"), ("ATTEMPTS", "attempts"),
               ("TOKEN", "token"), ("FUNCTION", "function"), ("RECORDED", "recordedAt"),
               ("IDEMPOTENCY KEY", "idempotencyKey")]
    columns += [("RESULT", "result"), ("ERROR", "error")] if args.values else [
        ("ERROR", "errorName")]
    table(steps, columns)
    return None


def cmd_start(fp: Client, args: argparse.Namespace) -> Any:
    started = fp.start(args.workflow_id, args.params, execution_id=args.new_id,
                       if_exists=args.if_exists, priority=args.priority,
                       start_at=args.start_at, delay_seconds=args.delay,
                       concurrency_key=args.concurrency_key)
    if args.json:
        return started.record or {"executionId": started.execution_id, "status": started.status}
    return {"executionId": started.execution_id, "status": started.status,
            "created": started.created}


def cmd_signal(fp: Client, args: argparse.Namespace) -> Any:
    return fp.signal(args.execution_id, args.name, args.payload)


def cmd_cancel(fp: Client, args: argparse.Namespace) -> Any:
    return fp.cancel(args.execution_id, by=args.by)


def cmd_terminate(fp: Client, args: argparse.Namespace) -> Any:
    return fp.terminate(args.execution_id, by=args.by)


def cmd_redrive(fp: Client, args: argparse.Namespace) -> Any:
    return fp.redrive(args.execution_id, from_step=args.from_step, reason=args.reason,
                      timeout_seconds=args.timeout)


def cmd_fork(fp: Client, args: argparse.Namespace) -> Any:
    return fp.fork(args.execution_id, args.from_step, execution_id=args.new_id,
                   params=args.params)


def cmd_resolve(fp: Client, args: argparse.Namespace) -> Any:
    if args.retry:
        body: dict[str, Any] = {"action": "retry"}
    elif args.fail is not None:
        body = {"action": "fail", "error": args.fail}
    else:
        # --succeed null records null: "result" is sent even when it is None.
        body = {"action": "succeed", "result": args.succeed}
    if args.by is not None:
        body["by"] = args.by
    return fp._call("POST", _path(args.execution_id, "steps", args.step, "resolve"),
                    json=body).json()


def cmd_resume(fp: Client, args: argparse.Namespace) -> Any:
    return fp._call("POST", _path(args.execution_id, "resume"), json=_body(by=args.by)).json()


def cmd_move_version(fp: Client, args: argparse.Namespace) -> Any:
    return fp.move_version(args.execution_id, None if args.unversioned else args.to,
                           force=args.force, reason=args.reason)


def cmd_move_versions(fp: Client, args: argparse.Namespace) -> Any:
    source: Any = ANY_VERSION
    if args.from_unversioned:
        source = None
    elif args.from_version is not None:
        source = args.from_version
    answer = fp.move_versions(None if args.unversioned else args.to, args.workflow,
                              from_version=source, statuses=args.status, ids=args.ids,
                              limit=args.limit, force=args.force, dry_run=args.dry_run,
                              reason=args.reason)
    if args.json:
        return answer
    block({k: v for k, v in answer.items() if k != "refused"})
    if answer["refused"]:
        print()
        table(answer["refused"], [("REFUSED EXECUTION", "executionId"), ("CODE", "code"),
                                  ("MESSAGE", "message")])
    return None


# --------------------------------------------------------------- workers


def configure_workers(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.set_defaults(_ops=cmd_workers)


def cmd_workers(fp: Client, args: argparse.Namespace) -> Any:
    answer = fp._call("GET", "/v1/workers").json()
    if args.json:
        return answer
    table(answer["workers"], [("WORKER", "workerId"), ("HOST", "host"), ("PID", "pid"),
                              ("ALIVE", "alive"), ("CONCURRENCY", "concurrency"),
                              ("HEARTBEAT", "heartbeatAt"), ("WORKFLOWS", "workflows")])
    return None


# ------------------------------------------------------------ operations


def configure_operations(p: argparse.ArgumentParser) -> None:
    sub = _group(p, "operations")

    s = _sub(sub, "create", "act on every execution a filter matches (bulk); at least one "
             "filter option", cmd_op_create)
    s.add_argument("--action", required=True, choices=ACTIONS)
    f = s.add_argument_group("filter (the executions it matches now are its items)")
    f.add_argument("--workflow", metavar="WORKFLOW_ID")
    f.add_argument("--status", choices=STATUSES)
    f.add_argument("--ids", type=ids_arg, metavar="ID,ID,...")
    # The API takes a time only with its UTC offset: a bare local time would be ambiguous.
    f.add_argument("--admitted-from", metavar="TIME",
                   help="admitted at or after (date and time with offset, e.g. 2026-01-01T00:00:00Z)")
    f.add_argument("--admitted-to", metavar="TIME",
                   help="admitted before (date and time with offset, e.g. 2026-01-01T00:00:00Z)")
    f.add_argument("--min-unacknowledged", type=int, metavar="N",
                   help="at least N unacknowledged deliveries")
    s.add_argument("--dry-run", action="store_true",
                   help="only count the matches and show a sample; nothing is done")
    s.add_argument("--reason", metavar="TEXT")
    s.add_argument("--by", metavar="WHO")
    s.add_argument("--from-step", metavar="KEY", help="redrive: run again from this step on")
    s.add_argument("--timeout", type=positive_float, metavar="SECONDS",
                   help="redrive: the new deadline, from now")
    how = s.add_mutually_exclusive_group()
    how.add_argument("--succeed", type=json_arg, metavar="JSON", default=NOT_GIVEN,
                     help="resolve: record JSON as each parked step's result (default: retry)")
    how.add_argument("--fail", type=failure_arg, metavar="NAME:MESSAGE",
                     help="resolve: record this error as each parked step's failure")

    s = _sub(sub, "get", "an operation's progress and failures", cmd_op_get)
    s.add_argument("operation_id", metavar="OP_ID")

    s = _sub(sub, "cancel", "stop an operation (what it did stays done)", cmd_op_cancel)
    s.add_argument("operation_id", metavar="OP_ID")
    s.add_argument("--by", metavar="WHO")


def _op_path(*parts: str) -> str:
    return "/v1/operations" + "".join("/" + quote(p, safe="") for p in parts)


def cmd_op_create(fp: Client, args: argparse.Namespace) -> Any:
    for given, option, action in ((args.from_step, "--from-step", "redrive"),
                                  (args.timeout, "--timeout", "redrive"),
                                  (args.fail, "--fail", "resolve"),
                                  (None if args.succeed is NOT_GIVEN else 0, "--succeed",
                                   "resolve")):
        if given is not None and args.action != action:
            raise UsageError(f"{option} goes only with --action {action}")
    body = _body(action=args.action, reason=args.reason, by=args.by,
                 fromStep=args.from_step, timeoutSeconds=args.timeout,
                 filter=_body(workflowId=args.workflow, status=args.status,
                              executionIds=args.ids, admittedFrom=args.admitted_from,
                              admittedTo=args.admitted_to,
                              minUnacknowledgedDeliveries=args.min_unacknowledged))
    if args.dry_run:
        body["dryRun"] = True
    if args.fail is not None:
        body["resolution"] = {"action": "fail", "error": args.fail}
    elif args.succeed is not NOT_GIVEN:  # --succeed null records null
        body["resolution"] = {"action": "succeed", "result": args.succeed}
    return operation(fp._call("POST", _op_path(), json=body, ok=(200, 202)).json(), args)


def cmd_op_get(fp: Client, args: argparse.Namespace) -> Any:
    return operation(fp._call("GET", _op_path(args.operation_id)).json(), args)


def cmd_op_cancel(fp: Client, args: argparse.Namespace) -> Any:
    return operation(fp._call("POST", _op_path(args.operation_id, "cancel"),
                              json=_body(by=args.by), ok=(200, 202)).json(), args)


def operation(record: dict[str, Any], args: argparse.Namespace) -> Any:
    """An operation's record; read by a person: its failures as a table below it."""
    if args.json:
        return record
    failures = record.get("failures") or []
    block({k: v for k, v in record.items() if k != "failures"})
    if failures:
        print()
        table(failures, [("FAILED EXECUTION", "executionId"), ("CODE", "code"),
                         ("MESSAGE", "message")])
    return None


# ---------------------------------------------------------------- output


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        # The API's times are UTC ("...Z"): read as "2026-01-01 12:00:00".
        if (len(value) >= 20 and value.endswith("Z") and value[4] == "-" and value[10] == "T"
                and value[13] == ":"):
            return value[:19].replace("T", " ")
        return value.replace("\n", "\\n")  # one line per row
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value) or "-"
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _blocked(row: dict[str, Any]) -> str:
    """blockedBy in a table: its reason, and the signal or step it names."""
    why = row.get("blockedBy")
    if not why:
        return "-"
    return " ".join(str(why[k]) for k in ("reason", "signal", "step") if why.get(k))


def table(rows: Sequence[dict[str, Any]],
          columns: Sequence[tuple[str, str | Callable[[dict[str, Any]], str]]]) -> None:
    cells = [[title for title, _ in columns]]
    cells += [[key(row) if callable(key) else _cell(row.get(key)) for _, key in columns]
              for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns) - 1)]
    for r in cells:
        print("  ".join([c.ljust(w) for c, w in zip(r, widths, strict=False)] + [r[-1]]))


def block(record: dict[str, Any]) -> None:
    width = max((len(k) for k in record), default=0)
    for key, value in record.items():
        print(f"{key + ':':<{width + 1}} {_cell(value)}")


# ------------------------------------------------------------------- run


def client_for(args: argparse.Namespace) -> tuple[Client, str]:
    url = args.url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"FENCEPOST_URL (or --url) {url!r} is not an http(s) URL; "
                          f"for example {DEFAULT_URL}")
    token = args.token if args.token is not None else os.environ.get(TOKEN_VARIABLE)
    return Client(url, token=token or None), url


def run(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; print its answer; the exit code."""
    try:
        fp, url = client_for(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with fp:
            _print(args._ops(fp, args), args)
        sys.stdout.flush()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FencepostError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_REFUSED
    except httpx.TransportError as exc:
        print(f"error: cannot reach fencepost at {url} (FENCEPOST_URL or --url): "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader stopped early (`| head`): no traceback, the shell's code for SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    return EXIT_OK


def _print(answer: Any, args: argparse.Namespace) -> None:
    if answer is None:  # printed already (a table)
        return
    if args.json:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
    else:
        block(answer)
