"""`create_app(settings)`: wires routers, error handlers and the lifespan-owned
pool. No module-level engine or settings."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api.auth import TokenVerifier
from app.api.errors import install_error_handlers
from app.api.front import Front
from app.api.http_metrics import preinitialise
from app.api.limits import parse_allowed_hosts
from app.api.openapi import publish
from app.api.routes import (
    bulk,
    executions,
    health,
    history,
    metrics,
    operations,
    queues,
    redrive,
    schedules,
    signals,
    versions,
)
from app.api.waiters import Waiters
from app.db import create_pool
from app.metrics import METRICS
from app.migrate import check_schema
from app.registry import WorkflowDefinition, declared_queues, load_workflows
from app.settings import Settings
from app.store import ExecutionStore
from app.ui import routes as ui_routes


def create_app(settings: Settings, workflows: dict[str, WorkflowDefinition] | None = None) -> FastAPI:
    """`workflows`: the registry admission checks against; by default the
    modules named in FENCEPOST_WORKFLOWS. With none configured, admission
    accepts any well-formed workflowId (the API then knows no workflow code)."""
    if workflows is None and settings.workflow_modules:
        workflows = load_workflows(settings.workflow_modules)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        pool = await create_pool(settings, application_name="fencepost-api")
        try:
            await check_schema(pool)
            app.state.settings = settings
            app.state.store = ExecutionStore.from_settings(pool, settings)
            app.state.workflows = workflows
            # The queues this code declares, as workers record them: a queue
            # is readable (and its declared limits shown) before any worker starts.
            await app.state.store.queues.declare(
                {q.name: q.settings() for q in declared_queues(workflows or {})})
            app.state.verifier = TokenVerifier(app.state.store)
            # One LISTEN connection, outside the pool, for every long-poll request.
            app.state.waiters = Waiters(settings, app.state.store)
            app.state.waiters.start()
            try:
                yield
            finally:
                await app.state.waiters.stop()
        finally:
            await pool.close()

    app = FastAPI(
        title="fencepost",
        version="0.1.0",
        summary="Durable workflows on PostgreSQL",
        lifespan=lifespan,
        # Swagger UI / ReDoc load scripts from a CDN: only when asked (FENCEPOST_API_DOCS).
        docs_url="/docs" if settings.api_docs else None,
        redoc_url="/redoc" if settings.api_docs else None,
    )
    install_error_handlers(app)
    # One layer: HTTP metrics (counting the guard's refusals too), request
    # IDs, and the refusal of oversized heads (431) and, with an allow-list,
    # foreign Host names (421) before any route: app/api/front.py.
    app.add_middleware(Front, max_header_bytes=settings.max_header_bytes,
                       allowed_hosts=parse_allowed_hosts(settings.allowed_hosts))
    publish(app)
    app.include_router(health.router)
    app.include_router(executions.router)
    app.include_router(signals.router)
    app.include_router(operations.router)
    app.include_router(redrive.router)
    app.include_router(bulk.router)
    app.include_router(versions.router)
    app.include_router(history.router)
    app.include_router(metrics.router)
    app.include_router(schedules.router)
    app.include_router(queues.router)
    app.include_router(ui_routes.router)
    preinitialise(app)
    METRICS.init_workflows(workflows or {})
    return app
