"""What `fencepost bench` says when a run fails: the children's log, one line
per record, a traceback by the exception it ends with."""

from __future__ import annotations

import json

from app.tools.bench import _log_summary


def test_log_summary_gives_each_record_one_line_and_a_traceback_its_exception() -> None:
    traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                 "asyncpg.exceptions.FeatureNotSupportedError: not on Citus\n")
    text = "\n".join([
        json.dumps({"event": "auth is off", "level": "warning", "logger": "fencepost.api"}),
        json.dumps({"event": traceback, "level": "error", "logger": "uvicorn.error"}),
        json.dumps({"event": "claim failed", "exception": traceback, "level": "error",
                    "logger": "fencepost.worker"}),
        "a line that is not JSON",
    ])
    assert _log_summary(text).splitlines() == [
        "warning fencepost.api: auth is off",
        "error uvicorn.error: traceback ending: "
        "asyncpg.exceptions.FeatureNotSupportedError: not on Citus",
        "error fencepost.worker: claim failed: "
        "asyncpg.exceptions.FeatureNotSupportedError: not on Citus",
        "a line that is not JSON",
    ]
    # Only the last records: the failure is at the end.
    many = "\n".join(json.dumps({"event": f"e{i}", "level": "info", "logger": "l"})
                     for i in range(30))
    assert _log_summary(many, records=2).splitlines() == ["info l: e28", "info l: e29"]
