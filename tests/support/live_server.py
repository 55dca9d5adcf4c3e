"""A real HTTP/1.1 server for tests: uvicorn serving an ASGI app on
127.0.0.1:<free port> from a thread with its own event loop (raw sockets and
browsers reach it like any server)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

import httpx
import uvicorn

from tests.support.waiting import wait_until


class ServerThread:
    def __init__(self, app, *, name: str = "test-server", **uvicorn_options) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, loop="asyncio", log_level="warning", lifespan="on",
                                access_log=False, **uvicorn_options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name=name, daemon=True)

    async def start(self):
        self.thread.start()
        def started() -> bool:
            assert self.thread.is_alive(), "the test server failed to start (see the log)"
            return self.server.started

        await wait_until(started, timeout=20, interval=0.02, what="the test server started")
        return self

    def client(self, **kw) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, timeout=kw.pop("timeout", 30), **kw)

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 15)
        self.sock.close()


@contextlib.asynccontextmanager
async def server_factory(default_settings, default_workflows=None, *,
                         name: str = "test-server"):
    """`make(settings=None, workflows=None, wrap=None)`: the real app served by
    a ServerThread (`wrap(app)`, an ASGI wrap, if given; `srv.app` is the app);
    every server made is stopped on exit."""
    from app.api.app import create_app

    made: list[ServerThread] = []

    async def make(settings=None, workflows=None, wrap=None) -> ServerThread:
        app = create_app(settings or default_settings,
                         workflows if workflows is not None else default_workflows)
        srv = ServerThread(wrap(app) if wrap else app, name=name)
        srv.app = app
        made.append(srv)
        return await srv.start()

    try:
        yield make
    finally:
        for srv in made:
            await srv.stop()
