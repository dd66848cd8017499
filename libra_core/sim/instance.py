"""A simulated vLLM rollout instance: continuous batching, KV capacity, chunked prefill.

Times come from the planner's cost model (`RolloutCostModel.decode_step_s`, `prefill_s_per_token`,
`kv_capacity_tokens`), tabulated once per TP degree over batch size x context (`CostTables`), so an
event costs a table look-up instead of a roofline evaluation.

Decode is aggregated: all running sequences advance together by one token per decode step, so the
instance keeps a step clock `clock` and each sequence the clock value at which its turn ends; the
next event is the smallest target, at `(target - clock) x ITL(batch, mean context)` seconds. The ITL
is held fixed between two events of the instance (the context grows within a turn; the mean context is
re-read at each event). Prefill of a joining turn stalls the whole batch for `tokens x prefill
s/token` (chunked prefill shares the step budget with decode), modelled as a stall that decode resumes
after. KV: a turn is admitted only if its final context fits beside the others' reserved contexts.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libra_core.planner.rollout_cost import RolloutCostModel

_CTX_GRID = np.geomspace(16, 262_144, 57)
# ... extended at the same log spacing to the largest context a trajectory can hold (int32 tokens,
# traces.schema.MAX_TRAJECTORY_TOKENS). The grid ended at 262,144 and a longer context was priced
# as that one (qwen3-8b at TP8 on H100, batch 1: a 1M-token decode step at 7.3 ms, the cost model's
# 11.7 ms; tests/sim/test_sim_input_bounds.py), though configs and traces allow it.
_LOG_STEP = math.log(_CTX_GRID[1]) - math.log(_CTX_GRID[0])
_MORE_POINTS = math.ceil(math.log((2**31 - 1) / _CTX_GRID[-1]) / _LOG_STEP)
_CTX_GRID = np.concatenate([_CTX_GRID, _CTX_GRID[-1] * np.exp(_LOG_STEP * np.arange(1, _MORE_POINTS + 1))])
_DONE_TOLERANCE = 1e-6  # decode steps: a turn this close to its end has ended (float rounding)


class CostTables:
    """Decode ITL[tp][batch, ctx] and prefill s/token[tp][ctx] from the planner's cost model."""

    def __init__(self, cost: RolloutCostModel, tps: tuple[int, ...]) -> None:
        self.cost = cost
        self.max_num_seqs = cost.max_num_seqs
        batch = np.arange(1, cost.max_num_seqs + 1, dtype=float)
        self._itl = {tp: cost.decode_step_s(tp, batch[:, None], _CTX_GRID[None, :]).tolist() for tp in tps}
        self._pre = {tp: cost.prefill_s_per_token(tp, _CTX_GRID).tolist() for tp in tps}
        self.kv_capacity = {tp: float(cost.kv_capacity_tokens(tp)) for tp in tps}
        self._log0 = math.log(_CTX_GRID[0])
        self._dlog = math.log(_CTX_GRID[1]) - self._log0
        self._n = len(_CTX_GRID)

    def itl_s(self, tp: int, batch: int, ctx: float) -> float:
        row = self._itl[tp][min(max(batch, 1), self.max_num_seqs) - 1]
        x = (math.log(max(ctx, 16.0)) - self._log0) / self._dlog  # position on the context grid
        i = min(int(x), self._n - 2)
        return row[i] + (row[i + 1] - row[i]) * min(1.0, x - i)

    def prefill_s(self, tp: int, tokens: float, ctx: float) -> float:
        if tokens <= 0:
            return 0.0
        row = self._pre[tp]
        x = (math.log(max(ctx, 16.0)) - self._log0) / self._dlog  # position on the context grid
        i = min(int(x), self._n - 2)
        return tokens * (row[i] + (row[i + 1] - row[i]) * min(1.0, x - i))


@dataclass(eq=False)
class Instance:
    """One rollout instance of TP degree `tp` serving bucket `bucket`.

    Every method runs a few times per simulated turn, so the cost-table interpolation
    (`CostTables.itl_s`, `prefill_s`) is inlined against the rows of this instance's TP degree,
    with the same float operations in the same order."""

    instance_id: int
    tp: int
    bucket: int
    tables: CostTables
    kv_capacity: float
    clock: float = 0.0  # decode steps done
    last_s: float = 0.0  # time the clock was last advanced to
    stall_until_s: float = 0.0  # prefill in progress until then
    ctx_sum: float = 0.0  # sum of the running sequences' contexts at `clock`
    reserved: float = 0.0  # sum of the running turns' final contexts (KV reservation)
    version: int = 0  # bumps whenever the next event moves (stale events are dropped)
    busy_s: float = 0.0
    # False while lent to training and once retired (a training hybrid back to training): the
    # router then never picks it, nor keeps a turn on it for its prefix (elastic pool).
    active: bool = True
    loans: int = 0  # times lent to training; a loan's HYBRID_READY carries its number
    # (clock at which the turn ends, join order, item, the turn's final context) per running turn.
    heap: list[tuple[float, int, Any, float]] = field(default_factory=list)
    _seq: int = 0
    _itl_rows: list[list[float]] = field(init=False, repr=False)
    _pre_row: list[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._itl_rows = self.tables._itl[self.tp]
        self._pre_row = self.tables._pre[self.tp]

    @property
    def batch(self) -> int:
        return len(self.heap)

    def fits(self, final_ctx: float) -> bool:
        heap = self.heap
        if not heap:
            return True  # an empty instance always takes one turn (no deadlock on giant contexts)
        return len(heap) < self.tables.max_num_seqs and self.reserved + final_ctx <= self.kv_capacity

    def _itl(self, batch: int, ctx: float) -> float:
        """`CostTables.itl_s(self.tp, batch, ctx)` for 1 <= batch <= max_num_seqs."""
        tables = self.tables
        row = self._itl_rows[batch - 1]
        x = (math.log(ctx if ctx > 16.0 else 16.0) - tables._log0) / tables._dlog
        i = int(x)
        if i > tables._n - 2:
            i = tables._n - 2
        d = x - i
        lo = row[i]
        return lo + (row[i + 1] - lo) * (d if d < 1.0 else 1.0)

    def advance(self, now_s: float) -> None:
        last = self.last_s
        if now_s <= last:
            return
        heap = self.heap
        if heap:
            self.busy_s += now_s - last
            stall = self.stall_until_s
            start = last if last >= stall else stall
            if now_s > start:
                b = len(heap)
                steps = (now_s - start) / self._itl(b, self.ctx_sum / b)
                clock = self.clock
                room = heap[0][0] - clock
                if room < steps:  # never past the next completion
                    steps = room
                self.clock = clock + steps
                self.ctx_sum += b * steps
        self.last_s = now_s

    def join(self, now_s: float, item: Any, ctx: float, prefill_tokens: float, gen_tokens: int) -> None:
        """Start a turn: prefill `prefill_tokens` (attending `ctx`), then decode `gen_tokens`."""
        self.advance(now_s)
        stall = self.stall_until_s
        if prefill_tokens <= 0:
            prefill_s = 0.0
        else:
            tables = self.tables
            row = self._pre_row
            x = (math.log(ctx if ctx > 16.0 else 16.0) - tables._log0) / tables._dlog
            i = int(x)
            if i > tables._n - 2:
                i = tables._n - 2
            d = x - i
            lo = row[i]
            prefill_s = prefill_tokens * (lo + (row[i + 1] - lo) * (d if d < 1.0 else 1.0))
        self.stall_until_s = (now_s if now_s >= stall else stall) + prefill_s
        final_ctx = ctx + gen_tokens
        seq = self._seq
        heapq.heappush(self.heap, (self.clock + gen_tokens, seq, item, final_ctx))
        self._seq = seq + 1
        self.ctx_sum += ctx
        self.reserved += final_ctx
        self.version += 1

    def next_done_s(self) -> float | None:
        """When the first running turn ends (None: none runs). Never `start` itself while that
        turn has more than `pop_done`'s tolerance left: past ~1e8 s of simulated time a short
        decode rounds to no time at all, and an event at `start` advanced nothing and was
        scheduled again there, forever; the next float after `start` lets `advance` finish it."""
        heap = self.heap
        if not heap:
            return None
        b = len(heap)
        last, stall = self.last_s, self.stall_until_s
        start = last if last >= stall else stall
        clock = self.clock
        left = heap[0][0] - clock
        done_s = start + (left if left > 0.0 else 0.0) * self._itl(b, self.ctx_sum / b)
        if done_s <= start and heap[0][0] > clock + _DONE_TOLERANCE:
            return math.nextafter(start, math.inf)
        return done_s

    def pop_done(self, now_s: float) -> list[Any]:
        """Turns whose generation ended by `now_s`, in completion order, each turn's final context
        already released from the running sums and the KV reservation (clipped at 0, both 0 once
        nothing runs)."""
        self.advance(now_s)
        heap = self.heap
        done = []
        limit = self.clock + _DONE_TOLERANCE
        while heap and heap[0][0] <= limit:
            done.append(heapq.heappop(heap))
        if done and heap:
            ctx_sum, reserved = self.ctx_sum, self.reserved
            for entry in done:
                final_ctx = entry[3]
                x = ctx_sum - final_ctx
                ctx_sum = x if x > 0.0 else 0.0
                x = reserved - final_ctx
                reserved = x if x > 0.0 else 0.0
            self.ctx_sum, self.reserved = ctx_sum, reserved
        elif done:
            self.ctx_sum = self.reserved = 0.0
        self.version += 1
        return [entry[2] for entry in done]
