"""The image built from the working tree (issue 17, item 2): who it runs as, its
command line, where `migrate` finds its migrations, and the API's HEALTHCHECK."""

from __future__ import annotations

import pytest

from tests.containers.stack import Stack, docker_inspect, run

pytestmark = pytest.mark.containers


def test_the_image_runs_as_a_non_root_user(image: str):
    assert docker_inspect(image)["Config"]["User"] == "10001:10001"
    who = run(["docker", "run", "--rm", "--entrypoint", "id", image], timeout=60).stdout
    assert who.startswith("uid=10001(fencepost) gid=10001(fencepost)"), who


def test_fencepost_help_works_without_the_embedded_extra(image: str):
    shown = run(["docker", "run", "--rm", image, "--help"], timeout=60).stdout
    for command in ("api", "worker", "migrate", "tokens"):
        assert command in shown, shown
    embedded = run(["docker", "run", "--rm", "--entrypoint", "python", image, "-c",
                    "import pgserver"], check=False, timeout=60)
    assert embedded.returncode != 0, "the image must not carry the embedded Postgres"


def test_migrate_finds_its_migrations_in_the_installed_package(stack: Stack):
    (migrate,) = stack.containers("migrate")
    state = docker_inspect(migrate)["State"]
    assert not state["Running"] and state["ExitCode"] == 0, state
    where = stack.compose("run", "--rm", "-T", "--no-deps", "--entrypoint", "python", "migrate",
                          "-c", "from app.migrate import MIGRATIONS; print(MIGRATIONS)",
                          timeout=120).stdout.strip().splitlines()[-1]
    assert "/site-packages/" in where and not where.startswith("/src"), where
    # The schema the stack runs on is the head of those migrations.
    stack.compose("run", "--rm", "-T", "--no-deps", "migrate", "migrate", "--check",
                  timeout=120)


def test_the_api_healthcheck_turns_healthy(stack: Stack):
    (api,) = stack.containers("api")
    health = docker_inspect(api)["State"]["Health"]
    assert health["Status"] == "healthy", health
    assert health["Log"] and health["Log"][-1]["ExitCode"] == 0, health["Log"]
