"""Operator commands: the one place an operator action is decided.

The HTTP API (app/api/routes) and the dashboard (app/ui) both call these;
the CLI reaches them through the API. A command validates its input, asks
the store once, and returns the store's outcome or raises CommandError
(HTTP status, stable code, message). Refusal messages end with a hint in
the caller's words (`Wording`: API or DASHBOARD).

  executions   cancel, terminate, wake, resume, resolve, signal
  redrive      redrive, fork
  operations   start_operation, stop_operation (bulk)
  schedules    set_paused (pause, resume), delete
  queues       change_queue (run-time settings, reset), pause, resume, read_queue
  errors       CommandError, Wording, the shared refusals
"""

from app.commands.errors import API, DASHBOARD, CommandError, Wording

__all__ = ["API", "DASHBOARD", "CommandError", "Wording"]
