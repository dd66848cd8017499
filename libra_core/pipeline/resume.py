"""Resuming a run folder: what `libra run --resume RUN_DIR [--set ...]` will do, checked before it
does anything, then done.

Who calls it: `libra run --resume` calls `plan_resume` before Prefect starts (a refusal is exit 2
and one line; the plan's `note` is printed), and the create-run task calls `plan_resume` again and
`apply_resume`, so a run started from the UI gets the same checks. `plan_resume` only reads;
`apply_resume` writes, after every check has passed, so a refused resume leaves the folder as it
was. Refused: a damaged `state.json` (a value of the wrong type included) or resolved config, a
missing `state.json` in a folder with checkpoints, overrides that change the model or the
tokenizer (the policy folder holds that model's weights; a tiny model's fields are also compared
with the policy folder's config.json, in case config.resolved.yaml was edited by hand; its
tokenizer was trained for the environment's type and prompt format, which are frozen too) or what the
C-MLFQ tree it restores is keyed by (the checkpoint's copy: the live tree is replaced), fewer
iterations than the run completed, a checkpoint with a file missing or damaged (its optimizer state
and C-MLFQ tree included), a history file that cannot be read or has columns this version does not
know, and turning the KL penalty on in a run that kept no reference policy. The checkpoint resumed
from is the newest the run's state covers. A resume forgets what the abandoned attempt recorded
after the point it continues from: history rows, lake partitions, timeline spans, the planner's
decisions and checkpoints of later iterations.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libra_core.config import LibraConfig, load_config, write_resolved_config
from libra_core.config.models import TinyModelConfig
from libra_core.data.atomic import atomic_path
from libra_core.data.history import drop_history_after, read_history, refuse_unknown_history_columns
from libra_core.data.io import drop_lake_after
from libra_core.observability.timeline import drop_timeline_after
from libra_core.pipeline.plan_stage import drop_unfinished_decisions, read_decisions
from libra_core.pipeline.run_dir import (
    RunLayout,
    RunState,
    checkpoint_dirs,
    checkpoint_iteration,
    copy_tree_atomic,
    load_run_config,
    parse_state,
    read_state,
    write_state,
)
from libra_core.scheduling.tree_io import load_tree
from libra_core.training.checkpoint import OPTIMIZER_FILE, WEIGHTS_FILE, optimizer_file_problem

# Config sections that the run folder's files embody: changing them on resume would pair a config
# with weights (and a tokenizer) of another model.
FROZEN_ON_RESUME = ("model", "tokenizer")
# Environment settings a tiny model's tokenizer was trained for (its alphabet and special tokens).
TOKENIZER_ENV_KEYS = ("type", "prompt_format")


class ResumeError(ValueError):
    """A resume that would not continue the run the folder holds; the message names why."""


@dataclass(frozen=True)
class ResumePlan:
    cfg: LibraConfig  # the run's config with this resume's overrides
    checkpoint: Path | None  # what is restored; None: start again at iteration 1
    state: RunState  # what the run continues from
    completed: int  # iterations the folder says completed
    note: str  # one line for the user: where the run continues and what is redone


def plan_resume(run_dir: str | Path, overrides: Sequence[str] = ()) -> ResumePlan:
    """Check a resume of `run_dir` with `overrides`; raise ConfigError (a damaged or invalid config),
    ResumeError (see the module docstring) or ValueError (a damaged state.json). Reads only."""
    layout = RunLayout(Path(run_dir))
    before = load_run_config(layout.root)
    cfg = load_config(layout.config, overrides) if overrides else before
    changed = [key for section in FROZEN_ON_RESUME for key in _changed_keys(section, before, cfg)]
    if isinstance(cfg.model, TinyModelConfig):
        # A tiny policy's tokenizer was trained on its environment's text, with its markers as
        # special tokens: another environment or prompt format would be read through <|unk|>.
        changed += [
            f"environment.{key}"
            for key in TOKENIZER_ENV_KEYS
            if getattr(cfg.environment, key, None) != getattr(before.environment, key, None)
        ]
    if changed:
        raise ResumeError(
            f"{layout.root}: {', '.join(changed)} cannot change on resume (the run's policy is that "
            "model, its tokenizer trained for that environment); start a new run instead"
        )
    # The check above compares with config.resolved.yaml, which a user may have edited by hand:
    # the policy folder's own config says what the weights are.
    differ = policy_disagreements(cfg, layout.policy / "config.json")
    if differ:
        raise ResumeError(
            f"{layout.root}: the config says {', '.join(differ)}; the model cannot change on resume "
            f"(was {layout.config.name} edited?); start a new run instead"
        )
    if not layout.state.exists() and checkpoint_dirs(layout.root):
        # Read as a fresh run, the resume restarted at iteration 1 beside the old checkpoints, and
        # the next save's rotation deleted the new one as the oldest.
        raise ResumeError(
            f"{layout.root}: state.json is missing but the folder holds checkpoints "
            f"({', '.join(p.name for p in checkpoint_dirs(layout.root))}); the run's state was lost. "
            "Start a new run, or restore state.json (a checkpoint's state.json is its state)"
        )
    state = read_state(layout.root)
    try:  # apply_resume rewrites it, after it has replaced the policy: a damaged one fails here
        # ... and so does the planner's decision log, which apply_resume trims too: a damaged one
        # failed at the first plan stage, after apply_resume had changed the folder (until 2026-12-07)
        read_decisions(layout.root)
        read_history(layout.root)
        # ... as it does when the file has columns this version does not know (a newer Libra's):
        # the rewrite refused it half-way, the policy already restored
        refuse_unknown_history_columns(layout.root)
    except ValueError as err:
        raise ResumeError(f"{err}; nothing was changed") from err
    if cfg.experiment.iterations < state.completed_iterations:
        raise ResumeError(
            f"{layout.root}: experiment.iterations={cfg.experiment.iterations} is below the "
            f"{state.completed_iterations} iterations the run completed"
        )
    # The newest checkpoint the run's state covers: one past it is an abandoned attempt's (a state
    # rewritten by hand, or lost), and resuming from it would continue from that attempt's weights.
    covered = [
        c for c in checkpoint_dirs(layout.root) if checkpoint_iteration(c) <= state.completed_iterations
    ]
    ckpt = covered[-1] if covered else None  # checkpoints start at iter_00001: none at 0 completed
    if ckpt is not None:
        missing = checkpoint_problems(ckpt)
        if missing:
            raise ResumeError(
                f"checkpoint {ckpt} is incomplete ({'; '.join(missing)}); nothing was changed. Delete "
                "it to resume from the checkpoint before it"
            )
        resumed = parse_state(ckpt / "state.json")
        if resumed.completed_iterations > state.completed_iterations:
            raise ResumeError(
                f"checkpoint {ckpt} says {resumed.completed_iterations} iterations completed, the run's "
                f"state.json {state.completed_iterations}; nothing was changed"
            )
        # The tree apply_resume makes live is the checkpoint's copy (none restored: the live one is
        # deleted, and the rollout builds one with this config's keys). The live tree was checked
        # until 2026-12-07: with it removed, new keys passed and the old-keyed copy came back.
        refuse_tree_key_changes(layout.root, cfg, RunLayout(ckpt).scheduler_tree)
    else:
        resumed = RunState()
    if resumed.completed_iterations and cfg.training.grpo.kl_coef > 0 and not layout.reference.is_dir():
        # The frozen warm-up policy is copied by the prepare step, which a resume past iteration 1
        # skips; the update would fail for want of it after this iteration's rollout.
        raise ResumeError(
            f"{layout.root}: training.grpo.kl_coef={cfg.training.grpo.kl_coef} needs the run's frozen "
            "warm-up policy (reference/), which a run with kl_coef 0 does not keep; start a new run "
            "instead"
        )
    start, last = resumed.completed_iterations + 1, cfg.experiment.iterations
    if start > last:
        note = f"{layout.root.name}: all {last} iterations done; nothing to run"
    elif ckpt is not None:
        redo = state.completed_iterations - resumed.completed_iterations
        again = f"; iterations {start}-{state.completed_iterations} are redone" if redo > 0 else ""
        note = f"resuming {layout.root.name} at iteration {start} of {last} from {ckpt.name}{again}"
    elif state.completed_iterations:
        note = (
            f"{layout.root.name}: no checkpoint yet (experiment.checkpoint_every "
            f"{cfg.experiment.checkpoint_every}); restarting at iteration 1, the "
            f"{state.completed_iterations} completed iterations are redone"
        )
    else:
        note = f"resuming {layout.root.name} at iteration 1 of {last}"
    return ResumePlan(cfg, ckpt, resumed, state.completed_iterations, note)


# TinyModelConfig field -> the Hugging Face config.json key `build_tiny_policy` writes it to.
_TINY_CONFIG_KEYS = {
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "dtype": "dtype",
}


def _changed_keys(section: str, before: LibraConfig, after: LibraConfig) -> list[str]:
    """`section.key` of every key of `section` that differs. A section of another variant (`model`
    from `tiny_qwen2` to `hf_local`) is `section.type` alone: the two variants' keys are not the
    same keys, and a switch is one change, whatever the keys hold."""
    old, new = getattr(before, section).model_dump(), getattr(after, section).model_dump()
    if old.get("type") != new.get("type"):
        return [f"{section}.type"]
    missing = object()
    return [f"{section}.{key}" for key in {**old, **new} if old.get(key, missing) != new.get(key, missing)]


def policy_disagreements(cfg: LibraConfig, policy_config: Path) -> list[str]:
    """`model.FIELD=value, but FILE has KEY=value` for each tiny-model field on which the config and
    the policy folder's config.json disagree (empty: they agree, or there is nothing to compare:
    no policy yet, or a model type whose config.json is not built from these fields)."""
    if not isinstance(cfg.model, TinyModelConfig) or not policy_config.is_file():
        return []
    try:
        written = json.loads(policy_config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResumeError(f"{policy_config} cannot be read ({err}); nothing was changed") from err
    if not isinstance(written, dict):
        raise ResumeError(f"{policy_config} is not a model config (a JSON object); nothing was changed")
    return [
        f"model.{field}={getattr(cfg.model, field)!r} but {policy_config} has {key}={written[key]!r}"
        for field, key in _TINY_CONFIG_KEYS.items()
        if key in written and written[key] != getattr(cfg.model, field)
    ]


def refuse_tree_key_changes(root: Path, cfg: LibraConfig, tree: Path) -> None:
    """Raise ResumeError if `cfg` asks for other keys than the C-MLFQ tree a resume restores,
    `tree` (a checkpoint's copy; absent: nothing to compare)."""
    keyed = tree_key_changes(cfg, tree) if tree.is_file() else {}
    if not keyed:
        return
    built = ", ".join(f"{key}={have}" for key, (_, have) in keyed.items())
    asked = ", ".join(f"{key}={want}" for key, (want, _) in keyed.items())
    compact = {key: json.dumps(have, separators=(",", ":")) for key, (_, have) in keyed.items()}
    raise ResumeError(
        f"{root}: {', '.join(keyed)} cannot change on resume (the run's C-MLFQ tree is keyed by them: "
        f"{tree}, which the resume restores, was built with {built}; the config asks for {asked}); "
        f"resume with the tree's values ({' '.join(f'--set {k}={v}' for k, v in compact.items())}), "
        "or start a new run instead; nothing was changed"
    )


def tree_key_changes(cfg: LibraConfig, tree_path: Path) -> dict[str, tuple[object, object]]:
    """`scheduler.KEY` -> (the config's value, the tree's) for each key the C-MLFQ tree in
    `tree_path` is keyed by on which it and `cfg` disagree: what `CMLFQScheduler` refuses at the
    first rollout (the bins only once the tree has a size level: an empty one takes the config's)."""
    tree = load_tree(tree_path)
    pairs: dict[str, tuple[object, object]] = {
        "payload_class_edges": (list(cfg.scheduler.payload_class_edges), list(tree.payload_edges))
    }
    if tree.size_classes:
        bins = (float(cfg.scheduler.prompt_size_bins_per_octave), tree.size_bins_per_octave)
        pairs["prompt_size_bins_per_octave"] = bins
    return {f"scheduler.{key}": pair for key, pair in pairs.items() if pair[0] != pair[1]}


def checkpoint_problems(ckpt: Path) -> list[str]:
    """What a checkpoint folder lacks, or holds damaged, to be restored (empty: it is whole).
    Reads every file `apply_resume` copies over the live ones: a damaged copy was restored, and the
    run failed later with an error naming no file (torch's "failed reading zip archive") or only the
    live copy, which a resume then restored again (until 2026-12-07)."""
    problems = [
        f"no {name}"
        for name in ("state.json", f"policy/{WEIGHTS_FILE}", "policy/config.json")
        if not (ckpt / name).is_file()
    ]
    if (ckpt / "state.json").is_file():
        try:
            parse_state(ckpt / "state.json")
        except ValueError as err:
            problems.append(str(err))
    # A checkpoint mirrors the run folder's layout; either file may be absent (taken before the
    # first optimizer step; a static scheduler), not empty or damaged.
    optimizer = RunLayout(ckpt).trainer / OPTIMIZER_FILE
    problem = optimizer_file_problem(optimizer) if optimizer.exists() else None
    if problem is not None:
        problems.append(f"{optimizer} is damaged: {problem}")
    tree = RunLayout(ckpt).scheduler_tree
    if tree.exists():
        try:
            load_tree(tree)
        except ValueError as err:  # it names the file
            problems.append(str(err))
    return problems


def apply_resume(run_dir: str | Path, plan: ResumePlan, overrides: Sequence[str] = ()) -> RunState:
    """Put the folder in the state `plan` continues from; returns it (status `running`)."""
    layout = RunLayout(Path(run_dir))
    if plan.checkpoint is not None:
        copy_tree_atomic(plan.checkpoint / "policy", layout.policy)
        if (plan.checkpoint / "trainer").exists():
            copy_tree_atomic(plan.checkpoint / "trainer", layout.trainer)
        else:  # taken before the first optimizer step: the state now there is the abandoned steps'
            shutil.rmtree(layout.trainer, ignore_errors=True)
        tree = plan.checkpoint / "scheduler" / layout.scheduler_tree.name
        if tree.exists():  # the router's statistics as of the checkpoint, not of the iterations redone
            with atomic_path(layout.scheduler_tree) as tmp:
                shutil.copyfile(tree, tmp)
        else:  # none then (a static scheduler at the time): the live one learnt the redone iterations
            layout.scheduler_tree.unlink(missing_ok=True)
    else:
        # Starting again at iteration 1: the optimizer state and the router's statistics belong to
        # the iterations about to be redone, or to an iteration 1 interrupted after its update (the
        # warm-up policy is put back by the prepare step).
        shutil.rmtree(layout.trainer, ignore_errors=True)
        layout.scheduler_tree.unlink(missing_ok=True)
    # What the abandoned attempt recorded after the point the run continues from would otherwise
    # be read as this run's past (dynamic sampling, the report, trace exports, the timeline).
    kept = plan.state.completed_iterations
    for later in checkpoint_dirs(layout.root):  # an abandoned attempt's: rotation would keep them
        if checkpoint_iteration(later) > kept:
            shutil.rmtree(later)
    _remove_leftovers(layout)
    drop_history_after(layout.root, kept)
    drop_lake_after(layout.root, kept)
    drop_timeline_after(layout.root, kept)
    # A static planner never trims it, and the libra planner's first plan stage trims it only
    # when it runs: the report showed the abandoned attempt's decisions (until 2026-12-07).
    drop_unfinished_decisions(layout.root, kept + 1)
    _drop_stages_after(layout, kept)
    if overrides:  # written back so the folder stays self-describing
        write_resolved_config(plan.cfg, layout.root)
    state = RunState(plan.state.completed_iterations, plan.state.policy_version, "running")
    write_state(layout.root, state)
    return state


def _drop_stages_after(layout: RunLayout, iteration: int) -> None:
    """Delete the stage folders of iterations after `iteration`: the abandoned attempt's files.
    One of them, an async rollout's C-MLFQ tree snapshot, was copied into the redone iteration's
    checkpoint when the resume ran in sync mode (which writes none), until 2026-12-06."""
    for folder in (layout.root / "stages").glob("iteration=*"):
        number = folder.name.removeprefix("iteration=")
        if number.isdigit() and int(number) > iteration:
            shutil.rmtree(folder, ignore_errors=True)


def _remove_leftovers(layout: RunLayout) -> None:
    """Delete what a process killed mid-write left: `atomic_path`'s `.NAME.tmp-PID-HEX` files, a
    checkpoint's `.iter_N.staging` copy (a whole policy and optimizer state) and a folder
    `replace_dir` had renamed aside, `.NAME.old-HEX` (a whole policy: the folder it replaced is
    restored from the checkpoint or prepared again), and `copy_tree_atomic`'s `.NAME.tmp` and
    `.NAME.old` folders (the latter was never removed). Safe while the resume holds the folder's
    lock: no other process is writing them."""
    patterns = (".*.tmp-*", ".*.old-*", ".*.tmp", ".*.old")
    for tmp in [path for pattern in patterns for path in layout.root.rglob(pattern)]:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
    for staging in layout.checkpoints.glob(".iter_*.staging"):
        shutil.rmtree(staging, ignore_errors=True)
