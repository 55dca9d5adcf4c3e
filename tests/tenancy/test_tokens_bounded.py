"""Token checks are cheap and bounded (issue 11, item 5).

Attack: 300 requests with a junk 256 KiB `Authorization` header grew the API
process by 75 MiB: every rejected token was cached, keyed by the raw header,
and the header size was unbounded. Now a malformed token is refused by its
shape before any cache or query, the cache is keyed by a digest and holds only
verified tokens (a bounded LRU), and a request head over
FENCEPOST_MAX_HEADER_BYTES is answered 431 REQUEST_HEADER_FIELDS_TOO_LARGE
(in the app, and by the `fencepost api` server before it buffers the rest).
"""

from __future__ import annotations

import base64
import hashlib
import os

import psutil
import pytest

from app.api.auth import TokenVerifier
from tests.support.api_process import ApiProcess, raw_request
from tests.tenancy.conftest import error_code, headers

KIB = 1024
MIB = 1024 * 1024


def junk(n: int) -> str:
    return base64.urlsafe_b64encode(os.urandom(n * 3 // 4 + 3)).decode()[:n]


@pytest.fixture
def counted_lookups(monkeypatch):
    """Count the verifier's database lookups (store.find_token) on every store."""
    from app.store.tokens import Tokens

    calls: list[str] = []
    original = Tokens.find_token

    async def find_token(self, token_id: str):
        calls.append(token_id)
        return await original(self, token_id)

    monkeypatch.setattr(Tokens, "find_token", find_token)
    return calls


MALFORMED = [
    "x" * 5000,                      # no fp_ prefix, long
    "fp_" + "a" * 70 + "_secret",    # token id longer than any issued
    "fp_abc_" + "s" * 300,           # secret longer than any issued
    "fp_ABC_secret",                 # upper-case id
    "fp_abc_sec ret",                # a space inside
    "fp_abc",                        # no secret
    "fp__secret",                    # no id
    "Zm9vYmFy.eyJhbGciOiJub25lIn0",  # something else entirely
]


async def test_malformed_tokens_are_refused_by_shape_before_any_cache_or_query(
        api, tokens, counted_lookups):
    verifier = api.app.state.verifier
    for token in MALFORMED:
        r = await api.get("/v1/executions", headers=headers(token))
        assert r.status_code == 401, (token[:40], r.text)
        assert r.json()["error"]["code"] == "UNAUTHENTICATED"
    assert counted_lookups == [], "a malformed token reached the database"
    assert len(verifier._cache) == 0, "a malformed token was cached"


async def test_rejections_are_not_cached_and_the_cache_is_keyed_by_a_digest(
        api, tokens, counted_lookups):
    verifier = api.app.state.verifier
    # Well-shaped but unknown, and a real ID with a wrong secret: each one is
    # looked up (one primary-key read) and none is remembered.
    bogus = [f"fp_{os.urandom(6).hex()}_{junk(43)}" for _ in range(200)]
    bogus.append(f"fp_{tokens.read.token_id}_{junk(43)}")
    for token in bogus:
        r = await api.get("/v1/executions", headers=headers(token))
        assert r.status_code == 401, r.text
    assert len(counted_lookups) == len(bogus)
    assert len(verifier._cache) == 0, "rejected tokens are cached"

    r = await api.get("/v1/executions", headers=tokens.read.headers)
    assert r.status_code == 200, r.text
    assert set(verifier._cache) == {hashlib.sha256(tokens.read.token.encode()).hexdigest()}
    assert tokens.read.token not in verifier._cache
    # Cached: a second request does not query again.
    lookups = len(counted_lookups)
    assert (await api.get("/v1/executions", headers=tokens.read.headers)).status_code == 200
    assert len(counted_lookups) == lookups


async def test_the_verified_cache_is_a_bounded_lru(store, make_token):
    verifier = TokenVerifier(store, max_entries=4)
    made = [await make_token("read", f"reader-{i}") for i in range(7)]
    for t in made:
        principal = await verifier.verify(t.token)
        assert principal is not None and principal.token_id == t.token_id
        assert len(verifier._cache) <= 4
    # The most recent four are the ones kept.
    assert set(verifier._cache) == {hashlib.sha256(t.token.encode()).hexdigest()
                                    for t in made[-4:]}


async def test_a_request_head_over_the_limit_is_431_with_the_error_shape(api, tokens):
    limit = api.app.state.settings.max_header_bytes
    for extra in ({"Authorization": "Bearer " + junk(limit + 10)},
                  {"X-Junk": junk(limit)},
                  {f"X-Junk-{i}": junk(1000) for i in range(limit // 1000 + 2)}):
        r = await api.get("/v1/executions", headers=extra)
        assert r.status_code == 431, r.text
        assert r.json()["error"]["code"] == "REQUEST_HEADER_FIELDS_TOO_LARGE"
        assert "header" in r.json()["error"]["message"]
    # Under the limit: answered as usual (401 for a junk token, 200 for a real one).
    r = await api.get("/v1/executions", headers={"Authorization": "Bearer " + junk(limit // 2)})
    assert r.status_code == 401
    assert (await api.get("/v1/executions", headers=tokens.read.headers)).status_code == 200


def _head(authorization: str) -> bytes:
    return (f"GET /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Authorization: Bearer {authorization}\r\n\r\n").encode("latin-1")


@pytest.fixture
async def auth_api(database_url, tmp_path):
    api = ApiProcess(database_url, tmp_path, env={"FENCEPOST_AUTH": "enabled"})
    try:
        yield await api.wait_ready()
    finally:
        api.stop()


async def test_the_api_process_answers_oversized_heads_431_itself(auth_api, tokens):
    # 256 KiB of junk: answered by the server with our error shape, the
    # connection closed; a head just under the limit still reaches the app.
    status, hdrs, body = await raw_request(auth_api.port, _head(junk(256 * KIB)))
    assert status == 431, body[:300]
    assert hdrs["content-type"].startswith("application/json")
    assert error_code(body) == "REQUEST_HEADER_FIELDS_TOO_LARGE"
    status, _, body = await raw_request(auth_api.port, _head(junk(20 * KIB)))
    assert (status, error_code(body)) == (431, "REQUEST_HEADER_FIELDS_TOO_LARGE"), body[:300]
    status, _, body = await raw_request(auth_api.port, _head(junk(8 * KIB)))
    assert (status, error_code(body)) == (401, "UNAUTHENTICATED"), body[:300]
    status, _, body = await raw_request(auth_api.port, _head(tokens.read.token))
    assert status == 200, body[:300]


async def test_300_junk_256kib_authorization_headers_do_not_grow_the_api_process(auth_api):
    proc = psutil.Process(auth_api.pid)
    statuses: dict[int, int] = {}

    async def burst(n: int) -> None:
        for _ in range(n):
            status, _, body = await raw_request(auth_api.port, _head(junk(256 * KIB)))
            statuses[status] = statuses.get(status, 0) + 1

    await burst(10)  # warm up the server's buffers and the allocator
    before = proc.memory_info().rss
    await burst(300)
    after = proc.memory_info().rss
    growth = (after - before) / MIB
    print(f"\nRSS of `fencepost api` before {before / MIB:.1f} MiB, after 300 junk 256 KiB "
          f"Authorization headers {after / MIB:.1f} MiB: growth {growth:+.2f} MiB; "
          f"answers {statuses}")
    assert set(statuses) <= {401, 431}, statuses
    assert growth < 4, f"the API grew by {growth:.1f} MiB"


async def test_the_server_protocol_refuses_a_long_head_while_reading_it(make_server, tenancy_settings):
    # The app's own limit is set far higher here, so a 431 can only come from
    # the protocol `fencepost api` serves with, which stops buffering a head
    # that is still incomplete past 16 KiB (a head complete within one read is
    # the app's to refuse: at most one read, 256 KiB, is ever held).
    from app.api.limits import guarded_http_protocol

    roomy = tenancy_settings.model_copy(update={"max_header_bytes": 4 * MIB})
    srv = await make_server(roomy, http=guarded_http_protocol(16 * KIB))
    for size in (400 * KIB, 900 * KIB):
        status, hdrs, body = await raw_request(srv.port, _head(junk(size)))
        assert (status, error_code(body)) == (431, "REQUEST_HEADER_FIELDS_TOO_LARGE"), body[:300]
        assert hdrs["connection"] == "close"
    status, _, body = await raw_request(srv.port, _head(junk(12 * KIB)))
    assert (status, error_code(body)) == (401, "UNAUTHENTICATED"), body[:300]


async def test_a_large_body_behind_a_small_head_is_not_refused(auth_api, tokens):
    # The head limit counts the head only, even when the body arrives in the same read.
    async with __import__("httpx").AsyncClient(base_url=auth_api.base, timeout=30) as c:
        r = await c.post("/v1/executions", headers=tokens.a.headers,
                         json={"workflowId": "wf", "params": {"blob": "x" * 200_000}})
    assert r.status_code == 201, r.text
