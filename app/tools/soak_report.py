"""The soak's report: the one machine-readable JSON line on stdout, the
invariants it must satisfy (exit 0 only if every one holds), and on failure
the examples and the children's log folder on stderr."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from app.tools.soak_chaos import Chaos
from app.tools.soak_processes import CHILD_SETTINGS


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(args: argparse.Namespace, result: dict, lease_seconds: float, database: str,
           log_dir: Path) -> int:
    """Print the line (and, when an invariant fails, why on stderr); the exit code."""
    chaos: Chaos = result["chaos"]
    latencies = result["latencies"]
    errors = result["admission_errors"]
    line = {
        "soak": "fencepost",
        "duration_s": args.duration,
        "admissions": result["admissions"],
        "completions": result["completions"],
        "non_terminal": result["non_terminal"],
        "kills": chaos.kills,
        "leases_taken_over": result["leases_taken_over"],
        "stale_writes_rejected": result["stale_writes_rejected"],
        "stale_writes_accepted": result["stale_writes_accepted"],
        "steps_recorded_more_than_once": result["steps_recorded_more_than_once"],
        "admission_p50_ms": _round(percentile(latencies, 0.5)),
        "admission_p99_ms": _round(percentile(latencies, 0.99)),
        "admission_errors": len(errors),
        "admissions_per_second": _round(result["admissions"] / result["admit_seconds"]),
        "drain_s": _round(result["drain_seconds"]),
        "leases_expired": result["leases_expired"],
        "leases_held_by_killed_workers": chaos.leases_held_by_killed,
        "pauses": chaos.pauses,
        "late_observations": result["late_observations"],
        "step_rows_inconsistent": result["step_rows_inconsistent"],
        "wrong_results": result["wrong_results"],
        "terminal_outcomes_more_than_once": result["terminal_outcomes_more_than_once"],
        "executions_not_admitted_by_client": result["executions_not_admitted_by_client"],
        "unexpected_worker_exits": len(chaos.unexpected_exits),
        "statuses": result["statuses"],
        "event_kinds": result["event_kinds"],
        "settings": {
            "workers": args.workers,
            "concurrency": args.concurrency,
            "clients": args.clients,
            "rate": args.rate,
            "kill_every_s": args.kill_every,
            "pause_every_s": args.pause_every,
            "drain_timeout_s": args.drain_timeout,
            "seed": args.seed,
            "lease_seconds": lease_seconds,
            "renew_seconds": float(CHILD_SETTINGS["FENCEPOST_RENEW_SECONDS"]),
            "poll_seconds": float(CHILD_SETTINGS["FENCEPOST_POLL_SECONDS"]),
            "redelivery_base_seconds": float(CHILD_SETTINGS["FENCEPOST_REDELIVERY_BASE_SECONDS"]),
            "redelivery_cap_seconds": float(CHILD_SETTINGS["FENCEPOST_REDELIVERY_CAP_SECONDS"]),
            "database": database,
            "cpus": os.cpu_count(),
        },
        "run": result["run"],
    }
    failures = [name for name, ok in [
        ("admissions > 0", line["admissions"] > 0),
        ("non_terminal == 0", line["non_terminal"] == 0),
        ("completions == admissions", line["completions"] == line["admissions"]),
        ("stale_writes_accepted == 0", line["stale_writes_accepted"] == 0),
        ("steps_recorded_more_than_once == 0", line["steps_recorded_more_than_once"] == 0),
        ("step_rows_inconsistent == 0", line["step_rows_inconsistent"] == 0),
        ("wrong_results == 0", line["wrong_results"] == 0),
        ("terminal_outcomes_more_than_once == 0", line["terminal_outcomes_more_than_once"] == 0),
        ("executions_not_admitted_by_client == 0",
         line["executions_not_admitted_by_client"] == 0),
        ("admission_errors == 0", line["admission_errors"] == 0),
        ("unexpected_worker_exits == 0", line["unexpected_worker_exits"] == 0),
    ] if not ok]
    line["ok"] = not failures
    line["failed"] = failures
    print(json.dumps(line), flush=True)
    if failures:
        examples = result["_examples"]
        print(f"soak: invariants failed: {', '.join(failures)}; children's logs in {log_dir}",
              file=sys.stderr)
        for e in errors[:10]:
            print(f"  admission error: {e}", file=sys.stderr)
        for e in chaos.unexpected_exits:
            print(f"  worker exited by itself: {e}", file=sys.stderr)
        for key, rows in examples.items():
            for r in rows:
                print(f"  {key}: {json.dumps(r, default=str)}", file=sys.stderr)
        return 1
    if args.logs is None:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
