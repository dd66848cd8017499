"""The schedule's cron and time-zone checks, as strict as Prefect's deployment schedule.

`libra config validate` (and every load) runs them, so a nightly schedule that Prefect would refuse
fails there, not only when `libra serve` registers it. Core must not import Prefect, so the rules
Prefect applies beyond `cronsim` are restated here (checked against Prefect 3.7's vendored croniter
by tests/config/test_cron_parity.py, which does import it):
- day of month: `LW` (the last weekday of the month) is refused by Prefect; cronsim takes it;
- day of week: Prefect writes "the last Friday of the month" `L5`; cronsim writes it `5L` and
  refuses `L5`. The field is accepted in Prefect's form (and checked with cronsim in its own);
  any other use of `L` there is refused;
- `?` (no specific value, Quartz's spelling) as the whole day or weekday field means `*` to
  Prefect; cronsim refuses it;
- a range that wraps around (`SAT-SUN`, `5-1`, `NOV-FEB`: Prefect fires on Sat and Sun) is
  spelt as two for cronsim, which refuses it (until 2026-12-07 a weekend-only schedule could not be
  configured); one with a step (`5-1/2`) is still refused;
- a day of the month that falls on no last or nth weekday it is paired with (`1 * L5`: Prefect's
  croniter wants both on one date), or that no listed month has, paired with a weekday
  (`30 2 1`): Prefect registers them and its scheduler never finds a date;
- time zone: one of `zoneinfo.available_timezones()`, which is Prefect's list; `ZoneInfo()` alone
  also opens files such as `posixrules` or `right/UTC` that Prefect refuses.
"""

from __future__ import annotations

import datetime
import functools
import re
import zoneinfo

_PREFECT_LAST_WEEKDAY = re.compile(r"L([0-7])")


def cron_problem(cron: str) -> str | None:
    """Why Prefect's scheduler would refuse `cron` (a five-field expression), or None."""
    from cronsim import CronSim, CronSimError

    fields = cron.split()
    if len(fields) != 5:
        return f"must have 5 fields (minute hour day month weekday), got {cron!r}"
    day, weekday = fields[2].upper(), fields[4].upper()
    if "LW" in day:
        return (
            f"{cron!r}: 'LW' (the last weekday of the month) in the day field is not supported by "
            "Prefect's scheduler"
        )
    last = _PREFECT_LAST_WEEKDAY.fullmatch(weekday)
    if "L" in weekday and last is None:
        return (
            f"{cron!r}: in the weekday field Prefect's scheduler takes 'L' only as 'L<day>' alone "
            "(the last such weekday of the month, e.g. 'L5' for the last Friday), got "
            f"{fields[4]!r}"
        )
    if last is not None:  # cronsim's spelling of the same thing
        fields[4] = f"{last.group(1)}L"
    for i in (2, 4):
        if fields[i] == "?":
            fields[i] = "*"
    fields = [_unwrapped(field, i) for i, field in enumerate(fields)]
    try:
        CronSim(" ".join(fields), datetime.datetime(2026, 1, 1))
    except CronSimError as err:
        if _never_fires(fields):
            return f"{cron!r} never fires: no month in the month field ({fields[3]!r}) has day {fields[2]!r}"
        return f"{cron!r} is not a valid cron expression: {err}"
    if fields[2] != "*" and fields[4] != "*":
        return _unschedulable_day_and_weekday(cron, fields)
    return None


def _unschedulable_day_and_weekday(cron: str, fields: list[str]) -> str | None:
    """A day of the month and a weekday together: Prefect registers these, but its scheduler finds
    no date (CroniterBadDateError on every loop, no run ever) when the day is in no listed month
    (`0 2 30 2 1`), or when the weekday is a last or nth one (`L5`, `5#2`), which its croniter
    requires on the same date as the day (`0 2 1 * L5`: day 1 is never a month's last Friday).
    Passed `libra config validate` until 2026-12-07."""
    from cronsim import CronSim, CronSimError

    day_alone = [*fields[:4], "*"]
    try:
        dates = CronSim(" ".join(day_alone), datetime.datetime(2026, 1, 1))
    except CronSimError:
        if _never_fires(day_alone):
            return (
                f"{cron!r} never fires: no month in the month field ({fields[3]!r}) has day "
                f"{fields[2]!r}, and Prefect's scheduler then finds no date for the weekday either"
            )
        return None  # cronsim judged the whole expression valid; leave it to it
    nth = re.fullmatch(r"([0-7])#([1-5])", fields[4])
    last = re.fullmatch(r"([0-7])L", fields[4])
    if nth is None and last is None:
        return None
    weekday = int((nth or last).group(1)) % 7  # type: ignore[union-attr]
    horizon = datetime.datetime(2026 + 28, 1, 1)  # weekdays and dates realign every 28 years
    for date in dates:
        if date >= horizon:
            break
        if (date.weekday() + 1) % 7 != weekday:
            continue
        if nth is not None and (date.day - 1) // 7 + 1 == int(nth.group(2)):
            return None
        if last is not None and (date + datetime.timedelta(days=7)).month != date.month:
            return None
    return (
        f"{cron!r} never fires: Prefect's scheduler needs the day of the month ({fields[2]!r}) and "
        f"the weekday ({cron.split()[4]!r}) on the same date, and none in 28 years has both"
    )


def _never_fires(fields: list[str]) -> bool:
    """Whether cronsim refused only because no listed month has the listed days (`0 2 31 2 *`):
    the same expression over every month parses. It says "Bad day-of-month" for both this and a
    day that is not a day (`32`), so the message could not tell them apart."""
    from cronsim import CronSim, CronSimError

    if fields[3] == "*":
        return False
    start = datetime.datetime(2026, 1, 1)
    try:
        CronSim(f"0 0 * {fields[3]} *", start)  # the month field alone is valid (not `13`)...
        CronSim(" ".join([*fields[:3], "*", fields[4]]), start)  # ... and so is the rest over every month
    except CronSimError:
        return False
    return True


_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))  # minute hour day month weekday
_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {
        m: i + 1
        for i, m in enumerate(
            ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
        )
    },
    {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])},
)
_RANGE = re.compile(r"([0-9A-Za-z]+)-([0-9A-Za-z]+)")


def _unwrapped(field: str, index: int) -> str:
    """`field` with each wrap-around range `a-b` (a > b, no step) as `a-max,min-b`, the way
    Prefect's croniter reads it; anything else as it was (cronsim judges it)."""
    lo, hi = _BOUNDS[index]
    names = _NAMES[index]

    def value(text: str) -> int | None:
        v = names.get(text.upper()) if not text.isdigit() else int(text)
        return 0 if index == 4 and v == 7 else v  # weekday 7 is Sunday

    parts = []
    for part in field.split(","):
        match = _RANGE.fullmatch(part)
        a, b = (value(match.group(1)), value(match.group(2))) if match else (None, None)
        if a is None or b is None or not (lo <= min(a, b) and max(a, b) <= hi):
            parts.append(part)
        elif a > b:
            parts += [f"{a}-{hi}", f"{lo}-{b}"]
        else:  # in order once weekday 7 reads as 0 (`7-1`: Sunday and Monday)
            parts.append(f"{a}-{b}" if index == 4 else part)
    return ",".join(parts)


@functools.cache
def _timezones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())  # ~4 ms: it walks the tz database


def timezone_problem(timezone: str) -> str | None:
    """Why Prefect would refuse `timezone`, or None."""
    if timezone not in _timezones():
        return f"{timezone!r} is not a known IANA time zone (e.g. UTC, Europe/Berlin, America/New_York)"
    return None
