"""`/metrics`: this process's metrics (HTTP, counters, process) and Prometheus
gauges read from the database at scrape time. A database that does not
answer is reported as `fencepost_database_up 0`, not as a failed scrape."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.auth import StrictReader
from app.api.common import ERRORS, FORBIDDEN, UNAUTHENTICATED
from app.api.deps import SettingsDep, StoreDep
from app.api.errors import DATABASE_ERROR_TYPES
from app.dberrors import is_infrastructure
from app.metrics import render_with_database

router = APIRouter(tags=["health"], responses={**UNAUTHENTICATED, **FORBIDDEN})


@router.get("/metrics", summary="Prometheus metrics: the database gauges (executions by status "
            "and by why they wait, per workflow; parked; oldest ages; live workers; database "
            "up) and this process's counters (HTTP, terminal transitions, process)",
            response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "metrics"},
                       503: {**ERRORS[503], "description": "DATABASE_UNAVAILABLE: the token "
                             "could not be verified (the gauges themselves say "
                             "fencepost_database_up 0)"}})
async def metrics(request: Request, store: StoreDep, settings: SettingsDep,
                  _: StrictReader) -> Response:
    try:
        snap = dict(await store.workers.metrics_snapshot(
            live_within_seconds=3 * settings.renew_seconds + 1))
        snap["workflows"] = sorted(request.app.state.workflows or ())
    except DATABASE_ERROR_TYPES as exc:
        if not is_infrastructure(exc):
            raise
        snap = None
    return Response(render_with_database(snap), media_type=CONTENT_TYPE_LATEST)
