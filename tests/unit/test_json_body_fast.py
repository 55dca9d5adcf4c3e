"""parse_json answers through orjson when it can, and through the standard
library's strict parser otherwise: for every document, the same value (same
types, same float bits, same key order) or the same refusal (status, code,
message) as the strict parser alone. Checked on edge cases and on documents
mutated at random."""

from __future__ import annotations

import json
import random

import pytest

from app.api.json_body import BodyError, _parse_strict, parse_json


def answer(parse, raw: bytes, max_depth: int = 64):
    try:
        # repr tells 1 from 1.0 and True, -0.0 from 0.0, and shows key order.
        return "value", repr(parse(raw, max_depth=max_depth))
    except BodyError as exc:
        return "refused", exc.status, exc.code, exc.message


def strict(raw: bytes, *, max_depth: int = 64):
    return _parse_strict(raw, max_depth)


def nested(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


CASES = [
    b'{"workflowId":"bench-3-steps","executionId":"run-mixed-1","params":{"n":1}}',
    b'{"workflowId":"wf","executionId":"a:b:c","params":{"url":"http://x:80/"}}',
    b'{"a":1,"a":2}', b'{"a:":1,"a":2}', b'{"x":{"k":1,"k":1}}', b'[{"a":1},{"b":2,"b":3}]',
    b'{"a":"\\":","a":1}', b'{"a\\\\":1,"a\\\\":2}', b'{"\\u0061":1,"a":2}',
    b'{"a\\u003a":1,"b":2}', b'{"":1,"":2}', b'{"":1}',
    b"123456789012345678", b"-123456789012345678", b"1234567890123456789",
    b"12345678901234567890", b"18446744073709551615", b"18446744073709551616",
    b"-9223372036854775808", b"-9223372036854775809", b"[9223372036854775807]",
    ("9" * 1000).encode(), ("9" * 1001).encode(), b"0.1", b"-0", b"-0.0", b"0e0", b"1E5",
    b"1e400", b"-1e400", b"1e-400", b"2.2250738585072014e-308", b"4.9e-324", b"2.5e-324",
    b"1.7976931348623157e308", b"1.7976931348623159e308", b"0.30000000000000004",
    b"9007199254740993", b"9007199254740993.0", b"123456789012345678.5",
    b"0.123456789012345678", b"1.000000000000000111", b"[1.0, 1, true, false, null]",
    b"NaN", b"Infinity", b"-Infinity", b"[NaN]", b'{"a": Infinity}',
    b'"\\u0000"', b'{"\\u0000":1}', b'"\\ud800"', b'"\\udc00"', b'"\\ud83d\\ude00"',
    b'"\\ud83dA"', b'"\xed\xa0\x80"', b'"\xff"', b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"',
    b"\xef\xbb\xbf{}", b'"a\x01b"', b'"a\x7fb"', b'"\xef\xbf\xbe"', b"", b"   ", b" \t\r\n",
    b"{} x", b"{}\x0c", b"\x0c{}", b"[1,]", b"{,}", b"01", b"1.", b".5", b"+1", b"-",
    b"tru", b"true ", b'"\\/"', b'"\\x"', b"[]", b"{}", b'"plain"', b"null", b"true",
    nested(64), nested(65), nested(256), nested(999), nested(1024), nested(1100),
    b'{"a":' * 70 + b"1" + b"}" * 70,
]


@pytest.mark.parametrize("raw", CASES, ids=lambda r: repr(r[:40]))
def test_edge_cases_answer_as_the_strict_parser_does(raw: bytes) -> None:
    assert answer(parse_json, raw) == answer(strict, raw)


@pytest.mark.parametrize("max_depth", [1, 2, 64, 256, 257, 2000])
def test_any_depth_limit_answers_as_the_strict_parser_does(max_depth: int) -> None:
    for depth in (1, 2, 3, 64, 65, 255, 256, 257, 900, 1000, 1020):
        raw = nested(depth)
        assert answer(parse_json, raw, max_depth) == answer(strict, raw, max_depth), depth


SEEDS = [
    {"workflowId": "wf", "executionId": "x:1", "params": {"a": [1, 2.5, -0.0, None, True],
                                                           "b": {"c": "d:e\\\"f"}}},
    {"k": "\u00e9\u2603\U0001f600", "n": 12345678901234567, "f": 1e-7, "e": 1e16},
    [{"a": 1}, {"a": {"a": [{}]}}, "x", 0.1],
]
# Bytes a mutation inserts: structure, escapes, digits, and what is refused.
ALPHABET = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"0", b"9", b"-", b".", b"e",
            b" ", b"a", b"\\u0000", b"\\ud800", b"NaN", b"\xff", b"\x01", b'"a":1,',
            b"12345678901234567890", b"1e999"]


def mutate(rng: random.Random, raw: bytes) -> bytes:
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(raw) + 1)
        op = rng.random()
        if op < 0.4:
            raw = raw[:at] + rng.choice(ALPHABET) + raw[at:]
        elif op < 0.7 and raw:
            raw = raw[:at] + raw[at + 1:]
        else:  # repeat a slice: duplicate keys and members
            end = min(len(raw), at + rng.randint(1, 12))
            raw = raw[:end] + raw[at:end] + raw[end:]
    return raw


def test_mutated_documents_answer_as_the_strict_parser_does() -> None:
    rng = random.Random(18)
    both = {"value": 0, "refused": 0}
    for i in range(6000):
        seed = SEEDS[i % len(SEEDS)]
        raw = mutate(rng, json.dumps(seed, ensure_ascii=rng.random() < 0.5,
                                     separators=rng.choice([(",", ":"), (", ", ": ")])).encode())
        expected = answer(strict, raw)
        assert answer(parse_json, raw) == expected, raw
        both[expected[0]] += 1
    # Both kinds of answer were exercised, many times each.
    assert min(both.values()) > 500, both
