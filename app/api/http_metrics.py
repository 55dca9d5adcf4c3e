"""HTTP metrics of the API: requests by route template, method and status,
and time to answer, counted by one ASGI middleware around every route (the
request guard's 421/431 included, as route "(unmatched)")."""

from __future__ import annotations

import time

from fastapi import FastAPI

from app.metrics import METRICS

UNMATCHED = "(unmatched)"


class HttpMetrics:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes every handler

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # The router writes the matched route into the request's scope.
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            method = scope["method"]
            METRICS.http_requests.labels(template, method, str(status)).inc()
            METRICS.http_seconds.labels(template, method).observe(time.perf_counter() - started)


def preinitialise(app: FastAPI) -> None:
    """Every published operation's documented statuses at zero, so rate()
    sees the first one."""
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            METRICS.init_route(path, method.upper(), sorted(operation["responses"]))
