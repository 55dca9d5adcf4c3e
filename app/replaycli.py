"""`fencepost replay`: run the current workflow code against recorded
histories before deploying it, and fail (exit 1) when it no longer fits one.

    fencepost replay --workflows shop.flows --sample 50
    fencepost replay --workflows shop.flows --execution order-1 --execution order-2
    fencepost replay --workflows shop.flows --file histories.json

Histories come from the API (`GET /v1/executions/{id}/history`, FENCEPOST_URL
and FENCEPOST_TOKEN or --url / --token, as `fencepost executions`), or from
a file holding one exported document or a JSON list of them. No step
function, effect, transaction or child start runs (app/replay.py).

Exit codes: 0 every history fits; 1 at least one diverges; 2 usage, a
history this code cannot check (unreadable, another format, a workflow the
modules do not define), or no service at the URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import httpx

from app.client import Client, FencepostError
from app.opscli import (
    DEFAULT_URL,
    MAX_PAGE,
    URL_VARIABLE,
    ConfigError,
    client_for,
    ids_arg,
)
from app.registry import WorkflowDefinition, load_workflows
from app.replay import HistoryFormatError, ReplayReport, check_document, replay
from app.schema import STATUSES, TERMINAL_STATUSES

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2
# What --sample draws from: executions that can still run, so code about to
# be deployed will replay their histories.
IN_FLIGHT = tuple(s for s in STATUSES if s not in TERMINAL_STATUSES)


class ReplayUsageError(Exception):
    """Something to fix before the check can run: exit 2, one line saying what."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workflows", type=ids_arg, required=True, metavar="MODULE[,MODULE]",
                   help="the modules of the code to check (as FENCEPOST_WORKFLOWS names them)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--execution", action="append", metavar="ID",
                        help="an execution whose history to replay (repeat for more)")
    source.add_argument("--file", metavar="HISTORY.json",
                        help="an exported history, or a JSON list of them")
    source.add_argument("--sample", type=_positive_int, metavar="N",
                        help="the newest N executions still in flight "
                        f"({', '.join(IN_FLIGHT)})")
    p.add_argument("--workflow", metavar="WORKFLOW_ID",
                   help="with --sample: only this workflow's executions (default: every "
                   "workflow the modules define)")
    g = p.add_argument_group("connection and output")
    g.add_argument("--url", help="the API's base URL (default: $FENCEPOST_URL, else "
                   "http://127.0.0.1:8000)")
    g.add_argument("--token", help="bearer token, read role (default: $FENCEPOST_TOKEN)")
    g.add_argument("--json", action="store_true",
                   help='print {"ok": ..., "reports": [...]} instead of one line each')


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"give a whole number from 1; got {text!r}")
    return int(text)


# ------------------------------------------------------------ histories


def _from_file(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)
    except OSError as exc:
        raise ReplayUsageError(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise ReplayUsageError(f"{path} is not JSON: {exc}") from None
    documents = loaded if isinstance(loaded, list) else [loaded]
    try:
        return [check_document(d) for d in documents]
    except HistoryFormatError as exc:
        raise ReplayUsageError(f"{path}: {exc}; export histories with "
                               "GET /v1/executions/{id}/history") from None


def _history(fp: Client, execution_id: str) -> dict[str, Any]:
    return check_document(fp.history(execution_id))


def _sample(fp: Client, n: int, workflow_ids: list[str]) -> list[str]:
    """The newest `n` in-flight executions of these workflows (the listing
    takes one status and one workflow per query: the newest `n` of each
    pair, merged, newest first)."""
    found: list[dict[str, Any]] = []
    for workflow_id in workflow_ids:
        for status in IN_FLIGHT:
            page = fp._call("GET", "/v1/executions", params={
                "status": status, "workflowId": workflow_id,
                "limit": min(n, MAX_PAGE)}).json()
            found += page["executions"]
    found.sort(key=lambda e: (e["admittedAt"], e["executionId"]), reverse=True)
    seen: dict[str, None] = {}
    for e in found:
        seen.setdefault(e["executionId"])
    return list(seen)[:n]


def _histories(args: argparse.Namespace, workflows: dict[str, WorkflowDefinition]
               ) -> list[dict[str, Any]]:
    if args.file is not None:
        return _from_file(args.file)
    fp, _ = client_for(args)
    with fp:
        if args.execution:
            ids = args.execution
        else:
            wanted = [args.workflow] if args.workflow else sorted(workflows)
            ids = _sample(fp, args.sample, wanted)
        return [_history(fp, i) for i in ids]


# ------------------------------------------------------------ the check


async def _check(documents: list[dict[str, Any]],
                 workflows: dict[str, WorkflowDefinition]) -> list[ReplayReport]:
    reports = []
    for document in documents:
        definition = workflows.get(document["workflowId"])
        if definition is None:
            raise ReplayUsageError(
                f"execution {document['executionId']!r} is of workflow "
                f"{document['workflowId']!r}, which the modules do not define "
                f"({', '.join(sorted(workflows)) or 'none'}); name its module in --workflows")
        reports.append(await replay(definition, document, workflows))
    return reports


def line(report: ReplayReport) -> str:
    if report.ok:
        return (f"ok  {report.execution_id}  (replayed {report.replayed} steps, "
                f"{report.end})")
    found = report.divergence or {}
    where = (f"at position {found['position']}: " if found.get("position") is not None
             else "")
    return f"DIVERGES  {report.execution_id}  {where}{found.get('message')}"


def run(args: argparse.Namespace) -> int:
    if args.workflow and args.sample is None:
        print("error: --workflow goes with --sample", file=sys.stderr)
        return EXIT_USAGE
    try:
        try:
            workflows = load_workflows(args.workflows)
        except ImportError as exc:
            raise ReplayUsageError(f"cannot import --workflows {','.join(args.workflows)}: "
                                   f"{exc}") from None
        if not workflows:
            raise ReplayUsageError(f"the modules {','.join(args.workflows)} define no workflow")
        if args.workflow and args.workflow not in workflows:
            raise ReplayUsageError(f"--workflow {args.workflow!r} is not defined in the modules "
                                   f"({', '.join(sorted(workflows))})")
        documents = _histories(args, workflows)
        reports = asyncio.run(_check(documents, workflows))
    except (ReplayUsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HistoryFormatError as exc:
        print(f"error: the API's history is not one this code reads ({exc}); "
              "run the same fencepost version as the server", file=sys.stderr)
        return EXIT_USAGE
    except FencepostError as exc:
        print(f"error: {exc.code}: {exc.message}"
              + ("; set FENCEPOST_TOKEN (or --token) to a token with the read role"
                 if exc.status_code in (401, 403) else ""), file=sys.stderr)
        return EXIT_USAGE
    except httpx.TransportError as exc:
        url = args.url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
        print(f"error: cannot reach fencepost at {url} (set FENCEPOST_URL or --url): "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ok = all(r.ok for r in reports)
    if args.json:
        print(json.dumps({"ok": ok, "reports": [r.to_json() for r in reports]}, indent=2,
                         ensure_ascii=False))
    else:
        for r in reports:
            print(line(r))
        if not reports:
            print("no executions to replay", file=sys.stderr)
    return EXIT_OK if ok else EXIT_DIVERGED
