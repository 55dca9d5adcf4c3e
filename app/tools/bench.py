"""`fencepost bench`: the service measured end to end, printed as one JSON line.

Starts the API and W worker processes on DATABASE_URL (or a throw-away
embedded Postgres), then:

1. each side alone: N admissions over HTTP with no worker running (the API
   alone), then W workers drain that backlog (the workers alone);
2. start latency: admits executions one at a time to idle workers and reads,
   from the database clock, how long each took from admission to its first
   recorded step (p50/p99);
3. end to end: admits N executions of a 3-step workflow over HTTP from
   concurrent clients while the workers run them; admissions/s is measured at
   the client, executions/s from the first admission to the last completion
   on the database clock;
4. commits per execution: the database's transaction counter over the run,
   divided by N (everything counts: API, workers, polling, renewals); and CPU
   seconds per execution over the same run, from /proc, of the API process,
   of the workers and of the Postgres server (null, with the reason, when it
   is not on this machine);
5. quotas, with the workers stopped (the API alone, as in 1): a second API
   process with authentication on; two trigger tokens,
   one with an admission quota far above the load, one without, admit
   --quota-executions each from the same concurrent clients, in alternating
   rounds (so drift in the machine's load falls on both); the ratio of their
   admissions/s is what a quota costs (1.0 = nothing).

`--history N` then keeps N completed executions in the tables (copied in
SQL, see bench_history) and runs 3 and 4 again, printing both rates, and
EXPLAINs the claim to say whether it still reads executions by index only.

`--timers N` measures durable timers instead (bench_timers): how late N
sleeping executions, admitted over about their sleep, wake and complete, and
how late a lone timer on the idle service does.

`--queues` measures flow control instead (no API; the workers alone): as many
executions on a queue limited per concurrency key (--per-key-concurrency,
over --queue-keys keys) as on a queue with no limit, each admitted while its
queue is paused and then drained; executions/s runs from the first claim to
the last completion on the database clock, in alternating rounds. The per-key
limit is set (at run time) for the limited rounds only: a claim locks every
limited queue, so the unlimited rounds run with no limited queue at all.

`--citus-url URL` runs the default mode's measurement (1-5) twice in one
invocation: on the plain database (DATABASE_URL or the embedded one), then
on URL, a database on a Citus coordinator (the citus extension and worker
nodes added there), upgraded and distributed first (upgrade(url, citus=True));
`--citus-first` swaps the order. One line: the plain figures as always, and
the same figures of the Citus run prefixed `citus_`, with `citus_ratio`
(its executions/s over the plain one's) and `citus_nodes` (its worker nodes).

Machines here are shared and noisy: compare figures within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import asyncpg
import httpx

from app.db import asyncpg_dsn
from app.devserver import describe, spawn_children, stop_children
from app.settings import Settings
from app.tools.bench_cpu import CpuMeter
from app.tools.bench_fields import FIELDS

TIMER_WORKFLOW = "bench-timer"

WORKFLOW = "bench-3-steps"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executions", type=int, default=2000, help="executions to run (default 2000)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=int, default=32, help="deliveries per worker (default 32)")
    p.add_argument("--clients", type=int, default=32, help="concurrent HTTP clients (default 32)")
    p.add_argument("--latency-samples", type=int, default=50,
                   help="sequential admissions for start latency (default 50)")
    p.add_argument("--quota-executions", type=int, default=1000,
                   help="admissions per token in the quota phase (default 1000; 0 skips it)")
    p.add_argument("--queues", action="store_true",
                   help="instead: a queue limited per key next to an unlimited one")
    p.add_argument("--queue-executions", type=int, default=10_000,
                   help="--queues: executions on each queue (default 10000)")
    p.add_argument("--queue-keys", type=int, default=100,
                   help="--queues: concurrency keys of the limited queue (default 100)")
    p.add_argument("--per-key-concurrency", type=int, default=2,
                   help="--queues: the limited queue's per-key concurrency (default 2)")
    p.add_argument("--history", type=int, default=0, metavar="N",
                   help="after the end-to-end run, keep N completed executions in the tables "
                        "and run it again (default 0: once)")
    p.add_argument("--timers", type=int, default=0, metavar="N",
                   help="instead: N executions each sleeping --timer-seconds, admitted over "
                        "about that long; prints their lateness (default 0: off)")
    p.add_argument("--timer-seconds", type=float, default=20.0, metavar="S",
                   help="--timers: each execution's sleep (default 20)")
    p.add_argument("--citus-url", metavar="URL",
                   help="also run the measurement on URL, a database on a Citus coordinator "
                        "(citus extension and worker nodes added there; upgraded and "
                        "distributed first), after the plain one; figures prefixed citus_")
    p.add_argument("--citus-first", action="store_true",
                   help="--citus-url: run on Citus first, then on the plain database")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = FIELDS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _wait_ready(base: str, conn: asyncpg.Connection, workers: int, timeout: float = 60,
                      exited: Callable[[], str | None] | None = None) -> None:
    """Return once the API answers ready and `workers` workers beat; raise
    past `timeout`, or at once when `exited()` names a child that exited
    (waiting on for it would only delay the same failure)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base) as client:
        while True:
            try:
                if (await client.get("/readyz")).status_code == 200:
                    alive = await conn.fetchval(
                        "SELECT count(*) FROM workers WHERE stopped_at IS NULL "
                        "AND heartbeat_at > now() - interval '60 seconds'"
                    )
                    if alive >= workers:
                        return
            except httpx.TransportError:
                pass
            if exited is not None and (gone := exited()):
                raise RuntimeError(f"{gone} before the service was ready")
            if time.monotonic() > deadline:
                raise RuntimeError("the API or the workers did not become ready in time")
            await asyncio.sleep(0.1)


async def _start_latency(client: httpx.AsyncClient, conn: asyncpg.Connection, run: str,
                         samples: int) -> list[float]:
    ids = []
    for i in range(samples):
        eid = f"{run}-lat-{i}"
        r = await client.post("/v1/executions", json={"workflowId": WORKFLOW, "executionId": eid,
                                                       "params": {"n": i}})
        r.raise_for_status()
        ids.append(eid)
        deadline = time.monotonic() + 10
        while not await conn.fetchval(
            "SELECT true FROM execution_steps "
            "WHERE execution_id = $1 AND bucket = fencepost_bucket($1) AND step_key = 'one'", eid
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{eid} did not start within 10 s")
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)  # let the workers go idle again
    rows = await conn.fetch(
        """
        -- Citus: several executions, of any buckets (multi-shard)
        SELECT extract(epoch FROM s.recorded_at - e.admitted_at) * 1000 AS ms
        FROM executions e JOIN execution_steps s
          ON s.execution_id = e.execution_id AND s.bucket = e.bucket AND s.step_key = 'one'
        WHERE e.execution_id = ANY($1::text[])
        """,
        ids,
    )
    return [float(r["ms"]) for r in rows]


async def _admit_over(port: int, bodies: list[bytes], latencies: list[float],
                      token: str | None = None, send_at: list[float] | None = None) -> None:
    """One keep-alive HTTP/1.1 connection admitting `bodies` in turn (each not
    before its `send_at` time.perf_counter() instant, when given). A plain
    asyncio client: httpx's own overhead capped the rate it could offer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = b"" if token is None else b"Authorization: Bearer " + token.encode() + b"\r\n"
    try:
        for i, body in enumerate(bodies):
            if send_at is not None and (wait := send_at[i] - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            request = (
                b"POST /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
                + b"Content-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            t = time.perf_counter()
            writer.write(request)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            answer = await reader.readexactly(length)
            latencies.append((time.perf_counter() - t) * 1000)
            if b" 201 " not in status:
                raise RuntimeError(f"admission failed: {status!r} {answer[:200]!r}")
    finally:
        writer.close()


async def _wait_completed(conn: asyncpg.Connection, ids: list[str], deadline: float,
                          poll: float = 0.1) -> None:
    """Return once every one of `ids` completed; raise past `deadline`
    (time.monotonic()). Looked up by key, the finished ones dropped from each
    next query: a LIKE pattern would scan every execution the tables keep
    (--history), and that scan's cost would fall on the measured run."""
    pending = ids
    while True:
        done = await conn.fetch(
            "-- Citus: several executions, of any buckets (multi-shard)\n"
            "SELECT execution_id FROM executions WHERE execution_id = ANY($1::text[]) "
            "AND status = 'completed'",
            pending,
        )
        finished = {r["execution_id"] for r in done}
        pending = [eid for eid in pending if eid not in finished]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(ids) - len(pending)} of {len(ids)} executions "
                               "completed in time")
        await asyncio.sleep(poll)


async def _throughput(port: int, conn: asyncpg.Connection, run: str, n: int,
                      clients: int, phase: str = "mixed") -> dict:
    latencies: list[float] = []
    bodies = [
        json.dumps({"workflowId": WORKFLOW, "executionId": f"{run}-{phase}-{i}",
                    "params": {"n": i}}).encode()
        for i in range(n)
    ]
    t0 = time.perf_counter()
    await asyncio.gather(*(_admit_over(port, bodies[c::clients], latencies) for c in range(clients)))
    admit_seconds = time.perf_counter() - t0
    deadline = time.monotonic() + max(120, n / 20)
    # Only this phase's executions (the backlog and latency phases use other IDs).
    ids = [f"{run}-{phase}-{i}" for i in range(n)]
    await _wait_completed(conn, ids, deadline)
    span = await conn.fetchval(
        "-- Citus: several executions, of any buckets (multi-shard)\n"
        "SELECT extract(epoch FROM max(updated_at) - min(admitted_at)) FROM executions "
        "WHERE execution_id = ANY($1::text[])",
        ids,
    )
    return {
        "admissions_per_second": n / admit_seconds,
        "executions_per_second": n / float(span),
        "admission_latency_p50_ms": _percentile(latencies, 0.5),
        "admission_latency_p99_ms": _percentile(latencies, 0.99),
        "wall_seconds": float(span),
    }


async def _commits(conn: asyncpg.Connection) -> int:
    await asyncio.sleep(1.2)  # backends flush their statistics about once a second
    return await conn.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )


async def _backlog(port: int, conn: asyncpg.Connection, run: str, n: int, clients: int,
                   start_workers, base: str, workers: int,
                   exited: Callable[[], str | None] | None = None) -> dict:
    """Admissions with no worker running (the API alone), then the workers
    drain that backlog (the workers alone): each side's own rate."""
    latencies: list[float] = []
    bodies = [
        json.dumps({"workflowId": WORKFLOW, "executionId": f"{run}-backlog-{i}",
                    "params": {"n": i}}).encode()
        for i in range(n)
    ]
    t0 = time.perf_counter()
    await asyncio.gather(*(_admit_over(port, bodies[c::clients], latencies) for c in range(clients)))
    admit_seconds = time.perf_counter() - t0
    start_workers()
    await _wait_ready(base, conn, workers, exited=exited)
    deadline = time.monotonic() + max(120, n / 20)
    pattern = f"{run}-backlog-%"
    while await conn.fetchval(
        "-- Citus: executions by an ID pattern, of every bucket (multi-shard)\n"
        "SELECT count(*) FROM executions WHERE execution_id LIKE $1 AND status <> 'completed'",
        pattern,
    ):
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not drain the backlog in time")
        await asyncio.sleep(0.1)
    span = await conn.fetchval(
        """
        -- Citus: executions by an ID pattern, of every bucket (multi-shard);
        -- each aggregate apart (Citus pushes no subquery of a target list
        -- down past an aggregate)
        WITH first_claim AS (
            SELECT min(v.at) AS at FROM execution_events v
            WHERE v.execution_id LIKE $1 AND v.kind = 'claimed'
        ), last_end AS (
            SELECT max(e.updated_at) AS at FROM executions e WHERE e.execution_id LIKE $1
        )
        SELECT extract(epoch FROM l.at - f.at) FROM first_claim f, last_end l
        """,
        pattern,
    )
    return {
        "admissions_per_second": n / admit_seconds,
        "admission_latency_p50_ms": _percentile(latencies, 0.5),
        "admission_latency_p99_ms": _percentile(latencies, 0.99),
        "backlog_executions_per_second": n / float(span),
    }


async def _quota_cost(url: str, port: int, run: str, n: int, clients: int) -> dict:
    """Admissions/s under a token with an admission quota far above the load
    against a token with none, on an API process with authentication on, in
    alternating rounds; the ratio is the quota's cost."""
    from app.api.auth import new_token
    from app.store import ExecutionStore

    pool = await asyncpg.create_pool(asyncpg_dsn(url), min_size=1, max_size=2)
    try:
        store = ExecutionStore(pool)
        tokens = {}
        for side, quota in (("none", None), ("quota", 2_000_000_000)):
            token_id, token, digest = new_token()
            await store.tokens.create_token(token_id, name=f"{run}-{side}", role="trigger",
                                     secret_sha256=digest, admissions_per_minute=quota)
            tokens[side] = token
    finally:
        await pool.close()
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base) as client:
        deadline = time.monotonic() + 60
        while True:
            try:
                if (await client.get("/readyz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the authenticated API did not become ready in time")
            await asyncio.sleep(0.1)
    rounds = 8
    seconds = {"none": 0.0, "quota": 0.0}
    done = {"none": 0, "quota": 0}
    for r in range(rounds):
        size = n // rounds + (1 if r < n % rounds else 0)
        order = ("none", "quota") if r % 2 == 0 else ("quota", "none")
        for side in order:
            bodies = [
                json.dumps({"workflowId": WORKFLOW, "executionId": f"{run}-q{side}-{r}-{i}",
                            "params": {"n": i}}).encode()
                for i in range(size)
            ]
            t0 = time.perf_counter()
            await asyncio.gather(*(_admit_over(port, bodies[c::clients], [], tokens[side])
                                   for c in range(clients)))
            seconds[side] += time.perf_counter() - t0
            done[side] += size
    no_quota = done["none"] / seconds["none"]
    with_quota = done["quota"] / seconds["quota"]
    return {
        "admissions_per_second_no_quota": no_quota,
        "admissions_per_second_with_quota": with_quota,
        "quota_admission_ratio": with_quota / no_quota,
    }


async def _measure(url: str, port: int, args: argparse.Namespace, start_workers,
                   auth_port: int | None = None, stop_workers=None, pids=None,
                   exited: Callable[[], str | None] | None = None) -> dict:
    base = f"http://127.0.0.1:{port}"
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await _wait_ready(base, conn, 0, exited=exited)
        run = f"bench-{uuid.uuid4().hex[:8]}"
        alone = await _backlog(port, conn, run, args.executions, args.clients, start_workers,
                               base, args.workers, exited)
        async with httpx.AsyncClient(base_url=base) as client:
            latency = await _start_latency(client, conn, run, args.latency_samples)
        meter = await CpuMeter.for_run(conn, url, pids)
        commits_before = await _commits(conn)
        meter.start()
        mixed = await _throughput(port, conn, run, args.executions, args.clients)
        cpu = meter.per_execution(args.executions)
        commits = await _commits(conn) - commits_before
        result = {
            "executions_per_second": mixed["executions_per_second"],
            "admissions_per_second": alone["admissions_per_second"],
            "admissions_per_second_while_running": mixed["admissions_per_second"],
            "backlog_executions_per_second": alone["backlog_executions_per_second"],
            "admission_latency_p50_ms": alone["admission_latency_p50_ms"],
            "admission_latency_p99_ms": alone["admission_latency_p99_ms"],
            "admission_latency_p99_ms_while_running": mixed["admission_latency_p99_ms"],
            "wall_seconds": mixed["wall_seconds"],
        }
        result.update({
            "start_latency_p50_ms": _percentile(latency, 0.5),
            "start_latency_p99_ms": _percentile(latency, 0.99),
            "commits_per_execution": commits / args.executions,
            **cpu,
        })
        if args.history:
            from app.tools.bench_history import measure_with_history

            result.update(await measure_with_history(port, conn, run, args, meter))
        if auth_port is not None:
            if stop_workers is not None:
                await asyncio.to_thread(stop_workers)
            result.update(await _quota_cost(url, auth_port, run, args.quota_executions,
                                            args.clients))
        return result
    finally:
        await conn.close()


# The rounds of `--queues`, alternating which queue goes first, so that drift
# in the machine's load falls on both.
QUEUE_ROUNDS = 4


async def _wait_workers(pool: asyncpg.Pool, workers: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while await pool.fetchval(
        "SELECT count(*) FROM workers WHERE stopped_at IS NULL "
        "AND heartbeat_at > now() - interval '60 seconds'"
    ) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not become ready in time")
        await asyncio.sleep(0.1)


async def _drain(store, pool: asyncpg.Pool, queue: str, workflow_id: str, ids: list[str],
                 keys: int | None) -> tuple[float, int]:
    """Admit `ids` to the paused `queue`, resume it, wait until every one
    completed, pause it again; (seconds from the first claim to the last
    completion, claim statements that took any of them)."""
    pending = iter(enumerate(ids))

    async def admitter() -> None:
        for i, eid in pending:
            key = f"key-{i % keys}" if keys else None
            await store.admissions.admit(workflow_id=workflow_id, execution_id=eid,
                                         params={"n": i, "key": key}, queue=queue,
                                         concurrency_key=key)

    await asyncio.gather(*(admitter() for _ in range(8)))
    await store.queues.change(queue, {}, actor="bench", reset=["paused"])
    deadline = time.monotonic() + max(120, len(ids) / 20)
    while await pool.fetchval(
        "-- Citus: a queue's executions, of every bucket (multi-shard)\n"
        "SELECT count(*) FROM executions "
        "WHERE queue = $1 AND status IN ('admitted', 'suspended', 'running')", queue
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not drain queue {queue} in time")
        await asyncio.sleep(0.05)
    await store.queues.change(queue, {"paused": True}, actor="bench")
    done = await pool.fetchval(
        "-- Citus: several executions, of any buckets (multi-shard)\n"
        "SELECT count(*) FROM executions WHERE execution_id = ANY($1::text[]) "
        "AND status = 'completed'", ids)
    if done != len(ids):
        raise RuntimeError(f"only {done} of {len(ids)} executions on {queue} completed")
    row = await pool.fetchrow(
        """
        -- Citus: several executions, of any buckets (multi-shard)
        SELECT extract(epoch FROM (SELECT max(updated_at) FROM executions
                                   WHERE execution_id = ANY($1::text[])) - min(v.at)),
               count(DISTINCT (v.detail->>'owner', v.at))
        FROM execution_events v
        WHERE v.execution_id = ANY($1::text[]) AND v.kind = 'claimed'
        """,
        ids,
    )
    assert row is not None  # an aggregate answers one row
    return float(row[0]), int(row[1])


async def _measure_queues(url: str, args: argparse.Namespace, settings: Settings,
                          start_workers) -> dict:
    from app.db import create_pool
    from app.store import ExecutionStore
    from app.tools.benchflows import FREE_QUEUE, KEYED_QUEUE

    pool = await create_pool(settings.model_copy(update={"database_url": url}),
                             min_size=1, max_size=8)
    try:
        store = ExecutionStore(pool)
        for queue in (FREE_QUEUE.name, KEYED_QUEUE.name):
            await store.queues.change(queue, {"paused": True}, actor="bench")
        start_workers()
        await _wait_workers(pool, args.workers)
        run = f"bench-{uuid.uuid4().hex[:8]}"
        seconds = {"free": 0.0, "keyed": 0.0}
        claims = {"free": 0, "keyed": 0}
        for r in range(QUEUE_ROUNDS):
            size = args.queue_executions // QUEUE_ROUNDS + (
                1 if r < args.queue_executions % QUEUE_ROUNDS else 0)
            for side in ("free", "keyed") if r % 2 == 0 else ("keyed", "free"):
                ids = [f"{run}-{side}-{r}-{i}" for i in range(size)]
                if side == "keyed":
                    await store.queues.change(
                        KEYED_QUEUE.name, {"per_key_concurrency": args.per_key_concurrency},
                        actor="bench")
                    span, n = await _drain(store, pool, KEYED_QUEUE.name, "bench-keyed", ids,
                                           args.queue_keys)
                    # The unlimited rounds run with no limited queue.
                    await store.queues.change(KEYED_QUEUE.name, {}, actor="bench",
                                              reset=["per_key_concurrency"])
                else:
                    span, n = await _drain(store, pool, FREE_QUEUE.name, "bench-free", ids, None)
                seconds[side] += span
                claims[side] += n
        for queue in (FREE_QUEUE.name, KEYED_QUEUE.name):
            await store.queues.change(queue, {}, actor="bench", reset=["paused"])
    finally:
        await pool.close()
    n = args.queue_executions
    unlimited, limited = n / seconds["free"], n / seconds["keyed"]
    return {
        "executions_per_second_unlimited": unlimited,
        "executions_per_second_per_key_limited": limited,
        "per_key_limited_ratio": limited / unlimited,
        "executions_per_claim_unlimited": n / max(claims["free"], 1),
        "executions_per_claim_per_key_limited": n / max(claims["keyed"], 1),
    }


def _run_queues(url: str, args: argparse.Namespace, settings: Settings) -> dict:
    env = {"FENCEPOST_WORKFLOWS": "app.tools.benchflows", "FENCEPOST_LOG_LEVEL": "warning"}
    devnull = open(os.devnull, "w")  # noqa: SIM115 - children's logs are not the result
    workers: list = []

    def start_workers() -> None:
        workers.extend(spawn_children(url, host="127.0.0.1", port=0, workers=args.workers,
                                      concurrency=args.concurrency, env_extra=env,
                                      log_level="warning", stderr=devnull, api=False))

    try:
        return asyncio.run(_measure_queues(url, args, settings, start_workers))
    finally:
        stop_children(workers)
        devnull.close()


def _rounded(key: str, value):
    if not isinstance(value, float):
        return value
    # CPU per execution is a few milliseconds: kept to the microsecond.
    return round(value, 6 if "_cpu_s_per_execution" in key else 2)


async def _prepare_citus(url: str) -> int:
    """Upgrade and distribute the database at `url` on its Citus cluster;
    the number of its worker nodes."""
    from app.migrate import upgrade

    await upgrade(url, citus=True)
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM pg_dist_node "
            "WHERE groupid <> 0 AND noderole = 'primary' AND isactive")
    finally:
        await conn.close()


def _log_summary(text: str, records: int = 20) -> str:
    """The last `records` records of the children's log, one line each: a
    JSON record as `level logger: event`, a traceback in it by its last line
    (the exception); other lines as they are."""
    lines = []
    for raw in text.splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            lines.append(raw)
            continue
        event = str(record.get("event", "")).strip().splitlines() or [""]
        exception = str(record.get("exception", "")).strip().splitlines()
        last = (exception or event)[-1]
        head = event[0] if len(event) == 1 or exception else "traceback ending"
        text_of = head if head == last else f"{head}: {last}"
        lines.append(f"{record.get('level', '?')} {record.get('logger', '?')}: {text_of}")
    return "\n".join(lines[-records:])


def _run_end_to_end(url: str, args: argparse.Namespace, where: str) -> dict:
    """The default mode's phases (1-5, and --history) on the database at
    `url`, with an API and workers of their own, stopped before returning.
    A failure names `where` and ends with the tail of the children's log."""
    port = _free_port()
    env = {"FENCEPOST_WORKFLOWS": "app.tools.benchflows", "FENCEPOST_LOG_LEVEL": "warning"}
    # The children's warnings are not the result, but say why a run failed.
    log = tempfile.TemporaryFile(mode="w+", errors="replace")  # noqa: SIM115 - closed below
    options = {"host": "127.0.0.1", "port": port, "concurrency": args.concurrency,
               "env_extra": env, "log_level": "warning", "stderr": log}
    children = spawn_children(url, workers=0, **options)
    api = [children[0].pid]
    auth_port = None
    try:
        if args.quota_executions:
            # The quota phase's API: the same service with authentication on.
            auth_port = _free_port()
            children += spawn_children(url, workers=0, **{
                **options, "port": auth_port,
                "env_extra": {**env, "FENCEPOST_AUTH": "enabled"}})

        workers: list = []

        def start_workers() -> None:
            workers.extend(spawn_children(url, workers=args.workers, api=False, **options))
            children.extend(workers)

        def stop_workers() -> None:
            stop_children(workers)

        def exited() -> str | None:
            gone = [f"{describe(c)} exited ({c.returncode})" for c in children
                    if c.poll() is not None]
            return ", ".join(gone) or None

        return asyncio.run(_measure(url, port, args, start_workers, auth_port, stop_workers,
                                    lambda: (api, [w.pid for w in workers]), exited))
    except Exception as exc:
        log.seek(0)
        exc.add_note(f"bench: this run was on {where}; its API's and workers' log ends:\n"
                     + _log_summary(log.read()))
        raise
    finally:
        stop_children(children)
        log.close()


def _run_timers(url: str, args: argparse.Namespace) -> dict:
    from app.tools.bench_timers import run_timers

    port = _free_port()
    env = {"FENCEPOST_WORKFLOWS": "app.tools.benchflows", "FENCEPOST_LOG_LEVEL": "warning"}
    devnull = open(os.devnull, "w")  # noqa: SIM115 - children's logs are not the result
    options = {"host": "127.0.0.1", "port": port, "concurrency": args.concurrency,
               "env_extra": env, "log_level": "warning", "stderr": devnull}
    children = spawn_children(url, workers=0, **options)
    try:
        children += spawn_children(url, workers=args.workers, api=False, **options)
        return asyncio.run(run_timers(url, port, args))
    finally:
        stop_children(children)
        devnull.close()


def run(args: argparse.Namespace, settings: Settings) -> int:
    from app.migrate import upgrade

    if args.executions < 1 or args.workers < 1 or args.concurrency < 1 or args.clients < 1:
        print("error: --executions, --workers, --concurrency and --clients must be positive")
        return 2
    if args.quota_executions < 0:
        print("error: --quota-executions must be 0 (skip the quota phase) or positive")
        return 2
    if args.history < 0 or args.timers < 0 or args.timer_seconds <= 0:
        print("error: --history and --timers must be 0 (off) or positive, "
              "--timer-seconds positive")
        return 2
    if args.queues and min(args.queue_executions, args.queue_keys,
                           args.per_key_concurrency) < 1:
        print("error: --queue-executions, --queue-keys and --per-key-concurrency must be "
              "positive")
        return 2
    if args.citus_url is not None:
        other = [flag for flag, on in (("--history", args.history), ("--timers", args.timers),
                                       ("--queues", args.queues)) if on]
        if other:
            print(f"error: --citus-url measures the default mode only, not with "
                  f"{' or '.join(other)}")
            return 2
    elif args.citus_first:
        print("error: --citus-first orders the runs of --citus-url, which is not given")
        return 2
    citus_nodes = None
    if args.citus_url is not None:
        from app.citus import CitusMissing

        # Before either run: a coordinator that cannot be distributed on fails
        # the command before the plain run spent its minutes.
        try:
            citus_nodes = asyncio.run(_prepare_citus(args.citus_url))
        except CitusMissing as exc:
            print(f"error: --citus-url: {exc}")
            return 2
    server = None
    url = settings.database_url
    if not url:
        from app.embedded import start_embedded_postgres

        data_dir = Path(tempfile.mkdtemp(prefix="fencepost-bench-"))
        server = start_embedded_postgres(data_dir / "pg")
        url = server.url
    try:
        asyncio.run(upgrade(url))
        if args.queues:
            queues = _run_queues(url, args, settings)
        elif args.timers:
            timers = _run_timers(url, args)
        elif args.citus_url is not None:
            runs = [(url, "the plain database"),
                    (args.citus_url, "the Citus database (--citus-url)")]
            if args.citus_first:
                runs.reverse()
            results = [_run_end_to_end(where, args, name) for where, name in runs]
            result, on_citus = results[::-1] if args.citus_first else results
        else:
            result = _run_end_to_end(url, args, "the database")
    finally:
        if server is not None:
            server.stop()
    if args.queues:
        print(json.dumps({
            "benchmark": "fencepost",
            "mode": "queues",
            "executions": args.queue_executions,
            "queue_keys": args.queue_keys,
            "per_key_concurrency": args.per_key_concurrency,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "steps_per_execution": 3,
            "database": "embedded" if server is not None else "DATABASE_URL",
            "lease_seconds": settings.lease_seconds,
            "renew_seconds": settings.renew_seconds,
            "cpus": os.cpu_count(),
            **{k: round(v, 2) for k, v in queues.items()},
        }))
        return 0
    if args.timers:
        from app.tools.bench_timers import timers_line

        print(json.dumps(timers_line(args, server is not None, timers)))
        return 0
    line = {
        "benchmark": "fencepost",
        "executions": args.executions,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "clients": args.clients,
        "quota_executions": args.quota_executions,
        "steps_per_execution": 3,
        "database": "embedded" if server is not None else "DATABASE_URL",
        "lease_seconds": settings.lease_seconds,
        "renew_seconds": settings.renew_seconds,
        "cpus": os.cpu_count(),
        **{k: _rounded(k, v) for k, v in result.items()},
    }
    if args.citus_url is not None:
        line.update({
            "citus_first": args.citus_first,
            "citus_nodes": citus_nodes,
            "citus_ratio": round(on_citus["executions_per_second"]
                                 / result["executions_per_second"], 3),
            **{f"citus_{k}": _rounded(k, v) for k, v in on_citus.items()},
        })
    print(json.dumps(line, sort_keys=False))
    return 0
