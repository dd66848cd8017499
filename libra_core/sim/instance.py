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
    """One rollout instance of TP degree `tp` serving bucket `bucket`."""

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
    active: bool = True  # False while lent to training (elastic pool)
    heap: list[tuple[float, int, Any]] = field(default_factory=list)
    _seq: int = 0

    @property
    def batch(self) -> int:
        return len(self.heap)

    def fits(self, final_ctx: float) -> bool:
        if not self.heap:
            return True  # an empty instance always takes one turn (no deadlock on giant contexts)
        return len(self.heap) < self.tables.max_num_seqs and self.reserved + final_ctx <= self.kv_capacity

    def advance(self, now_s: float) -> None:
        if now_s <= self.last_s:
            return
        if self.heap:
            self.busy_s += now_s - self.last_s
            start = max(self.last_s, self.stall_until_s)
            if now_s > start:
                b = len(self.heap)
                steps = (now_s - start) / self.tables.itl_s(self.tp, b, self.ctx_sum / b)
                steps = min(steps, self.heap[0][0] - self.clock)  # never past the next completion
                self.clock += steps
                self.ctx_sum += b * steps
        self.last_s = now_s

    def join(self, now_s: float, item: Any, ctx: float, prefill_tokens: float, gen_tokens: int) -> None:
        """Start a turn: prefill `prefill_tokens` (attending `ctx`), then decode `gen_tokens`."""
        self.advance(now_s)
        self.stall_until_s = max(now_s, self.stall_until_s) + self.tables.prefill_s(
            self.tp, prefill_tokens, ctx
        )
        heapq.heappush(self.heap, (self.clock + gen_tokens, self._seq, item))
        self._seq += 1
        self.ctx_sum += ctx
        self.reserved += ctx + gen_tokens
        self.version += 1

    def next_done_s(self) -> float | None:
        if not self.heap:
            return None
        b = len(self.heap)
        start = max(self.last_s, self.stall_until_s)
        return start + max(0.0, self.heap[0][0] - self.clock) * self.tables.itl_s(
            self.tp, b, self.ctx_sum / b
        )

    def pop_done(self, now_s: float) -> list[Any]:
        """Turns whose generation ended by `now_s` (the caller releases their context)."""
        self.advance(now_s)
        done = []
        while self.heap and self.heap[0][0] <= self.clock + 1e-6:
            _, _, item = heapq.heappop(self.heap)
            done.append(item)
        self.version += 1
        return done

    def release(self, ctx_now: float, reserved: float) -> None:
        self.ctx_sum = max(0.0, self.ctx_sum - ctx_now)
        self.reserved = max(0.0, self.reserved - reserved)
        if not self.heap:
            self.ctx_sum = self.reserved = 0.0
