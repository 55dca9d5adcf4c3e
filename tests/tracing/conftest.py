"""The report hook of tests/support/harness.py: a test that fails shows its
workers' logs (a hook counts only in a conftest, not in a test module)."""

from tests.support.harness import pytest_runtest_makereport  # noqa: F401
