"""The soak's load: HTTP clients admitting executions of the soak workflow at
a bounded rate, recording what was admitted, how long each admission took
and every failed one."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from app.tools.soakflows import WORKFLOW

ADMIT_TIMEOUT_SECONDS = 15.0



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
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        reader = self.reader
        self.writer.write(
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        status = await reader.readline()
        if not status:
            raise ConnectionError("the API closed the connection")
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return int(status.split()[1]), await reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def admit(port: int, run: str, rate: float, t0: float, t_end: float,
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
