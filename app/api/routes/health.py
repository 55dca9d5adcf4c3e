"""Liveness and readiness. Both stay open to every caller."""

from __future__ import annotations

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.common import refusal
from app.api.errors import DATABASE_ERROR_TYPES, RETRY_AFTER_SECONDS, error_response
from app.dberrors import is_infrastructure
from app.migrate import head_revision

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="The database answers and its schema is at this build's head revision",
    responses={503: refusal("DATABASE_UNAVAILABLE or SCHEMA_OUT_OF_DATE")},
)
async def readyz(request: Request):
    try:
        revision = await request.app.state.store.pool.fetchval(
            "SELECT version_num FROM alembic_version", timeout=2
        )
    except asyncpg.UndefinedTableError:
        revision = None  # never migrated: SCHEMA_OUT_OF_DATE below
    except DATABASE_ERROR_TYPES as exc:
        if not is_infrastructure(exc):
            raise
        return error_response(
            503, "DATABASE_UNAVAILABLE", "the database does not answer; retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    head = head_revision()
    if revision != head:
        return error_response(
            503, "SCHEMA_OUT_OF_DATE",
            f"the database schema is at {revision}, this build needs {head}; run `fencepost migrate`",
        )
    return JSONResponse({"status": "ready", "schemaRevision": revision})
