"""Issue 10, item 12: settings that cannot work are refused at start, with a
message naming the variables, and `fencepost api` / `fencepost worker` print
it and exit 2 (configuration error) before touching the database."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith("FENCEPOST_") or name.upper() == "DATABASE_URL":
            monkeypatch.delenv(name)


@pytest.mark.parametrize("lease, renew", [("10", "10"), ("10", "30"), ("0.5", "0.6")])
def test_renewal_not_shorter_than_the_lease_is_refused(monkeypatch, lease, renew):
    monkeypatch.setenv("FENCEPOST_LEASE_SECONDS", lease)
    monkeypatch.setenv("FENCEPOST_RENEW_SECONDS", renew)
    with pytest.raises(ValidationError) as info:
        Settings()
    message = str(info.value)
    assert "FENCEPOST_RENEW_SECONDS" in message and "FENCEPOST_LEASE_SECONDS" in message


def test_a_lease_alone_shorter_than_the_default_renewal_renews_three_times_per_lease(
        monkeypatch):
    monkeypatch.setenv("FENCEPOST_LEASE_SECONDS", "6")  # renewal not set: default 10 cannot work
    assert Settings().renew_seconds == 2.0
    monkeypatch.setenv("FENCEPOST_LEASE_SECONDS", "60")  # the default works: kept
    assert Settings().renew_seconds == 10.0


def test_a_renewal_given_explicitly_is_never_adjusted(monkeypatch):
    monkeypatch.setenv("FENCEPOST_LEASE_SECONDS", "6")
    monkeypatch.setenv("FENCEPOST_RENEW_SECONDS", "10")
    with pytest.raises(ValidationError, match="FENCEPOST_RENEW_SECONDS"):
        Settings()
    assert Settings(lease_seconds=6, renew_seconds=1).renew_seconds == 1


def test_renewal_shorter_than_the_lease_is_accepted(monkeypatch):
    monkeypatch.setenv("FENCEPOST_LEASE_SECONDS", "1")
    monkeypatch.setenv("FENCEPOST_RENEW_SECONDS", "0.2")
    s = Settings()
    assert (s.lease_seconds, s.renew_seconds) == (1.0, 0.2)


def test_pool_min_above_max_is_refused(monkeypatch):
    monkeypatch.setenv("FENCEPOST_POOL_MIN_SIZE", "5")
    monkeypatch.setenv("FENCEPOST_POOL_MAX_SIZE", "2")
    with pytest.raises(ValidationError, match="FENCEPOST_POOL_MIN_SIZE"):
        Settings()


def test_pool_min_equal_to_max_is_accepted(monkeypatch):
    monkeypatch.setenv("FENCEPOST_POOL_MIN_SIZE", "3")
    monkeypatch.setenv("FENCEPOST_POOL_MAX_SIZE", "3")
    assert (Settings().pool_min_size, Settings().pool_max_size) == (3, 3)


def test_every_problem_is_reported_at_once(monkeypatch):
    monkeypatch.setenv("FENCEPOST_LEASE_SECONDS", "2")
    monkeypatch.setenv("FENCEPOST_RENEW_SECONDS", "3")
    monkeypatch.setenv("FENCEPOST_POOL_MIN_SIZE", "9")
    monkeypatch.setenv("FENCEPOST_POOL_MAX_SIZE", "1")
    monkeypatch.setenv("FENCEPOST_REDELIVERY_BASE_SECONDS", "10")
    monkeypatch.setenv("FENCEPOST_REDELIVERY_CAP_SECONDS", "1")
    with pytest.raises(ValidationError) as info:
        Settings()
    message = str(info.value)
    for name in ("FENCEPOST_RENEW_SECONDS", "FENCEPOST_POOL_MIN_SIZE",
                 "FENCEPOST_REDELIVERY_CAP_SECONDS"):
        assert name in message, message


def test_the_defaults_work():
    Settings()


def _fencepost() -> str:
    exe = shutil.which("fencepost", path=str(Path(sys.executable).parent)) or shutil.which(
        "fencepost")
    assert exe, "the `fencepost` console script is not installed (pip install -e .)"
    return exe


@pytest.mark.parametrize("command", ["worker", "api"])
def test_the_cli_prints_the_message_and_exits_2(command):
    env = {k: v for k, v in os.environ.items()
           if not (k.upper().startswith("FENCEPOST_") or k.upper() == "DATABASE_URL")}
    # An address nothing listens on: the refusal must come before any connection.
    env.update({"DATABASE_URL": "postgresql://u:p@127.0.0.1:9/none",
                "FENCEPOST_LEASE_SECONDS": "10", "FENCEPOST_RENEW_SECONDS": "10"})
    result = subprocess.run([_fencepost(), command], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "invalid configuration" in result.stderr, result.stderr
    assert "FENCEPOST_RENEW_SECONDS" in result.stderr and "FENCEPOST_LEASE_SECONDS" in \
        result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
