"""Short timings for tests with in-process workers: a lease of one second,
renewals and polls every 0.2 s, redelivery from 50 ms, a cleanup window of one
second after a cancel or the deadline, so nothing waits long."""

from __future__ import annotations

from typing import Any

from app.settings import Settings

QUICK: dict[str, Any] = {
    "lease_seconds": 1,
    "renew_seconds": 0.2,
    "poll_seconds": 0.2,
    "redelivery_base_seconds": 0.05,
    "redelivery_cap_seconds": 0.5,
    "shutdown_grace_seconds": 2,
    "cancel_grace_seconds": 1,
}


def quick_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for `database_url` with the short timings (each overridable).
    On Citus every claim looks in every shard group, as with the `settings`
    fixture (tests/conftest.py): a test claims right after it writes."""
    from tests.conftest import citus_mode

    citus = {"claim_recheck_seconds": 0} if citus_mode() else {}
    return Settings(**{**QUICK, **citus, "database_url": database_url, **overrides})
