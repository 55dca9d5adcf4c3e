"""`fencepost tokens create|list|revoke`, run as a real process on the test
database: the token is printed alone on the last line, only a SHA-256 of its
secret is stored, and a revoked token stops working."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.auth.conftest import headers
from tests.support.responses import assert_error

ROOT = Path(__file__).resolve().parents[2]
TOKEN_RE = re.compile(r"fp_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")

pytestmark = pytest.mark.timeout(120)


async def tokens(database_url: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "FENCEPOST_DATABASE_URL")}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "app.cli", "tokens", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )


async def create(database_url: str, role: str, name: str) -> str:
    done = await tokens(database_url, "create", "--role", role, "--name", name)
    assert done.returncode == 0, (done.stdout, done.stderr)
    last = done.stdout.rstrip("\n").splitlines()[-1]
    assert TOKEN_RE.fullmatch(last), f"the last line is not the token alone: {last!r}"
    return last


async def test_create_list_revoke_round_trip(database_url, pool, make_api) -> None:
    ops = await create(database_url, "operate", "ops-cli")
    reader = await create(database_url, "read", "dash-cli")  # created after: list order
    token_id, secret = TOKEN_RE.fullmatch(ops).groups()
    assert ops != reader

    # Only the SHA-256 of the secret is stored; no column holds the secret or the token.
    rows = await pool.fetch("SELECT * FROM api_tokens ORDER BY created_at")
    assert [(r["name"], r["role"]) for r in rows] == [("ops-cli", "operate"), ("dash-cli", "read")]
    row = next(r for r in rows if r["token_id"] == token_id)
    assert row["secret_sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    dump = await pool.fetchval("SELECT string_agg(t::text, '|') FROM api_tokens t")
    assert secret not in dump and ops not in dump and TOKEN_RE.fullmatch(reader)[2] not in dump

    api = await make_api()
    assert (await api.get("/v1/executions", headers=headers(ops))).status_code == 200
    assert (await api.get("/v1/executions", headers=headers(reader))).status_code == 200

    listed = await tokens(database_url, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["ID", "ROLE", "CREATED", "REVOKED", "NAME"], lines
    mine = [line for line in lines if line.startswith(token_id)]
    assert len(mine) == 1 and mine[0].split()[1] == "operate" and mine[0].split()[3] == "-"
    assert mine[0].split()[-1] == "ops-cli"
    assert secret not in listed.stdout and "fp_" not in listed.stdout

    revoked = await tokens(database_url, "revoke", token_id)
    assert revoked.returncode == 0, (revoked.stdout, revoked.stderr)
    again = await tokens(database_url, "revoke", token_id)
    assert again.returncode == 1, (again.stdout, again.stderr)
    listed = (await tokens(database_url, "list")).stdout
    line = next(x for x in listed.splitlines() if x.startswith(token_id))
    assert line.split()[3] != "-", line  # the revocation time

    # A fresh app (no cached verification) refuses it at once; the other token still works.
    fresh = await make_api()
    r = await fresh.get("/v1/executions", headers=headers(ops))
    assert_error(r, 401, "UNAUTHENTICATED")
    assert r.headers["www-authenticate"] == "Bearer"
    assert (await fresh.get("/v1/executions", headers=headers(reader))).status_code == 200


async def test_revoke_by_name_revokes_every_live_token_of_that_name(database_url, make_api):
    first, second, other = await asyncio.gather(
        create(database_url, "trigger", "ci-bot"),
        create(database_url, "trigger", "ci-bot"),
        create(database_url, "trigger", "other-bot"),
    )
    done = await tokens(database_url, "revoke", "ci-bot")
    assert done.returncode == 0 and "revoked 2 token(s)" in done.stdout, done.stdout
    api = await make_api()
    for token in (first, second):
        assert_error(await api.get("/v1/executions", headers=headers(token)), 401,
                     "UNAUTHENTICATED")
    assert (await api.get("/v1/executions", headers=headers(other))).status_code == 200


async def test_usage_errors(database_url, pool) -> None:
    bad_role, no_name, long_name, unknown, no_url, unreachable = await asyncio.gather(
        tokens(database_url, "create", "--role", "admin", "--name", "x"),
        tokens(database_url, "create", "--role", "read", "--name", "   "),
        tokens(database_url, "create", "--role", "read", "--name", "n" * 201),
        tokens(database_url, "revoke", "nobody"),
        tokens(None, "list"),
        tokens("postgresql://nobody@127.0.0.1:1/none", "list"),
    )
    assert bad_role.returncode == 2 and "invalid choice" in bad_role.stderr, bad_role.stderr
    assert no_name.returncode == 2, (no_name.stdout, no_name.stderr)
    assert long_name.returncode == 2, (long_name.stdout, long_name.stderr)
    assert unknown.returncode == 1, (unknown.stdout, unknown.stderr)
    assert no_url.returncode == 2 and "DATABASE_URL" in no_url.stderr, no_url.stderr
    assert unreachable.returncode == 1, (unreachable.stdout, unreachable.stderr)
    assert "cannot connect to the database" in unreachable.stderr, unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    assert await pool.fetchval("SELECT count(*) FROM api_tokens") == 0


def test_tokens_are_random_and_well_formed() -> None:
    from app.api.auth import new_token

    seen = set()
    for _ in range(200):
        token_id, token, digest = new_token()
        m = TOKEN_RE.fullmatch(token)
        assert m and m[1] == token_id
        assert digest == hashlib.sha256(m[2].encode()).hexdigest()
        seen.add(m[2])
    assert len(seen) == 200
