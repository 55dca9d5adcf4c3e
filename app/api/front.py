"""The API's own ASGI layer in front of every route, one layer for three
jobs (one call and one `send` wrapper per request instead of three):

1. HTTP metrics (app/api/http_metrics.py), outermost: every answer is
   counted, the guard's refusals included, and an exception that escapes
   every handler as 500;
2. the request ID (app/api/request_ids.py): current while the request is
   answered, and on every answer as `X-Request-ID`;
3. the request guard (app/api/limits.py): 431 for an oversized head, 421 for
   a Host outside the allow-list, before any route runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api import http_metrics
from app.api.limits import RequestGuard
from app.api.request_ids import HEADER, request_id_of
from app.logs import REQUEST_ID


class Front:
    def __init__(self, app: ASGIApp, *, max_header_bytes: int,
                 allowed_hosts: Iterable[str] | None) -> None:
        self.app = app
        self.guard = RequestGuard(app, max_header_bytes=max_header_bytes,
                                  allowed_hosts=allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes every handler
        request_id = request_id_of(scope)
        id_header = (HEADER, request_id.encode())

        async def send_answer(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], id_header]
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            refusal = self.guard.refusal(scope)
            if refusal is None:
                await self.app(scope, receive, send_answer)
            else:
                await self.guard.answer(send_answer, *refusal)
        finally:
            REQUEST_ID.reset(token)
            http_metrics.record(scope, status, time.perf_counter() - started)
