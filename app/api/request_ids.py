"""Request IDs: every answer carries `X-Request-ID`, the caller's own (when it
is a plain token of at most 128 characters) or a new one. Lines logged while
answering carry it as `request_id`, and an admission stores it in its
`admitted` event (`detail.requestId`), so the HTTP request, the execution's
history and the logs can be joined. Set and added to the answer by the API's
front layer (app/api/front.py)."""

from __future__ import annotations

import os
import re

HEADER = b"x-request-id"
_ACCEPTED = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


def new_request_id() -> str:
    """A random (version 4) UUID as 32 hex digits, as `uuid.uuid4().hex`
    makes it, without building a UUID object per request."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()


def request_id_of(scope) -> str:
    """The caller's X-Request-ID when it is acceptable, else a new one."""
    given = None
    for name, value in scope.get("headers") or ():
        if name == HEADER:
            given = value  # the last one, as a dict of the headers keeps it
    if given is not None and _ACCEPTED.fullmatch(given):
        return given.decode()
    return new_request_id()
