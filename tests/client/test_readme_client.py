"""The README's "Calling fencepost from Python" example runs as written
against the live service with the example workflows."""

from __future__ import annotations

import asyncio
import re

from app.registry import load_workflows
from tests.client.conftest import InProcessWorkers
from tests.support.processes import REPO_ROOT


def readme_example() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Calling fencepost from Python", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


async def test_the_readme_client_example_runs(make_server, client_settings):
    examples = load_workflows(["app.examples"])
    srv = await make_server(workflows=examples)
    workers = InProcessWorkers(client_settings, examples)
    await workers.start()
    code = readme_example().replace("http://localhost:8000", srv.base)
    assert srv.base in code
    namespace: dict = {}
    try:
        await asyncio.to_thread(exec, code, namespace)
        again: dict = {}
        await asyncio.to_thread(exec, code, again)  # the idempotent start, run twice
    finally:
        await workers.stop_all()
    assert namespace["started"].created and not again["started"].created
    assert namespace["receipt"]["charged"] is True
    assert again["receipt"] == namespace["receipt"]
