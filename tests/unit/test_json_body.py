"""Unit tests for app.api.json_body (no database needed)."""

from __future__ import annotations

import json
import math
import time

import pytest
from starlette.requests import Request

from app.api.json_body import (
    MAX_INT_DIGITS,
    BodyError,
    check_content_type,
    error_body,
    parse_json,
    read_body,
)

# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def make_request(
    chunks: list[bytes] | None = None,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    *,
    disconnect: bool = False,
) -> tuple[Request, list[int]]:
    """A Request whose body arrives as ``chunks``; the list counts receive() calls."""
    pending = list(chunks or [])
    calls = [0]

    async def receive() -> dict:
        calls[0] += 1
        if not pending:
            if disconnect:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": b"", "more_body": False}
        body = pending.pop(0)
        more = bool(pending) or disconnect
        return {"type": "http.request", "body": body, "more_body": more}

    items = headers.items() if isinstance(headers, dict) else (headers or [])
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in items],
    }
    return Request(scope, receive), calls


def reject(raw: bytes | str, **kwargs) -> BodyError:
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    with pytest.raises(BodyError) as info:
        parse_json(raw, **kwargs)
    return info.value


def assert_422(err: BodyError) -> None:
    assert (err.status, err.code) == (422, "INVALID_EXECUTION_EVENT"), err.message


def assert_400(err: BodyError) -> None:
    assert (err.status, err.code) == (400, "MALFORMED_JSON"), err.message


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --------------------------------------------------------------------------- #
# BodyError / error_body
# --------------------------------------------------------------------------- #


def test_body_error_attributes():
    err = BodyError(415, "UNSUPPORTED_MEDIA_TYPE", "nope")
    assert (err.status, err.code, err.message) == (415, "UNSUPPORTED_MEDIA_TYPE", "nope")
    assert str(err) == "nope"
    assert isinstance(err, Exception)


def test_error_body_shape():
    assert error_body("X", "msg") == {"error": {"code": "X", "message": "msg"}}
    assert error_body("X", "msg", limit=10, path="$.a") == {
        "error": {"code": "X", "message": "msg", "limit": 10, "path": "$.a"}
    }


# --------------------------------------------------------------------------- #
# parse_json: values that must round-trip
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "value",
    [
        {"workflow": "w", "params": {"a": [1, 2, {"b": None}], "c": True, "d": False}},
        [],
        {},
        "",
        0,
        -17,
        None,
        True,
        1.5,
        -2.25e-8,
        1.7976931348623157e308,
        5e-324,
        "héllo wörld — ☃",
        "emoji 😀 and astral 𝄞 𐍈",
        {"😀 key": "value", "ключ": ["значение"]},
        10**999,  # 1000 digits: the largest accepted size
        -(10**999),
        [[[[[[[[[[{"deep": "ok"}]]]]]]]]]],
        'tab\tnewline\nquote"backslash\\',
    ],
)
def test_valid_values_round_trip(value):
    for raw in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        parsed = parse_json(raw.encode("utf-8"))
        assert parsed == value
        assert type(parsed) is type(value)
        assert json.loads(json.dumps(parsed)) == value


def test_paired_surrogate_escape_becomes_astral_char():
    assert parse_json(b'"\\ud83d\\ude00"') == "\U0001f600"
    assert parse_json(b'{"\\ud83d\\ude00": "\\uD834\\uDD1E"}') == {"😀": "𝄞"}


def test_other_escapes_accepted():
    assert parse_json(b'"\\u0001\\u00e9\\u2603\\/"') == "\x01é☃/"


def test_whitespace_around_value_allowed():
    assert parse_json(b' \r\n\t{"a": 1}\n ') == {"a": 1}


def test_big_int_exactly_at_limit_accepted():
    digits = "9" * MAX_INT_DIGITS
    assert parse_json(f"[{digits}, -{digits}]".encode()) == [int(digits), -int(digits)]


def test_large_but_finite_floats_accepted():
    assert parse_json(b"[1e308, -1e308, 1e-400]") == [1e308, -1e308, 0.0]


# --------------------------------------------------------------------------- #
# parse_json: malformed input (400)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",
        b'{"a": "\xc3"}',  # truncated multibyte sequence
        b'"\xed\xa0\x80"',  # a surrogate encoded directly as UTF-8
        b'{"a": "caf\xe9"}',  # latin-1
        '{"a": 1}'.encode("utf-16"),
    ],
)
def test_non_utf8_is_malformed(raw):
    err = reject(raw)
    assert_400(err)
    assert "UTF-8" in err.message


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        '{"a" 1}',
        '{"a": 1,}',
        "[1, 2,]",
        "{'a': 1}",
        "undefined",
        "01",
        '{"a": 1} {"b": 2}',
        '"unterminated',
        '"raw\ncontrol char"',
        "nan",
        "+1",
        "\ufeff{}",
    ],
)
def test_syntax_errors_are_malformed(raw):
    err = reject(raw)
    assert_400(err)
    assert "not valid JSON" in err.message
    assert "line " in err.message and "column " in err.message


def test_syntax_error_reports_line_and_column():
    err = reject('{\n  "a": 1,\n  "b": ]\n}')
    assert_400(err)
    assert "line 3 column 8" in err.message
    assert "send a well-formed JSON document" in err.message


@pytest.mark.parametrize("raw", [b"", b"   ", b"\n"])
def test_empty_body_is_malformed(raw):
    err = reject(raw)
    assert_400(err)
    assert "empty" in err.message


# --------------------------------------------------------------------------- #
# parse_json: well-formed but unstorable (422)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_rejected(token):
    err = reject(f'{{"params": {{"a": [0, 1, 2, {token}]}}}}')
    assert_422(err)
    assert "NaN and Infinity cannot be stored; send a finite number or null" in err.message
    assert "$.params.a[3]" in err.message
    assert token in err.message


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "1.5E+309"])
def test_overflowing_float_rejected(literal):
    err = reject(f'{{"x": {literal}}}')
    assert_422(err)
    assert "NaN and Infinity cannot be stored" in err.message
    assert "$.x" in err.message


def test_top_level_nan_rejected():
    err = reject("NaN")
    assert_422(err)
    assert "at $" in err.message


def test_duplicate_key_rejected_with_path():
    err = reject('{"params": {"a": 1, "b": 2, "a": 3}}')
    assert_422(err)
    assert err.message == 'duplicate key "a" in one JSON object at $.params; send each key once'


def test_duplicate_key_at_root_and_in_array():
    assert "at $;" in reject('{"k": 1, "k": 1}').message
    err = reject('{"items": [{}, {"x": 1, "x": 1}]}')
    assert_422(err)
    assert 'duplicate key "x"' in err.message and "$.items[1]" in err.message


def test_same_key_in_different_objects_is_fine():
    assert parse_json(b'{"a": {"a": 1}, "b": {"a": 2}}') == {"a": {"a": 1}, "b": {"a": 2}}


@pytest.mark.parametrize(
    "raw, where",
    [
        ('"\\u0000"', "string at $ "),
        ('{"a": "x\\u0000y"}', "string at $.a "),
        ('{"a": ["ok", "\\u0000"]}', "string at $.a[1] "),
        ('{"x\\u0000": 1}', 'object key "x\\u0000" at $ '),
        ('{"p": {"\\u0000": 1}}', "at $.p "),
    ],
)
def test_nul_character_rejected(raw, where):
    err = reject(raw)
    assert_422(err)
    assert "\\u0000" in err.message and "jsonb" in err.message
    assert where in err.message


@pytest.mark.parametrize(
    "raw, where",
    [
        ('"\\ud800"', "string at $ "),
        ('"\\udc00"', "string at $ "),
        ('{"a": "x\\ud83dy"}', "string at $.a "),
        ('["\\ude00\\ud83d"]', "string at $[0] "),  # pair in the wrong order
        ('{"\\ud800": 1}', "object key"),
        ('{"b": {"k\\udfff": 1}}', "at $.b "),
    ],
)
def test_lone_surrogate_rejected(raw, where):
    err = reject(raw)
    assert_422(err)
    assert "unpaired UTF-16 surrogate" in err.message
    assert where in err.message


def test_too_many_integer_digits_rejected():
    err = reject(f'{{"n": {"1" * (MAX_INT_DIGITS + 1)}}}')
    assert_422(err)
    assert f"{MAX_INT_DIGITS + 1} digits" in err.message
    assert "$.n" in err.message
    assert "as a string" in err.message


def test_integer_beyond_python_str_digit_limit_rejected():
    # Beyond sys.get_int_max_str_digits() (4300): int() would raise ValueError.
    err = reject(f"[-{'7' * 50_000}]")
    assert_422(err)
    assert "50000 digits" in err.message


def test_long_float_mantissa_is_not_an_integer():
    # Only integer literals are capped; a float literal is parsed as a float.
    assert parse_json(("0." + "1" * 2000).encode()) == pytest.approx(0.1111111111111111)


def test_path_quotes_non_identifier_keys():
    err = reject('{"my key": {"2": [NaN]}}')
    assert '$["my key"]["2"][0]' in err.message


def test_messages_tell_client_what_to_do():
    for raw in ["NaN", '{"a":1,"a":1}', '"\\u0000"', '"\\ud800"', "{", nested(100)]:
        assert "; " in reject(raw).message


# --------------------------------------------------------------------------- #
# parse_json: nesting depth
# --------------------------------------------------------------------------- #


def test_depth_at_limit_accepted_and_one_beyond_rejected():
    assert parse_json(nested(64).encode()) is not None
    err = reject(nested(65))
    assert_422(err)
    assert "64" in err.message


def test_depth_counts_objects_and_arrays():
    def mixed(depth: int) -> str:
        text = "1"
        for i in range(depth):
            text = f'{{"k": {text}}}' if i % 2 else f"[{text}]"
        return text

    assert parse_json(mixed(10).encode(), max_depth=10) is not None
    err = reject(mixed(11), max_depth=10)
    assert_422(err)
    assert "10 levels" in err.message


def test_custom_max_depth():
    assert parse_json(b"[[1]]", max_depth=2) == [[1]]
    assert parse_json(b"1", max_depth=0) == 1
    assert_422(reject("[[1]]", max_depth=1))
    assert_422(reject("[]", max_depth=0))


def test_depth_beyond_recursion_limit_rejected_as_too_deep():
    err = reject(nested(5000), max_depth=64)
    assert_422(err)
    assert "64 levels" in err.message


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 200_000,
        b"[" * 200_000 + b"]" * 200_000,
        b'{"a":' * 200_000 + b"1" + b"}" * 200_000,
    ],
)
def test_extremely_deep_input_rejected_fast(raw):
    started = time.perf_counter()
    with pytest.raises(BodyError) as info:  # not RecursionError
        parse_json(raw)
    assert time.perf_counter() - started < 2.0
    assert_422(info.value)
    assert "nested more than 64 levels" in info.value.message


def test_wide_document_is_fine():
    value = {"items": [{"id": i, "tags": ["a", "b"], "score": i / 7} for i in range(5000)]}
    assert parse_json(json.dumps(value).encode()) == value


def test_parse_never_raises_anything_but_body_error():
    samples = [
        b"[" * 3000 + b"NaN" + b"]" * 3000,
        b'{"a":' + b"9" * 10_000 + b"}",
        b"[1e999999999999]",
        b'"\\ud800\\u0000"',
        b"\x00",
        b'"\\x41"',
        b'"\\u12"',
    ]
    for raw in samples:
        with pytest.raises(BodyError):
            parse_json(raw)


def test_negative_zero_and_tiny_floats_are_finite():
    value = parse_json(b"[-0.0, 1e-320]")
    assert all(math.isfinite(v) for v in value)


# --------------------------------------------------------------------------- #
# check_content_type
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        'application/json; charset="utf-8"',
        "application/json; charset=utf8",
        "  application/json  ",
        "application/merge-patch+json",
        "application/vnd.fencepost.v1+json; charset=utf-8",
        "APPLICATION/PROBLEM+JSON",
    ],
)
def test_json_content_types_accepted(content_type):
    request, _ = make_request(headers={"Content-Type": content_type})
    check_content_type(request)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "text/plain",
        "text/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "application/json-seq",
        "application/+json",
        "application/xml",
        "json",
    ],
)
def test_other_content_types_rejected(content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    request, _ = make_request(headers=headers)
    with pytest.raises(BodyError) as info:
        check_content_type(request)
    err = info.value
    assert (err.status, err.code) == (415, "UNSUPPORTED_MEDIA_TYPE")
    assert err.message == "send the body as JSON with Content-Type: application/json"


@pytest.mark.parametrize("charset", ["latin-1", "utf-16", "iso-8859-1"])
def test_non_utf8_charset_rejected(charset):
    request, _ = make_request(headers={"Content-Type": f"application/json; charset={charset}"})
    with pytest.raises(BodyError) as info:
        check_content_type(request)
    assert (info.value.status, info.value.code) == (415, "UNSUPPORTED_MEDIA_TYPE")
    assert "UTF-8" in info.value.message and "application/json" in info.value.message


# --------------------------------------------------------------------------- #
# read_body
# --------------------------------------------------------------------------- #


async def test_content_length_over_limit_rejected_before_reading():
    request, calls = make_request([b"x" * 11], {"Content-Length": "11"})
    with pytest.raises(BodyError) as info:
        await read_body(request, limit=10)
    err = info.value
    assert (err.status, err.code) == (413, "PAYLOAD_TOO_LARGE")
    assert "10 bytes" in err.message
    assert calls[0] == 0  # nothing was received


async def test_chunked_stream_over_limit_rejected_without_reading_the_rest():
    chunks = [b"a" * 4, b"b" * 4, b"c" * 4, b"d" * 4, b"e" * 4]
    request, calls = make_request(chunks, {"Transfer-Encoding": "chunked"})
    with pytest.raises(BodyError) as info:
        await read_body(request, limit=10)
    assert (info.value.status, info.value.code) == (413, "PAYLOAD_TOO_LARGE")
    assert "10 bytes" in info.value.message
    assert calls[0] == 3  # stopped at the chunk that crossed the limit


async def test_lying_content_length_still_limited():
    request, calls = make_request([b"x" * 8, b"y" * 8, b"z" * 8], {"Content-Length": "5"})
    with pytest.raises(BodyError) as info:
        await read_body(request, limit=10)
    assert info.value.status == 413
    assert calls[0] == 2


async def test_body_exactly_at_limit_accepted():
    request, _ = make_request([b"0123", b"456", b"789"], {"Content-Length": "10"})
    assert await read_body(request, limit=10) == b"0123456789"


async def test_chunked_body_exactly_at_limit_accepted():
    request, _ = make_request([b"01234", b"", b"56789"])
    assert await read_body(request, limit=10) == b"0123456789"


async def test_single_oversized_chunk_rejected():
    request, _ = make_request([b"x" * 11])
    with pytest.raises(BodyError) as info:
        await read_body(request, limit=10)
    assert info.value.status == 413


async def test_empty_body_read():
    request, _ = make_request([], {"Content-Length": "0"})
    assert await read_body(request, limit=10) == b""


async def test_body_can_be_read_again_after_read_body():
    request, _ = make_request([b'{"a":', b" 1}"])
    raw = await read_body(request, limit=100)
    assert await read_body(request, limit=100) == raw
    assert await request.json() == {"a": 1}


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Length": "abc"},
        {"Content-Length": "-1"},
        {"Content-Length": "1.5"},
        {"Content-Length": ""},
        {"Content-Length": "\u00b2"},  # "²": str.isdigit() but not ASCII
        [("Content-Length", "3"), ("Content-Length", "4")],
    ],
)
async def test_invalid_content_length_rejected(headers):
    request, calls = make_request([b"abc"], headers)
    with pytest.raises(BodyError) as info:
        await read_body(request, limit=10)
    assert (info.value.status, info.value.code) == (400, "INVALID_REQUEST")
    assert "Content-Length" in info.value.message
    assert calls[0] == 0


async def test_repeated_identical_content_length_accepted():
    request, _ = make_request([b"abc"], [("Content-Length", "3"), ("Content-Length", "3")])
    assert await read_body(request, limit=10) == b"abc"


async def test_client_disconnect_becomes_body_error():
    request, _ = make_request([b"abc"], disconnect=True)
    with pytest.raises(BodyError) as info:
        await read_body(request, limit=10)
    assert (info.value.status, info.value.code) == (400, "INVALID_REQUEST")


async def test_read_then_parse_end_to_end():
    payload = {"workflow": "ship", "params": {"items": [1, 2, 3], "note": "😀"}}
    raw = json.dumps(payload).encode()
    request, _ = make_request(
        [raw[:7], raw[7:]],
        {"Content-Type": "application/json", "Content-Length": str(len(raw))},
    )
    check_content_type(request)
    assert parse_json(await read_body(request, limit=len(raw))) == payload
