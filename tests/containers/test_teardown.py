"""The stack leaves nothing behind (issue 17, item 2): the suite's own teardown
(Stack.torn_down, which the `project` fixture uses) removes the containers, networks
and volumes of a project even when the block it guards fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.containers.stack import Stack

pytestmark = pytest.mark.containers


def test_a_failing_block_still_removes_containers_networks_and_volumes(
        compose_command: list[str], workflows_dir: Path):
    stack = Stack.new(compose_command, workflows_dir)
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="a test failed"):
        with stack.torn_down():
            stack.compose("up", "-d", "postgres", timeout=300)
            seen = stack.leftovers()
            raise RuntimeError("a test failed")
    assert len(seen) >= 3, f"expected a container, a network and a volume: {seen}"
    assert stack.leftovers() == []
