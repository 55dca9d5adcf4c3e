"""Connections: the asyncpg pool every process uses, and URL translation for
SQLAlchemy/alembic (which reach Postgres through the same asyncpg driver)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from app.settings import Settings


def sqlalchemy_url(url: str) -> str:
    """`postgresql://...` as SQLAlchemy's asyncpg dialect spells it."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError(f"not a postgres URL: {url.split('://')[0]}://...")


def asyncpg_dsn(url: str) -> str:
    """The plain libpq form asyncpg accepts."""
    if url.startswith("postgresql+asyncpg://"):
        return "postgresql://" + url[len("postgresql+asyncpg://") :]
    return url


def _exponent_float(value: Any) -> float | None:
    """The first float whose jsonb copy would read back as an int (1e+23 is
    stored as the exact decimal 100000000000000000000000), if any."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and "e+" in repr(item):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def encode_json(value: Any) -> str:
    """JSON for jsonb, refusing what would not come back exactly: NaN and
    Infinity (allow_nan=False), lone surrogates (ensure_ascii=False leaves them
    raw, and they cannot be encoded as UTF-8), large floats written with an
    exponent (jsonb would return them as integers)."""
    text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    if "e+" in text:  # cheap filter; the walk runs only when a string or float has it
        found = _exponent_float(value)
        if found is not None:
            raise ValueError(
                f"the number {found!r} would be stored as an integer; send it as a string "
                "or an integer"
            )
    return text


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb travels as text; decoding here keeps every caller on plain Python values.
    await conn.set_type_codec("jsonb", encoder=encode_json, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool connections carry no session state of ours (no LISTEN, no advisory
    locks, no prepared cursors), so the default reset round trip is skipped."""


async def create_pool(settings: Settings, *, min_size: int | None = None, max_size: int | None = None,
                      application_name: str = "fencepost") -> asyncpg.Pool:
    if not settings.database_url:
        raise RuntimeError("DATABASE_URL is not set")
    return await asyncpg.create_pool(
        asyncpg_dsn(settings.database_url),
        min_size=settings.pool_min_size if min_size is None else min_size,
        max_size=settings.pool_max_size if max_size is None else max_size,
        timeout=settings.connect_timeout_seconds,
        command_timeout=settings.statement_timeout_seconds + 5,
        init=_init_connection,
        reset=_keep_session,
        server_settings={
            "application_name": application_name,
            "statement_timeout": str(int(settings.statement_timeout_seconds * 1000)),
            "timezone": "UTC",
            # Every statement of ours is short: compiling one with JIT (tens
            # of ms of CPU) never pays, and a generic plan's estimate can
            # cross jit_above_cost on every call (the claim's queue limits did).
            "jit": "off",
            # Citus: catalog reads see shards as the tables they are. With
            # its default (hide them), every pg_class scan filters each row
            # through a function, and asyncpg's type lookup (the first use
            # of int4[] and the like on each connection) took 730 ms instead
            # of 11 ms on a 1+2 cluster, stalling every new connection. On one
            # Postgres the setting is an unused placeholder.
            "citus.override_table_visibility": "off",
        },
    )
