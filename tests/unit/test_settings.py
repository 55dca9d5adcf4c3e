"""Settings are read from exactly the documented environment names."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from app.settings import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith("FENCEPOST_") or name.upper() == "DATABASE_URL":
            monkeypatch.delenv(name)


def test_database_url_is_read_from_DATABASE_URL(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db:5432/app")
    assert Settings().database_url == "postgresql://u:p@db:5432/app"


def test_database_url_defaults_to_none():
    assert Settings().database_url is None


def test_lease_seconds_accepts_fractions(monkeypatch):
    monkeypatch.setenv("FENCEPOST_LEASE_SECONDS", "0.25")
    assert Settings().lease_seconds == 0.25


def test_unprefixed_names_are_not_read(monkeypatch):
    monkeypatch.setenv("LEASE_SECONDS", "7")
    assert Settings().lease_seconds == 30.0


def test_workflows_split_on_commas(monkeypatch):
    monkeypatch.setenv("FENCEPOST_WORKFLOWS", "examples.orders, examples.mail,,")
    assert Settings().workflow_modules == ["examples.orders", "examples.mail"]


def test_no_workflows_by_default():
    assert Settings().workflow_modules == []


def test_redelivery_cap_below_base_is_rejected(monkeypatch):
    monkeypatch.setenv("FENCEPOST_REDELIVERY_BASE_SECONDS", "10")
    monkeypatch.setenv("FENCEPOST_REDELIVERY_CAP_SECONDS", "5")
    with pytest.raises(ValidationError, match="REDELIVERY_CAP_SECONDS"):
        Settings()


def test_redelivery_cap_equal_to_base_is_accepted(monkeypatch):
    monkeypatch.setenv("FENCEPOST_REDELIVERY_BASE_SECONDS", "2")
    monkeypatch.setenv("FENCEPOST_REDELIVERY_CAP_SECONDS", "2")
    s = Settings()
    assert (s.redelivery_base_seconds, s.redelivery_cap_seconds) == (2.0, 2.0)
