"""HTTP metrics of the API: requests by route template, method and status,
and time to answer, counted by the API's front layer (app/api/front.py)
around every route (the request guard's 421/431 included, as route
"(unmatched)")."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from app.metrics import METRICS

UNMATCHED = "(unmatched)"


class RouteCounters:
    """Counts answers into METRICS. Each label set's counter and histogram
    are looked up once and kept (the label sets are those the metrics keep
    anyway), not looked up by label values on every answer."""

    def __init__(self) -> None:
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._seconds: dict[tuple[str, str], Any] = {}

    def record(self, scope, status: int, seconds: float) -> None:
        # The router writes the matched route into the request's scope.
        route = scope.get("route")
        template = getattr(route, "path", None) or UNMATCHED
        method = scope["method"]
        counter = self._requests.get((template, method, status))
        if counter is None:
            counter = self._requests[(template, method, status)] = METRICS.http_requests.labels(
                template, method, str(status))
        counter.inc()
        histogram = self._seconds.get((template, method))
        if histogram is None:
            histogram = self._seconds[(template, method)] = METRICS.http_seconds.labels(
                template, method)
        histogram.observe(seconds)


def preinitialise(app: FastAPI) -> None:
    """Every published operation's documented statuses at zero, so rate()
    sees the first one."""
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            METRICS.init_route(path, method.upper(), sorted(operation["responses"]))
