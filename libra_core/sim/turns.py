"""A trajectory's turns on the simulated rollout instances, between the events the engine handles.

A `Flight` is one trajectory in flight (its context, bucket, turn and the instance that served its
last turn). `SimTurns`, the middle of `Simulator` (engine.py) over `SimDeployments`
(deployments.py), moves it turn by turn: `route` places a turn on the instance that holds its
prefix or the router's choice (router.py), else queues it; the instance prefills the new tokens
where the prefix is cached and the whole context elsewhere (`_prefill_tokens`); `_schedule` puts
the instance's next decode end on the event queue; `_drain` fills freed room from the queues; at a
tool return the scheduler may move the trajectory to another bucket (`on_tool_return`). The engine
calls these from its event handlers and the pipeline (pipeline.py) when instances come or go.
"""

from __future__ import annotations

from dataclasses import dataclass

from libra_core.scheduling.base import SchedRequest, ToolReturn
from libra_core.sim.deployments import SimDeployments
from libra_core.sim.events import Kind
from libra_core.sim.instance import Instance
from libra_core.sim.trajectory import SimTrajectory


@dataclass(slots=True, eq=False)
class Flight:
    """One trajectory in flight: admitted, not finished; the event target of its tool returns."""

    traj: SimTrajectory
    req: SchedRequest
    bucket: int
    ctx: float
    admit_s: float
    turn: int = 0
    last: Instance | None = None
    pinned: Instance | None = None
    new_tokens: float = 0.0  # tokens appended since the previous turn (prompt, then payloads)
    moved: bool = False  # the scheduler moved it at the last tool return (leave the old instance)


class SimTurns(SimDeployments):
    """The turn path of `Simulator`: routing, prefill, decode ends and tool returns of `Flight`s."""

    def route(self, f: Flight) -> None:
        gen = f.traj.turns[f.turn].gen_tokens
        last = f.last
        held = f.pinned
        if held is None and self.s.sticky_turns and not f.moved:
            held = self.router.holder(f.bucket, last)
        if held is not None:  # the turn stays where it is pinned or where its prefix is cached
            queue = self.router.pinned_queues[held.instance_id]
            inst = held if held.fits(f.ctx + gen) and not queue else None
            if inst is None:
                queue.append(f)
                return
        else:
            inst = self.router.choose(f.bucket, None if f.moved else last, f.ctx + gen)
            f.moved = False
            if inst is None:
                self.router.queues[f.bucket].append(f)
                return
        inst.join(self.q.now_s, f, f.ctx, self._prefill_tokens(f, inst), gen)
        self._schedule(inst)

    def _prefill_tokens(self, f: Flight, inst: Instance) -> float:
        """New tokens on the instance that holds the prefix, else the whole context."""
        last = f.last
        if inst is last or last is None or not self.s.move_reprefill:
            return f.new_tokens
        return f.ctx

    def _schedule(self, inst: Instance) -> None:
        t = inst.next_done_s()
        if t is not None:
            self.q.push(t, Kind.DECODE_DONE, inst, inst.version)

    def _drain(self, inst: Instance) -> None:
        queues = [self.router.pinned_queues[inst.instance_id]]
        if self.p.placement != "round_robin":
            queues += self.router.drain_order(inst.bucket)
        now = self.q.now_s
        for q in queues:
            while q and inst.active:
                f = q[0]
                gen = f.traj.turns[f.turn].gen_tokens
                if not inst.fits(f.ctx + gen):
                    return
                q.popleft()
                inst.join(now, f, f.ctx, self._prefill_tokens(f, inst), gen)

    def finish(self, f: Flight) -> None:
        """End `f`: the scheduler learns it, the rollout may end (`Simulator.finish`)."""
        raise NotImplementedError

    def on_tool_return(self, f: Flight) -> None:
        turns = f.traj.turns
        t = turns[f.turn]
        f.ctx += t.payload_tokens
        if f.turn + 2 == len(turns) and turns[-1].gen_tokens == 0:
            # The return ended the trajectory (a trace's 0-token closing turn: it hit max_turns or
            # its token budget). Nothing runs after it, so, as in the agent loop and the trace
            # evaluator, no scheduler is asked and nothing is prefilled (until 2026-12-06 the
            # scheduler was asked, and a move there counted, and the payload was prefilled).
            f.turn += 1
            self.finish(f)
            return
        f.new_tokens = float(t.payload_tokens)
        assert self.sched is not None and t.tool is not None and t.status is not None
        ret = ToolReturn(f.turn, t.gen_tokens, t.tool, t.payload_tokens, t.status, int(f.ctx))
        move = self.sched.on_tool_return(f.req, ret)
        if move is not None and f.pinned is None:
            self.bucket_flights[f.bucket] -= 1
            f.bucket = self.router.clamp(move.bucket)
            self.bucket_flights[f.bucket] += 1
            f.moved = True
            if self.cur:
                self.cur.moves += 1
        f.turn += 1
        self.route(f)
