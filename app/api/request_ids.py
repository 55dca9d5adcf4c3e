"""Request IDs: every answer carries `X-Request-ID`, the caller's own (when it
is a plain token of at most 128 characters) or a new one. Lines logged while
answering carry it as `request_id`, and an admission stores it in its
`admitted` event (`detail.requestId`), so the HTTP request, the execution's
history and the logs can be joined."""

from __future__ import annotations

import re
import uuid

from app.logs import REQUEST_ID

HEADER = b"x-request-id"
_ACCEPTED = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


class RequestIds:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or ()).get(HEADER)
        request_id = (given.decode() if given is not None and _ACCEPTED.fullmatch(given)
                      else uuid.uuid4().hex)

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (HEADER, request_id.encode())]
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
