"""`/metrics`: Prometheus text, read from the database at scrape time."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.auth import StrictReader
from app.api.common import ERRORS, FORBIDDEN, UNAUTHENTICATED
from app.api.deps import StoreDep
from app.metrics import render_database_metrics

router = APIRouter(tags=["health"], responses={**UNAUTHENTICATED, **FORBIDDEN})


@router.get("/metrics", summary="Prometheus metrics (executions by status, parked, "
            "outcome-unknown steps, unacknowledged deliveries, oldest due age)",
            response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "metrics"},
                       503: ERRORS[503]})
async def metrics(store: StoreDep, _: StrictReader) -> Response:
    return Response(await render_database_metrics(store), media_type=CONTENT_TYPE_LATEST)
