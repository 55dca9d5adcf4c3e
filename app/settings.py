"""Every setting fencepost reads, from the environment, in one place.

Operators and scripts rely on these names: `DATABASE_URL` and the
`FENCEPOST_*` variables. Durations are seconds and accept fractions, so tests
can run with leases of a fraction of a second.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConfigurationError(Exception):
    """A setting (environment variable or command-line flag) that cannot work:
    `fencepost` prints the message as one line and exits 2. The message names
    the setting and says what to do."""


def env_name(field: str) -> str:
    """The environment variable an operator sets for Settings field `field`."""
    return "DATABASE_URL" if field == "database_url" else f"FENCEPOST_{field.upper()}"


def database_url_problem(url: str) -> str | None:
    """Why DATABASE_URL cannot be a Postgres URL, or None (judged before any
    connection, so a typo is not reported as an unreachable server)."""
    from urllib.parse import urlsplit

    example = "postgresql://user:password@host:5432/dbname"
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
            return (f"DATABASE_URL must start with postgresql:// (got "
                    f"{parts.scheme + '://' if parts.scheme else 'no scheme'}); "
                    f"for example {example}")
        if "," not in parts.netloc:  # several hosts: libpq's own syntax, left to the driver
            parts.port  # noqa: B018 - raises ValueError on a port that is not 0-65535
    except ValueError as exc:
        return f"DATABASE_URL has an invalid host or port ({exc}); for example {example}"
    return None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FENCEPOST_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "FENCEPOST_DATABASE_URL"),
        description="Postgres URL (postgresql://user:pass@host:port/db). Unset: `dev` starts an embedded Postgres.",
    )
    auth: Literal["enabled", "disabled"] = Field(
        "enabled", description="Bearer-token authentication of the API; `disabled` only for development."
    )
    lease_seconds: float = Field(30.0, gt=0, description="How long a claim holds an execution without renewal."
                                 " Shared: stored once in the database; every api and worker must match it (`fencepost settings`).")
    renew_seconds: float = Field(
        10.0, gt=0,
        description="How often a worker renews the leases it holds; must be shorter than the lease "
        "(unset with a lease of 10 s or less: a third of the lease).",
    )
    redelivery_base_seconds: float = Field(
        1.0, gt=0, description="Redelivery delay after the first unacknowledged delivery."
        " Shared: stored once in the database; every api and worker must match it (`fencepost settings`)."
    )
    redelivery_cap_seconds: float = Field(300.0, gt=0, description="Upper bound of the redelivery delay."
                                          " Shared: stored once in the database; every api and worker must match it (`fencepost settings`).")
    max_payload_bytes: int = Field(262144, gt=0, description="Largest accepted request body.")
    max_operation_executions: int = Field(
        100_000, gt=0, le=10_000_000,
        description="Most executions one bulk operation may act on; a filter that matches more "
        "is refused (422 TOO_MANY_MATCHED).",
    )
    max_pending_signals: int = Field(
        1000, gt=0,
        description="Most unconsumed signals one execution holds; more are refused (429).",
    )
    body_timeout_seconds: float = Field(
        5.0, gt=0, description="Longest the API waits for a request body to arrive in full (408 after)."
    )
    max_unacknowledged_deliveries: int = Field(
        25, gt=0, description="Unacknowledged deliveries after which an execution is parked as poison."
        " Shared: stored once in the database; every api and worker must match it (`fencepost settings`)."
    )
    workflows: str = Field("", description="Comma-separated Python modules that register workflows.")
    max_json_depth: int = Field(64, gt=0, description="Deepest nesting accepted in params and context.")
    pool_min_size: int = Field(1, ge=0, description="Connections each process keeps open.")
    pool_max_size: int = Field(10, gt=0, description="Most connections each process opens.")
    statement_timeout_seconds: float = Field(
        10.0, gt=0, description="Longest a single statement may run before Postgres cancels it."
    )
    poll_seconds: float = Field(
        1.0, gt=0, description="How often an idle worker polls for due executions at most (LISTEN/NOTIFY wakes it sooner, and it wakes at the earliest due time its last claim told of)."
    )
    claim_recheck_seconds: float = Field(
        1.0, ge=0, description="On Citus: how long a claimer skips a shard group where its last claim found nothing due (until that claim's next due time if sooner; a NOTIFY ends it at once). 0: every claim looks in every group."
    )
    shutdown_grace_seconds: float = Field(
        30.0, ge=0, description="How long a stopping worker lets running deliveries finish before releasing them."
    )
    retention: timedelta = Field(
        timedelta(days=14),
        description="Age (since last update) after which terminal executions are deleted; "
        "seconds or ISO 8601 (P14D).",
    )
    cancel_grace_seconds: float = Field(
        30.0, ge=0, le=86400,
        description="How long workflow cleanup (`except Cancelled:`, `finally:`) may run after a "
        "cancel request or the deadline, for workflows without `@workflow(cancel_grace=)`; "
        "0: none, the execution ends at once.",
    )
    connect_timeout_seconds: float = Field(5.0, gt=0, description="Longest a connection attempt may take.")
    schedule_catch_up: int = Field(
        1, ge=1, le=1000,
        description="Most slots of one schedule admitted after the scheduler missed some (a worker "
        "was down); older missed slots are skipped with an event. A schedule's catchUp overrides it.",
    )
    maintenance_lease_seconds: float = Field(
        15.0, gt=0, le=3600,
        description="How long a worker leads a maintenance role (the reaper, retention and bulk "
        "operations; the scheduler) without renewing; renewed every third of it. Another "
        "worker takes the role over within about this long after its leader dies or stalls "
        "(unset with a lease shorter than 15 s: the lease).",
    )
    scheduler_interval_seconds: float = Field(
        10.0, gt=0, le=60,
        description="How often each worker evaluates the schedules of its workflows; a slot is "
        "admitted at most this long after its time.",
    )
    quota_refresh_seconds: float = Field(
        5.0, gt=0, le=300,
        description="How often each API process re-reads the tokens' quotas from Postgres; a "
        "quota set or changed with `fencepost tokens` applies within this long.",
    )
    api_processes: int = Field(
        1, gt=0,
        description="API processes sharing the traffic: each enforces its share (1/N) of every "
        "token quota, so N processes together allow the quota.",
    )
    api_docs: bool = Field(
        False,
        description="Serve /docs (Swagger UI) and /redoc, which load their scripts from a CDN; "
        "`fencepost dev` turns them on. /openapi.json is always served.",
    )

    max_header_bytes: int = Field(
        16384, ge=1024,
        description="Largest request head (request line and headers together); larger ones are "
        "answered 431 before they are buffered.",
    )
    session_seconds: float = Field(
        28800.0, gt=0, description="How long a dashboard sign-in lasts (the session then expires)."
    )
    cookie_secure: bool = Field(
        True, description="Mark the dashboard's cookies Secure (HTTPS only); `fencepost dev` turns it off."
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        description="Comma-separated proxy addresses (or networks, or *) whose X-Forwarded-Proto and "
        "X-Forwarded-For the API trusts: the TLS proxy in front of it.",
    )
    allowed_hosts: str | None = Field(
        None,
        description="Comma-separated host names the API answers (any port; * for any); other Host "
        "headers get 421. Unset: localhost, 127.0.0.1 and [::1] when authentication is disabled, "
        "any host when it is enabled.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        "info", description="Least severe log records `api` and `worker` write (--log-level "
        "overrides it).",
    )
    log_format: Literal["json", "console"] = Field(
        "json", description="json: one JSON object per line; console: readable lines "
        "(--log-format overrides it).",
    )
    allow_remote_without_auth: bool = Field(
        False,
        description="Let `fencepost api` bind a non-loopback interface with authentication disabled.",
    )

    @model_validator(mode="after")
    def _settings_that_can_work(self) -> Settings:
        """Combinations that cannot work are refused at start, all of them in
        one message, so the operator fixes the configuration once."""
        problems = []
        if "renew_seconds" not in self.model_fields_set and self.renew_seconds >= self.lease_seconds:
            # Only the lease was given, shorter than the default renewal
            # interval: renew three times per lease instead of refusing.
            self.renew_seconds = self.lease_seconds / 3
        if "maintenance_lease_seconds" not in self.model_fields_set:
            # A deployment with short execution leases expects a dead
            # worker's work back as soon: its maintenance roles too.
            self.maintenance_lease_seconds = min(self.maintenance_lease_seconds,
                                                 self.lease_seconds)
        if self.renew_seconds >= self.lease_seconds:
            problems.append(
                f"FENCEPOST_RENEW_SECONDS ({self.renew_seconds:g}) must be shorter than "
                f"FENCEPOST_LEASE_SECONDS ({self.lease_seconds:g}): a lease renewed no more "
                "often than it lasts expires between renewals and every delivery is taken over "
                "(a third of the lease is a good renewal interval)"
            )
        if self.redelivery_cap_seconds < self.redelivery_base_seconds:
            problems.append(
                f"FENCEPOST_REDELIVERY_CAP_SECONDS ({self.redelivery_cap_seconds:g}) must be >= "
                f"FENCEPOST_REDELIVERY_BASE_SECONDS ({self.redelivery_base_seconds:g}): the cap "
                "bounds a delay that starts at the base"
            )
        if self.pool_min_size > self.pool_max_size:
            problems.append(
                f"FENCEPOST_POOL_MIN_SIZE ({self.pool_min_size}) must be <= "
                f"FENCEPOST_POOL_MAX_SIZE ({self.pool_max_size})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower_case(cls, v):
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("retention", mode="before")
    @classmethod
    def _seconds_as_number(cls, v):
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                return v
        return v

    @field_validator("retention")
    @classmethod
    def _retention_positive(cls, v: timedelta) -> timedelta:
        if v.total_seconds() <= 0:
            raise ValueError("FENCEPOST_RETENTION must be positive")
        return v

    @property
    def workflow_modules(self) -> list[str]:
        return [m.strip() for m in self.workflows.split(",") if m.strip()]
