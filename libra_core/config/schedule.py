"""The `schedule` section: when `libra serve` runs the experiment on its own. The cron and time-zone
checks are Prefect's rules restated (cron.py), so `libra config validate` refuses what Prefect would."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from libra_core.config.base import Frozen
from libra_core.config.cron import cron_problem, timezone_problem

# What `libra serve` does with the nightly runs that fell due while it was stopped (Airflow's
# `catchup`): flows/serve_schedule_refresh.py.
CatchUp = Literal["latest", "all", "none"]


class ScheduleConfig(Frozen):
    """When `libra serve` runs this experiment on its own (a Prefect deployment schedule)."""

    cron: str | None = Field(
        "0 2 * * *", description="Five-field cron expression for scheduled runs; null: no schedule."
    )
    timezone: str = Field("UTC", min_length=1, description="IANA time zone the cron is read in.")
    active: bool = Field(True, description="false registers the schedule paused (visible, not run).")
    catch_up: CatchUp = Field(
        "latest",
        description=(
            "Scheduled runs that fell due while `libra serve` was stopped, at its next start: 'latest' "
            "runs only the newest (the others are deleted), 'all' runs every one, one after another, "
            "'none' deletes them all (the next run is at the next cron time)."
        ),
    )

    # Field validators, so the error's location is `schedule.cron` once (a model validator's
    # message had to name the key, and the loader added the location: "schedule: schedule.cron").
    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, cron: str | None) -> str | None:
        problem = cron_problem(cron) if cron is not None else None
        if problem:
            raise ValueError(problem)
        return cron

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, timezone: str) -> str:
        problem = timezone_problem(timezone)
        if problem:
            raise ValueError(problem)
        return timezone
