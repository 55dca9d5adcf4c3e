"""Where the API listens and which names it answers (issue 11, item 6).

With authentication disabled every caller is an operator, so:
* `fencepost api` binds loopback only: a non-loopback --host is refused with
  a message unless --allow-remote-without-auth (or
  FENCEPOST_ALLOW_REMOTE_WITHOUT_AUTH=true) says otherwise;
* it answers only the Host names in FENCEPOST_ALLOWED_HOSTS (default
  localhost, 127.0.0.1, [::1], any port): DNS rebinding — a page on
  evil.example whose name now resolves to 127.0.0.1 — sends Host: evil.example
  and is refused 421 HOST_NOT_ALLOWED.
Behind a TLS proxy, `fencepost api` trusts X-Forwarded-Proto/For from the
addresses in FENCEPOST_FORWARDED_ALLOW_IPS only. `fencepost dev` turns Secure
cookies off and says so.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

import httpx
import pytest

from app.serve import is_loopback
from tests.support.api_process import ApiProcess, api_env, free_port, raw_request, run_api_cli
from tests.support.processes import REPO_ROOT, _die_with_parent
from tests.support.waiting import wait_until
from tests.tenancy.conftest import error_code

NO_AUTH = {"FENCEPOST_AUTH": "disabled"}


def _get(path: str, host: str, extra: str = "") -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\r\n"
            ).encode("latin-1")


@contextlib.asynccontextmanager
async def api_process(database_url, tmp_path, env, args=()):
    api = ApiProcess(database_url, tmp_path, env=env, args=tuple(args))
    try:
        yield await api.wait_ready()
    finally:
        api.stop()


async def test_dns_rebinding_a_foreign_host_is_refused_without_auth(database_url, tmp_path):
    async with api_process(database_url, tmp_path, NO_AUTH) as api:
        for path in ("/v1/executions", "/ui", "/healthz"):
            status, hdrs, body = await raw_request(api.port, _get(path, "evil.example"))
            assert (status, error_code(body)) == (421, "HOST_NOT_ALLOWED"), (path, body[:300])
            assert hdrs["content-type"].startswith("application/json")
            status, _, body = await raw_request(api.port, _get(path, f"evil.example:{api.port}"))
            assert status == 421, (path, body[:300])
        # A cross-site write the browser would send after rebinding: refused, nothing admitted.
        payload = b'{"workflowId": "wf", "executionId": "rebound"}'
        head = (f"POST /v1/executions HTTP/1.1\r\nHost: evil.example:{api.port}\r\n"
                "Origin: http://evil.example\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload
        status, _, body = await raw_request(api.port, head)
        assert (status, error_code(body)) == (421, "HOST_NOT_ALLOWED"), body[:300]
        status, _, _ = await raw_request(api.port, _get("/v1/executions/rebound", "127.0.0.1"))
        assert status == 404
        # The loopback names, with any port or none, are answered.
        for host in ("localhost", f"localhost:{api.port}", f"127.0.0.1:{api.port}", "[::1]",
                     f"[::1]:{api.port}", "LOCALHOST:1"):
            status, _, body = await raw_request(api.port, _get("/v1/executions", host))
            assert status == 200, (host, body[:300])
        # No Host at all (HTTP/1.0): not one of the names, refused.
        status, _, _ = await raw_request(
            api.port, b"GET /v1/executions HTTP/1.0\r\nConnection: close\r\n\r\n")
        assert status == 421


async def test_allowed_hosts_names_the_hosts_answered(database_url, tmp_path):
    env = {**NO_AUTH, "FENCEPOST_ALLOWED_HOSTS": "fencepost.internal, localhost"}
    async with api_process(database_url, tmp_path, env) as api:
        for host, expected in (("fencepost.internal", 200), ("FENCEPOST.internal:8443", 200),
                               ("localhost:1", 200), ("127.0.0.1", 421), ("evil.example", 421),
                               ("fencepost.internal.evil.example", 421)):
            status, _, body = await raw_request(api.port, _get("/v1/executions", host))
            assert status == expected, (host, body[:300])


async def test_with_auth_enabled_any_host_unless_a_list_is_given(make_api, tenancy_settings,
                                                                 tokens):
    api = await make_api()  # Host: fencepost.test; no list: tokens guard the API
    assert (await api.get("/v1/executions", headers=tokens.read.headers)).status_code == 200
    listed = await make_api(tenancy_settings.model_copy(update={"allowed_hosts": "api.example"}))
    r = await listed.get("/v1/executions", headers=tokens.read.headers)
    assert r.status_code == 421 and r.json()["error"]["code"] == "HOST_NOT_ALLOWED"
    assert "FENCEPOST_ALLOWED_HOSTS" in r.json()["error"]["message"]
    r = await listed.get("http://api.example:8000/v1/executions", headers=tokens.read.headers)
    assert r.status_code == 200
    star = await make_api(tenancy_settings.model_copy(update={"allowed_hosts": "*"}))
    assert (await star.get("/v1/executions", headers=tokens.read.headers)).status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.com"])
def test_a_non_loopback_bind_without_auth_is_refused_with_a_message(database_url, host):
    done = run_api_cli(database_url, "--host", host, "--port", str(free_port()), env=NO_AUTH)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "refusing to serve --host" in done.stderr and "FENCEPOST_AUTH=disabled" in done.stderr
    assert "--allow-remote-without-auth" in done.stderr


def test_loopback_names():
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.com", "localhost.example.com", ""):
        assert not is_loopback(host), host


@pytest.mark.parametrize("how", ["flag", "setting", "auth-enabled"])
async def test_a_non_loopback_bind_starts_when_told_or_with_auth(database_url, tmp_path, how):
    env = dict(NO_AUTH)
    args = ["--host", "0.0.0.0"]
    if how == "flag":
        args.append("--allow-remote-without-auth")
    elif how == "setting":
        env["FENCEPOST_ALLOW_REMOTE_WITHOUT_AUTH"] = "true"
    else:
        env = {"FENCEPOST_AUTH": "enabled"}
    async with api_process(database_url, tmp_path, env, args) as api:
        status, _, body = await raw_request(api.port, _get("/healthz", "127.0.0.1"))
        assert status == 200, body[:300]


async def test_forwarded_proto_is_trusted_from_the_listed_proxies_only(database_url, tmp_path):
    # A Secure cookie over plain HTTP is dropped by the browser: the login page
    # says so unless the request came (through a trusted proxy) over HTTPS.
    env = {"FENCEPOST_AUTH": "enabled"}
    behind_tls = "X-Forwarded-Proto: https\r\nX-Forwarded-For: 198.51.100.7\r\n"
    async with api_process(database_url, tmp_path, env) as trusted:  # default: 127.0.0.1
        status, _, page = await raw_request(trusted.port, _get("/ui/login", "fp.example", behind_tls))
        assert status == 200 and b"insecure-transport" not in page
        status, _, page = await raw_request(trusted.port, _get("/ui/login", "fp.example"))
        assert status == 200 and b"insecure-transport" in page
        # On loopback a browser keeps Secure cookies over HTTP: no warning.
        status, _, page = await raw_request(trusted.port, _get("/ui/login", "127.0.0.1"))
        assert status == 200 and b"insecure-transport" not in page
    env["FENCEPOST_FORWARDED_ALLOW_IPS"] = "10.9.9.9"
    async with api_process(database_url, tmp_path, env) as untrusted:
        status, _, page = await raw_request(untrusted.port,
                                            _get("/ui/login", "fp.example", behind_tls))
        assert status == 200 and b"insecure-transport" in page


async def test_fencepost_dev_turns_secure_cookies_off_and_says_so(database_url, tmp_path):
    port = free_port()
    log = open(tmp_path / "dev.log", "w+")  # noqa: SIM115 - closed below
    env = api_env(database_url, {"FENCEPOST_WORKFLOWS": "app.examples"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "dev", "--port", str(port), "--workers", "1"],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as c:
            async def ready() -> bool:
                assert proc.poll() is None, (tmp_path / "dev.log").read_text()
                return (await c.get("/readyz")).status_code == 200

            await wait_until(ready, timeout=60, interval=0.1, tolerate=(httpx.TransportError,),
                             detail=(tmp_path / "dev.log").read_text, what="fencepost dev ready")
            r = await c.get("/ui")
        banner = (tmp_path / "dev.log").read_text()
        assert "FENCEPOST_COOKIE_SECURE=false" in banner, banner
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("fencepost_ui_csrf=") and "secure" not in cookie.lower(), cookie
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


async def test_fencepost_api_without_auth_marks_its_cookies_secure(database_url, tmp_path):
    async with api_process(database_url, tmp_path, NO_AUTH) as api:
        status, hdrs, _ = await raw_request(api.port, _get("/ui", "127.0.0.1"))
        assert status == 200 and "secure" in hdrs["set-cookie"].lower(), hdrs
