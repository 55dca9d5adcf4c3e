"""Alembic environment: runs migrations over asyncpg (the one driver fencepost
uses), against the URL given by `fencepost migrate` or `-x url=...`."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import sqlalchemy_url
from app.schema import metadata

config = context.config


def _url() -> str:
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        from app.settings import Settings

        url = Settings().database_url
    if not url:
        raise SystemExit("no database URL: set DATABASE_URL or pass -x url=...")
    return sqlalchemy_url(url)


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(_url())
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")

connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    asyncio.run(_run_async())
