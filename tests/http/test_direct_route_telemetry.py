"""POST /v1/executions calls its endpoint directly (app/api/common.py
DirectRoute) unless FastAPI's own telemetry records the request: with a
global tracer provider set, the admission gets FastAPI's operation spans as
any route does, and answers the same bytes. In a child process: the global
provider is set once per process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import asyncio, json, sys

    import httpx
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from app.api.app import create_app
    from app.settings import Settings

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    async def main():
        app = create_app(Settings(database_url=sys.argv[1], auth="disabled", workflows=""))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                out = {}
                for name, call in (
                    ("admit", c.post("/v1/executions", json={"workflowId": "wf",
                                                              "executionId": "tel-1"})),
                    ("read", c.get("/v1/executions/tel-1")),
                ):
                    exporter.clear()
                    r = await call
                    out[name] = {"status": r.status_code, "body": r.text,
                                 "spans": sorted(s.name for s in exporter.get_finished_spans())}
        print(json.dumps(out))

    asyncio.run(main())
""")


def test_with_fastapi_telemetry_on_the_admission_has_its_operation_spans(database_url) -> None:
    run = subprocess.run([sys.executable, "-c", SCRIPT, database_url], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    admit, read = out["admit"], out["read"]
    assert admit["status"] == 201 and read["status"] == 200
    assert admit["body"] == '{"executionId":"tel-1","status":"admitted"}'
    operations = {s for s in read["spans"] if s.startswith("fastapi.")}
    assert operations, read["spans"]  # FastAPI records operations for a plain route...
    # ...and for the admission too: the dependencies and the endpoint.
    assert operations & set(admit["spans"]) >= {"fastapi.dependencies", "fastapi.endpoint"}, out
    assert "fencepost admit" in admit["spans"]
