"""The step functions of the replay tests' workflows, shared by the code that
records histories (flows.py) and the changed code replayed against them
(variants.py): a step recorded by one function replays only under the same.

`ARMED["mode"]` says whether they may run: None (the workers recording a
history), "test" (an in-process replay: a call fails the test) or "process"
(a `fencepost replay` subprocess: a call exits with STEP_RAN_EXIT).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

ARMED: dict[str, str | None] = {"mode": None}
CALLED: list[str] = []
STEP_RAN_EXIT = 97


def _guard(what: str) -> None:
    if ARMED["mode"] is None:
        return
    CALLED.append(what)
    if ARMED["mode"] == "process":
        os._exit(STEP_RAN_EXIT)
    pytest.fail(f"{what} ran during a replay")


async def reserve(n: int) -> int:
    _guard("step reserve")
    return n * 10


async def fraud_check(amount: int) -> bool:
    _guard("step fraud_check")
    return amount < 1000


async def audit() -> str:
    _guard("step audit")
    return "audited"


async def ship() -> str:
    _guard("step ship")
    return "shipped"


async def charge(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    _guard("effect charge")
    return {"charged": amount, "key": idempotency_key}


async def book(conn: Any) -> int:
    _guard("transaction book")
    return int(await conn.fetchval("SELECT 1"))


async def wrap() -> str:
    _guard("step wrap")
    return "wrapped"
