"""Issue 11 item 7 on a real Postgres: deploy/postgres/roles.sql (what the
compose postgres container runs at initialization), then `fencepost migrate`
as the migrator role; the runtime role (the API's and the workers') admits,
claims, writes steps and acknowledges, but cannot create, drop, alter or
truncate anything — not even by running `fencepost migrate` itself.

The compose and Dockerfile side is checked by parsing, in tests/deploy."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import pytest

from app.db import asyncpg_dsn, create_pool
from app.migrate import check_schema
from app.settings import Settings
from app.store import ExecutionStore

ROOT = Path(__file__).resolve().parents[2]
ROLES_SQL = ROOT / "deploy" / "postgres" / "roles.sql"

pytestmark = pytest.mark.timeout(180)


def render_psql(sql: str, variables: dict[str, str]) -> str:
    """psql's variable interpolation, as `psql -v name=value -f roles.sql` does
    it: :"name" an identifier, :'name' a literal. Every variable must be given."""
    def ident(m: re.Match) -> str:
        return '"' + variables[m[1]].replace('"', '""') + '"'

    def literal(m: re.Match) -> str:
        return "'" + variables[m[1]].replace("'", "''") + "'"

    sql = re.sub(r'--[^\n]*', "", sql)
    sql = re.sub(r':"(\w+)"', ident, sql)
    sql = re.sub(r":'(\w+)'", literal, sql)
    assert not re.search(r":[\"'a-z]", sql.replace("::", "")), "an uninterpolated psql variable"
    return sql


def as_role(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user)}:{quote(password)}@{host}"))


def fencepost(*args: str, database_url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FENCEPOST_") and k != "DATABASE_URL"}
    env["DATABASE_URL"] = database_url
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


REFUSED_TO_RUNTIME = [
    "CREATE TABLE intruder (a int)",
    "CREATE TEMP TABLE intruder (a int)",
    "CREATE SCHEMA intruder",
    "DROP TABLE executions",
    "ALTER TABLE executions ADD COLUMN intruder int",
    "ALTER TABLE api_tokens DROP CONSTRAINT quotas_positive",
    "TRUNCATE executions",
    "CREATE INDEX intruder ON executions (status)",
    "DROP INDEX ix_executions_admitted",
    "CREATE FUNCTION intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "DROP FUNCTION fencepost_redelivery_delay",
    "COMMENT ON TABLE executions IS 'intruder'",
    "ALTER SEQUENCE signals_signal_id_seq RESTART",
]


async def test_runtime_role_runs_fencepost_but_cannot_change_the_schema(
        empty_database_url, pg_admin, make_api, tenancy_settings) -> None:
    suffix = uuid.uuid4().hex[:10]
    names = {
        "database": urlsplit(empty_database_url).path.lstrip("/"),
        "migrator": f"fp_migrator_{suffix}", "migrator_password": secrets.token_hex(16),
        "runtime": f"fp_runtime_{suffix}", "runtime_password": secrets.token_hex(16),
    }
    migrator_url = as_role(empty_database_url, names["migrator"], names["migrator_password"])
    runtime_url = as_role(empty_database_url, names["runtime"], names["runtime_password"])
    admin = await asyncpg.connect(asyncpg_dsn(empty_database_url))  # the superuser
    pool = None
    try:
        await admin.execute(render_psql(ROLES_SQL.read_text(), names))

        # The runtime role cannot migrate: no DDL at all, nothing created.
        refused = await asyncio.to_thread(fencepost, "migrate", database_url=runtime_url)
        assert refused.returncode != 0, refused.stdout
        assert "permission denied" in refused.stderr + refused.stdout, refused.stderr[-2000:]
        assert not await admin.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")

        migrated = await asyncio.to_thread(fencepost, "migrate", database_url=migrator_url)
        assert migrated.returncode == 0, migrated.stderr[-2000:]
        owners = await admin.fetch(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")
        assert [r["tableowner"] for r in owners] == [names["migrator"]]

        # The runtime role: the schema check, then a whole execution through the store.
        pool = await create_pool(Settings(database_url=runtime_url))
        await check_schema(pool)
        store = ExecutionStore(pool)
        await store.admissions.admit(workflow_id="wf", params={"n": 1}, execution_id="least-1")
        (delivery,) = await store.leases.claim_due(1, 30, "worker-1")
        await store.steps.write_step(delivery.lease, "one", value={"ok": 1})
        await store.leases.acknowledge(delivery.lease, "completed", result={"done": True})
        assert await pool.fetchval(
            "SELECT status FROM executions WHERE execution_id = 'least-1'") == "completed"
        await store.operator.request_wake("least-1")
        await store.tokens.create_token("t1", name="n", role="trigger", secret_sha256="0" * 64,
                                 admissions_per_minute=5)
        assert await store.tokens.token_quotas() == {"t1": (5, None)}

        # ... and over HTTP: the API starts (schema check) and admits as the runtime role.
        api = await make_api(tenancy_settings.model_copy(
            update={"database_url": runtime_url, "auth": "disabled"}))
        r = await api.post("/v1/executions",
                           json={"workflowId": "wf", "executionId": "least-2", "params": {}})
        assert r.status_code == 201, r.text
        assert (await api.get("/v1/executions/least-1")).json()["status"] == "completed"

        async with pool.acquire() as conn:
            for statement in REFUSED_TO_RUNTIME:
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute(statement)
        # The migrator, owner of the schema, can (a later migration).
        mig = await asyncpg.connect(asyncpg_dsn(migrator_url))
        try:
            await mig.execute("CREATE INDEX ix_probe ON executions (status); DROP INDEX ix_probe")
        finally:
            await mig.close()
    finally:
        if pool is not None:
            await pool.close()
        # The test database is dropped by its fixture; the roles are the server's.
        # One role at a time (both at once trips over the shared default ACL).
        for role in (names["runtime"], names["migrator"]):
            await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.close()
        for role in (names["runtime"], names["migrator"]):
            await pg_admin.execute(f'DROP ROLE IF EXISTS "{role}"')


# ------------------------------------------------------------------ /docs


async def test_docs_pages_load_no_foreign_script_on_the_api_origin_unless_turned_on(
        make_api, tenancy_settings) -> None:
    """Swagger UI and ReDoc pages load their scripts from a CDN: served on the
    dashboard's origin, a script from elsewhere runs where the session cookie
    lives. Off by default (FENCEPOST_API_DOCS; `fencepost dev` turns it on);
    the schema itself is always served."""
    api = await make_api()
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        r = await api.get(path)
        assert r.status_code == 404, (path, r.status_code)
        assert not re.search(r"<script[^>]+src=", r.text), r.text[:300]
    schema = await api.get("/openapi.json")
    assert schema.status_code == 200 and schema.json()["openapi"].startswith("3.")

    dev = await make_api(tenancy_settings.model_copy(update={"api_docs": True}))
    page = await dev.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    assert (await dev.get("/redoc")).status_code == 200
    assert Settings().api_docs is False or "FENCEPOST_API_DOCS" in os.environ
