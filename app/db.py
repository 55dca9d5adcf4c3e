"""Connections: the asyncpg pool every process uses, and URL translation for
SQLAlchemy/alembic (which reach Postgres through the same asyncpg driver)."""

from __future__ import annotations

import functools
import json

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


# NaN and Infinity are refused here rather than stored as text jsonb cannot parse.
_encode_json = functools.partial(json.dumps, allow_nan=False, separators=(",", ":"))


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb travels as text; decoding here keeps every caller on plain Python values.
    await conn.set_type_codec("jsonb", encoder=_encode_json, decoder=json.loads, schema="pg_catalog")


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
        },
    )
