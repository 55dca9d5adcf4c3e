"""app.cron: the five-field parser and matcher, slot computation, and the
daylight-saving rules (fold=0: a nonexistent local time fires once at the
shifted instant; a repeated one fires once, at its first occurrence)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from app import cron


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


# --------------------------------------------------------------------- parser


@pytest.mark.parametrize(
    ("expression", "field", "expected"),
    [
        ("* * * * *", "minutes", set(range(60))),
        ("*/15 * * * *", "minutes", {0, 15, 30, 45}),
        ("1,2,5-7 * * * *", "minutes", {1, 2, 5, 6, 7}),
        ("1-10/3 * * * *", "minutes", {1, 4, 7, 10}),
        ("5/20 * * * *", "minutes", {5, 25, 45}),
        ("0 9-17 * * *", "hours", set(range(9, 18))),
        ("0 0 1,15 * *", "days", {1, 15}),
        ("0 0 * jan,jul-sep *", "months", {1, 7, 8, 9}),
        ("0 0 * */3 *", "months", {1, 4, 7, 10}),
        ("0 0 * * MON-FRI", "weekdays", {1, 2, 3, 4, 5}),
        ("0 0 * * 7", "weekdays", {0}),
        ("0 0 * * 5-7", "weekdays", {5, 6, 0}),
        ("0 0 * * sun,sat", "weekdays", {0, 6}),
        ("  0   0  *  *  *  ", "hours", {0}),
    ],
)
def test_fields(expression, field, expected):
    assert getattr(cron.parse(expression), field) == frozenset(expected)


@pytest.mark.parametrize(
    ("macro", "same_as"),
    [("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"), ("@hourly", "0 * * * *"),
     ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"),
     ("@ANNUALLY", "0 0 1 1 *")],
)
def test_macros(macro, same_as):
    assert cron.parse(macro).expression == same_as


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "expected 5 fields"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * *", "got 6"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("* 24 * * *", "hour: 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month: 0 is out of range 1-31"),
        ("* * 32 * *", "day-of-month: 32"),
        ("* * * 13 *", "month: 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week: 8 is out of range 0-7"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "step 0"),
        ("*/61 * * * *", "step 61"),
        ("1,,2 * * * *", "empty list item"),
        ("1, * * * *", "empty list item"),
        ("a * * * *", "minute: 'a' is not a number"),
        ("* * * foo *", "month name"),
        ("* * * * funday", "day name"),
        ("* * * mon *", "month: 'mon'"),
        ("-1 * * * *", "minute"),
        ("*-5 * * * *", "minute"),
        ("1.5 * * * *", "minute"),
        ("@reboot", "unknown macro"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0\x00 0 * * *", "minute"),
        ("0 0 * * *" + " " * 300, "at most 200"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expression, message):
    with pytest.raises(cron.CronError) as info:
        cron.parse(expression)
    assert message in str(info.value)


def test_not_a_string():
    with pytest.raises(cron.CronError):
        cron.parse(5)  # type: ignore[arg-type]


def test_feb_29_and_dow_or_dom_are_not_never():
    cron.parse("0 0 29 2 *")  # leap years
    cron.parse("0 0 30 2 mon")  # both restricted: every Monday of February


# -------------------------------------------------------------------- matcher


def test_day_of_month_or_day_of_week_when_both_are_restricted():
    c = cron.parse("0 0 13 * fri")
    assert c.matches(datetime(2026, 2, 13))  # a Friday the 13th
    assert c.matches(datetime(2026, 1, 13))  # Tuesday the 13th: day-of-month matches
    assert c.matches(datetime(2026, 1, 2))  # Friday the 2nd: day-of-week matches
    assert not c.matches(datetime(2026, 1, 3))


def test_day_of_month_and_day_of_week_when_one_is_a_star():
    c = cron.parse("0 0 */2 * fri")  # '*/2' counts as '*' (Vixie cron): both must match
    assert c.matches(datetime(2026, 1, 9))  # Friday, odd day
    assert not c.matches(datetime(2026, 1, 2 + 14))  # Friday the 16th: even day
    assert not c.matches(datetime(2026, 1, 11))  # odd day, Sunday
    only_dow = cron.parse("0 0 * * 0")
    assert only_dow.matches(datetime(2026, 1, 4)) and not only_dow.matches(datetime(2026, 1, 5))


def test_matches_minute_hour_month():
    c = cron.parse("30 2 * 3 *")
    assert c.matches(datetime(2026, 3, 1, 2, 30))
    assert not c.matches(datetime(2026, 3, 1, 2, 31))
    assert not c.matches(datetime(2026, 3, 1, 3, 30))
    assert not c.matches(datetime(2026, 4, 1, 2, 30))


# ---------------------------------------------------------------- time zones


@pytest.mark.parametrize("name", ["", "Mars/Olympus", "../etc/passwd", "/etc/localtime",
                                  "Europe", "europe/warsaw", "UTC\x00", None, 5])
def test_unknown_time_zones(name):
    with pytest.raises(cron.TimezoneError) as info:
        cron.zone(name)
    assert "IANA time zone" in str(info.value)


def test_known_time_zones():
    assert str(cron.zone("Europe/Warsaw")) == "Europe/Warsaw"
    assert str(cron.zone("UTC")) == "UTC"


# ---------------------------------------------------------------------- slots


def test_window_is_after_exclusive_until_inclusive():
    c, tz = cron.parse("0 * * * *"), cron.zone("UTC")
    admit, skipped = cron.slots(c, tz, utc(2026, 1, 1, 0), utc(2026, 1, 1, 3), 10)
    assert admit == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2), utc(2026, 1, 1, 3)]
    assert skipped == 0
    assert cron.slots(c, tz, utc(2026, 1, 1, 3), utc(2026, 1, 1, 3), 10) == ([], 0)
    assert cron.slots(c, tz, utc(2026, 1, 1, 4), utc(2026, 1, 1, 3), 10) == ([], 0)


def test_catch_up_admits_the_newest_and_counts_the_rest():
    c, tz = cron.parse("*/5 * * * *"), cron.zone("UTC")
    after = utc(2026, 1, 1, 0, 0)
    admit, skipped = cron.slots(c, tz, after, after + timedelta(minutes=50), 1)
    assert admit == [after + timedelta(minutes=50)] and skipped == 9
    admit, skipped = cron.slots(c, tz, after, after + timedelta(minutes=50), 3)
    assert admit == [after + timedelta(minutes=m) for m in (40, 45, 50)] and skipped == 7
    with pytest.raises(ValueError):
        cron.slots(c, tz, after, after, 0)


def test_long_downtime_is_bounded_and_counted_exactly():
    c, tz = cron.parse("* * * * *"), cron.zone("UTC")
    until = utc(2026, 6, 1)
    admit, skipped = cron.slots(c, tz, utc(2026, 1, 1), until, 2)
    minutes = int((until - utc(2026, 1, 1)).total_seconds() // 60)
    assert admit == [until - timedelta(minutes=1), until] and skipped == minutes - 2
    # Years of downtime: only the last MAX_WINDOW is looked at.
    admit, skipped = cron.slots(c, tz, utc(2000, 1, 1), until, 1)
    assert admit == [until] and skipped == cron.MAX_WINDOW // timedelta(minutes=1) - 1


def test_counting_across_dst_is_exact():
    """A year of every minute in Warsaw: one spring-forward day has 60 fewer
    distinct instants, the fall-back day's repeated hour fires once."""
    c, tz = cron.parse("* * * * *"), cron.zone("Europe/Warsaw")
    after, until = utc(2025, 6, 1), utc(2026, 6, 1)
    admit, skipped = cron.slots(c, tz, after, until, 1)
    real_minutes = int((until - after).total_seconds() // 60)
    assert len(admit) + skipped == real_minutes - 60


def test_aware_datetimes_required():
    c, tz = cron.parse("* * * * *"), cron.zone("UTC")
    with pytest.raises(ValueError):
        cron.slots(c, tz, datetime(2026, 1, 1), utc(2026, 1, 2), 1)


def test_slot_id():
    slot = datetime(2026, 3, 29, 3, 30, tzinfo=cron.zone("Europe/Warsaw"))
    assert cron.slot_id("nightly", slot) == "nightly~2026-03-29T01:30Z"


def test_next_slot():
    c, tz = cron.parse("30 2 * * *"), cron.zone("Europe/Warsaw")
    assert cron.next_slot(c, tz, utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 1, 30)
    assert cron.next_slot(c, tz, utc(2026, 3, 29, 1, 30)) == utc(2026, 3, 30, 0, 30)
    leap = cron.parse("0 0 29 2 *")
    assert cron.next_slot(leap, cron.zone("UTC"), utc(2026, 3, 1)) == utc(2028, 2, 29)


# ------------------------------------------------------------------------ DST


WARSAW = cron.zone("Europe/Warsaw")


def test_daily_0230_across_spring_forward_fires_once_at_0130_utc():
    """29 March 2026: Warsaw jumps from 02:00 CET to 03:00 CEST; 02:30 does not
    exist. fold=0 reads it with the old offset: 01:30 UTC (03:30 local)."""
    c = cron.parse("30 2 * * *")
    # The whole local day: 00:00 CET (23:00 UTC the day before) to 24:00 CEST.
    admit, skipped = cron.slots(c, WARSAW, utc(2026, 3, 28, 23), utc(2026, 3, 29, 22), 100)
    assert admit == [utc(2026, 3, 29, 1, 30)] and skipped == 0
    assert admit[0].astimezone(WARSAW).strftime("%H:%M %Z") == "03:30 CEST"
    # Three days around it: one slot a day, the offset changing under them.
    admit, _ = cron.slots(c, WARSAW, utc(2026, 3, 27, 12), utc(2026, 3, 30, 12), 100)
    assert admit == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 30), utc(2026, 3, 30, 0, 30)]
    assert [cron.slot_id("n", s) for s in admit] == [
        "n~2026-03-28T01:30Z", "n~2026-03-29T01:30Z", "n~2026-03-30T00:30Z"]


def test_daily_0230_across_fall_back_fires_once_at_the_first_occurrence():
    """25 October 2026: Warsaw goes from 03:00 CEST back to 02:00 CET; 02:30
    happens twice (00:30 and 01:30 UTC). It fires once, at 00:30 UTC."""
    c = cron.parse("30 2 * * *")
    admit, skipped = cron.slots(c, WARSAW, utc(2026, 10, 24, 22), utc(2026, 10, 25, 23), 100)
    assert admit == [utc(2026, 10, 25, 0, 30)] and skipped == 0
    admit, _ = cron.slots(c, WARSAW, utc(2026, 10, 23, 12), utc(2026, 10, 26, 12), 100)
    assert admit == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_hourly_across_fall_back_gives_24_distinct_slots_for_the_25_hour_day():
    c = cron.parse("0 * * * *")
    # Local 25 October 00:00 CEST (22:00 UTC) exclusive to 26 October 00:00 CET (23:00 UTC).
    admit, skipped = cron.slots(c, WARSAW, utc(2026, 10, 24, 22), utc(2026, 10, 25, 23), 1000)
    assert skipped == 0
    assert len(admit) == len(set(admit)) == 24
    hours = [s.hour for s in admit]
    assert hours == [23, 0] + list(range(2, 24))  # 01:00 UTC (the second 02:00) does not fire
    local = [s.astimezone(WARSAW).strftime("%H") for s in admit]
    assert local == [f"{h:02d}" for h in range(1, 24)] + ["00"]


def test_hourly_across_spring_forward_gives_23_distinct_slots():
    c = cron.parse("0 * * * *")
    admit, _ = cron.slots(c, WARSAW, utc(2026, 3, 28, 23), utc(2026, 3, 29, 22), 1000)
    # 02:00 does not exist: it is read as 01:00 UTC, the same instant as 03:00 CEST.
    assert len(admit) == len(set(admit)) == 23
    assert utc(2026, 3, 29, 1) in admit


def test_every_15_minutes_through_the_gap_fires_each_instant_once():
    c = cron.parse("*/15 * * * *")
    admit, _ = cron.slots(c, WARSAW, utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 2, 0), 1000)
    # 01:45 CET, then (02:00-02:45 CET = 03:00-03:45 CEST), then 04:00 CEST.
    assert admit == [utc(2026, 3, 29, 0, 45), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 15),
                     utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 1, 45), utc(2026, 3, 29, 2, 0)]


def test_new_york_gap_at_0230():
    ny = cron.zone("America/New_York")
    admit, _ = cron.slots(cron.parse("30 2 * * *"), ny, utc(2026, 3, 8, 5), utc(2026, 3, 9, 4), 10)
    assert admit == [utc(2026, 3, 8, 7, 30)]  # 02:30 EST = 03:30 EDT


@pytest.mark.parametrize("zone_name", ["Europe/Warsaw", "America/New_York", "Australia/Sydney",
                                       "America/Havana", "Australia/Lord_Howe", "Asia/Kolkata",
                                       "America/Santiago", "UTC"])
@pytest.mark.parametrize("expression", ["30 2 * * *", "0 0 * * *", "45 23 * * *", "0 1 * * *"])
def test_a_daily_schedule_fires_once_every_local_day_of_a_year(zone_name, expression):
    """Whatever the zone's transitions (Havana and Santiago change at
    midnight, Lord Howe by 30 minutes), a daily schedule fires exactly once on
    every local date."""
    tz = cron.zone(zone_name)
    after = datetime(2026, 1, 1, tzinfo=tz) - timedelta(minutes=1)
    until = datetime(2027, 1, 1, tzinfo=tz) - timedelta(minutes=1)
    admit, skipped = cron.slots(cron.parse(expression), tz, after, until, 1000)
    assert skipped == 0 and len(admit) == len(set(admit)) == 365
    days = {s.astimezone(tz).date() for s in admit}
    assert days == {date(2026, 1, 1) + timedelta(days=i) for i in range(365)}
