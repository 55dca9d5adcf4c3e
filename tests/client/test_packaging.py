"""Packaging fit for `pip install` (issue 14 item 6): the wheel ships py.typed
and the migrations, so `fencepost migrate` works from a plain install in a
fresh venv; FENCEPOST_LOG_LEVEL / FENCEPOST_LOG_FORMAT work like every other
setting; the API and workers do not import the bench and soak tooling."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.db import asyncpg_dsn
from app.migrate import head_revision
from tests.support.api_process import api_env, free_port
from tests.support.processes import REPO_ROOT
from tests.support.waiting import wait_until

# The measuring tools' package: the API and the worker must load none of it.
TOOLING = "app.tools"


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process that knows nothing of this checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FENCEPOST_") and k not in ("DATABASE_URL", "PYTHONPATH")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built the documented way (`pip wheel . --no-deps`) from a copy
    of the sources (the checkout stays untouched)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("app", "migrations"):
        shutil.copytree(REPO_ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(tmp / "wheels"), str(src)],
        capture_output=True, text=True, timeout=300, env=_clean_env(),
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (path,) = (tmp / "wheels").glob("fencepost-*.whl")
    return path


def test_the_wheel_ships_py_typed_the_migrations_and_every_module(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "app/py.typed" in names
    assert "app/client.py" in names
    wanted = [f"app/migrations/{p.relative_to(REPO_ROOT / 'migrations').as_posix()}"
              for p in (REPO_ROOT / "migrations").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts]
    assert "app/migrations/env.py" in wanted and "app/migrations/script.py.mako" in wanted
    missing = sorted(set(wanted) - names)
    assert not missing, f"migrations missing from the wheel: {missing}"
    for f in (REPO_ROOT / "app").rglob("*"):
        rel = f.relative_to(REPO_ROOT).as_posix()
        if f.is_file() and "__pycache__" not in rel and not rel.endswith(".pyc"):
            assert rel in names, (f"{rel} is missing from the wheel: add its package to "
                                  "[tool.setuptools] packages / package-data in pyproject.toml")


async def test_fencepost_migrate_from_a_plain_install_in_a_fresh_venv(
        wheel, tmp_path, empty_database_url):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300, env=_clean_env())
    assert installed.returncode == 0, installed.stderr
    # The runtime dependencies come from this test run's environment (a path
    # entry, not a site dir: its editable `app` finder is not loaded), so the
    # test needs no network; `app` itself can only come from the wheel.
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = subprocess.run(
        [str(python), "-c",
         "import app, app.migrate; print(app.__file__); print(app.migrate.MIGRATIONS)"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=60)
    assert where.returncode == 0, where.stderr
    package_file, migrations = where.stdout.split()
    assert Path(package_file).is_relative_to(site), package_file
    assert Path(migrations) == site / "app" / "migrations"

    migrated = subprocess.run(
        [str(venv / "bin" / "fencepost"), "migrate"], capture_output=True, text=True,
        cwd=tmp_path, env=_clean_env(DATABASE_URL=empty_database_url), timeout=120)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    conn = await asyncpg.connect(asyncpg_dsn(empty_database_url))
    try:
        assert await conn.fetchval("SELECT version_num FROM alembic_version") == head_revision()
    finally:
        await conn.close()


def _loaded_modules(*modules: str) -> set[str]:
    probe = (f"import sys, importlib\nfor m in {list(modules)!r}: importlib.import_module(m)\n"
             f"print(sorted(m for m in sys.modules if m == {TOOLING!r} "
             f"or m.startswith({TOOLING + '.'!r})))")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return set(eval(ran.stdout))  # noqa: S307 - our own probe's printed list


def test_the_api_and_worker_modules_do_not_import_bench_or_soak_tooling():
    assert _loaded_modules("app.serve", "app.worker", "app.api.app") == set()


def test_the_command_line_entry_point_does_not_import_bench_or_soak_tooling():
    assert _loaded_modules("app.cli") == set()


async def _api_log(database_url: str, tmp_path: Path, **env: str) -> str:
    port = free_port()
    log_path = tmp_path / f"api-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "api", "--port", str(port)], cwd=REPO_ROOT,
            env=api_env(database_url, env), stdout=log, stderr=subprocess.STDOUT)
        try:
            async with httpx.AsyncClient(timeout=2) as http:
                async def ready() -> bool:
                    assert proc.poll() is None, log_path.read_text()
                    return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200

                await wait_until(ready, timeout=30, interval=0.05, what="the API ready",
                                 tolerate=(httpx.TransportError,), detail=log_path.read_text)
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 15)
    return log_path.read_text()


async def test_log_level_and_format_come_from_the_environment(database_url, tmp_path):
    default = await _api_log(database_url, tmp_path)
    startup = [line for line in default.splitlines() if "Application startup complete" in line]
    assert startup and json.loads(startup[0])["level"] == "info"

    console = await _api_log(database_url, tmp_path, FENCEPOST_LOG_FORMAT="console")
    startup = [line for line in console.splitlines() if "Application startup complete" in line]
    assert startup and not startup[0].startswith("{")

    quiet = await _api_log(database_url, tmp_path, FENCEPOST_LOG_LEVEL="WARNING")
    assert "Application startup complete" not in quiet


def test_a_bad_log_setting_is_refused_naming_it(database_url):
    ran = subprocess.run([sys.executable, "-m", "app.cli", "api"], cwd=REPO_ROOT,
                         env=api_env(database_url, {"FENCEPOST_LOG_LEVEL": "loud"}),
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2
    assert "FENCEPOST_LOG_LEVEL" in ran.stderr  # the variable an operator sets
