"""Global Resource Planner: cost model, search and replanning (formulas in docs/planner.md).

Entry points: `plan_cluster` (the `libra plan` CLI), `LibraPlanner` (the flow's plan stage),
`search_plans` (the search itself). Never imports Prefect.
"""

from libra_core.planner.calibration import StageCorrection
from libra_core.planner.iteration import iteration_time_s
from libra_core.planner.presets import PRESETS, workload_preset
from libra_core.planner.replan import ReplanDecision, ReplanPolicy
from libra_core.planner.report import (
    PlanReport,
    format_plain,
    load_workload,
    plan_cluster,
    plan_to_dict,
    render_rich,
)
from libra_core.planner.reprice import evaluate_plan
from libra_core.planner.search import Plan, SearchSettings, search_plans
from libra_core.planner.service import LibraPlanner
from libra_core.planner.specs import get_hardware, get_model, parse_cluster
from libra_core.planner.workload import Workload, read_trace
from libra_core.traces.schema import TRACE_SCHEMA

__all__ = [
    "PRESETS",
    "TRACE_SCHEMA",
    "LibraPlanner",
    "Plan",
    "PlanReport",
    "ReplanDecision",
    "ReplanPolicy",
    "SearchSettings",
    "StageCorrection",
    "Workload",
    "evaluate_plan",
    "format_plain",
    "get_hardware",
    "get_model",
    "iteration_time_s",
    "load_workload",
    "parse_cluster",
    "plan_cluster",
    "plan_to_dict",
    "read_trace",
    "render_rich",
    "search_plans",
    "workload_preset",
]
