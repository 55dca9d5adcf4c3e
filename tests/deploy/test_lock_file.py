"""constraints.txt pins every distribution the image installs, at the version
the tests ran with, and the Dockerfile installs from it.

Run as a module it prints the file as it should be:
    .venv/bin/python -m tests.deploy.test_lock_file > constraints.txt
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
# The installer and the build backend of fencepost's own wheel: pinned in the
# file, not part of the runtime closure (the venv may carry other versions).
TOOLS = {"pip": "26.3", "setuptools": "84.2.1"}

HEADER = """\
# The image's Python dependencies, pinned: every distribution pip installs for
# pyproject.toml's [project].dependencies, at the version the test suite ran
# with (Python 3.11, Linux), plus the installer and build backend. The
# Dockerfile installs with `-c constraints.txt` (PIP_CONSTRAINT, which also pins
# the setuptools that builds fencepost's wheel); tests/deploy/test_lock_file.py
# keeps this file in step with pyproject.toml and the venv. Regenerate after a
# dependency change with:
#   .venv/bin/python -m tests.deploy.test_lock_file > constraints.txt
"""


def runtime_closure() -> dict[str, str]:
    """{distribution: installed version} of everything [project].dependencies pulls in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    seen: set[tuple[str, frozenset[str]]] = set()
    versions: dict[str, str] = {}
    stack = [(Requirement(r), frozenset({""})) for r in project["dependencies"]]
    while stack:
        req, parent_extras = stack.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in parent_extras):
            continue
        name = canonicalize_name(req.name)
        extras = frozenset(req.extras) | {""}
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        versions[name] = metadata.version(req.name)
        stack += [(Requirement(c), extras) for c in metadata.requires(req.name) or []]
    return versions


def render() -> str:
    pins = {**runtime_closure(), **TOOLS}
    return HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def pins_in(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert match, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_every_runtime_distribution_is_pinned_at_the_tested_version() -> None:
    pins = pins_in(CONSTRAINTS.read_text())
    closure = runtime_closure()
    missing = sorted(set(closure) - set(pins))
    assert not missing, f"not pinned in constraints.txt: {missing} (regenerate it, see its header)"
    stale = {n: (pins[n], v) for n, v in closure.items() if pins[n] != v}
    assert not stale, f"constraints.txt pins other versions than the tests ran with: {stale}"
    extra = sorted(set(pins) - set(closure) - set(TOOLS))
    assert not extra, f"constraints.txt pins distributions the image does not install: {extra}"
    assert {n: pins.get(n) for n in TOOLS} == TOOLS


def test_the_file_is_exactly_what_the_generator_prints() -> None:
    assert CONSTRAINTS.read_text() == render(), (
        "constraints.txt is out of step: .venv/bin/python -m tests.deploy.test_lock_file "
        "> constraints.txt"
    )


if __name__ == "__main__":
    print(render(), end="")
