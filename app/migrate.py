"""Schema migrations: `fencepost migrate` and the start-up schema check."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import sqlalchemy_url

# A source checkout has migrations/ beside the package (the image copies it
# there too); an installed wheel carries the same files as app/migrations.
_BESIDE = Path(__file__).resolve().parent.parent / "migrations"
_PACKAGED = Path(__file__).resolve().parent / "migrations"
MIGRATIONS = _BESIDE if (_BESIDE / "env.py").is_file() else _PACKAGED
# One arbitrary 64-bit key: concurrent `fencepost migrate` runs queue behind it.
MIGRATION_LOCK_KEY = 0x66656E6365  # "fence"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    if url:
        cfg.attributes["url"] = url
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def _with_lock(url: str, fn) -> None:
    engine = create_async_engine(sqlalchemy_url(url))
    try:
        async with engine.connect() as conn:
            # Session-level lock: held across alembic's own transactions.
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            await conn.commit()
            try:
                await conn.run_sync(fn)
                await conn.commit()
            finally:
                await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
                await conn.commit()
    finally:
        await engine.dispose()


async def upgrade(url: str, revision: str = "head") -> None:
    def run(sync_conn) -> None:
        cfg = alembic_config(url)
        cfg.attributes["connection"] = sync_conn
        command.upgrade(cfg, revision)

    await _with_lock(url, run)


async def downgrade(url: str, revision: str = "base") -> None:
    def run(sync_conn) -> None:
        cfg = alembic_config(url)
        cfg.attributes["connection"] = sync_conn
        command.downgrade(cfg, revision)

    await _with_lock(url, run)


async def current_revision(url: str) -> str | None:
    engine = create_async_engine(sqlalchemy_url(url))
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda c: MigrationContext.configure(c).get_current_revision()
            )
    finally:
        await engine.dispose()


async def is_at_head(url: str) -> bool:
    return await current_revision(url) == head_revision()


class SchemaOutOfDate(RuntimeError):
    pass


async def check_schema(pool) -> None:
    """API and workers refuse to start on a schema that is not at head."""
    try:
        revision = await pool.fetchval("SELECT version_num FROM alembic_version")
    except Exception as exc:  # the table is missing: never migrated
        raise SchemaOutOfDate("the database has no fencepost schema; run `fencepost migrate`") from exc
    if revision != head_revision():
        raise SchemaOutOfDate(
            f"the database schema is at {revision}, this build needs {head_revision()}; "
            "run `fencepost migrate`"
        )
