"""The Postgres side of the peer comparison (run with fencepost's own Python).

    postgres.py start DIR        start a throw-away embedded Postgres on DIR, print its URL
    postgres.py stop DIR         stop it
    postgres.py database URL NAME
                                 (re)create database NAME on URL's server, print its URL

Every system compared runs on the same server, each in a database of its own,
so that none reads another's tables and each starts from empty ones. The
embedded server has the settings `fencepost bench` gives its own (durable:
fsync and synchronous commit on), so the figures match that command's.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from app.db import asyncpg_dsn
from app.embedded import EmbeddedPostgres, start_embedded_postgres


def database_url(url: str, name: str) -> str:
    """`url` with its database replaced by `name` (host, user, options kept)."""
    parts = urlsplit(asyncpg_dsn(url))
    return urlunsplit(parts._replace(path="/" + name))


async def recreate(url: str, name: str) -> str:
    # Only names this comparison owns are dropped: they all start with this prefix.
    if not name.startswith("fencepost_peers_"):
        raise SystemExit(f"refusing to drop {name!r}: not a fencepost_peers_* database")
    conn = await asyncpg.connect(database_url(url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return database_url(url, name)


def main(argv: list[str]) -> int:
    match argv:
        case ["start", data_dir]:
            server = start_embedded_postgres(Path(data_dir), stop_at_exit=False)
            print(server.url)
        case ["stop", data_dir]:
            EmbeddedPostgres(Path(data_dir)).stop()
        case ["database", url, name]:
            print(asyncio.run(recreate(url, name)))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
