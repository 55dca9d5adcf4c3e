"""What the API refuses before any route runs: request heads over
FENCEPOST_MAX_HEADER_BYTES (431 REQUEST_HEADER_FIELDS_TOO_LARGE) and, where an
allow-list applies, a `Host` the API does not answer for (421
HOST_NOT_ALLOWED: a page on another site that rebinds its DNS name to
127.0.0.1 still sends its own name as Host).

Two layers, one answer (the API's error shape):

* `RequestGuard`, an ASGI middleware (its checks run in the API's front
  layer, app/api/front.py): sees the parsed head.
* `guarded_http_protocol(limit)`, the HTTP protocol `fencepost api` serves
  with: uvicorn's httptools protocol buffers a head of any size (httptools
  sets no limit; h11 stops at 16 KiB with a bare 400). This one stops reading
  a head once it passes the limit, answers 431, discards the rest of the head
  (bounded) and closes, so a 256 KiB (or 1 GiB) header is never held.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.json_body import error_body

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
HEADERS_TOO_LARGE = "REQUEST_HEADER_FIELDS_TOO_LARGE"
HOST_NOT_ALLOWED = "HOST_NOT_ALLOWED"


def headers_too_large_message(limit: int) -> str:
    return (f"the request line and headers exceed {limit} bytes; send a smaller request "
            "(an API token is under 400 bytes)")


def _json_answer(status: int, code: str, message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps(error_body(code, message), separators=(",", ":")).encode()
    return body, [(b"content-type", b"application/json"),
                  (b"content-length", str(len(body)).encode())]


def parse_allowed_hosts(value: str | None) -> frozenset[str] | None:
    """The names of FENCEPOST_ALLOWED_HOSTS (lower case, no port); None: any
    (unset, blank, or *)."""
    if value is None or not value.strip():
        return None
    names = {h.strip().lower() for h in value.split(",") if h.strip()}
    return None if "*" in names else frozenset(names)


def host_name(host: str) -> str:
    """`Host` without its port, lower case: "[::1]:8000" -> "[::1]"."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() else host


class RequestGuard:
    """ASGI middleware: 431 for a head over `max_header_bytes`; 421 for a Host
    outside `allowed_hosts` (None: any host)."""

    def __init__(self, app: ASGIApp, *, max_header_bytes: int,
                 allowed_hosts: Iterable[str] | None):
        self.app = app
        self.max_header_bytes = max_header_bytes
        self.allowed_hosts = None if allowed_hosts is None else frozenset(allowed_hosts)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, code, message) refusing an HTTP request, or None."""
        headers = scope.get("headers") or ()
        size = (len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
                + sum(len(k) + len(v) + 4 for k, v in headers))
        if size > self.max_header_bytes:
            return 431, HEADERS_TOO_LARGE, headers_too_large_message(self.max_header_bytes)
        if self.allowed_hosts is not None:
            host = next((v.decode("latin-1") for k, v in headers if k == b"host"), "")
            if host_name(host) not in self.allowed_hosts:
                return (421, HOST_NOT_ALLOWED,
                        f"this server does not answer for host {host[:100]!r}; open it as "
                        f"{' or '.join(sorted(self.allowed_hosts)) or 'a configured host'}, or "
                        "add the name to FENCEPOST_ALLOWED_HOSTS")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refusal := self.refusal(scope)) is not None:
            await self.answer(send, *refusal)
            return
        await self.app(scope, receive, send)

    @staticmethod
    async def answer(send: Send, status: int, code: str, message: str) -> None:
        body, headers = _json_answer(status, code, message)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


# How much of an oversized head is read and thrown away (to let the client
# finish sending, so it reads the 431 instead of a reset) before closing.
DISCARD_BYTES = 1 << 20
DISCARD_SECONDS = 5.0


def guarded_http_protocol(limit: int) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol, refusing heads over `limit` bytes as they
    arrive. None when httptools is not installed (the middleware still answers)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        return None

    body, headers = _json_answer(431, HEADERS_TOO_LARGE, headers_too_large_message(limit))
    answer = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
              + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
              + b"connection: close\r\n\r\n" + body)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _in_head = True
        _head_bytes = 0
        _discarding = False
        _discarded = 0
        _tail = b""

        def data_received(self, data: bytes) -> None:
            if self._discarding:
                self._discard(data)
                return
            super().data_received(data)
            if self._in_head and not self._discarding:
                self._head_bytes += len(data)
                if self._head_bytes > limit and not self.transport.is_closing():
                    self._refuse(data)

        def on_message_begin(self) -> None:
            self._in_head, self._head_bytes = True, 0
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def _refuse(self, data: bytes) -> None:
            self._discarding = True
            self.headers.clear()  # what was parsed so far goes now, and the parser's buffers
            self.url = b""
            self.parser = type(self.parser)(self)
            self.transport.write(answer)
            self.logger.info("refused a request head over %d bytes from %s", limit,
                             self.client[0] if self.client else "?")
            asyncio.get_running_loop().call_later(DISCARD_SECONDS, self._close)
            self._tail = data[-3:]

        def _discard(self, data: bytes) -> None:
            self._discarded += len(data)
            if b"\r\n\r\n" in self._tail + data or self._discarded > DISCARD_BYTES:
                self._close()
            self._tail = data[-3:]

        def _close(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpToolsProtocol
