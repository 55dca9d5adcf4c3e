"""`fencepost queues list|show|set|pause|resume`: flow control over the HTTP
API, as app/opscli.py speaks it (FENCEPOST_URL, FENCEPOST_TOKEN, --json,
the same exit codes).

A run-time setting wins over the one the queue's code declares until it is
reset (`set NAME --reset FIELD`); `none` is no limit.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from app.client import KEEP, Client
from app.opscli import UsageError, _cell, _group, _sub, block, table

# --reset FIELD, as the CLI spells it -> the API's setting name.
RESET_FIELDS = {"concurrency": "concurrency", "per-key-concurrency": "perKeyConcurrency",
                "rate-limit": "rateLimit", "hold-while-suspended": "holdWhileSuspended",
                "paused": "paused"}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(\.\d+)?)\s*$")


def limit_arg(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"give a whole number from 1, or none for no limit; "
                                         f"got {text!r}")
    return int(text)


def rate_arg(text: str) -> tuple[int, float] | None:
    if text.strip().lower() == "none":
        return None
    m = _RATE.match(text)
    if m is None or int(m.group(1)) < 1 or float(m.group(2)) <= 0:
        raise argparse.ArgumentTypeError(
            f"give STARTS/SECONDS (for example 100/60: 100 starts per 60 seconds), or none; "
            f"got {text!r}")
    return int(m.group(1)), float(m.group(2))


def configure_queues(p: argparse.ArgumentParser) -> None:
    sub = _group(p, "queues")
    _sub(sub, "list", "queues with their effective limits and what runs and waits", cmd_list)

    s = _sub(sub, "show", "one queue: settings (declared and run-time), counts, changes",
             cmd_show)
    s.add_argument("name", metavar="QUEUE")

    s = _sub(sub, "set", "change a queue's run-time settings (they win over the declared "
             "ones until reset); creates a queue nobody declared", cmd_set)
    s.add_argument("name", metavar="QUEUE")
    s.add_argument("--concurrency", type=limit_arg, default=KEEP, metavar="N|none",
                   help="most executions of the queue running at once")
    s.add_argument("--per-key-concurrency", type=limit_arg, default=KEEP, metavar="N|none",
                   help="most running at once per concurrency key")
    s.add_argument("--rate-limit", type=rate_arg, default=KEEP, metavar="N/SECONDS|none",
                   help="most starts per period, e.g. 100/60")
    s.add_argument("--rate-per-key", action=argparse.BooleanOptionalAction, default=KEEP,
                   help="count the rate limit per concurrency key (not per queue)")
    s.add_argument("--hold-while-suspended", action=argparse.BooleanOptionalAction,
                   default=KEEP, help="a suspended execution keeps its slot")
    s.add_argument("--reset", action="append", default=[], choices=sorted(RESET_FIELDS),
                   metavar="FIELD", help="drop the run-time value (the declared one applies); "
                   f"one of {', '.join(RESET_FIELDS)}; repeatable")

    s = _sub(sub, "pause", "claim nothing of the queue until resumed (what runs goes on)",
             cmd_pause)
    s.add_argument("name", metavar="QUEUE")
    s = _sub(sub, "resume", "claim the queue's due executions again, within its limits",
             cmd_resume)
    s.add_argument("name", metavar="QUEUE")


def cmd_list(fp: Client, args: argparse.Namespace) -> Any:
    queues = fp.list_queues()
    if args.json:
        return {"queues": queues}
    table(queues, [("QUEUE", "name"),
                   ("CONCURRENCY", lambda q: _cell(q["effective"]["concurrency"])),
                   ("PER KEY", lambda q: _cell(q["effective"]["perKeyConcurrency"])),
                   ("RATE", lambda q: _rate(q["effective"]["rateLimit"])),
                   ("PAUSED", lambda q: _cell(q["effective"]["paused"])),
                   ("RUNNING", lambda q: _cell(q["counts"]["running"])),
                   ("DUE", lambda q: _cell(q["counts"]["due"])),
                   ("RUN-TIME SETTINGS", lambda q: ",".join(q["override"]) or "-")])
    return None


def cmd_show(fp: Client, args: argparse.Namespace) -> Any:
    return _shown(fp.get_queue(args.name), args)


def cmd_set(fp: Client, args: argparse.Namespace) -> Any:
    rate_limit = args.rate_limit
    if args.rate_per_key is not KEEP and rate_limit is KEEP:
        # The per-key flag belongs to a rate limit: keep the one in effect.
        current = fp.get_queue(args.name)["effective"]["rateLimit"]
        if current is None:
            raise UsageError(f"queue {args.name!r} has no rate limit: give --rate-limit "
                             "N/SECONDS with --rate-per-key")
        rate_limit = (current["limit"], current["periodSeconds"])
    if rate_limit is None and args.rate_per_key is not KEEP:
        raise UsageError("--rate-per-key goes with a rate limit, not --rate-limit none")
    given = [args.concurrency, args.per_key_concurrency, rate_limit, args.hold_while_suspended]
    if all(v is KEEP for v in given) and not args.reset:
        raise UsageError("give a setting to change (--concurrency, --per-key-concurrency, "
                         "--rate-limit, --rate-per-key, --hold-while-suspended) or --reset")
    return _shown(fp.set_queue(
        args.name, concurrency=args.concurrency, per_key_concurrency=args.per_key_concurrency,
        rate_limit=rate_limit, rate_per_key=args.rate_per_key,
        hold_while_suspended=args.hold_while_suspended,
        reset=[RESET_FIELDS[f] for f in args.reset]), args)


def cmd_pause(fp: Client, args: argparse.Namespace) -> Any:
    return _shown(fp.pause_queue(args.name), args)


def cmd_resume(fp: Client, args: argparse.Namespace) -> Any:
    return _shown(fp.resume_queue(args.name), args)


# ---------------------------------------------------------------- output


def _rate(rate: dict[str, Any] | None) -> str:
    if rate is None:
        return "-"
    return (f"{rate['limit']}/{rate['periodSeconds']:g}s"
            + (" per key" if rate.get("perKey") else ""))


def _setting(queue: dict[str, Any], name: str) -> str:
    """The effective value, and where it comes from (run time or code)."""
    show = _rate if name == "rateLimit" else _cell
    value = show(queue["effective"][name])
    if name in queue["override"]:
        if name in queue["declared"]:
            return f"{value} (run time; declared {show(queue['declared'][name])})"
        return f"{value} (run time)"
    if name in queue["declared"]:
        return f"{value} (declared)"
    return value


def _shown(queue: dict[str, Any], args: argparse.Namespace) -> Any:
    if args.json:
        return queue
    counts = queue["counts"]
    block({
        "name": queue["name"],
        "concurrency": _setting(queue, "concurrency"),
        "perKeyConcurrency": _setting(queue, "perKeyConcurrency"),
        "rateLimit": _setting(queue, "rateLimit"),
        "holdWhileSuspended": _setting(queue, "holdWhileSuspended"),
        "paused": _setting(queue, "paused"),
        "running": counts["running"],
        "due": counts["due"],
        "startsInPeriod": counts["startsInPeriod"],
        "updatedAt": queue["updatedAt"],
    })
    if queue.get("changes"):
        print()
        table(queue["changes"], [("CHANGED AT", "at"), ("BY", "actor"), ("CHANGE", "change")])
    return None
