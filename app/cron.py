"""Five-field cron expressions and the slots they name in a time zone.

    minute hour day-of-month month day-of-week
    0-59   0-23 1-31         1-12  0-7 (0 and 7 are Sunday)

Each field is `*` or a comma-separated list of `n`, `a-b`, `*/s`, `a-b/s`,
`a/s` (from a to the field's end); months and weekdays also take English
names (`jan`, `mon-fri`). `@yearly`, `@annually`, `@monthly`, `@weekly`,
`@daily`, `@midnight` and `@hourly` are accepted. As in Vixie cron, when both
day-of-month and day-of-week are restricted (neither starts with `*`), a day
matches if *either* matches; otherwise both must.

Slots are local wall-clock times in the schedule's time zone, turned into
instants with Python's zoneinfo rules for `fold=0`:

* a local time that does not exist (inside a spring-forward gap) fires once,
  at the instant `fold=0` gives it: 02:30 in Europe/Warsaw on the last Sunday
  of March is 01:30 UTC (03:30 local);
* a local time that happens twice (fall-back) fires once, at its first
  occurrence;
* two local times that name the same instant fire once.

So every matching local time fires at most once; an hourly `0 * * * *` gives
23 slots on a spring-forward day and 24 on a fall-back day (schedule in UTC
for one firing per real hour).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, available_timezones

MAX_EXPRESSION_LENGTH = 200
# Slot computation never looks further back than this (a worker that was down
# longer forgets the older slots without counting them).
MAX_WINDOW = timedelta(days=366)
DAY = timedelta(days=1)
# next_slot looks this far ahead (a 29 February schedule fires within it).
NEXT_SLOT_HORIZON = timedelta(days=366 * 4 + 1)

FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_NAMES = (None, None, None, _MONTHS, _DAYS)
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_ITEM = re.compile(r"^(?:(\*)|([a-z0-9]+)(?:-([a-z0-9]+))?)(?:/([0-9]+))?$")
# Days each month can have (February: 29, in leap years).
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CronError(ValueError):
    """The expression is not a valid five-field cron expression."""


class TimezoneError(ValueError):
    """Not an IANA time zone name this system knows."""


@dataclass(frozen=True)
class Cron:
    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool
    # Every (hour, minute) of a matching day, in order.
    times: tuple[tuple[int, int], ...]

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return dom or dow
        return dom and dow

    def matches(self, local: datetime) -> bool:
        """Does this wall-clock time (its date, hour and minute) match?"""
        return (
            local.minute in self.minutes
            and local.hour in self.hours
            and self.matches_day(local.date())
        )


def _value(token: str, field: int) -> int:
    names = _NAMES[field]
    if token.isdigit():
        value = int(token)
    elif names is not None and token in names:
        value = names[token]
    else:
        kind = {3: " or a month name (jan-dec)", 4: " or a day name (sun-sat)"}.get(field, "")
        raise CronError(f"{FIELD_NAMES[field]}: {token!r} is not a number{kind}")
    lo, hi = _BOUNDS[field]
    if not lo <= value <= hi:
        raise CronError(f"{FIELD_NAMES[field]}: {value} is out of range {lo}-{hi}")
    return value


def _parse_field(text: str, field: int) -> frozenset[int]:
    lo, hi = _BOUNDS[field]
    values: set[int] = set()
    for item in text.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise CronError(
                f"{FIELD_NAMES[field]}: {item!r} is not *, n, a-b, */s, a-b/s or a/s"
                if item else f"{FIELD_NAMES[field]}: empty list item in {text!r}"
            )
        star, first, last, step_text = match.groups()
        step = 1
        if step_text is not None:
            step = int(step_text)
            if not 1 <= step <= hi - lo + 1:
                raise CronError(f"{FIELD_NAMES[field]}: step {step} must be 1-{hi - lo + 1}")
        if star:
            start, end = lo, hi
        else:
            start = _value(first, field)
            if last is not None:
                end = _value(last, field)
                if end < start:
                    raise CronError(
                        f"{FIELD_NAMES[field]}: range {first}-{last} runs backwards; "
                        f"write {last}-{first} or a list"
                    )
            else:
                end = hi if step_text is not None else start
        values.update(range(start, end + 1, step))
    if field == 4 and 7 in values:  # 7 is Sunday too
        values.discard(7)
        values.add(0)
    return frozenset(values)


def parse(expression: str) -> Cron:
    """Parse a five-field cron expression; CronError says what is wrong."""
    if not isinstance(expression, str):
        raise CronError("a cron expression is a string such as '0 2 * * *'")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CronError(f"a cron expression is at most {MAX_EXPRESSION_LENGTH} characters")
    text = expression.strip().lower()
    text = _MACROS.get(text, text)
    if text.startswith("@"):
        raise CronError(f"unknown macro {expression.strip()!r}; known: {', '.join(_MACROS)}")
    fields = text.split()
    if len(fields) != 5:
        raise CronError(
            f"expected 5 fields (minute hour day-of-month month day-of-week), got "
            f"{len(fields)} in {expression!r}"
        )
    minutes, hours, days, months, weekdays = (_parse_field(f, i) for i, f in enumerate(fields))
    cron = Cron(
        expression=" ".join(fields),
        minutes=minutes,
        hours=hours,
        days=days,
        months=months,
        weekdays=weekdays,
        days_restricted=not fields[2].startswith("*"),
        weekdays_restricted=not fields[4].startswith("*"),
        times=tuple((h, m) for h in sorted(hours) for m in sorted(minutes)),
    )
    # With day-of-month alone deciding (day-of-week unrestricted or '*'-based),
    # some chosen month must have one of the chosen days: '0 0 30 2 *' never fires.
    if not (cron.days_restricted and cron.weekdays_restricted):
        if not any(d <= _MONTH_DAYS[m - 1] for m in months for d in days):
            raise CronError(f"{expression!r} never fires: no chosen month has the chosen days")
    return cron


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones())


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (e.g. Europe/Warsaw, UTC); TimezoneError if unknown."""
    if not isinstance(name, str) or name not in _known_zones():
        raise TimezoneError(
            f"{name!r} is not a known IANA time zone name (for example UTC, Europe/Warsaw, "
            "America/New_York)"
        )
    return ZoneInfo(name)


# ------------------------------------------------------------------- instants


def _instant(local: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant of a naive local time, with zoneinfo's fold=0 rule."""
    return local.replace(tzinfo=tz, fold=0).astimezone(UTC)


def _steady_offset(day: date, tz: ZoneInfo) -> timedelta | None:
    """The day's UTC offset when no transition touches it (the usual case)."""
    start = datetime.combine(day, time())
    offsets = {
        (start + timedelta(hours=h)).replace(tzinfo=tz, fold=fold).utcoffset()
        for h in (0, 6, 12, 18, 24)
        for fold in (0, 1)
    }
    return offsets.pop() if len(offsets) == 1 else None


def _day_instants(cron: Cron, day: date, tz: ZoneInfo) -> list[datetime]:
    """The UTC instants of a matching day's slots, ascending, duplicates kept."""
    offset = _steady_offset(day, tz)
    if offset is not None:
        base = datetime(day.year, day.month, day.day, tzinfo=UTC) - offset
        return [base + timedelta(hours=h, minutes=m) for h, m in cron.times]
    return sorted(
        _instant(datetime(day.year, day.month, day.day, h, m), tz) for h, m in cron.times
    )


def slots(cron: Cron, tz: ZoneInfo, after: datetime, until: datetime,
          catch_up: int) -> tuple[list[datetime], int]:
    """The slots in (after, until] (aware datetimes) to admit, oldest first, at
    most the newest `catch_up` of them, and how many older ones are skipped.
    Only the last MAX_WINDOW before `until` is looked at."""
    if catch_up < 1:
        raise ValueError("catch_up must be at least 1")
    if after.tzinfo is None or until.tzinfo is None:
        raise ValueError("after and until must be aware datetimes")
    start = max(after, until - MAX_WINDOW)
    if until <= start:
        return [], 0
    newest: list[datetime] = []
    skipped = 0
    seen: set[datetime] = set()
    # A day's slots can land up to a day away from its date (offsets reach
    # +-14 h, gaps shift forward), hence the margins; the window filter decides.
    day = until.astimezone(tz).date() + timedelta(days=1)
    first_day = start.astimezone(tz).date() - timedelta(days=1)
    per_day = len(cron.times)
    while day >= first_day:
        if cron.matches_day(day):
            offset = _steady_offset(day, tz) if len(newest) >= catch_up else None
            if offset is not None:
                day_start = datetime(day.year, day.month, day.day, tzinfo=UTC) - offset
                if start < day_start and day_start + timedelta(days=1) <= until:
                    # Wholly inside the window, no transition: count, don't build.
                    skipped += per_day
                    day -= timedelta(days=1)
                    continue
            for instant in reversed(_day_instants(cron, day, tz)):
                if not start < instant <= until or instant in seen:
                    continue
                seen.add(instant)
                if len(newest) < catch_up:
                    newest.append(instant)
                else:
                    skipped += 1
        day -= timedelta(days=1)
    newest.sort()
    return newest, skipped


def next_slot(cron: Cron, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The first slot after `after`, or None if none within NEXT_SLOT_HORIZON."""
    if after.tzinfo is None:
        raise ValueError("after must be an aware datetime")
    day = after.astimezone(tz).date() - timedelta(days=1)
    last_day = day + NEXT_SLOT_HORIZON
    found: datetime | None = None
    while day <= last_day:
        if cron.matches_day(day):
            later = [i for i in _day_instants(cron, day, tz) if i > after]
            if later and (found is None or later[0] < found):
                found = later[0]
        # A later day's slots all come after (its date, 00:00 UTC) - 14 h.
        if found is not None and found < datetime.combine(day, time(), tzinfo=UTC) - DAY:
            return found
        day += timedelta(days=1)
    return found


def slot_id(schedule_id: str, slot: datetime) -> str:
    """The execution ID a slot is admitted under: `{schedule}~{UTC minute}Z`.
    `~` is outside the client ID alphabet, so no client can admit a slot's ID
    first (and suppress the run); slots fired before this form kept `:`."""
    from app.registry import SYSTEM_ID_SEPARATOR

    return f"{schedule_id}{SYSTEM_ID_SEPARATOR}{slot.astimezone(UTC).strftime('%Y-%m-%dT%H:%MZ')}"
