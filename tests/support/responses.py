"""The API's answers in tests: the one error shape, raw request bodies, a record."""

from __future__ import annotations

import httpx


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """The one error shape, with a stable code and a non-empty message."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error.get("code"), str) and error["code"], body
    if code is not None:
        assert error["code"] == code, body
    assert isinstance(error.get("message"), str) and error["message"].strip(), body
    return error


JSON = {"content-type": "application/json"}


async def post_raw(client: httpx.AsyncClient, body: bytes | str, path: str = "/v1/executions",
                   headers: dict | None = None) -> httpx.Response:
    """POST a body exactly as given (json libraries will not emit NaN, lone
    surrogates or duplicate keys)."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    return await client.post(path, content=body, headers=JSON if headers is None else headers)


async def get_record(client: httpx.AsyncClient, execution_id: str) -> dict:
    r = await client.get(f"/v1/executions/{execution_id}")
    assert r.status_code == 200, r.text
    return r.json()
