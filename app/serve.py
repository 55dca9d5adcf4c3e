"""`fencepost api` and `fencepost worker`: the two long-running processes."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING

from app import tracing
from app.logs import FORMATS, configure_logging
from app.settings import ConfigurationError, Settings

if TYPE_CHECKING:  # for annotations only: import_workflows imports the registry when it runs
    from app.registry import WorkflowDefinition


def configure_api(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    p.add_argument("--workflows", help="comma-separated workflow modules (FENCEPOST_WORKFLOWS)")
    p.add_argument("--allow-remote-without-auth", action="store_true", default=None,
                   help="with FENCEPOST_AUTH=disabled, bind a non-loopback --host anyway "
                        "(FENCEPOST_ALLOW_REMOTE_WITHOUT_AUTH); anyone who reaches it acts as operator")
    p.add_argument("--log-level", help="critical, error, warning, info or debug "
                   "(FENCEPOST_LOG_LEVEL, default info)")
    p.add_argument("--log-format", choices=FORMATS,
                   help="json lines or console (FENCEPOST_LOG_FORMAT, default json)")


def is_loopback(host: str) -> bool:
    """True for an interface only this machine reaches: localhost, 127.0.0.0/8, ::1."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def unauthenticated_bind_problem(host: str, settings: Settings, allow: bool | None) -> str | None:
    """Why `fencepost api --host HOST` must not start, or None: with
    authentication disabled every caller is an operator, so the API binds
    loopback unless the operator opts in."""
    if settings.auth != "disabled" or is_loopback(host):
        return None
    if allow or settings.allow_remote_without_auth:
        return None
    return (f"refusing to serve --host {host} with FENCEPOST_AUTH=disabled: anyone who can reach "
            "it could run every operation. Bind 127.0.0.1, enable authentication "
            "(FENCEPOST_AUTH=enabled and `fencepost tokens create`), or pass "
            "--allow-remote-without-auth (FENCEPOST_ALLOW_REMOTE_WITHOUT_AUTH=true) and list the "
            "names clients use in FENCEPOST_ALLOWED_HOSTS")


def check_port(flag: str, host: str, port: int, *, zero_means: str | None = None) -> None:
    """Refuse, as a configuration error, a port outside 0-65535 (the kernel
    would silently use another) or one another process holds."""
    lowest = 0 if zero_means else 1
    if not lowest <= port <= 65535:
        raise ConfigurationError(
            f"{flag} {port} is out of range: give a port from {max(lowest, 1)} to 65535"
            + (f" (0: {zero_means})" if zero_means else ""))
    if port == 0:
        return
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ConfigurationError(f"cannot bind {host}:{port} ({exc}): give an address of "
                                 "this machine") from None
    # A probe bind, closed at once: SO_REUSEADDR as the real listener sets it.
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigurationError(
                    f"{flag} {port}: port {port} on {host} is in use by another process; "
                    f"stop it or choose another {flag}") from None
            raise ConfigurationError(f"{flag} {port}: cannot bind {host}:{port} ({exc})") from None


def import_workflows(settings: Settings) -> dict[str, WorkflowDefinition]:
    """The workflows of FENCEPOST_WORKFLOWS; a module that cannot be imported
    is a configuration error."""
    from app.registry import load_workflows

    try:
        return load_workflows(settings.workflow_modules)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"cannot import the workflow modules {','.join(settings.workflow_modules)} "
            f"(FENCEPOST_WORKFLOWS or --workflows): {exc}; check the module names and that "
            "they are on PYTHONPATH") from None


API_SHUTDOWN_SECONDS = 5
GC_YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Once a process has started: what it holds from start-up on (modules,
    the app, schemas, pools) is never garbage, so it leaves the collector's
    generations and no collection walks it again; and the young generation
    is collected every GC_YOUNG_THRESHOLD allocations instead of 700 (most of
    a request's or a delivery's objects die by reference count; cycles wait
    a little longer). Measured with `fencepost bench`: the API spent about a
    tenth of its CPU in the collector before."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run_api(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from app.api.app import create_app
    from app.api.limits import LOOPBACK_HOSTS, guarded_http_protocol

    if args.workflows is not None:
        settings = settings.model_copy(update={"workflows": args.workflows})
    problem = unauthenticated_bind_problem(args.host, settings, args.allow_remote_without_auth)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not (settings.allowed_hosts or "").strip() and settings.auth == "disabled":
        # DNS rebinding: without tokens, answer only the loopback names (unless
        # FENCEPOST_ALLOWED_HOSTS lists others). create_app checks only a list
        # it is given, so in-process clients of any name keep working.
        settings = settings.model_copy(update={"allowed_hosts": ",".join(LOOPBACK_HOSTS)})
    check_port("--port", args.host, args.port)
    workflows = import_workflows(settings) if settings.workflow_modules else None
    log_level = args.log_level or settings.log_level
    configure_logging(log_level, args.log_format or settings.log_format)
    tracing.configure_from_env("fencepost-api")
    asyncio.run(_preflight(settings))
    if settings.auth == "disabled":
        logging.getLogger("fencepost.api").warning(
            "authentication is disabled (FENCEPOST_AUTH=disabled): every caller acts as "
            "operator; set FENCEPOST_AUTH=enabled and create tokens with `fencepost tokens "
            "create` for anything but development")
    app = create_app(settings, workflows)
    # The head limit is enforced while reading (not only once parsed), and
    # X-Forwarded-Proto/For are trusted from the listed proxies only.
    protocol = guarded_http_protocol(settings.max_header_bytes) or "auto"
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=log_level, access_log=False,
        lifespan="on", log_config=None, http=protocol, proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        h11_max_incomplete_event_size=settings.max_header_bytes,
        # A stop lets requests finish for this long, then cuts what is left.
        timeout_graceful_shutdown=API_SHUTDOWN_SECONDS)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)  # the lifespan's start-up included
            settle_heap()

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:  # SIGTERM, SIGINT
            # The long-polls (waitSeconds up to 60) answer now with the record
            # as it is: a stop is not held up by them, and no client is cut.
            waiters = getattr(app.state, "waiters", None)
            if waiters is not None and waiters.loop is not None:
                waiters.loop.call_soon_threadsafe(waiters.release_all)
            super().handle_exit(sig, frame)

    Server(config).run()
    return 0


async def _preflight(settings: Settings) -> None:
    """Refuse to start, with one clear line, on an unreachable database or a
    schema that is not at this build's revision (exit 1); with a message per
    setting, on shared settings that differ from the stored ones (exit 2; the
    first process stores its own)."""
    from app import shared_settings
    from app.db import create_pool
    from app.migrate import SchemaNewerThanBuild, SchemaOutOfDate, check_schema

    pool = await create_pool(settings, min_size=1, max_size=1)
    try:
        await check_schema(pool)
        await shared_settings.check(pool, settings)
    except SchemaNewerThanBuild as exc:
        raise ConfigurationError(str(exc)) from None
    except SchemaOutOfDate as exc:
        raise SystemExit(f"error: {exc}") from None
    except shared_settings.SharedSettingsMismatch as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(shared_settings.EXIT_MISMATCH) from None
    finally:
        await pool.close()


def configure_worker(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, default=10,
                   help="most deliveries this worker runs at once (default 10)")
    p.add_argument("--workflows", help="comma-separated workflow modules (FENCEPOST_WORKFLOWS)")
    p.add_argument("--worker-id", help="a stable name for this worker (default host:pid:random)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on this port (default: off)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="interface for --metrics-port (default 127.0.0.1)")
    p.add_argument("--log-level", help="critical, error, warning, info or debug "
                   "(FENCEPOST_LOG_LEVEL, default info)")
    p.add_argument("--log-format", choices=FORMATS,
                   help="json lines or console (FENCEPOST_LOG_FORMAT, default json)")


def run_worker(args: argparse.Namespace, settings: Settings) -> int:
    from app.worker import Worker

    if args.workflows is not None:
        settings = settings.model_copy(update={"workflows": args.workflows})
    configure_logging(args.log_level or settings.log_level, args.log_format or settings.log_format)
    tracing.configure_from_env("fencepost-worker")
    if not settings.workflow_modules:
        print("error: name the workflow modules: --workflows or FENCEPOST_WORKFLOWS", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print("error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    check_port("--metrics-port", args.metrics_host, args.metrics_port,
               zero_means="no metrics endpoint")
    workflows = import_workflows(settings)
    if not workflows:
        print(f"error: modules {settings.workflow_modules} register no workflow", file=sys.stderr)
        return 2
    asyncio.run(_preflight(settings))
    worker = Worker(settings, workflows, concurrency=args.concurrency, worker_id=args.worker_id)
    if args.metrics_port:
        from prometheus_client import start_http_server

        from app.metrics import METRICS

        try:
            start_http_server(args.metrics_port, addr=args.metrics_host,
                              registry=METRICS.registry)
        except OSError as exc:  # taken since the check: still the port, not the database
            raise ConfigurationError(f"--metrics-port {args.metrics_port}: cannot serve "
                                     f"metrics on {args.metrics_host} ({exc})") from None

    settle_heap()

    async def main() -> None:
        worker.install_signal_handlers()
        await worker.run()

    try:
        import uvloop
    except ImportError:  # optional: uvicorn[standard] brings it
        asyncio.run(main())
    else:
        uvloop.run(main())
    return 0
