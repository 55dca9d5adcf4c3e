"""Settings every api and worker process must share, and the start-up check.

The poison threshold, the lease and the redelivery delays decide what happens
to an execution whichever process touches it; a worker parking at 3
unacknowledged deliveries beside one parking at 25 (or a dashboard showing the
API's 25) is a lie about the system. So they are stored once in the database:
the first api or worker process to start stores its values, and every process
compares its own with the stored ones at start and refuses to run (exit 2) on
any difference, naming the setting, both values and how to change it on
purpose (`fencepost settings set NAME VALUE`, then restart every process with
the new value).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import asyncpg

from app.settings import Settings
from app.store.shared import StoredSetting

# Settings field -> environment variable, for every setting all processes share.
SHARED: dict[str, str] = {
    "max_unacknowledged_deliveries": "FENCEPOST_MAX_UNACKNOWLEDGED_DELIVERIES",
    "lease_seconds": "FENCEPOST_LEASE_SECONDS",
    "redelivery_base_seconds": "FENCEPOST_REDELIVERY_BASE_SECONDS",
    "redelivery_cap_seconds": "FENCEPOST_REDELIVERY_CAP_SECONDS",
}
BY_ENV = {env: field for field, env in SHARED.items()}

EXIT_MISMATCH = 2


class SharedSettingsMismatch(Exception):
    """This process's value of a shared setting differs from the stored one;
    the process prints the message and exits 2."""


def given_values(settings: Settings) -> dict[str, Any]:
    return {field: getattr(settings, field) for field in SHARED}


def _same(stored: Any, given: Any) -> bool:
    try:
        return math.isclose(float(stored), float(given), rel_tol=0, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def mismatches(stored: dict[str, StoredSetting], settings: Settings) -> list[str]:
    """One message per shared setting whose stored value differs from this
    process's; empty when every one agrees."""
    problems = []
    for field, env in SHARED.items():
        if field not in stored:
            continue
        have, want = getattr(settings, field), stored[field].value
        if _same(want, have):
            continue
        problems.append(
            f"{env} is {_show(have)} in this process but {_show(want)} in the database "
            f"(stored {stored[field].updated_at:%Y-%m-%d %H:%M:%S %Z}); every api and worker "
            f"must use the same value. Start this process with {env}={_show(want)}, or change "
            f"it for all deliberately: stop every api and worker, run `fencepost settings set "
            f"{env} {_show(have)}`, and start them all with {env}={_show(have)}"
        )
    return problems


async def check(pool: asyncpg.Pool, settings: Settings) -> dict[str, StoredSetting]:
    """Store this process's shared settings where none are stored; raise
    SharedSettingsMismatch (exit 2, a message per difference) when a stored
    one differs. Returns the stored values."""
    from app.store import ExecutionStore

    stored = await ExecutionStore(pool).settings.store_shared_settings(given_values(settings))
    problems = mismatches(stored, settings)
    if problems:
        raise SharedSettingsMismatch(
            "error: refusing to start: shared settings differ from the stored ones:\n"
            + "\n".join(f"  {p}" for p in problems))
    return stored


# -- `fencepost settings` -----------------------------------------------------


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="settings_command", metavar="ACTION")
    sub.required = True
    sub.add_parser("show", help="the stored shared settings and this environment's values")
    s = sub.add_parser(
        "set", help="change a stored shared setting on purpose (then restart every api and "
        "worker with the new value)")
    s.add_argument("name", choices=sorted(BY_ENV), metavar="NAME",
                   help="one of " + ", ".join(sorted(BY_ENV)))
    s.add_argument("value")


def _parse(field: str, text: str, stored: dict[str, StoredSetting]) -> int | float:
    annotation = Settings.model_fields[field].annotation
    try:
        value: int | float = int(text) if annotation is int else float(text)
    except ValueError:
        raise ValueError(f"{SHARED[field]}: {text!r} is not a{'n integer' if annotation is int else ' number'}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{SHARED[field]}: must be a finite number above 0")
    current = {f: v.value for f, v in stored.items()} | {field: value}
    base, cap = current.get("redelivery_base_seconds"), current.get("redelivery_cap_seconds")
    if base is not None and cap is not None and cap < base:
        raise ValueError(
            f"FENCEPOST_REDELIVERY_CAP_SECONDS ({_show(cap)}) must be >= "
            f"FENCEPOST_REDELIVERY_BASE_SECONDS ({_show(base)})")
    return value


def run(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from app.db import create_pool
    from app.store import ExecutionStore

    async def main() -> int:
        pool = await create_pool(settings, min_size=1, max_size=1)
        try:
            store = ExecutionStore(pool)
            stored = await store.settings.shared_settings()
            if args.settings_command == "show":
                for field, env in SHARED.items():
                    row = stored.get(field)
                    where = (f"{_show(row.value)} (stored {row.updated_at:%Y-%m-%d %H:%M:%S %Z})"
                             if row else "not stored yet (the first api or worker stores its own)")
                    print(f"{env} = {where}; this environment: {_show(getattr(settings, field))}")
                return 0
            field = BY_ENV[args.name]
            try:
                value = _parse(field, args.value, stored)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            answer = await store.settings.set_shared_setting(field, value)
            before = "not stored" if answer.previous is None else _show(answer.previous)
            print(f"{args.name} = {_show(value)} (was {before}). Running processes keep the value "
                  f"they started with: restart every api and worker with {args.name}="
                  f"{_show(value)}; a process started with another value refuses to start.")
            return 0
        finally:
            await pool.close()

    return asyncio.run(main())
