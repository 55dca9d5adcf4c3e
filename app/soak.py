"""`fencepost soak`: sustained load while workers are SIGKILLed, then proof.

On DATABASE_URL (or a throw-away embedded Postgres) it migrates, starts the API
and W worker processes with short lease settings (a lease lost to a kill is
taken over within about two seconds), and then for `--duration` seconds:

- HTTP clients admit executions of `soak-steps` (app/soakflows.py: three
  steps of 20-100 ms with a durable sleep of 0.1-0.5 s after the first) at a
  bounded rate (`--rate` per second);
- every `--kill-every` seconds the longest-running worker is SIGKILLed and a
  replacement started (optionally, every `--pause-every` seconds another worker
  is SIGSTOPped for longer than a lease and then continued, so that its
  deliveries go stale while it still believes it holds them).

After the admission window it stops killing, waits (at most `--drain-timeout`
seconds) until every admitted execution is terminal, and verifies from the
database (events ordered by event_id within an execution):

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
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import asyncpg

from app.db import asyncpg_dsn
from app.settings import Settings
from app.soakflows import STEP_KEYS, WORKFLOW

TERMINAL = ("completed", "failed", "cancelled", "timed_out")

# Short leases so that a killed worker's deliveries are taken over within the run.
CHILD_SETTINGS: dict[str, str] = {
    "FENCEPOST_LEASE_SECONDS": "2",
    "FENCEPOST_RENEW_SECONDS": "0.5",
    "FENCEPOST_POLL_SECONDS": "0.2",
    "FENCEPOST_REDELIVERY_BASE_SECONDS": "0.1",
    "FENCEPOST_REDELIVERY_CAP_SECONDS": "1",
    "FENCEPOST_SHUTDOWN_GRACE_SECONDS": "3",
    "FENCEPOST_CONNECT_TIMEOUT_SECONDS": "5",
}
ADMIT_TIMEOUT_SECONDS = 15.0


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


# ------------------------------------------------------------------ processes


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    name: str
    worker_id: str | None
    proc: subprocess.Popen
    log: TextIO = field(repr=False)
    killed: bool = False  # by the soak, on purpose
    paused: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None


class Processes:
    """The API and the workers: spawned from the main thread (the parent-death
    signal follows the thread that forked), each in its own session, logs in
    `log_dir`."""

    def __init__(self, url: str, port: int, concurrency: int, log_dir: Path):
        self.port = port
        self.concurrency = concurrency
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            **CHILD_SETTINGS,
            "DATABASE_URL": url,
            "FENCEPOST_WORKFLOWS": "app.soakflows",
            # Loopback children of this process only, as for dev and bench.
            "FENCEPOST_AUTH": "disabled",
            "PYTHONUNBUFFERED": "1",
        }
        self.api: Child | None = None
        self.workers: list[Child] = []  # live ones, oldest first
        self.gone: list[Child] = []  # killed or exited
        self._n = 0
        self._tag = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"

    def _spawn(self, name: str, argv: list[str], worker_id: str | None) -> Child:
        log = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *argv], env=self.env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        return Child(name, worker_id, proc, log)

    def start_api(self) -> Child:
        self.api = self._spawn("api", ["api", "--host", "127.0.0.1", "--port", str(self.port),
                                       "--log-level", "warning"], None)
        return self.api

    def start_worker(self) -> Child:
        self._n += 1
        worker_id = f"soak-{self._tag}-w{self._n}"
        child = self._spawn(f"worker-{self._n}", [
            "worker", "--concurrency", str(self.concurrency), "--worker-id", worker_id,
            "--log-level", "info",
        ], worker_id)
        self.workers.append(child)
        return child

    def kill(self, child: Child) -> None:
        child.killed = True
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGCONT)  # a stopped process dies only once continued
            child.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=10)
        self._retire(child)

    def _retire(self, child: Child) -> None:
        if child in self.workers:
            self.workers.remove(child)
            self.gone.append(child)

    def reap_exited(self) -> list[Child]:
        """Workers that exited on their own (not killed by the soak)."""
        exited = [c for c in self.workers if not c.alive()]
        for c in exited:
            self._retire(c)
        return exited

    def stop(self, grace: float = 15.0) -> None:
        children = [*self.workers, *([self.api] if self.api else [])]
        for c in children:
            if c.alive():
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGCONT)
                    c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        for c in [*children, *self.gone]:
            with contextlib.suppress(Exception):
                c.log.close()


# -------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _short_tempdir(prefix: str) -> Path:
    """On tmpfs when it has room (the server is throw-away, durability off)."""
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= 1 << 30:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=shm))
    base = tempfile.gettempdir()
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base if len(base) <= 40 else "/tmp"))


async def _wait_ready(procs: Processes, conn: asyncpg.Connection, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not procs.api.alive():
            raise RuntimeError(f"the API exited with {procs.api.proc.returncode}")
        if procs.reap_exited():
            raise RuntimeError("a worker exited before the soak began")
        api_ready = False
        with contextlib.suppress(OSError, TimeoutError, ValueError):
            api_ready = await asyncio.wait_for(_http_get(procs.port, "/readyz"), 2) == 200
        if api_ready:
            ids = [w.worker_id for w in procs.workers]
            registered = await conn.fetchval(
                "SELECT count(*) FROM workers WHERE worker_id = ANY($1::text[]) "
                "AND stopped_at IS NULL", ids)
            if registered == len(ids):
                return
        if time.monotonic() > deadline:
            raise RuntimeError("the API or the workers did not become ready in time")
        await asyncio.sleep(0.1)


async def _http_get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        status = await reader.readline()
        return int(status.split()[1])
    finally:
        writer.close()


# ----------------------------------------------------------------- admissions


@dataclass
class Admissions:
    admitted: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    next_index: int = 0


class _Connection:
    """One keep-alive HTTP/1.1 connection (a plain asyncio client, as bench's)."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        status = await self.reader.readline()
        if not status:
            raise ConnectionError("the API closed the connection")
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return int(status.split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _admit(port: int, run: str, rate: float, t0: float, t_end: float,
                 rng: random.Random, out: Admissions) -> None:
    """Admit on a fixed schedule (admission i at t0 + i/rate) until t_end; a
    client that falls behind sends at once, so the rate is a ceiling."""
    conn = _Connection(port)
    try:
        while True:
            i = out.next_index
            out.next_index += 1
            due = t0 + i / rate
            if due >= t_end:
                return
            if (delay := due - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            eid = f"{run}-{i}"
            body = json.dumps({"workflowId": WORKFLOW, "executionId": eid, "params": {
                "n": i,
                "ms": [rng.randint(20, 100) for _ in range(3)],
                "sleep": round(rng.uniform(0.1, 0.5), 3),
            }}).encode()
            t = time.perf_counter()
            try:
                status, answer = await asyncio.wait_for(conn.post("/v1/executions", body),
                                                        ADMIT_TIMEOUT_SECONDS)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                conn.close()
                out.errors.append(f"{eid}: {type(exc).__name__}: {exc}")
                continue
            out.latencies_ms.append((time.perf_counter() - t) * 1000)
            if status == 201:
                out.admitted.append(eid)
            else:
                out.errors.append(f"{eid}: HTTP {status} {answer[:200]!r}")
    finally:
        conn.close()


# ---------------------------------------------------------------------- chaos


@dataclass
class Chaos:
    kills: int = 0
    leases_held_by_killed: int = 0
    pauses: int = 0
    replacements_started: int = 0
    unexpected_exits: list[str] = field(default_factory=list)


async def _held_by(conn: asyncpg.Connection, worker_id: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM executions WHERE lease_owner = $1 AND status = 'running' "
        "AND lease_expires_at > now()", worker_id)


async def _chaos(procs: Processes, conn: asyncpg.Connection, args: argparse.Namespace,
                 lease_seconds: float, t_end: float, rng: random.Random, out: Chaos) -> None:
    """Until t_end: every kill_every seconds SIGKILL the oldest live worker and
    start a replacement; every pause_every seconds SIGSTOP another one for a
    lease and a half plus a second, then SIGCONT it. Also watches for workers
    that exit by themselves (each one is reported and replaced)."""
    now = time.monotonic()
    next_kill = now + args.kill_every if args.kill_every > 0 else float("inf")
    next_pause = now + args.pause_every if args.pause_every > 0 else float("inf")
    resume: list[tuple[float, Child]] = []
    try:
        while True:
            now = time.monotonic()
            for c in procs.reap_exited():
                out.unexpected_exits.append(f"{c.name} ({c.worker_id}) exit {c.proc.returncode}")
                procs.start_worker()
                out.replacements_started += 1
            for when, c in list(resume):
                if now >= when:
                    resume.remove((when, c))
                    if c.alive():
                        c.paused = False
                        c.proc.send_signal(signal.SIGCONT)
            if now >= t_end:
                return
            if now >= next_kill:
                next_kill += args.kill_every
                victim = next((w for w in procs.workers if not w.paused), None) or procs.workers[0]
                out.leases_held_by_killed += await _held_by(conn, victim.worker_id)
                procs.kill(victim)
                out.kills += 1
                procs.start_worker()
                out.replacements_started += 1
            if now >= next_pause:
                next_pause += args.pause_every
                # Not the next kill victim (the oldest) when there is a choice.
                candidates = [w for w in procs.workers[1:] if not w.paused and w.alive()]
                if candidates:
                    c = rng.choice(candidates)
                    c.paused = True
                    c.proc.send_signal(signal.SIGSTOP)
                    resume.append((now + lease_seconds * 1.5 + 1.0, c))
                    out.pauses += 1
            await asyncio.sleep(0.05)
    finally:
        for _, c in resume:
            if c.alive():
                c.paused = False
                c.proc.send_signal(signal.SIGCONT)


# --------------------------------------------------------------------- verify


async def _wait_terminal(conn: asyncpg.Connection, pattern: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        open_ = await conn.fetchval(
            "SELECT count(*) FROM executions WHERE execution_id LIKE $1 "
            "AND status <> ALL($2::text[])", pattern, list(TERMINAL))
        if open_ == 0 or time.monotonic() > deadline:
            return open_
        await asyncio.sleep(0.5)


STALE_SQL = """
SELECT w.execution_id, w.event_id, w.kind, w.token, w.detail::text AS detail,
       CASE
         WHEN EXISTS (SELECT 1 FROM execution_events c
                      WHERE c.execution_id = w.execution_id AND c.event_id < w.event_id
                        AND c.kind = 'claimed' AND c.token > w.token)
           THEN 'after a newer claim'
         WHEN EXISTS (SELECT 1 FROM execution_events x
                      WHERE x.execution_id = w.execution_id AND x.event_id < w.event_id
                        AND x.kind IN ('acknowledged', 'released', 'lease_expired')
                        AND x.token = w.token)
           THEN 'after its lease ended'
         WHEN NOT EXISTS (SELECT 1 FROM execution_events c
                          WHERE c.execution_id = w.execution_id AND c.event_id < w.event_id
                            AND c.kind = 'claimed' AND c.token = w.token)
           THEN 'without a claim'
       END AS why
FROM execution_events w
WHERE w.execution_id LIKE $1 AND w.kind IN ('step_recorded', 'acknowledged', 'released')
"""


async def _verify(conn: asyncpg.Connection, pattern: str, admitted: list[str]) -> dict:
    statuses = {r["status"]: r["n"] for r in await conn.fetch(
        "SELECT status, count(*) AS n FROM executions WHERE execution_id LIKE $1 "
        "GROUP BY status", pattern)}
    kinds = {r["kind"]: r["n"] for r in await conn.fetch(
        "SELECT kind, count(*) AS n FROM execution_events WHERE execution_id LIKE $1 "
        "GROUP BY kind ORDER BY kind", pattern)}
    taken_over = await conn.fetchval(
        """
        SELECT count(*) FROM execution_events c
        WHERE c.execution_id LIKE $1 AND c.kind = 'claimed' AND EXISTS (
            SELECT 1 FROM execution_events x
            WHERE x.execution_id = c.execution_id AND x.event_id < c.event_id
              AND x.kind = 'lease_expired' AND x.token = c.token - 1)
        """, pattern)
    stale = [dict(r) for r in await conn.fetch(
        f"SELECT * FROM ({STALE_SQL}) s WHERE why IS NOT NULL ORDER BY execution_id, event_id",
        pattern)]
    twice = [dict(r) for r in await conn.fetch(
        """
        SELECT execution_id, detail->>'stepKey' AS step_key, count(*) AS n
        FROM execution_events WHERE execution_id LIKE $1 AND kind = 'step_recorded'
        GROUP BY 1, 2 HAVING count(*) > 1 ORDER BY 1, 2
        """, pattern)]
    # Every completed execution recorded each of its steps, by the token of its event.
    inconsistent = [dict(r) for r in await conn.fetch(
        """
        SELECT e.execution_id, k.step_key, s.token AS row_token,
               (SELECT array_agg(v.token ORDER BY v.event_id) FROM execution_events v
                WHERE v.execution_id = e.execution_id AND v.kind = 'step_recorded'
                  AND v.detail->>'stepKey' = k.step_key) AS event_tokens
        FROM executions e CROSS JOIN unnest($2::text[]) AS k(step_key)
        LEFT JOIN execution_steps s
          ON s.execution_id = e.execution_id AND s.step_key = k.step_key
        WHERE e.execution_id LIKE $1 AND e.status = 'completed'
          AND (s.token IS NULL OR s.token IS DISTINCT FROM (
                SELECT max(v.token) FROM execution_events v
                WHERE v.execution_id = e.execution_id AND v.kind = 'step_recorded'
                  AND v.detail->>'stepKey' = k.step_key))
        ORDER BY 1, 2
        """, pattern, list(STEP_KEYS))]
    wrong_results = await conn.fetchval(
        """
        SELECT count(*) FROM executions
        WHERE execution_id LIKE $1 AND status = 'completed'
          AND (outcome->'result'->>'n')::bigint
              IS DISTINCT FROM (params->>'n')::bigint + 3
        """, pattern)
    terminal_twice = await conn.fetchval(
        """
        SELECT count(*) FROM (
            SELECT execution_id FROM execution_events
            WHERE execution_id LIKE $1 AND kind = 'acknowledged'
              AND detail->>'status' = ANY($2::text[])
            GROUP BY execution_id HAVING count(*) > 1) t
        """, pattern, list(TERMINAL))
    late = await conn.fetchval(
        "SELECT count(*) FROM late_observations WHERE execution_id LIKE $1", pattern)
    in_db = sum(statuses.values())
    not_admitted = await conn.fetchval(
        "SELECT count(*) FROM executions WHERE execution_id LIKE $1 "
        "AND execution_id <> ALL($2::text[])", pattern, admitted)
    return {
        "statuses": statuses,
        "event_kinds": kinds,
        "executions_in_database": in_db,
        "executions_not_admitted_by_client": not_admitted,
        "completions": statuses.get("completed", 0),
        "non_terminal": sum(n for s, n in statuses.items() if s not in TERMINAL),
        "leases_taken_over": taken_over,
        "leases_expired": kinds.get("lease_expired", 0),
        "stale_writes_rejected": kinds.get("fenced_write_rejected", 0),
        "late_observations": late,
        "stale_writes_accepted": len(stale),
        "steps_recorded_more_than_once": len(twice),
        "step_rows_inconsistent": len(inconsistent),
        "wrong_results": wrong_results,
        "terminal_outcomes_more_than_once": terminal_twice,
        "_examples": {"stale": stale[:10], "twice": twice[:10], "inconsistent": inconsistent[:10]},
    }


# ------------------------------------------------------------------------ run


async def _soak(procs: Processes, url: str, args: argparse.Namespace, lease_seconds: float,
                rng: random.Random) -> dict:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await _wait_ready(procs, conn)
        run = f"soak-{uuid.uuid4().hex[:10]}"
        pattern = f"{run}-%"
        admissions = Admissions()
        chaos = Chaos()
        t0 = time.monotonic()
        t_end = t0 + args.duration
        clients = [asyncio.create_task(
            _admit(procs.port, run, args.rate, t0, t_end, random.Random(rng.random()), admissions))
            for _ in range(args.clients)]
        chaos_task = asyncio.create_task(
            _chaos(procs, conn, args, lease_seconds, t_end, rng, chaos))
        await asyncio.gather(*clients)
        admit_seconds = time.monotonic() - t0
        await chaos_task
        drain_started = time.monotonic()
        await _wait_terminal(conn, pattern, args.drain_timeout)
        drain_seconds = time.monotonic() - drain_started
        verified = await _verify(conn, pattern, admissions.admitted)
        for c in procs.reap_exited():
            chaos.unexpected_exits.append(f"{c.name} ({c.worker_id}) exit {c.proc.returncode}")
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

            pg_root = _short_tempdir("fp-soak-")
            server = start_embedded_postgres(pg_root / "pg", durable=False)
            url = server.url
        asyncio.run(upgrade(url))
        lease_seconds = float(CHILD_SETTINGS["FENCEPOST_LEASE_SECONDS"])
        procs = Processes(url, _free_port(), args.concurrency, log_dir)
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
        "admission_p50_ms": _round(_percentile(latencies, 0.5)),
        "admission_p99_ms": _round(_percentile(latencies, 0.99)),
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
            "database": "embedded" if server is not None else "DATABASE_URL",
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
