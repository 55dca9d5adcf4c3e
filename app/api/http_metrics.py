"""HTTP metrics of the API: requests by route template, method and status,
and time to answer, counted by the API's front layer (app/api/front.py)
around every route (the request guard's 421/431 included, as route
"(unmatched)")."""

from __future__ import annotations

from fastapi import FastAPI

from app.metrics import METRICS

UNMATCHED = "(unmatched)"


def record(scope, status: int, seconds: float) -> None:
    """One answer: counted by route template, method and status, and timed."""
    # The router writes the matched route into the request's scope.
    route = scope.get("route")
    template = getattr(route, "path", None) or UNMATCHED
    method = scope["method"]
    METRICS.http_requests.labels(template, method, str(status)).inc()
    METRICS.http_seconds.labels(template, method).observe(seconds)


def preinitialise(app: FastAPI) -> None:
    """Every published operation's documented statuses at zero, so rate()
    sees the first one."""
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            METRICS.init_route(path, method.upper(), sorted(operation["responses"]))
