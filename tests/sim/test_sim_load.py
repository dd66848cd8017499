"""Under load the heterogeneous policies must not lose to the one-degree plan they extend.

dapo-math at 96 prompts per iteration: until the promoting price used the context at each
trajectory's last tool return (`Workload.last_call_ctx_tokens`), the heterogeneous search took
4xTP1 2xTP4 3xTP8 and ran its first iteration at 9,197 tok/s against `+planning`'s 14,288 on 4xTP8:
long answers written after an early call never left the TP1 bucket (docs/simulator-notebook.md,
sixteenth session)."""

from __future__ import annotations

from libra_core.sim.simulate import simulate


def test_heterogeneous_policies_keep_up_with_planning_on_loaded_dapo_math() -> None:
    policies = ["+planning", "+hetero-tp", "+cmlfq"]
    report = simulate("dapo-math", "48xA800", 1, policies, spec_overrides={"prompts_per_iteration": 96})
    planning = report.result("+planning").tokens_per_s
    for name in policies[1:]:
        assert report.result(name).tokens_per_s >= 0.98 * planning, name
