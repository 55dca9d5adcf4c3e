"""`fencepost tokens create|list|revoke`: API tokens, managed on the database."""

from __future__ import annotations

import argparse
import asyncio
import sys

from app.api.auth import ROLES, new_token
from app.db import create_pool
from app.settings import Settings
from app.store import ExecutionStore


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="tokens_command", metavar="ACTION")
    sub.required = True
    create = sub.add_parser("create", help="create a token; it is printed once, on the last line")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--name", required=True, help="who or what uses it (shown in the history)")
    sub.add_parser("list", help="list tokens (never their secrets)")
    revoke = sub.add_parser("revoke", help="revoke a token by ID, or every token of a name")
    revoke.add_argument("token", metavar="ID_OR_NAME")


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    pool = await create_pool(settings, min_size=1, max_size=2, application_name="fencepost-tokens")
    try:
        store = ExecutionStore.from_settings(pool, settings)
        if args.tokens_command == "create":
            name = args.name.strip()
            if not name or len(name) > 200:
                print("error: --name must be 1-200 characters", file=sys.stderr)
                return 2
            token_id, token, digest = new_token()
            await store.create_token(token_id, name=name, role=args.role, secret_sha256=digest)
            print(f"created token {token_id} ({args.role}) for {name}; it is shown only once:")
            print(token)
            return 0
        if args.tokens_command == "list":
            rows = await store.list_tokens()
            print(f"{'ID':<14}{'ROLE':<9}{'CREATED':<27}{'REVOKED':<27}NAME")
            for r in rows:
                revoked = r["revoked_at"].isoformat(timespec="seconds") if r["revoked_at"] else "-"
                print(f"{r['token_id']:<14}{r['role']:<9}"
                      f"{r['created_at'].isoformat(timespec='seconds'):<27}{revoked:<27}{r['name']}")
            return 0
        count = await store.revoke_token(args.token)
        if not count:
            print(f"error: no live token with ID or name {args.token!r}", file=sys.stderr)
            return 1
        print(f"revoked {count} token(s); running APIs stop accepting them within seconds")
        return 0
    finally:
        await pool.close()


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run(args, settings))
