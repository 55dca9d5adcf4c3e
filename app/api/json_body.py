"""Strict parsing of JSON request bodies.

Values accepted here are stored in PostgreSQL ``jsonb`` and read back later, so
they must survive ``json.dumps`` -> jsonb -> ``json.loads`` unchanged.  Anything
that would not (NaN/Infinity, ``\\u0000``, unpaired surrogates, duplicate keys,
absurdly large integers, pathological nesting) is rejected up front with a
stable error code and a message that tells the client what to send instead.

Every failure is raised as :class:`BodyError`; callers turn it into a response
with :func:`error_body` so that bad input never becomes a 500.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from contextlib import aclosing
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request

__all__ = [
    "MAX_INT_DIGITS",
    "BodyError",
    "check_content_type",
    "error_body",
    "parse_json",
    "read_body",
]

#: Longest integer literal (in digits, sign excluded) accepted in a body.
MAX_INT_DIGITS = 1000

_CONTENT_LENGTH_RE = re.compile(r"[0-9]+")
_JSON_MEDIA_TYPE_RE = re.compile(r"application/(?:json|[a-z0-9!#$&^_.+-]+\+json)")
_BAD_CHAR_RE = re.compile("[\x00\ud800-\udfff]")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_MAX_PARTS = 12  # longer JSON paths are abbreviated in messages

_MEDIA_TYPE_MESSAGE = "send the body as JSON with Content-Type: application/json"
_NON_FINITE_MESSAGE = "NaN and Infinity cannot be stored; send a finite number or null"


class BodyError(Exception):
    """A request body was rejected; ``status``/``code``/``message`` describe why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"BodyError({self.status!r}, {self.code!r}, {self.message!r})"


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The JSON error envelope: ``{"error": {"code": ..., "message": ..., **extra}}``."""
    return {"error": {"code": code, "message": message, **extra}}


# --------------------------------------------------------------------------- #
# Transport: size limit and media type
# --------------------------------------------------------------------------- #


def _too_large(limit: int) -> BodyError:
    return BodyError(
        413,
        "PAYLOAD_TOO_LARGE",
        f"request body exceeds the limit of {limit} bytes; send a smaller body",
    )


def _timed_out(timeout: float) -> BodyError:
    return BodyError(
        408,
        "REQUEST_TIMEOUT",
        f"the request body did not arrive in full within {timeout:g} s "
        "(FENCEPOST_BODY_TIMEOUT_SECONDS); send the whole body without pausing and try again",
    )


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytes:
    """Read the request body, refusing to buffer more than ``limit`` bytes.

    A declared Content-Length above the limit is rejected before anything is
    read; otherwise the stream is consumed chunk by chunk and rejected as soon
    as the running total passes the limit (covers chunked encoding and a
    Content-Length that understates the body). With ``timeout`` the whole body
    must arrive within that many seconds (a body held back or dribbled in is
    408 REQUEST_TIMEOUT): callers read the body before doing anything else,
    so a request never waits on its body with work half done.
    """
    declared = request.headers.getlist("content-length")
    if declared:
        values = {v.strip() for v in declared}
        if len(values) != 1 or not all(_CONTENT_LENGTH_RE.fullmatch(v) for v in values):
            raise BodyError(
                400,
                "INVALID_REQUEST",
                "Content-Length header is not a single non-negative integer; "
                "send a valid Content-Length or use chunked transfer encoding",
            )
        if int(values.pop()) > limit:
            raise _too_large(limit)

    chunks: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(timeout), aclosing(request.stream()) as stream:
            async for chunk in stream:
                if not chunk:
                    continue
                total += len(chunk)
                if total > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise _timed_out(timeout or 0) from None
    except ClientDisconnect:
        raise BodyError(
            400,
            "INVALID_REQUEST",
            "client disconnected before the request body was complete; resend the request",
        ) from None
    body = b"".join(chunks)
    # Cache the body the way Request.body() does, so a later request.body() or
    # request.json() in the same request does not fail with "Stream consumed".
    request._body = body
    return body


def check_content_type(request: Request) -> None:
    """Require ``application/json`` (or ``application/*+json``), UTF-8 if a charset is given."""
    header = request.headers.get("content-type")
    if header is None:
        raise BodyError(415, "UNSUPPORTED_MEDIA_TYPE", _MEDIA_TYPE_MESSAGE)
    media_type, _, params = header.partition(";")
    if not _JSON_MEDIA_TYPE_RE.fullmatch(media_type.strip().lower()):
        raise BodyError(415, "UNSUPPORTED_MEDIA_TYPE", _MEDIA_TYPE_MESSAGE)
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() != "charset":
            continue
        charset = value.strip().strip('"').lower()
        if charset not in ("utf-8", "utf8"):
            raise BodyError(
                415,
                "UNSUPPORTED_MEDIA_TYPE",
                f"charset {charset!r} is not supported; encode the body as UTF-8 and "
                "send it with Content-Type: application/json",
            )


# --------------------------------------------------------------------------- #
# Strict JSON
# --------------------------------------------------------------------------- #


class _Rejected:
    """Placed in the parsed tree by a parser hook; reported (with its path) by the walk."""

    __slots__ = ("before", "after")

    def __init__(self, before: str, after: str) -> None:
        # The message is before + JSON path + after.
        self.before = before
        self.after = after

    def describe(self, path: str) -> str:
        return f"{self.before}{path}{self.after}"


def _show(text: str, limit: int = 60) -> str:
    """A JSON-quoted, ASCII-only, length-capped rendering of a key or literal."""
    if len(text) > limit:
        text = text[:limit] + "..."
    return json.dumps(text)


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Rejected:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Rejected(
                f"duplicate key {_show(key)} in one JSON object at ", "; send each key once"
            )
        seen.add(key)
    raise AssertionError("unreachable")  # pragma: no cover


def _parse_constant(token: str) -> _Rejected:
    # Called for NaN, Infinity and -Infinity.
    return _Rejected(f"{_NON_FINITE_MESSAGE} (found {token} at ", ")")


def _parse_int(literal: str) -> int | _Rejected:
    digits = len(literal) - (literal[0] == "-")
    if digits > MAX_INT_DIGITS:
        return _Rejected(
            "integer at ",
            f" has {digits} digits; send at most {MAX_INT_DIGITS} digits, "
            "or send the number as a string",
        )
    return int(literal)


# Where a value sits: (its container's node, its key or index); None at the top.
PathNode = tuple["PathNode | None", str | int]


def _path(node: PathNode | None) -> str:
    parts: list[str] = []
    while node is not None:
        node, key = node
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif _IDENTIFIER_RE.fullmatch(key):
            parts.append(f".{key}")
        else:
            parts.append(f"[{_show(key)}]")
    parts.reverse()
    if len(parts) > _PATH_MAX_PARTS:
        parts = [*parts[:6], "...", *parts[-4:]]
    return "$" + "".join(parts)


def _string_problem(text: str, what: str) -> str | None:
    """Describe why ``text`` cannot be stored, or None if it can."""
    match = _BAD_CHAR_RE.search(text)
    if match is None:
        return None
    char = match.group()
    if char == "\x00":
        return (
            f"{what} contains \\u0000, which PostgreSQL jsonb cannot store; "
            "remove the NUL character or encode the data (e.g. base64)"
        )
    return (
        f"{what} contains an unpaired UTF-16 surrogate \\u{ord(char):04x}; send valid "
        "Unicode (escape characters outside the BMP as a high+low surrogate pair)"
    )


def _too_deep(max_depth: int, where: str = "") -> BodyError:
    return BodyError(
        422,
        "INVALID_EXECUTION_EVENT",
        f"JSON is nested more than {max_depth} levels deep{where}; "
        f"flatten the structure to at most {max_depth} levels of arrays/objects",
    )


def _invalid(message: str) -> BodyError:
    return BodyError(422, "INVALID_EXECUTION_EVENT", message)


def _check_scalar(item: Any, node: PathNode | None) -> None:
    """Validate a non-container value; ``node`` locates it for the message."""
    if isinstance(item, str):
        if _BAD_CHAR_RE.search(item):
            raise _invalid(_string_problem(item, f"string at {_path(node)}") or "")
    elif isinstance(item, float):
        # Finite-looking literals that overflow, e.g. 1e400, parse to inf.
        if not math.isfinite(item):
            raise _invalid(f"{_NON_FINITE_MESSAGE} (number at {_path(node)} is out of range)")
    elif isinstance(item, _Rejected):
        raise _invalid(item.describe(_path(node)))


def _check_tree(value: Any, max_depth: int) -> None:
    """Iteratively validate a parsed tree; raise for the first problem found."""
    if not isinstance(value, (dict, list)):
        _check_scalar(value, None)
        return
    # Stack entries: (container, its depth, path node). A path node is
    # (parent node, key), so paths are only materialised when reporting an error.
    # Scalars are checked in place; only containers go on the stack.
    stack: list[tuple[Any, int, PathNode | None]] = [(value, 1, None)]
    while stack:
        container, depth, node = stack.pop()
        if depth > max_depth:
            raise _too_deep(max_depth, f" at {_path(node)}")
        pending: list[tuple[Any, int, PathNode | None]] = []
        if isinstance(container, dict):
            for key, child in container.items():
                if _BAD_CHAR_RE.search(key):
                    what = f"object key {_show(key)} at {_path(node)}"
                    raise _invalid(_string_problem(key, what) or "")
                if isinstance(child, (dict, list)):
                    pending.append((child, depth + 1, (node, key)))
                elif not isinstance(child, (int, bool)) and child is not None:
                    _check_scalar(child, (node, key))
        else:
            for index, child in enumerate(container):
                if isinstance(child, (dict, list)):
                    pending.append((child, depth + 1, (node, index)))
                elif not isinstance(child, (int, bool)) and child is not None:
                    _check_scalar(child, (node, index))
        stack.extend(reversed(pending))


# The fast path (orjson) answers only when the strict parser would answer the
# same value; anything else (an error of any kind, a possible difference) is
# decided by the strict parser, so every refusal keeps its code and message.
# What orjson refuses itself: invalid UTF-8, lone surrogates (escaped or
# not), NaN/Infinity and numbers that overflow a double, control characters.
_FAST_MAX_DEPTH = 256  # deeper limits: the strict parser (its recursion limit decides)
# orjson reads an integer past 64 bits as a float: at least this large.
_INTEGER_AS_FLOAT = 9.2e18
# A JSON string in raw bytes (the document is known to be well-formed JSON).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_UNDECIDED = object()


def _members(value: Any, max_depth: int) -> int | None:
    """How many members the objects of a tree orjson parsed hold in all; None
    when the strict parser must decide (nested too deep, or a float as large
    as an integer orjson may have read past 64 bits)."""
    if type(value) is float:
        return None if abs(value) >= _INTEGER_AS_FLOAT else 0
    if type(value) is not dict and type(value) is not list:
        return 0
    members = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > max_depth:
            return None
        if type(container) is dict:
            members += len(container)
            container = container.values()
        for child in container:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif kind is float and abs(child) >= _INTEGER_AS_FLOAT:
                return None
    return members


def _parse_fast(raw: bytes, max_depth: int) -> Any:
    """The value of ``raw`` as the strict parser would return it, or
    _UNDECIDED when the strict parser must decide."""
    if b"\\u0000" in raw:  # a NUL (orjson takes it; jsonb cannot store it)
        return _UNDECIDED
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _UNDECIDED
    members = _members(value, max_depth)
    if members is None:
        return _UNDECIDED
    # orjson keeps the last of duplicate keys silently; the strict parser
    # refuses them. Outside strings a colon only separates a key from its
    # value, so the document's colons (those in strings taken out) count its
    # members: more than the parsed objects hold means a key was repeated.
    if raw.count(b":") != members and _JSON_STRING.sub(b"", raw).count(b":") != members:
        return _UNDECIDED
    return value


def parse_json(raw: bytes, *, max_depth: int = 64) -> Any:
    """Parse ``raw`` as strict UTF-8 JSON whose value round-trips through jsonb.

    Raises :class:`BodyError`: 400 ``MALFORMED_JSON`` for bytes that are not
    UTF-8 or not JSON; 422 ``INVALID_EXECUTION_EVENT`` for well-formed JSON
    that cannot be stored faithfully. ``max_depth`` counts nested arrays and
    objects (``[]`` is depth 1); values nested deeper than the interpreter's
    recursion limit are always rejected as too deep.
    """
    if isinstance(raw, bytes) and max_depth <= _FAST_MAX_DEPTH:
        value = _parse_fast(raw, max_depth)
        if value is not _UNDECIDED:
            return value
    return _parse_strict(raw, max_depth)


def _parse_strict(raw: bytes, max_depth: int) -> Any:
    """parse_json with the standard library's parser and hooks: the
    reference for every value and every refusal."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            400,
            "MALFORMED_JSON",
            f"request body is not valid UTF-8 (bad byte at offset {exc.start}); "
            "encode the JSON body as UTF-8",
        ) from None
    if not text.strip(" \t\r\n"):  # JSON whitespace only
        raise BodyError(400, "MALFORMED_JSON", "request body is empty; send a JSON document")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_pairs,
            parse_constant=_parse_constant,
            parse_int=_parse_int,
        )
    except json.JSONDecodeError as exc:
        raise BodyError(
            400,
            "MALFORMED_JSON",
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}; send a well-formed JSON document",
        ) from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError:  # pragma: no cover - int digit limit; _parse_int caps digits first
        raise _invalid(
            f"a number in the body is too large; send integers of at most "
            f"{MAX_INT_DIGITS} digits, or send the number as a string"
        ) from None
    _check_tree(value, max_depth)
    return value
