"""Migrations: up, down, up again; no drift against app.schema; the CLI check;
concurrent upgrades serialised by the advisory lock."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from app import migrate
from app.db import sqlalchemy_url
from app.schema import metadata

EXPECTED_TABLES = {t.name for t in metadata.sorted_tables}


def fencepost_exe() -> str:
    exe = shutil.which("fencepost", path=str(Path(sys.executable).parent)) or shutil.which("fencepost")
    assert exe, "the `fencepost` console script is not installed (pip install -e .)"
    return exe


def run_cli(*args: str, database_url: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "FENCEPOST_DATABASE_URL")}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return subprocess.run([fencepost_exe(), *args], env=env, capture_output=True, text=True,
                          timeout=120)


async def user_objects(url: str) -> dict[str, set[str]]:
    """Everything a migration could leave behind in the public schema."""
    conn = await asyncpg.connect(url)
    try:
        relations = await conn.fetch(
            """SELECT c.relname, c.relkind::text AS relkind FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'public'"""
        )
        functions = await conn.fetch(
            """SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE n.nspname = 'public'"""
        )
        types = await conn.fetch(
            """SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
               WHERE n.nspname = 'public' AND t.typtype::text IN ('e', 'd', 'c')
                 AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid)"""
        )
    finally:
        await conn.close()
    return {
        "tables": {r["relname"] for r in relations if r["relkind"] in ("r", "p")},
        "relations": {r["relname"] for r in relations},
        "functions": {r["proname"] for r in functions},
        "types": {r["typname"] for r in types},
    }


async def test_upgrade_empty_database_to_head(empty_database_url):
    assert await migrate.current_revision(empty_database_url) is None
    assert not await migrate.is_at_head(empty_database_url)

    await migrate.upgrade(empty_database_url)

    assert await migrate.current_revision(empty_database_url) == migrate.head_revision()
    assert await migrate.is_at_head(empty_database_url)
    objects = await user_objects(empty_database_url)
    assert objects["tables"] == EXPECTED_TABLES | {"alembic_version"}
    assert "fencepost_redelivery_delay" in objects["functions"]
    assert "ix_executions_due" in objects["relations"]


async def test_downgrade_to_base_leaves_nothing_and_upgrades_again(empty_database_url):
    await migrate.upgrade(empty_database_url)

    await migrate.downgrade(empty_database_url, "base")

    assert await migrate.current_revision(empty_database_url) is None
    objects = await user_objects(empty_database_url)
    # alembic keeps its (now empty) bookkeeping table; nothing of ours survives.
    assert objects["tables"] <= {"alembic_version"}
    assert objects["relations"] <= {"alembic_version", "alembic_version_pkc"}
    assert objects["functions"] == set()
    assert objects["types"] == set()

    await migrate.upgrade(empty_database_url)
    assert await migrate.is_at_head(empty_database_url)
    assert (await user_objects(empty_database_url))["tables"] == EXPECTED_TABLES | {"alembic_version"}


async def test_schema_metadata_matches_migrations(database_url):
    """app.schema (Core) and the migrated database must not drift apart."""
    engine = create_async_engine(sqlalchemy_url(database_url))
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync_conn: compare_metadata(
                    MigrationContext.configure(sync_conn, opts={"compare_type": True}), metadata
                )
            )
    finally:
        await engine.dispose()
    assert diff == [], f"app.schema and migrations differ; write a migration:\n{diff!r}"


async def test_template_clone_is_at_head(database_url):
    assert await migrate.is_at_head(database_url)


async def test_cli_migrate_check_then_migrate(empty_database_url):
    check = await asyncio.to_thread(run_cli, "migrate", "--check", database_url=empty_database_url)
    assert check.returncode == 1, check
    assert "fencepost migrate" in check.stderr

    result = await asyncio.to_thread(run_cli, "migrate", database_url=empty_database_url)
    assert result.returncode == 0, result
    assert migrate.head_revision() in result.stdout

    check = await asyncio.to_thread(run_cli, "migrate", "--check", database_url=empty_database_url)
    assert check.returncode == 0, check
    assert await migrate.is_at_head(empty_database_url)


async def test_cli_migrate_citus_without_citus_changes_nothing(empty_database_url):
    """`migrate --citus` on a database without the citus extension refuses
    before it migrates anything, and says what to do."""
    result = await asyncio.to_thread(run_cli, "migrate", "--citus",
                                     database_url=empty_database_url)
    assert result.returncode == 2, result
    assert "CREATE EXTENSION citus" in result.stderr
    assert await migrate.current_revision(empty_database_url) is None


@pytest.mark.parametrize("args", [["--shards", "4"], ["--citus", "--shards", "0"],
                                  ["--citus", "--shards", "5000"]])
async def test_cli_migrate_shards_out_of_place_changes_nothing(empty_database_url, args):
    """`--shards` without `--citus`, or out of range, is refused before
    anything is migrated, saying what it needs."""
    result = await asyncio.to_thread(run_cli, "migrate", *args, database_url=empty_database_url)
    assert result.returncode == 2, result
    assert "--shards needs --citus and a number of shards from 1 to 4096" in result.stderr
    assert await migrate.current_revision(empty_database_url) is None


async def test_cli_without_database_url_exits_2():
    result = await asyncio.to_thread(run_cli, "migrate", "--check", database_url=None)
    assert result.returncode == 2, result
    assert "DATABASE_URL" in result.stderr


async def test_concurrent_upgrades_both_succeed(empty_database_url):
    await asyncio.gather(migrate.upgrade(empty_database_url), migrate.upgrade(empty_database_url))
    assert await migrate.is_at_head(empty_database_url)


async def test_concurrent_migrate_processes_both_succeed(empty_database_url):
    procs = [
        await asyncio.create_subprocess_exec(
            fencepost_exe(), "migrate",
            env={**os.environ, "DATABASE_URL": empty_database_url},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(3)
    ]
    outputs = await asyncio.gather(*(p.communicate() for p in procs))
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, (out.decode(), err.decode())
    assert await migrate.is_at_head(empty_database_url)
