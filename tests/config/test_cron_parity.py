"""The config's schedule checks accept exactly what Prefect's deployment schedule accepts.

Before 2026-12-06 `libra config validate` passed `LW` and `5L` (cronsim takes them, Prefect's
croniter does not) and refused Prefect's own `L5`; time zones such as `right/UTC` that `ZoneInfo`
opens but Prefect refuses passed too. Each failed only when `libra serve` registered the schedule.
Prefect is imported here (tests only) as the reference; core restates its rules."""

from __future__ import annotations

import itertools
import re

import pytest
from prefect.client.schemas.schedules import CronSchedule
from pydantic import ValidationError

from libra_core.config.cron import cron_problem, timezone_problem

DAYS = ("*", "1", "L", "LW", "lw", "1-5", "*/3", "1,L", "L,15", "LW,15", "15W", "31", "?", "1,?")
WEEKDAYS = (
    "*",
    "5",
    "5L",
    "fril",
    "FRI",
    "L5",
    "l5",
    "L0",
    "L7",
    "L",
    "5#2",
    "5#L",
    "MON-FRI",
    "L5,1",
    "1,5L",
    "?",
    "SAT-SUN",  # wraps around: Sat and Sun (refused until 2026-12-07)
    "5-1",
    "7-1",
)
MONTHS = ("*", "JAN", "1-12/2", "NOV-FEB")


def _prefect_accepts(cron: str | None = "0 2 * * *", timezone: str = "UTC") -> bool:
    try:
        CronSchedule(cron=cron, timezone=timezone)
    except (ValidationError, ValueError):
        return False
    return True


def test_the_config_accepts_a_cron_exactly_when_prefect_does() -> None:
    crons = [f"0 2 {d} {m} {w}" for d, w, m in itertools.product(DAYS, WEEKDAYS, MONTHS)]
    differ = [(c, cron_problem(c)) for c in crons if (cron_problem(c) is None) != _prefect_accepts(c)]
    # Prefect registers, and never schedules, the ones that never fire (the test below)
    assert [(c, p) for c, p in differ if not (p and " never fires: " in p)] == []
    assert 0 < sum(cron_problem(c) is None for c in crons) < len(crons)  # both answers occur


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 2 LW * *", r"'LW' \(the last weekday of the month\) in the day field is not supported"),
        ("0 2 * * 5L", r"takes 'L' only as 'L<day>' alone .* e.g. 'L5' for the last Friday\), got '5L'"),
    ],
)
def test_a_refused_cron_names_the_part_and_prefects_spelling(cron: str, message: str) -> None:
    problem = cron_problem(cron)
    assert problem is not None
    assert re.search(message, problem), problem


@pytest.mark.parametrize(
    "timezone",
    ["UTC", "Europe/Berlin", "localtime", "Factory", "EST5EDT", "posixrules", "right/UTC", "Mars/Base"],
)
def test_the_config_accepts_a_time_zone_exactly_when_prefect_does(timezone: str) -> None:
    assert (timezone_problem(timezone) is None) == _prefect_accepts(timezone=timezone)


def test_where_the_check_is_stricter_than_prefect() -> None:
    # Prefect registers these; a wrapping range with a step, and a date no month has (it would
    # never fire), are refused here instead.
    for cron in ("0 2 * * 5-1/2", "0 2 31 2 *"):
        assert _prefect_accepts(cron) and cron_problem(cron) is not None


def _prefect_finds_a_date(cron: str) -> bool:
    """Whether Prefect's server-side scheduler finds a next date (what its scheduler loop asks)."""
    import asyncio
    import datetime
    import inspect

    from prefect.server.schemas.schedules import CronSchedule as ServerCronSchedule

    start = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
    try:
        dates = ServerCronSchedule(cron=cron, timezone="UTC").get_dates(n=1, start=start)
        if inspect.isawaitable(dates):
            dates = asyncio.run(dates)
    except Exception:  # noqa: BLE001 - croniter's CroniterBadDateError, whatever Prefect wraps it in
        return False
    return bool(dates)


def test_every_cron_the_config_accepts_gets_a_date_from_prefects_scheduler() -> None:
    # Prefect registered `0 2 1 * L5` (day 1 and the last Friday: its croniter wants both on one
    # date) and `0 0 30 2 1` (30 Feb), and its scheduler failed on them every loop, making no run;
    # both passed `libra config validate` until 2026-12-07.
    crons = [f"0 2 {d} {m} {w}" for d, w, m in itertools.product(DAYS, WEEKDAYS, MONTHS)]
    crons += ["0 2 1 * L5", "0 0 30 2 1", "0 2 15 * 5#2", "0 2 31 4,6 1", "0 2 29 2 1", "0 2 L * L5"]
    registered = [c for c in crons if _prefect_accepts(c) and c != "0 2 31 2 *"]
    accepted = [c for c in registered if cron_problem(c) is None]
    assert [c for c in accepted if not _prefect_finds_a_date(c)] == []
    # ... and the only registered crons refused are those with no date, or stricter by design
    refused = [c for c in registered if cron_problem(c) is not None]
    assert [c for c in refused if _prefect_finds_a_date(c) and "/" not in c.split()[4]] == []
    assert {"0 2 1 * L5", "0 0 30 2 1", "0 2 15 * 5#2"} <= set(refused)
    assert {"0 2 29 2 1", "0 2 L * L5"} <= set(accepted)
    problem = cron_problem("0 2 1 * L5")
    assert problem is not None and "none in 28 years has both" in problem


@pytest.mark.parametrize(
    ("cron", "fires_on"),
    [
        ("0 2 * * SAT-SUN", {5, 6}),
        ("0 2 * * 5-1", {4, 5, 6, 0}),
        ("0 2 * * 7-1", {6, 0}),
        ("0 2 1 NOV-FEB *", None),
    ],
)
def test_a_wrapping_range_fires_where_prefect_fires(cron: str, fires_on: set[int] | None) -> None:
    # Prefect's server-side schedule is the reference; cronsim reads the range as two (`_unwrapped`).
    import asyncio
    import datetime
    import inspect

    from cronsim import CronSim
    from prefect.server.schemas.schedules import CronSchedule as ServerCronSchedule

    from libra_core.config.cron import _unwrapped

    assert cron_problem(cron) is None
    start = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)  # a Monday
    dates = ServerCronSchedule(cron=cron, timezone="UTC").get_dates(n=12, start=start)
    if inspect.isawaitable(dates):  # sync-compatible: a coroutine where an event loop may run
        dates = asyncio.run(dates)
    prefect = [d.replace(tzinfo=None) for d in dates]
    ours = CronSim(" ".join(_unwrapped(f, i) for i, f in enumerate(cron.split())), start.replace(tzinfo=None))
    assert [next(ours) for _ in prefect] == prefect
    if fires_on is not None:  # Python's weekday(): Monday 0 .. Sunday 6
        assert {d.weekday() for d in prefect} == fires_on
