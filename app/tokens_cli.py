"""`fencepost tokens create|list|revoke|quota`: API tokens, managed on the database.

Quotas (admissions and signals per minute, app/api/quotas.py) are off unless
given: at `create`, or later with `quota ID_OR_NAME --admissions-per-minute N`
(`none` removes one); running APIs apply a change within
FENCEPOST_QUOTA_REFRESH_SECONDS."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Mapping
from typing import Any

from app.api.auth import ROLES, new_token
from app.db import create_pool
from app.settings import Settings
from app.store import ExecutionStore
from app.store.tokens import UNCHANGED

QUOTAS = (("admissions_per_minute", "admissions"), ("signals_per_minute", "signals"))


def _per_minute(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: give a positive whole number per minute")
    return n


def _per_minute_or_none(value: str) -> int | None:
    if value.strip().lower() in ("none", "off"):
        return None
    try:
        return _per_minute(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give a positive whole number per minute, or none to remove the limit"
        ) from None


def _quota_options(p: argparse.ArgumentParser, kind: Callable[[str], Any],
                   default: object) -> None:
    p.add_argument("--admissions-per-minute", type=kind, default=default, metavar="N",
                   help="most admissions per minute for this token (default: no limit)")
    p.add_argument("--signals-per-minute", type=kind, default=default, metavar="N",
                   help="most signals per minute for this token (default: no limit)")


def _describe(row: Mapping[str, Any]) -> str:
    parts = []
    for column, kind in QUOTAS:
        n = row[column]
        parts.append(f"no limit on {kind}" if n is None else f"{n} {kind} per minute")
    return ", ".join(parts)


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="tokens_command", metavar="ACTION")
    sub.required = True
    create = sub.add_parser("create", help="create a token; it is printed once, on the last line")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--name", required=True, help="who or what uses it (shown in the history)")
    _quota_options(create, _per_minute, None)
    sub.add_parser("list", help="list tokens (never their secrets)")
    revoke = sub.add_parser("revoke", help="revoke a token by ID, or every token of a name")
    revoke.add_argument("token", metavar="ID_OR_NAME")
    quota = sub.add_parser(
        "quota", help="show a token's quotas, or change them (N per minute, or none)",
        description="Without options: show the quotas of the live tokens of that ID or name. "
        "With options: set them (none removes a limit); running APIs apply the change within "
        "FENCEPOST_QUOTA_REFRESH_SECONDS.")
    quota.add_argument("token", metavar="ID_OR_NAME")
    _quota_options(quota, _per_minute_or_none, UNCHANGED)


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
            await store.tokens.create_token(token_id, name=name, role=args.role, secret_sha256=digest,
                                     admissions_per_minute=args.admissions_per_minute,
                                     signals_per_minute=args.signals_per_minute)
            quotas = _describe({"admissions_per_minute": args.admissions_per_minute,
                                "signals_per_minute": args.signals_per_minute})
            print(f"created token {token_id} ({args.role}) for {name} ({quotas}); "
                  "it is shown only once:")
            print(token)
            return 0
        if args.tokens_command == "list":
            rows = await store.tokens.list_tokens()
            print(f"{'ID':<14}{'ROLE':<9}{'CREATED':<27}{'REVOKED':<27}NAME")
            for r in rows:
                revoked = r["revoked_at"].isoformat(timespec="seconds") if r["revoked_at"] else "-"
                print(f"{r['token_id']:<14}{r['role']:<9}"
                      f"{r['created_at'].isoformat(timespec='seconds'):<27}{revoked:<27}{r['name']}")
            return 0
        if args.tokens_command == "quota":
            changes = {column: getattr(args, column) for column, _ in QUOTAS
                       if getattr(args, column) is not UNCHANGED}
            if changes and not await store.tokens.set_token_quotas(args.token, **changes):
                print(f"error: no live token with ID or name {args.token!r}", file=sys.stderr)
                return 1
            rows = [r for r in await store.tokens.list_tokens()
                    if args.token in (r["token_id"], r["name"]) and r["revoked_at"] is None]
            if not rows:
                print(f"error: no live token with ID or name {args.token!r}", file=sys.stderr)
                return 1
            for r in rows:
                print(f"{r['token_id']} ({r['role']}, {r['name']}): {_describe(r)}")
            if changes:
                print("running APIs apply it within FENCEPOST_QUOTA_REFRESH_SECONDS (5 s by default)")
            return 0
        count = await store.tokens.revoke_token(args.token)
        if not count:
            print(f"error: no live token with ID or name {args.token!r}", file=sys.stderr)
            return 1
        print(f"revoked {count} token(s); running APIs stop accepting them within seconds")
        return 0
    finally:
        await pool.close()


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run(args, settings))
