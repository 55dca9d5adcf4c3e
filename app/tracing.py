"""Tracing with OpenTelemetry, when it is installed (`pip install
'fencepost[otel]'`); without it every call here is a no-op.

One trace follows an execution from the request that admitted it to every
step that ran it, across deliveries, workers and crashes:

- admission: a span (child of the request's W3C `traceparent`, if any); its
  own `traceparent` is stored with the execution (without OpenTelemetry the
  request's, if well-formed, is stored as is);
- each delivery: a span whose parent is that stored `traceparent`, with the
  execution ID, workflow, token and whether it took over an expired lease;
- each step attempt, effect call and transactional step: a child span of the
  delivery, with the step key and attempt. Replayed steps make no span.

Exporters follow the standard variables: OTEL_TRACES_EXPORTER (`otlp`,
`console` — one JSON line per span —, or `none`, the default),
OTEL_SERVICE_NAME, and the OTLP exporter's own OTEL_EXPORTER_OTLP_*.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # the optional extra is not installed
    propagate = trace = None  # type: ignore[assignment]

log = logging.getLogger("fencepost.tracing")

# W3C Trace Context, version 00: version-trace_id-parent_id-flags.
TRACEPARENT_RE = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")

# Tests swap in a provider of their own (an in-memory exporter); None: the global one.
PROVIDER: Any = None


def valid_traceparent(value: str | None) -> str | None:
    """`value` when it is a well-formed W3C traceparent, else None (ignored)."""
    if isinstance(value, str) and TRACEPARENT_RE.match(value.strip().lower()):
        return value.strip().lower()
    return None


def enabled() -> bool:
    return trace is not None


@contextlib.contextmanager
def span(name: str, *, parent: str | None = None,
         attributes: dict[str, Any] | None = None) -> Iterator[Any]:
    """A span, current while the block runs: a child of the current span, or
    of the W3C traceparent `parent` when given. Nothing without OpenTelemetry."""
    if trace is None:
        yield None
        return
    tracer = PROVIDER.get_tracer("fencepost") if PROVIDER is not None else _global_tracer()
    if not parent and _records_nothing(tracer):
        # A no-op tracer's span without a parent is the current span made
        # current again (or a non-recording view of its context): no change.
        yield None
        return
    context = propagate.extract({"traceparent": parent}) if parent else None
    with tracer.start_as_current_span(name, context=context,
                                      attributes={k: v for k, v in (attributes or {}).items()
                                                  if v is not None}) as current:
        yield current


_TRACER: Any = None


def _global_tracer() -> Any:
    """The global provider's tracer, looked up once. Before a provider is set
    it is OpenTelemetry's proxy tracer, which hands each span to the provider
    set later (set once, never replaced): the same spans as a lookup per span,
    without reading the environment on every span."""
    global _TRACER
    if _TRACER is None:
        _TRACER = trace.get_tracer_provider().get_tracer("fencepost")
    return _TRACER


def _records_nothing(tracer: Any) -> bool:
    """True for OpenTelemetry's no-op tracer, or its proxy while no provider is set."""
    if isinstance(tracer, trace.ProxyTracer):
        tracer = tracer._tracer  # the provider's tracer once one is set, else a no-op one
    return isinstance(tracer, trace.NoOpTracer)


def current_traceparent() -> str | None:
    """The current span's W3C traceparent, or None (no span, or no OpenTelemetry)."""
    if trace is None:
        return None
    # No valid span context (no span, or a no-op one without a parent): there
    # is nothing to render; a traceparent of zeros would be refused below.
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return valid_traceparent(carrier.get("traceparent"))


def configure_from_env(service_name: str) -> None:
    """Install a tracer provider as OTEL_TRACES_EXPORTER says (none: nothing)."""
    wanted = [e.strip() for e in os.environ.get("OTEL_TRACES_EXPORTER", "none").split(",")
              if e.strip() and e.strip() != "none"]
    if not wanted:
        return
    if trace is None:
        log.warning("OTEL_TRACES_EXPORTER=%s but OpenTelemetry is not installed; "
                    "pip install 'fencepost[otel]'", ",".join(wanted))
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                               service_name)})
    provider = TracerProvider(resource=resource)
    for exporter in wanted:
        if exporter == "console":
            # One line per span, written as it ends (it survives a SIGKILL after).
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
                formatter=lambda s: s.to_json(indent=None) + os.linesep)))
        elif exporter == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                log.warning("OTEL_TRACES_EXPORTER=otlp needs "
                            "opentelemetry-exporter-otlp-proto-http (fencepost[otel])")
                continue
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r ignored", exporter)
    trace.set_tracer_provider(provider)
