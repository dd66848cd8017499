"""Trace-evaluator metrics on a hand-computed 3-trajectory trace, and the replay protocol."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, Turn
from libra_core.scheduling.registry import build_scheduler
from libra_core.traces.evaluate import SchedulerContractError, parse_buckets, replay, run_trace_eval
from libra_core.traces.report import format_plain, format_rich
from libra_core.traces.schema import TraceTrajectory, trace_table, write_trace

BOUNDS = (10, 20)  # three buckets: <=10, <=20, >20

# A: size 4 + 3+2 + 2 = 11 -> bucket 1.  B: size 5 + 4+6 + 5+3 + 2 = 25 -> bucket 2.  C: 2 + 3 = 5 -> 0.
TRACE = [
    TraceTrajectory("A", "pa", 0, 4, (Turn(3, "calc", 2, "success"), Turn(2, None, 0, None))),
    TraceTrajectory(
        "B",
        "pb",
        0,
        5,
        (Turn(4, "calc", 6, "failure"), Turn(5, "calc", 3, "success"), Turn(2, None, 0, None)),
    ),
    TraceTrajectory("C", "pc", 0, 2, (Turn(3, None, 0, None),)),
]


class Scripted:
    """Admits everything to bucket 0; moves B to bucket 2 at its first tool return."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def admit(self, request: SchedRequest) -> int:
        self.calls.append(f"admit {request.request_id}")
        return 0

    def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
        self.calls.append(f"tool {request.request_id} {ret.turn_index} ctx={ret.context_tokens}")
        return Move(2) if (request.request_id, ret.turn_index) == ("B", 0) else None

    def on_finish(self, trajectory: FinishedTrajectory) -> None:
        self.calls.append(f"finish {trajectory.request_id}")

    def on_policy_version(self, version: int) -> None:
        self.calls.append(f"version {version}")


def test_metrics_match_hand_computation() -> None:
    m = replay(TRACE, Scripted(), BOUNDS, name="scripted")
    # routing (bucket after the decision vs bucket of the realised remaining tokens):
    #   A admit: remaining 3+2+2 = 7 -> 0, chose 0: right.   A after turn 0: remaining 2 -> 0, in 0: right.
    #   B admit: remaining 4+6+5+3+2 = 20 -> 1, chose 0: wrong.
    #   B after turn 0: remaining 5+3+2 = 10 -> 0, moved to 2: wrong.  B after turn 1: 2 -> 0, in 2: wrong.
    #   C admit: remaining 3 -> 0, chose 0: right.                         => 3 / 6 = 0.5
    assert m.decisions == 6 and m.routing_accuracy == pytest.approx(3 / 6)
    # class accuracy: generated tokens 5 (A) + 11 (B) + 3 (C) = 19. A (bucket 1) decodes all 5 in
    # bucket 0: 0 right. B (bucket 2): turn 0 (4) in bucket 0 wrong, turns 1-2 (5 + 2) in bucket 2
    # right: 7. C (bucket 0): 3 right.                                   => 10 / 19
    assert m.class_accuracy == pytest.approx(10 / 19)
    # migration: one move, of B after turn 0, re-prefills its context before the payload that just
    # returned, prompt 5 + generated 4 = 9 tokens (the payload's 6 are prefilled wherever the next
    # turn runs); all tokens processed are the sizes 11 + 25 + 5 = 41.     => 9 / 41
    assert m.moves == 1 and m.migration_token_ratio == pytest.approx(9 / 41)
    assert m.score == pytest.approx(10 / 19 - 9 / 41)


def test_a_return_that_ends_the_trajectory_asks_nothing() -> None:
    # D hit max_turns on a tool return; the export closes it with a 0-token turn. No generation runs
    # after that return, so (as in the agent loop) the scheduler is not asked and mlfq, which demotes
    # everything past a bound, counts no move there: before, D's context was charged as migrated.
    d = TraceTrajectory("D", "pd", 0, 8, (Turn(5, "calc", 4, "success"), Turn(0, None, 0, None)))
    scripted = Scripted()
    m = replay([d], scripted, BOUNDS, name="scripted")
    assert [c for c in scripted.calls if c.startswith("tool")] == []
    assert m.decisions == 1  # the admission
    mlfq = replay([d], build_scheduler(SchedulerConfig(type="mlfq", buckets=BOUNDS)), BOUNDS, name="mlfq")
    assert (mlfq.moves, mlfq.migration_token_ratio) == (0, 0.0)


def test_oracle_is_perfect_on_class_accuracy() -> None:
    oracle = build_scheduler(SchedulerConfig(type="oracle", buckets=BOUNDS), allow_oracle=True)
    m = replay(TRACE, oracle, BOUNDS, name="oracle")
    assert (m.class_accuracy, m.migration_token_ratio, m.score) == (1.0, 0.0, 1.0)
    # The oracle places by final size (A: 1, B: 2, C: 0) and never moves; of the remaining-token
    # buckets (A: 0, 0; B: 1, 0, 0; C: 0) only C's admission matches: 1 / 6.
    assert m.routing_accuracy == pytest.approx(1 / 6)


def test_replay_order_learns_only_from_earlier_iterations() -> None:
    trace = [replace(t, iteration=1 if t.trajectory_id == "C" else 0) for t in TRACE]
    s = Scripted()
    replay(trace, s, BOUNDS)
    assert s.calls == [
        "version 0",
        "admit A",
        "admit B",
        "tool A 0 ctx=9",
        "tool B 0 ctx=15",
        "tool B 1 ctx=23",
        "finish A",
        "finish B",
        "version 1",
        "admit C",
        "finish C",
    ]


def test_contract_violations_are_reported() -> None:
    class Bad(Scripted):
        def admit(self, request: SchedRequest) -> int:
            return 3

    with pytest.raises(SchedulerContractError, match="bucket 3"):
        replay(TRACE, Bad(), BOUNDS, name="bad")

    class SelfMove(Scripted):
        def on_tool_return(self, request: SchedRequest, ret: ToolReturn) -> Move | None:
            return Move(0)

    with pytest.raises(SchedulerContractError, match="its own bucket"):
        replay(TRACE, SelfMove(), BOUNDS, name="self")


def test_parse_buckets() -> None:
    assert parse_buckets("2000,8000") == (2000, 8000)
    for bad in ("", "8000,2000", "a,b", "0,5"):
        with pytest.raises(ValueError, match="--buckets"):
            parse_buckets(bad)


def test_run_trace_eval_all_and_tables(tmp_path: Path) -> None:
    path = write_trace(trace_table(TRACE), tmp_path / "t.parquet")
    records = run_trace_eval(path, "all", BOUNDS)
    assert [r["scheduler"] for r in records][-1] == "oracle"
    assert {"scheduler", "routing_accuracy", "class_accuracy", "migration_token_ratio", "score"} <= set(
        records[0]
    )
    text = format_plain(records)
    assert text.count("\n") == len(records) + 1 and "| oracle | 0.167 | 1.000 | 0.000 | 1.000 | 0 |" in text
    assert format_rich(records).row_count == len(records)
    with pytest.raises(ValueError, match="unknown scheduler 'nope'"):
        run_trace_eval(path, "nope", BOUNDS)


def test_the_replay_clock_is_the_recorded_policy_version() -> None:
    """A live run's scheduler ages its statistics by policy version, one per optimizer step (four
    per iteration at `minibatches: 4`); the replay counted iterations, so C-MLFQ's statistics aged
    four times slower than in the run the trace came from."""
    finished: list[tuple[str, int, int]] = []

    class Recording(Scripted):
        def on_finish(self, trajectory: FinishedTrajectory) -> None:
            finished.append((trajectory.request_id, trajectory.iteration, trajectory.policy_version))

    trace = [
        replace(TRACE[0], iteration=0, policy_version=0),
        replace(TRACE[1], iteration=1, policy_version=5),  # an async row, a version behind C's
        replace(TRACE[2], iteration=1, policy_version=6),
    ]
    scripted = Recording()
    replay(trace, scripted, BOUNDS, name="scripted")
    assert [c for c in scripted.calls if c.startswith("version")] == ["version 0", "version 5"]
    assert finished == [("A", 0, 0), ("B", 1, 5), ("C", 1, 6)]
    # a trace that records no version (synthetic, or written before the field) counts iterations
    untimed = Scripted()
    replay([replace(t, iteration=i) for i, t in enumerate(TRACE)], untimed, BOUNDS, name="scripted")
    assert [c for c in untimed.calls if c.startswith("version")] == ["version 0", "version 1", "version 2"]


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ((0, None, 3), "policy_version is null on trajectory 'B' and set on others"),
        (
            (4, 2, 2),
            "policy_version goes back from iteration 0 \\(version 4\\) to iteration 1 \\(version 2\\)",
        ),
        ((0, 1, -1), "policy_version is -1, must be >= 0"),
    ],
)
def test_a_trace_with_inconsistent_policy_versions_is_refused(
    versions: tuple[int | None, ...], message: str
) -> None:
    from libra_core.traces.schema import TraceSchemaError

    iterations = (0, 1, 1)
    rows = zip(TRACE, iterations, versions, strict=True)
    trace = [replace(t, iteration=i, policy_version=v) for t, i, v in rows]
    with pytest.raises(TraceSchemaError, match=message):
        trace_table(trace)
