"""Schema migrations: `fencepost migrate` and the start-up schema check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import asyncpg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import sqlalchemy_url
from app.version import VERSION

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
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # only with no revision files at all: a broken install
        raise RuntimeError(f"no schema revisions in {MIGRATIONS}")
    return head


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


async def _with_lock(url: str, fn: Callable[[Connection], None]) -> None:
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


async def upgrade(url: str, revision: str = "head", *, citus: bool = False,
                  shards: int | None = None) -> None:
    """Upgrade to `revision`; with `citus`, then distribute the tables over the
    database's Citus cluster (app/citus.py; at head only; `shards` as there)."""
    def run(sync_conn: Connection) -> None:
        cfg = alembic_config(url)
        cfg.attributes["connection"] = sync_conn
        command.upgrade(cfg, revision)

    await _with_lock(url, run)
    if citus:
        from app.citus import distribute

        await distribute(url, shards)


async def downgrade(url: str, revision: str = "base") -> None:
    def run(sync_conn: Connection) -> None:
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


class SchemaNewerThanBuild(SchemaOutOfDate):
    """The database was migrated by a newer build: `fencepost migrate` of this
    build cannot help (it knows no way back from a revision it has never seen)."""

    def __init__(self, revision: str) -> None:
        super().__init__(
            f"the database schema is at revision {revision}, newer than this build "
            f"(fencepost {VERSION}, which knows revisions up to {head_revision()}): run a "
            "fencepost build that includes that revision; `fencepost migrate` of this build "
            "cannot downgrade it"
        )


def schema_problem(revision: str | None) -> SchemaOutOfDate | None:
    """Why a database at `revision` cannot be served by this build, or None."""
    if revision is None:
        return SchemaOutOfDate("the database has no fencepost schema; run `fencepost migrate`")
    if revision not in known_revisions():
        return SchemaNewerThanBuild(revision)
    if revision != head_revision():
        return SchemaOutOfDate(
            f"the database schema is at {revision}, this build needs {head_revision()}; "
            "run `fencepost migrate`"
        )
    return None


async def check_schema(pool: asyncpg.Pool) -> None:
    """API and workers refuse to start on a schema that is not at head."""
    try:
        revision = await pool.fetchval("SELECT version_num FROM alembic_version")
    except Exception as exc:  # the table is missing: never migrated
        raise SchemaOutOfDate("the database has no fencepost schema; run `fencepost migrate`") from exc
    problem = schema_problem(revision)
    if problem is not None:
        raise problem
