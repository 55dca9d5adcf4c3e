"""The embedded Postgres used by `fencepost dev` and the tests: restartable on
the same data directory and URL, and safe with long data-directory paths."""

from __future__ import annotations

import os
import shutil

import asyncpg
import pytest

from app.embedded import MAX_SOCKET_PATH, SOCKET_NAME, EmbeddedPostgres, socket_dir_for


async def test_stop_and_start_keep_url_and_data(embedded_server: EmbeddedPostgres):
    url = embedded_server.url
    conn = await asyncpg.connect(url)
    await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
    await conn.close()

    embedded_server.stop()
    assert not embedded_server.is_running()
    with pytest.raises((OSError, asyncpg.PostgresError)):
        await asyncpg.connect(url, timeout=2)

    embedded_server.start()
    assert embedded_server.url == url
    conn = await asyncpg.connect(url)
    assert await conn.fetchval("SELECT v FROM kept") == 42
    await conn.close()

    # A crash-like stop recovers too.
    embedded_server.stop(mode="immediate")
    embedded_server.start()
    conn = await asyncpg.connect(url)
    assert await conn.fetchval("SELECT v FROM kept") == 42
    await conn.close()


async def test_start_is_idempotent_and_reuses_running_server(embedded_server: EmbeddedPostgres):
    other = EmbeddedPostgres(embedded_server.data_dir, durable=False)
    assert other.is_running()
    other.start()  # no second server, same URL
    assert other.url == embedded_server.url


async def test_long_data_dir_puts_socket_somewhere_short(tmp_path):
    data_dir = tmp_path / ("d" * 90) / "pgdata"
    socket_dir = socket_dir_for(data_dir)
    assert socket_dir != data_dir.resolve()
    assert len(os.fsencode(socket_dir / SOCKET_NAME)) <= MAX_SOCKET_PATH
    assert socket_dir_for(data_dir) == socket_dir  # deterministic

    pg = EmbeddedPostgres(data_dir, durable=False)
    try:
        pg.start()
        conn = await asyncpg.connect(pg.url)
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
        assert (data_dir / "PG_VERSION").exists()
    finally:
        pg.stop(mode="immediate")
        shutil.rmtree(socket_dir, ignore_errors=True)
