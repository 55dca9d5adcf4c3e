"""app.tracing looks the global tracer up once: spans made after a global
provider is installed still reach it, and a span with a parent but no
provider still makes that parent current (its traceparent is what an
admission stores). In a child process: the global provider is set once per
process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

SCRIPT = textwrap.dedent(f"""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from app import tracing

    # No provider yet: nothing recorded, the parent is current all the same.
    with tracing.span("before", parent="{PARENT}"):
        print("inside-before", tracing.current_traceparent())
    print("after-before", tracing.current_traceparent())
    with tracing.span("outer", parent="{PARENT}"):
        with tracing.span("inner"):
            print("nested-before", tracing.current_traceparent())
    with tracing.span("alone"):
        print("alone-before", tracing.current_traceparent())

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    with tracing.span("alone-after"):
        alone = tracing.current_traceparent()
    print("alone-after-recorded", alone is not None and alone.split("-")[1] != "{PARENT.split('-')[1]}")
    exporter.clear()
    with tracing.span("after", parent="{PARENT}", attributes={{"a": 1, "b": None}}) as s:
        inner = tracing.current_traceparent()
    [done] = exporter.get_finished_spans()
    print("recorded", done.name, format(done.context.trace_id, "032x"),
          format(done.parent.span_id, "016x"), sorted(done.attributes.items()))
    print("inner-is-new-span", inner != "{PARENT}" and inner.split("-")[1] == "{PARENT.split('-')[1]}")
""")


def test_spans_reach_a_global_provider_installed_after_the_first_span() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out == [
        f"inside-before {PARENT}",
        "after-before None",
        f"nested-before {PARENT}",
        "alone-before None",
        "alone-after-recorded True",
        "recorded after 4bf92f3577b34da6a3ce929d0e0e4736 00f067aa0ba902b7 [('a', 1)]",
        "inner-is-new-span True",
    ]
