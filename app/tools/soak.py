"""`fencepost soak`: sustained load while workers are SIGKILLed, then proof.

On DATABASE_URL (or a throw-away embedded Postgres) it migrates, starts the API
and W worker processes with short lease settings (a lease lost to a kill is
taken over within about two seconds), and then for `--duration` seconds:

- HTTP clients admit executions of `soak-steps` (app/tools/soakflows.py: three
  steps of 20-100 ms with a durable sleep of 0.1-0.5 s after the first) at a
  bounded rate (`--rate` per second);
- every `--kill-every` seconds the longest-running worker is SIGKILLed and a
  replacement started (optionally, every `--pause-every` seconds another worker
  is SIGSTOPped for longer than a lease and then continued, so that its
  deliveries go stale while it still believes it holds them).

After the admission window it stops killing, waits (at most `--drain-timeout`
seconds) until every admitted execution is terminal, and verifies from the
database (events in their execution's order, `seq`):

- non_terminal: executions of this run not terminal (must be 0);
- completions == admissions, every result correct;
- stale_writes_accepted (must be 0): a 'step_recorded', 'acknowledged' or
  'released' event with token T after a 'claimed' event with a token > T, or
  after the lease T ended ('acknowledged' / 'released' / 'lease_expired' with
  token T), or with no 'claimed' T before it;
- steps_recorded_more_than_once (must be 0): 'step_recorded' events per
  (execution, stepKey) > 1; every completed execution recorded each of its
  steps, and each step row carries the token of its event;
- at most one terminal acknowledgement per execution; no worker exited by
  itself; no admission failed.

It reports leases taken over (claims whose previous token's lease ended by
expiry: one 'lease_expired' event each), stale writes rejected
('fenced_write_rejected' events) and admission latency at the client, as one
JSON line on stdout. Exit 0 only if every invariant holds, else 1; the
children's logs are kept (and their folder named on stderr) when it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from app.db import asyncpg_dsn
from app.settings import Settings
from app.tools.soak_chaos import Chaos, inject_faults
from app.tools.soak_load import Admissions, admit
from app.tools.soak_processes import (
    CHILD_SETTINGS,
    Processes,
    free_port,
    log_tail,
    short_tempdir,
    wait_ready,
)
from app.tools.soak_report import report
from app.tools.soak_verify import verify, wait_terminal


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds of admissions and kills (default 60)")
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument("--concurrency", type=int, default=16,
                   help="deliveries per worker (default 16)")
    p.add_argument("--kill-every", type=float, default=3.0,
                   help="SIGKILL one worker and start a replacement every K seconds "
                        "(default 3; 0: never)")
    p.add_argument("--rate", type=float, default=50.0,
                   help="admissions per second, at most (default 50)")
    p.add_argument("--clients", type=int, default=8,
                   help="concurrent HTTP connections admitting (default 8)")
    p.add_argument("--pause-every", type=float, default=0.0,
                   help="SIGSTOP one worker for longer than a lease, then SIGCONT it, every "
                        "P seconds (default 0: never)")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="longest wait for every execution to end after admissions stop "
                        "(default 60)")
    p.add_argument("--seed", type=int, default=None, help="seed for step durations and victims")
    p.add_argument("--logs", type=Path, default=None,
                   help="keep the children's logs in this folder (default: a temp folder, "
                        "removed when every invariant holds)")


async def _soak(procs: Processes, url: str, args: argparse.Namespace, lease_seconds: float,
                rng: random.Random) -> dict:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await wait_ready(procs, conn)
        run = f"soak-{uuid.uuid4().hex[:10]}"
        pattern = f"{run}-%"
        admissions = Admissions()
        chaos = Chaos()
        t0 = time.monotonic()
        t_end = t0 + args.duration
        clients = [asyncio.create_task(
            admit(procs.port, run, args.rate, t0, t_end, random.Random(rng.random()), admissions))
            for _ in range(args.clients)]
        chaos_task = asyncio.create_task(
            inject_faults(procs, conn, args, lease_seconds, t_end, rng, chaos))
        await asyncio.gather(*clients)
        admit_seconds = time.monotonic() - t0
        await chaos_task
        drain_started = time.monotonic()
        await wait_terminal(conn, pattern, args.drain_timeout)
        drain_seconds = time.monotonic() - drain_started
        verified = await verify(conn, pattern, admissions.admitted)
        for c in procs.reap_exited():
            chaos.unexpected_exits.append(f"{c.name} ({c.worker_id}) exit {c.proc.returncode}")
        if verified["non_terminal"]:
            # What the live workers last warned of (the logs stay on disk).
            verified["_examples"]["worker log"] = [
                {"worker": c.name, "line": line[:300]}
                for c in procs.workers if c.alive()
                for line in log_tail(procs.log_dir / f"{c.name}.log", 3)]
        return {
            "run": run,
            "admit_seconds": admit_seconds,
            "drain_seconds": drain_seconds,
            "admissions": len(admissions.admitted),
            "admission_errors": admissions.errors,
            "latencies": admissions.latencies_ms,
            "chaos": chaos,
            **verified,
        }
    finally:
        await conn.close()


def run(args: argparse.Namespace, settings: Settings) -> int:
    from app.migrate import upgrade

    if (args.duration <= 0 or args.workers < 1 or args.concurrency < 1 or args.rate <= 0
            or args.clients < 1 or args.kill_every < 0 or args.pause_every < 0):
        print("error: --duration, --workers, --concurrency, --rate and --clients must be "
              "positive; --kill-every and --pause-every not negative", file=sys.stderr)
        return 2
    if args.workers < 2 and args.kill_every > 0:
        print("note: with one worker every kill leaves none running until its replacement "
              "starts", file=sys.stderr)
    rng = random.Random(args.seed)
    server = None
    pg_root: Path | None = None
    url = settings.database_url
    if args.logs is not None:
        log_dir = args.logs
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="fencepost-soak-logs-"))
    try:
        if not url:
            from app.embedded import start_embedded_postgres

            pg_root = short_tempdir("fp-soak-")
            server = start_embedded_postgres(pg_root / "pg", durable=False)
            url = server.url
        asyncio.run(upgrade(url))
        lease_seconds = float(CHILD_SETTINGS["FENCEPOST_LEASE_SECONDS"])
        procs = Processes(url, free_port(), args.concurrency, log_dir)
        procs.start_api()
        for _ in range(args.workers):
            procs.start_worker()
        try:
            result = asyncio.run(_soak(procs, url, args, lease_seconds, rng))
        finally:
            procs.stop()
    except Exception as exc:
        print(f"error: soak did not run to the end: {type(exc).__name__}: {exc}; "
              f"children's logs in {log_dir}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop(mode="immediate")
        if pg_root is not None:
            shutil.rmtree(pg_root, ignore_errors=True)

    return report(args, result, lease_seconds,
                  "embedded" if server is not None else "DATABASE_URL", log_dir)
