"""The `fencepost` command line.

Every subcommand is one entry in COMMANDS: a name, a help line, a function that
adds its arguments to its argparse subparser, and a function `run(args) -> int`
(the process exit code). To add `api`, `worker`, `dev` or `bench`, write the two
functions and add one `Command(...)` line to COMMANDS; `main()` needs no change.

Exit codes: 0 success, 1 the command ran and failed (e.g. schema behind),
2 usage or configuration error (e.g. DATABASE_URL missing).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from app import devserver, opscli, queuescli, replaycli, serve, shared_settings, tokens_cli
from app.settings import ConfigurationError, Settings, database_url_problem, env_name
from app.version import VERSION

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A failure with a message for the operator; main() prints it and exits."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# -- shared helpers ---------------------------------------------------------


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        # One line for all problems: each names its environment variable.
        problems = []
        for e in exc.errors():
            message = e["msg"].removeprefix("Value error, ")
            problems.append(f"{env_name(str(e['loc'][0]))}: {message}" if e["loc"] else message)
        raise CliError("invalid configuration: " + "; ".join(problems), EXIT_USAGE) from None


def require_database_url(settings: Settings, command: str) -> str:
    if not settings.database_url:
        raise CliError(
            f"fencepost {command}: DATABASE_URL is not set; "
            "export DATABASE_URL=postgresql://user:password@host:5432/dbname",
            EXIT_USAGE,
        )
    problem = database_url_problem(settings.database_url)
    if problem:
        raise CliError(problem, EXIT_USAGE)
    return settings.database_url


def _tooling(module: str, name: str) -> Callable:
    """`app.tools.<module>.<name>`, imported when the command runs: the measuring
    tools (and their workflows) stay out of `fencepost api` / `worker`."""
    def call(*args):
        return getattr(importlib.import_module(f"app.tools.{module}"), name)(*args)
    return call


def _describe_connect_error(exc: BaseException) -> str | None:
    """A one-line message when `exc` (or what caused it) means 'cannot reach the database'."""
    import asyncpg

    connect_errors = (
        OSError,
        TimeoutError,
        asyncpg.exceptions.PostgresConnectionError,
        asyncpg.exceptions.InvalidCatalogNameError,
        asyncpg.exceptions.InvalidAuthorizationSpecificationError,
        asyncpg.exceptions.InvalidPasswordError,
        asyncpg.exceptions.CannotConnectNowError,
    )
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        # A reader that went away (`| head`) is not the database.
        if isinstance(cur, connect_errors) and not isinstance(cur, BrokenPipeError):
            return f"cannot connect to the database in DATABASE_URL: {type(cur).__name__}: {cur}"
        cur = cur.__cause__ or cur.__context__
    return None


# -- migrate ----------------------------------------------------------------


def _configure_migrate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 0 if the schema is at head, 1 if it needs `fencepost migrate`",
    )
    p.add_argument(
        "--citus",
        action="store_true",
        help="then distribute the tables over the database's Citus cluster (coordinator's "
             "DATABASE_URL; the citus extension and worker nodes added first): per-execution "
             "tables by bucket, the small shared ones as reference tables; again is harmless",
    )
    p.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="with --citus, when the tables are first distributed: spread the executions "
             "over N shards (default: 2 per worker node). Fewer is faster (each batch makes "
             "one round trip per shard it reaches); more lets more nodes share the load "
             "later without splitting shards",
    )


def cmd_migrate(args: argparse.Namespace) -> int:
    from app import migrate

    url = require_database_url(load_settings(), "migrate")
    head = migrate.head_revision()
    current = asyncio.run(migrate.current_revision(url))
    if current is not None and current not in migrate.known_revisions():
        raise CliError(str(migrate.SchemaNewerThanBuild(current)), EXIT_USAGE)

    if args.check:
        if current == head:
            print(f"schema is at head ({head})")
            return EXIT_OK
        print(
            f"schema is at revision {current or '<none: empty database>'}, "
            f"this code needs {head}; run `fencepost migrate`",
            file=sys.stderr,
        )
        return EXIT_FAILED

    # Refused before anything is migrated.
    if args.shards is not None and (not args.citus or not 1 <= args.shards <= 4096):
        raise CliError("--shards needs --citus and a number of shards from 1 to 4096 "
                       f"(got {args.shards}{'' if args.citus else ', without --citus'})",
                       EXIT_USAGE)
    if args.citus:
        from app import citus

        try:
            asyncio.run(citus.require_citus(url))
        except citus.CitusMissing as exc:
            raise CliError(str(exc), EXIT_USAGE) from exc

    async def upgrade_and_read() -> str | None:
        await migrate.upgrade(url)
        return await migrate.current_revision(url)

    current = asyncio.run(upgrade_and_read())
    print(f"schema is at revision {current} (head {head})")
    if current != head:
        return EXIT_FAILED
    if args.citus:
        from app import citus

        try:
            changed = asyncio.run(citus.distribute(url, args.shards))
        except citus.CitusMissing as exc:
            raise CliError(str(exc), EXIT_USAGE) from exc
        for line in changed:
            print(f"citus: {line}")
        print("citus: every table distributed")
    return EXIT_OK


# -- dispatch table -----------------------------------------------------------
# Add further subcommands here (api, worker, dev, bench), one line each.

def _with_settings(run: Callable[[argparse.Namespace, Settings], int], *,
                   needs_database: str | None = None) -> Callable[[argparse.Namespace], int]:
    def wrapped(args: argparse.Namespace) -> int:
        settings = load_settings()
        if needs_database:
            require_database_url(settings, needs_database)
        return run(args, settings)

    return wrapped


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in [
        Command("migrate", "apply database migrations (alembic upgrade head)", _configure_migrate,
                cmd_migrate),
        Command("api", "serve the HTTP API", serve.configure_api,
                _with_settings(serve.run_api, needs_database="api")),
        Command("worker", "run workflows: claim, renew, fence, acknowledge", serve.configure_worker,
                _with_settings(serve.run_worker, needs_database="worker")),
        Command("settings", "show or deliberately change the settings every process shares",
                shared_settings.configure,
                _with_settings(shared_settings.run, needs_database="settings")),
        Command("tokens", "create, list and revoke API tokens", tokens_cli.configure,
                _with_settings(tokens_cli.run, needs_database="tokens")),
        Command("dev", "embedded Postgres (unless DATABASE_URL is set), API and two workers",
                devserver.configure, _with_settings(devserver.run)),
        Command("bench", "measure throughput and latency; prints one JSON line",
                _tooling("bench", "configure"), _with_settings(_tooling("bench", "run"))),
        Command("soak", "admit under load while killing workers; verify; prints one JSON line",
                _tooling("soak", "configure"), _with_settings(_tooling("soak", "run"))),
        # The operator CLI speaks HTTP (FENCEPOST_URL, FENCEPOST_TOKEN), not SQL.
        Command("executions", "list, inspect and act on executions over the HTTP API",
                opscli.configure_executions, opscli.run),
        Command("workers", "the workers the API knows of", opscli.configure_workers, opscli.run),
        Command("operations", "bulk operations over the HTTP API: create, get, cancel",
                opscli.configure_operations, opscli.run),
        Command("queues", "flow control over the HTTP API: list, show, set, pause, resume",
                queuescli.configure_queues, opscli.run),
        Command("replay", "check workflow code against recorded histories before deploying it "
                "(exit 1 on a divergence)", replaycli.configure, replaycli.run),
    ]
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencepost", description="Durable workflows on PostgreSQL."
    )
    parser.add_argument("--version", action="version", version=f"fencepost {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS.values():
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.configure(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args._run(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = _describe_connect_error(exc)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
