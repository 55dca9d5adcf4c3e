"""Which errors mean "the database failed", judged by SQLSTATE class.

An error of fencepost's own database is infrastructure, never a workflow
outcome: it must not reach workflow code as an ordinary exception, must not
be recorded as `failed`, must not end a worker's side task, and is a 503 at
the API. Everything else is an outcome (or, at the API, a caller's error).

Infrastructure, by SQLSTATE:

| code | what |
|---|---|
| class 08 | connection exception |
| class 40 | transaction rollback (40001 serialization failure, 40P01 deadlock) |
| class 53 | insufficient resources (disk full, out of memory, too many connections) |
| class 57 | operator intervention (admin shutdown, statement timeout 57014) |
| class 58 | system error (I/O) |
| 25006 | read-only SQL transaction (a standby or a read-only primary) |
| 55P03 | lock not available (lock_timeout) |
| 3D000, 28xxx | the database or the role went away under a running process |

plus the client side: a socket error, a timeout, asyncpg's interface errors
(a closed connection, a pool being closed).
"""

from __future__ import annotations

import asyncpg

INFRASTRUCTURE_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58", "28"})
INFRASTRUCTURE_SQLSTATES = frozenset({"25006", "55P03", "3D000"})

# Conflicts between concurrent transactions: the same work retried at once
# usually succeeds (a bounded number of times).
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})

# For `except` clauses. asyncpg maps each known SQLSTATE to a subclass of its
# class's exception (DeadlockDetectedError < TransactionRollbackError), so
# these catch whole classes; an unknown code arrives as UnknownPostgresError,
# which `is_infrastructure` judges by its `sqlstate`.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,  # 08
    asyncpg.TransactionRollbackError,  # 40
    asyncpg.InsufficientResourcesError,  # 53
    asyncpg.OperatorInterventionError,  # 57 (QueryCanceledError, AdminShutdownError, ...)
    asyncpg.PostgresSystemError,  # 58
    asyncpg.ReadOnlySQLTransactionError,  # 25006
    asyncpg.LockNotAvailableError,  # 55P03
    asyncpg.InvalidCatalogNameError,  # 3D000
    asyncpg.InvalidAuthorizationSpecificationError,  # 28
)


def sqlstate_of(exc: BaseException) -> str | None:
    code = getattr(exc, "sqlstate", None)
    return code if isinstance(code, str) and len(code) == 5 else None


def is_infrastructure(exc: BaseException) -> bool:
    """True when `exc`, raised by a call to fencepost's own database, means
    the database failed rather than the request or the workflow."""
    code = sqlstate_of(exc)
    if code is not None:
        return code[:2] in INFRASTRUCTURE_SQLSTATE_CLASSES or code in INFRASTRUCTURE_SQLSTATES
    return isinstance(exc, INFRASTRUCTURE_ERRORS)


def is_database_failure(exc: BaseException) -> bool:
    """`is_infrastructure` for an error that may come from user code as well
    (a transactional step's function): only an error carrying an
    infrastructure SQLSTATE, or asyncpg's own client errors, count; a bare
    OSError or TimeoutError the function raised itself is its own failure."""
    if sqlstate_of(exc) is not None:
        return is_infrastructure(exc)
    return isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError)


def is_retryable_conflict(exc: BaseException) -> bool:
    """A serialization failure or deadlock: the transaction was rolled back
    and may be run again as a whole."""
    return sqlstate_of(exc) in RETRYABLE_SQLSTATES
