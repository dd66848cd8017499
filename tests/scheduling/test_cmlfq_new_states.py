"""A tool-return state the tree first learns while a request is running.

At a request's tool return the tree is queried on its exact path (docs/scheduling.md). A state the
tree had not seen at that return has no code yet (-1); trajectories finishing during the same
rollout may teach it the state, and the request's later lookups must then walk the real path. Until
2026-12-07 the -1 stayed in the request's path, so every later lookup missed the exact-path nodes
and mixed only the Markov node and the shallower ancestors. Checked for the live scheduler and the
simulator's lazy one, which must decide alike.
"""

from __future__ import annotations

import pytest

from libra_core.config.models import SchedulerConfig
from libra_core.scheduling.base import FinishedTrajectory, Move, SchedRequest, ToolReturn, Turn
from libra_core.scheduling.cmlfq import CMLFQScheduler
from libra_core.sim.cmlfq import SimCMLFQScheduler

BOUND = 150  # two buckets: up to 150 tokens, and above
CFG = SchedulerConfig(type="cmlfq", buckets=(BOUND,), min_support=4, prompt_size_bins_per_octave=0)
PROMPT = 10


def _finish(s: CMLFQScheduler, rid: str, turns: tuple[Turn, ...]) -> None:
    s.admit(SchedRequest(rid, rid, PROMPT, 0))
    s.on_finish(FinishedTrajectory(rid, rid, PROMPT, 0, 0, turns))


@pytest.mark.parametrize("kind", [CMLFQScheduler, SimCMLFQScheduler])
def test_a_state_learnt_during_the_request_is_found_at_its_next_return(kind: type[CMLFQScheduler]) -> None:
    s = kind(CFG)
    s.on_policy_version(0)
    # Known before: a search that succeeds, a failed python call, then a short answer (5 tokens).
    for k in range(40):
        _finish(
            s,
            f"short{k}",
            (Turn(5, "search", 5, "success"), Turn(5, "python", 5, "failure"), Turn(5, None, 0, None)),
        )
    request = SchedRequest("A", "pA", PROMPT, 0)
    assert s.admit(request) == 0  # every finished one was short
    # A's search times out: a state the tree has not seen.
    assert s.on_tool_return(request, ToolReturn(0, 5, "search", 5, "timeout", PROMPT + 10)) is None
    assert s.counters.low_support == 1
    # Meanwhile 20 trajectories with that timeout finish, each with a 300-token answer after the
    # failed python call: on A's path the remaining length is 300, far past the bound.
    for k in range(20):
        _finish(
            s,
            f"long{k}",
            (Turn(5, "search", 5, "timeout"), Turn(5, "python", 5, "failure"), Turn(300, None, 0, None)),
        )
    # A's python call fails: its exact path (timeout, failure) holds only the 20 long ones, so the
    # mean, the tail and the best bucket all say the long bucket, and the move is cheap (a 5-token
    # payload against 300 tokens of decode). With the timeout kept as -1 the Markov node (40 short,
    # 20 long after a python failure) pulled the mean under the bound and A stayed.
    move = s.on_tool_return(request, ToolReturn(1, 5, "python", 5, "failure", PROMPT + 20))
    assert move == Move(1)
    assert (s.counters.moves, s.counters.disagree, s.counters.low_support) == (1, 0, 1)
    timeout = s.tree.code(s.tree.state_key("search", 5, "timeout"))
    assert timeout >= 0 and s._progress["A"].codes[0] == timeout and not s._progress["A"].unknown


@pytest.mark.parametrize("kind", [CMLFQScheduler, SimCMLFQScheduler])
def test_a_state_never_learnt_stays_unknown(kind: type[CMLFQScheduler]) -> None:
    s = kind(CFG)
    s.on_policy_version(0)
    for k in range(8):
        _finish(s, f"t{k}", (Turn(5, "search", 5, "success"), Turn(5, None, 0, None)))
    request = SchedRequest("B", "pB", PROMPT, 0)
    s.admit(request)
    s.on_tool_return(request, ToolReturn(0, 5, "calculator", 5, "success", PROMPT + 10))
    s.on_tool_return(request, ToolReturn(1, 5, "search", 5, "success", PROMPT + 25))
    progress = s._progress["B"]
    assert progress.codes[0] == -1 and progress.unknown == {0: s.tree.state_key("calculator", 5, "success")}
    assert progress.codes[1] == s.tree.code(s.tree.state_key("search", 5, "success")) >= 0
