"""Logging: one JSON object per line (or readable console lines for `make
dev`), from the API and the workers alike, through structlog's formatter.

Records carry structured fields where they have them: `execution_id`,
`token`, `worker_id`, plus the event text. Logs never contain the content of
params, results or signals: callers pass identifiers, never values.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from contextvars import ContextVar
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

FORMATS = ("json", "console")

# The request being answered (app/api/request_ids.py): every line logged
# while answering it carries `request_id`.
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)


def _add_request_id(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    request_id = REQUEST_ID.get()
    if request_id is not None:
        event_dict.setdefault("request_id", request_id)
    return event_dict


def _drop_color_message(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    event_dict.pop("color_message", None)  # uvicorn's ANSI copy of the message
    return event_dict


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    pre_chain: list[Processor] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
        _add_request_id,
        _drop_color_message,
        structlog.processors.format_exc_info,
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=pre_chain,
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


class Fields(logging.LoggerAdapter[logging.Logger]):
    """A logger that adds fixed fields (e.g. worker_id) to every record and
    merges them with the call's own `extra=`."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


_audit = logging.getLogger("fencepost.audit")


def operator_action(action: str, *, by: str, result: str | None, **target: Any) -> None:
    """One line per operator action: who did what to which execution or
    schedule, and what came of it (never the values it carried)."""
    what = ", ".join(f"{k} {v}" for k, v in target.items())
    _audit.info("operator action: %s %s by %s: %s", action, what, by, result,
                extra={"kind": "operator_action", "action": action, "by": by,
                       "result": result, **target})
