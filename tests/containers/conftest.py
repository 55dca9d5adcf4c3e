"""The container suite: the image built from the working tree and the compose stack
of docker-compose.yml, run for real (select it with `-m containers`).

It runs whenever a Docker engine answers and the base images can be had (here:
`../shared/containers/setup`, which .ci/run runs, builds them and exports
PYTHON_IMAGE and POSTGRES_IMAGE). Otherwise every test is skipped with the reason,
and the end of the run says so in a line of its own.

Fixtures (session scope: one build, one stack for the tests that do not destroy it):
  compose_command  the compose command line (`docker compose` or `docker-compose`)
  project          a Stack (tests/containers/stack.py) not started yet: its own
                   project name, generated passwords; brought down (containers,
                   networks, volumes) and its image tag removed at the end, whatever
                   happened
  image            the image tag, built by `docker compose build`
  stack            the project after `docker compose up -d --build`, API and workers healthy
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.stack import (
    FIGURES,
    FLOWS,
    ROOT,
    Stack,
    compose_default,
    dockerfile_default,
    find_compose_command,
    run,
)

_SKIPPED: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "containers: builds the image and runs the compose stack (needs Docker)")


def _why_not() -> str | None:
    """None when the suite can run, else why not."""
    try:
        info = run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout=20)
    except (OSError, TimeoutError) as exc:
        return f"no Docker engine answered ({type(exc).__name__}: {exc})"
    if info.returncode != 0:
        return f"no Docker engine answered ({info.stderr.strip()[-300:]})"
    if find_compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    wanted = {"PYTHON_IMAGE": dockerfile_default("PYTHON_IMAGE"),
              "POSTGRES_IMAGE": compose_default("POSTGRES_IMAGE")}
    for variable, default in wanted.items():
        image = os.environ.get(variable) or default
        if run(["docker", "image", "inspect", image], check=False, timeout=30).returncode == 0:
            continue
        pulled = run(["docker", "pull", image], check=False, timeout=300)
        if pulled.returncode != 0:
            return (f"base image {image} ({variable}) is not here and cannot be pulled "
                    f"({pulled.stderr.strip()[-300:]}); set {variable} to an image that is, "
                    "e.g. `eval \"$(../shared/containers/setup)\"`")
    return None


@pytest.fixture(scope="session")
def compose_command() -> list[str]:
    if _SKIPPED:
        pytest.skip(_SKIPPED[0])
    reason = _why_not()
    if reason is not None:
        _SKIPPED.append(f"container suite skipped: {reason}")
        pytest.skip(_SKIPPED[0])
    command = find_compose_command()
    assert command is not None
    return command


@pytest.fixture(scope="session")
def workflows_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/workflows' modules and this suite's, in one folder the image's user can read."""
    folder = tmp_path_factory.mktemp("workflows")
    for module in [*(ROOT / "deploy" / "workflows").glob("*.py"), *FLOWS.glob("*.py")]:
        shutil.copy(module, folder / module.name)
        (folder / module.name).chmod(0o644)
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="session")
def project(compose_command: list[str], workflows_dir: Path) -> Iterator[Stack]:
    stack = Stack.new(compose_command, workflows_dir)
    try:
        with stack.torn_down():
            yield stack
    finally:
        # The builder stage's layers (dependencies) stay, as the next session's cache.
        run(["docker", "image", "rm", stack.env["IMAGE_TAG"]], check=False, timeout=120)


@pytest.fixture(scope="session")
def image(project: Stack) -> str:
    started = time.monotonic()
    built = project.compose("build", timeout=900)
    cached = built.stdout.count("Using cache")
    FIGURES["image build"] = (f"{time.monotonic() - started:.1f} s (`docker compose build`; "
                              f"{cached} build steps came from the cache)")
    return project.env["IMAGE_TAG"]


@pytest.fixture(scope="session")
def stack(project: Stack, image: str) -> Stack:
    started = time.monotonic()
    project.up()
    FIGURES["stack healthy"] = (f"{time.monotonic() - started:.1f} s (`docker compose up "
                                "--build -d`: postgres, roles, migrate, api and 2 workers healthy)")
    return project


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    for reason in _SKIPPED:
        terminalreporter.write_sep("!", reason.upper().split(":")[0], yellow=True, bold=True)
        terminalreporter.write_line(reason, yellow=True, bold=True)
    if FIGURES:
        terminalreporter.write_sep("-", "container suite figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
