"""This build's version: the installed package's (pyproject.toml), for
`fencepost --version` and the `fencepost_build_info` metric."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("fencepost")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"
