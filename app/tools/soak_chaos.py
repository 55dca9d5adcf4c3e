"""The soak's fault injection: SIGKILL a worker and start a replacement every
`--kill-every` seconds, SIGSTOP another one past its lease every
`--pause-every` seconds, and replace workers that exit by themselves."""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import time
from dataclasses import dataclass, field

import asyncpg

from app.tools.soak_processes import Child, Processes


@dataclass
class Chaos:
    kills: int = 0
    leases_held_by_killed: int = 0
    pauses: int = 0
    replacements_started: int = 0
    unexpected_exits: list[str] = field(default_factory=list)


async def _held_by(conn: asyncpg.Connection, worker_id: str | None) -> int:
    return await conn.fetchval(
        "-- Citus: one worker's leases, on executions of any buckets (multi-shard)\n"
        "SELECT count(*) FROM executions WHERE lease_owner = $1 AND status = 'running' "
        "AND lease_expires_at > now()", worker_id)


async def inject_faults(procs: Processes, conn: asyncpg.Connection, args: argparse.Namespace,
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
