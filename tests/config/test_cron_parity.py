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
)
MONTHS = ("*", "JAN", "1-12/2")


def _prefect_accepts(cron: str | None = "0 2 * * *", timezone: str = "UTC") -> bool:
    try:
        CronSchedule(cron=cron, timezone=timezone)
    except (ValidationError, ValueError):
        return False
    return True


def test_the_config_accepts_a_cron_exactly_when_prefect_does() -> None:
    crons = [f"0 2 {d} {m} {w}" for d, w, m in itertools.product(DAYS, WEEKDAYS, MONTHS)]
    differ = [(c, cron_problem(c)) for c in crons if (cron_problem(c) is None) != _prefect_accepts(c)]
    assert differ == []
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
