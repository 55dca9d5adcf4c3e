"""An embedded Postgres for `fencepost dev` and the test suite.

The server binaries come from the `pgserver` wheel (Postgres 16, extra
`embedded`); the lifecycle is driven with the bundled `initdb` / `pg_ctl`
directly, so a server can be stopped and started again on the same data
directory and the same URL (outage tests rely on that). pgserver's own
`get_server()/cleanup()` only stops a server when no other process ever held
a handle on it (it keeps a pid list inside the data directory), which is not
reliable enough for tests that must take the database away.

The server listens on a unix socket only (no TCP port, so no port clashes).
The socket normally lives in the data directory; when that path would exceed
the unix-socket limit (~107 bytes) the socket goes to a short, deterministic
directory under the system temp dir instead (`fencepost-<hash of data dir>`),
and a warning says so. The data itself always stays in `data_dir`.

Postgres refuses to run as root. When fencepost runs as root, the server runs
as the system user `pgserver` (created with `useradd` if missing, as pgserver
itself does); directories leading to the data directory, the socket directory
and the binaries get `o+x` so that user can reach them.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("fencepost.embedded")

PORT = 5432  # only names the socket file (.s.PGSQL.5432); nothing listens on TCP
SOCKET_NAME = f".s.PGSQL.{PORT}"
# sockaddr_un.sun_path is 108 bytes including the NUL; keep a margin.
MAX_SOCKET_PATH = 100
RUN_AS_USER = "pgserver"

# Throw-away test servers: durability off, more connections for multi-process tests.
FAST_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_wal_size": "256MB",  # bounds WAL when the data dir is on tmpfs
    "max_connections": "300",
}
DEV_SETTINGS: dict[str, str] = {"max_connections": "200"}


class EmbeddedPostgresError(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """Directory holding initdb/pg_ctl/postgres.

    `FENCEPOST_PG_BINDIR` wins; else the pgserver wheel's bundled binaries
    (located without importing pgserver, whose import has side effects); else a
    system install (`pg_config --bindir`, /usr/lib/postgresql/<newest>/bin).
    """
    candidates: list[Path] = []
    if env := os.environ.get("FENCEPOST_PG_BINDIR"):
        candidates.append(Path(env))
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin")
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(Path(out.stdout.strip()))
    system = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(system)
    for c in candidates:
        if (c / "pg_ctl").is_file() and (c / "initdb").is_file() and (c / "postgres").is_file():
            return c
    raise EmbeddedPostgresError(
        "no Postgres binaries found: install the embedded extra "
        "(pip install -e '.[embedded]', which brings pgserver) or set FENCEPOST_PG_BINDIR"
    )


def socket_dir_for(data_dir: Path) -> Path:
    """Where the socket of the server on `data_dir` lives (deterministic)."""
    data_dir = data_dir.resolve()
    if len(os.fsencode(data_dir / SOCKET_NAME)) <= MAX_SOCKET_PATH:
        return data_dir
    digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:12]
    base = Path(tempfile.gettempdir())
    if len(os.fsencode(base / f"fencepost-{digest}" / SOCKET_NAME)) > MAX_SOCKET_PATH:
        base = Path("/tmp")
    return base / f"fencepost-{digest}"


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str


def _run_as() -> _RunAs | None:
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(RUN_AS_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", RUN_AS_USER],
            check=True, capture_output=True, text=True,
        )
        entry = pwd.getpwnam(RUN_AS_USER)
    return _RunAs(entry.pw_uid, entry.pw_gid, RUN_AS_USER)


def _ensure_traversable(path: Path) -> None:
    """Give others `x` on every ancestor of `path` (root only)."""
    for p in [path, *path.parents]:
        with contextlib.suppress(OSError):
            mode = p.stat().st_mode
            if not mode & 0o001:
                p.chmod(mode | 0o001)


class EmbeddedPostgres:
    """One Postgres server on one data directory; restartable.

    `url` is stable across stop()/start(). `start()` is a no-op when the server
    is already running (also when a previous process left it running), and
    `stop()` is a no-op when it is stopped.
    """

    def __init__(self, data_dir: Path, *, settings: Mapping[str, str] | None = None,
                 durable: bool = True, bin_dir: Path | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.socket_dir = socket_dir_for(self.data_dir)
        self.bin_dir = bin_dir or find_bin_dir()
        self.settings = dict(DEV_SETTINGS if durable else FAST_SETTINGS)
        self.settings.update(settings or {})
        self.durable = durable
        self.log_file = self.data_dir / "postgres.log"
        self._run_as = _run_as()
        self._atexit_registered = False
        self._warned = False

    # -- public API -------------------------------------------------------

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.socket_dir}"

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        rc = self._pg_ctl(["status"], check=False).returncode
        return rc == 0

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        with self._lock():
            self._prepare()
            if self.is_running():
                running_socket = self._running_socket_dir()
                if running_socket is not None and running_socket != self.socket_dir:
                    self.socket_dir = running_socket
                log.info("embedded postgres already running on %s", self.data_dir)
                return self
            parts = ["-c", "listen_addresses=", "-k", str(self.socket_dir), "-p", str(PORT)]
            for key, value in self.settings.items():
                parts += ["-c", f"{key}={value}"]
            options = " ".join(shlex.quote(p) for p in parts)
            result = self._pg_ctl(
                ["start", "-w", "-t", str(int(timeout)), "-l", str(self.log_file), "-o", options],
                check=False,
            )
            if result.returncode != 0 or not self.is_running():
                raise EmbeddedPostgresError(
                    f"embedded postgres did not start on {self.data_dir} (pg_ctl exit "
                    f"{result.returncode}): {result.stdout.strip()}\n--- {self.log_file} ---\n"
                    f"{self._log_tail()}"
                )
            self._wait_for_socket(timeout)
        return self

    def stop(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """Stop the server. mode: 'smart' | 'fast' | 'immediate' (a crash-like stop)."""
        if not self.is_running():
            return
        result = self._pg_ctl(["stop", "-w", "-t", str(int(timeout)), "-m", mode], check=False)
        if result.returncode != 0 and self.is_running():
            raise EmbeddedPostgresError(
                f"embedded postgres on {self.data_dir} did not stop: {result.stdout.strip()}"
            )

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop_at_exit(self) -> EmbeddedPostgres:
        if not self._atexit_registered:
            atexit.register(self._stop_quietly)
            self._atexit_registered = True
        return self

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(data_dir={str(self.data_dir)!r}, url={self.url!r})"

    # -- internals --------------------------------------------------------

    def _stop_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.data_dir.parent / f".{self.data_dir.name}.lock"
        with open(lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _prepare(self) -> None:
        if self.socket_dir != self.data_dir and not self._warned:
            self._warned = True
            log.warning(
                "data directory path is too long for a unix socket; the embedded postgres "
                "socket goes to %s (data stays in %s)", self.socket_dir, self.data_dir,
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            for d in (self.data_dir, self.socket_dir):
                os.chown(d, self._run_as.uid, self._run_as.gid)
            _ensure_traversable(self.data_dir.parent)
            _ensure_traversable(self.socket_dir.parent)
            _ensure_traversable(self.bin_dir)
        self.data_dir.chmod(0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            if any(p.name != "postgres.log" for p in self.data_dir.iterdir()):
                raise EmbeddedPostgresError(
                    f"{self.data_dir} is not empty and holds no Postgres cluster; "
                    "remove it or choose another directory"
                )
            args = ["-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                    "--encoding=UTF8", "--locale=C"]
            if not self.durable:
                args.append("--no-sync")
            result = self._run("initdb", args)
            if result.returncode != 0:
                raise EmbeddedPostgresError(f"initdb failed for {self.data_dir}:\n{result.stdout}")

    def _pg_ctl(self, args: list[str], *, check: bool) -> subprocess.CompletedProcess[str]:
        result = self._run("pg_ctl", ["-D", str(self.data_dir), *args])
        if check and result.returncode != 0:
            raise EmbeddedPostgresError(f"pg_ctl {' '.join(args)} failed:\n{result.stdout}")
        return result

    def _run(self, exe: str, args: list[str]) -> subprocess.CompletedProcess[str]:
        # Output goes to a temp file, not a pipe: the postmaster forked by
        # `pg_ctl start` could otherwise inherit the pipe and keep it open.
        kwargs: dict[str, Any] = {}
        if self._run_as is not None:
            kwargs = {"user": self._run_as.uid, "group": self._run_as.gid, "extra_groups": []}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.run(
                [str(self.bin_dir / exe), *args], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd="/", env=env, text=True, **kwargs,
            )
            out.seek(0)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), "")

    def _running_socket_dir(self) -> Path | None:
        pid_file = self.data_dir / "postmaster.pid"
        with contextlib.suppress(OSError):
            lines = pid_file.read_text().splitlines()
            if len(lines) >= 5 and lines[4].strip():
                return Path(lines[4].strip().split(",")[0])
        return None

    def _wait_for_socket(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        sock = self.socket_dir / SOCKET_NAME
        while not sock.exists():
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"no socket at {sock} after start")
            time.sleep(0.02)

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_embedded_postgres(data_dir: Path, *, durable: bool = True,
                            settings: Mapping[str, str] | None = None,
                            stop_at_exit: bool = True) -> EmbeddedPostgres:
    """Start (initialising if needed) a Postgres server on `data_dir` and return it.

    `durable=False` turns fsync off and speeds initdb up: for throw-away test
    servers. With `stop_at_exit` the server is stopped when this process exits
    normally (not on SIGKILL; a later start on the same data dir reuses a
    server left running).
    """
    server = EmbeddedPostgres(Path(data_dir), durable=durable, settings=settings)
    server.start()
    if stop_at_exit:
        server.stop_at_exit()
    return server
