"""Layout and state of a run folder, checkpoints and resume.

<output_dir>/<name>-<timestamp>/
  config.resolved.yaml      the exact config the run used (written before anything else)
  state.json                completed iterations, policy version, status
  policy/                   HF folder the rollout engines serve and reload after each update
  reference/                frozen warm-up policy (only when training.grpo.kl_coef > 0)
  trainer/optimizer.pt      AdamW state of the trainer
  stages/iteration=NNNNN/   Arrow IPC files exchanged between rollout, reward and update, and the
                            rollout's and the evaluation's request spans for the timeline
                            (requests.arrow, eval_requests.arrow)
  lake/iteration=NNNNN.parquet   rewarded trajectories (the trajectory lake)
  history.parquet           one row per iteration: stage timings, tokens, rewards
  scheduler/cmlfq_tree.json C-MLFQ statistics carried across iterations (scheduler.type: cmlfq)
  checkpoints/iter_NNNNN/   policy + optimizer + C-MLFQ tree + state copies for resume (pipeline/resume.py)
  .lock                     held by the process running the run (pipeline/run_lock.py)
  logs/                     engine logs
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from libra_core.config import LibraConfig, load_config
from libra_core.config.loader import RESOLVED_CONFIG_NAME
from libra_core.data.atomic import atomic_path, sync_folder, sync_tree

_CHECKPOINT_NAME = re.compile(r"iter_(\d+)")  # RunLayout.checkpoint's names


@dataclass(frozen=True)
class RunState:
    completed_iterations: int = 0
    policy_version: int = 0
    status: str = "created"  # created | running | finished | failed | cancelled


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / RESOLVED_CONFIG_NAME

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def policy(self) -> Path:
        return self.root / "policy"

    @property
    def reference(self) -> Path:
        return self.root / "reference"

    @property
    def trainer(self) -> Path:
        return self.root / "trainer"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def scheduler_tree(self) -> Path:
        return self.root / "scheduler" / "cmlfq_tree.json"

    def stage_dir(self, iteration: int) -> Path:
        return self.root / "stages" / f"iteration={iteration:05d}"

    def rollout_requests(self, iteration: int) -> Path:
        """When each generation request of the rollout of `iteration` ran, on which instance
        (observability/request_spans.py)."""
        return self.stage_dir(iteration) / "requests.arrow"

    def eval_requests(self, iteration: int) -> Path:
        """The same for the greedy evaluation after the update of `iteration`."""
        return self.stage_dir(iteration) / "eval_requests.arrow"

    def scheduler_tree_at(self, iteration: int) -> Path:
        """The C-MLFQ tree as the rollout of `iteration` left it (async mode only)."""
        return self.stage_dir(iteration) / self.scheduler_tree.name

    def checkpoint(self, iteration: int) -> Path:
        return self.checkpoints / f"iter_{iteration:05d}"


# What a run writes and its stages, commands and resume read: an output of another command must not
# replace these (`libra trace export -o RUN/history.parquet` once did).
RUN_FILES = (RESOLVED_CONFIG_NAME, "state.json", "history.parquet", ".lock")
RUN_FOLDERS: tuple[str, ...] = ("policy", "reference", "trainer", "stages", "lake", "checkpoints")
RUN_FOLDERS += ("scheduler", "logs", "timeline", "planner")


def is_run_file(run_dir: str | Path, path: str | Path) -> bool:
    """Whether `path` is (or lies in) a file or folder that run folder `run_dir` is made of."""
    root, target = Path(run_dir).resolve(), Path(path).resolve()
    if not target.is_relative_to(root) or target == root:
        return False
    first = target.relative_to(root).parts[0]
    return first in RUN_FILES or first in RUN_FOLDERS


def new_run_dir(cfg: LibraConfig, now: datetime | None = None) -> Path:
    """Make and return a new, empty run folder `<output_dir>/<name>-<stamp>[-N]`. Made here, by
    one `mkdir` that fails if the folder exists, so two runs started in the same second (two
    `libra run`, or a schedule and a UI click) never share one: the second takes the next N."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    root = cfg.experiment.output_path / f"{cfg.experiment.name}-{stamp}"
    candidate, suffix = root, 1
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                candidate.mkdir()
            except FileExistsError:
                suffix += 1
                candidate = root.with_name(f"{root.name}-{suffix}")
                continue
            return candidate.resolve()
    except OSError as err:
        # A run started from the UI or a schedule does not go through the CLI's output check: it
        # failed with a bare NotADirectoryError naming no setting (until 2026-12-07).
        raise ValueError(
            f"experiment.output_dir {str(cfg.experiment.output_dir)!r}: cannot make the run folder "
            f"{candidate} ({err.strerror or err})"
        ) from None


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int) -> LibraConfig:
    return load_config(path)


def load_run_config(run_dir: str | Path) -> LibraConfig:
    """The resolved config of a run (cached; re-read if the file changes)."""
    path = RunLayout(Path(run_dir)).config
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder: {path.name} is missing")
    return _load_cached(str(path), path.stat().st_mtime_ns)


RUN_STATUSES = ("created", "running", "finished", "failed", "cancelled")


def parse_state(path: Path) -> RunState:
    """The RunState in the JSON file `path`, its value types checked; a ValueError naming the
    file otherwise (`"completed_iterations": "3"` failed later in a comparison, with a traceback
    naming no file, and -4 or 3.0 were taken)."""
    try:
        data = json.loads(path.read_text())
    except ValueError as err:  # JSONDecodeError, a file that is not UTF-8
        raise ValueError(f"run state {path} is damaged: {err}") from err
    except OSError as err:  # a folder of that name, no permission
        raise ValueError(f"run state {path} cannot be read: {err.strerror or err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"run state {path} is damaged: not a JSON object")
    unknown = [k for k in data if k not in ("completed_iterations", "policy_version", "status")]
    if unknown:
        raise ValueError(f"run state {path} is damaged: unknown keys {unknown}")
    for key in ("completed_iterations", "policy_version"):
        value = data.get(key, 0)
        if type(value) is not int or value < 0:
            raise ValueError(f"run state {path} is damaged: {key} is {value!r}, not a count >= 0")
    if data.get("status", "created") not in RUN_STATUSES:
        raise ValueError(
            f"run state {path} is damaged: status {data['status']!r} is not one of {RUN_STATUSES}"
        )
    return RunState(**data)


def read_state(run_dir: str | Path) -> RunState:
    """The run's state (a fresh RunState when there is no state.json yet)."""
    path = RunLayout(Path(run_dir)).state
    if not path.exists():
        return RunState()
    return parse_state(path)


def write_state(run_dir: str | Path, state: RunState) -> None:
    with atomic_path(RunLayout(Path(run_dir)).state) as tmp:
        tmp.write_text(json.dumps(asdict(state), indent=2))


def copy_tree_atomic(src: Path, dst: Path) -> None:
    """Replace folder `dst` by a copy of `src`. The copy is made beside `dst`, then the old folder
    is renamed aside and the copy renamed in (two renames: a crash between them, the only window,
    leaves the old folder whole at `.NAME.old`), then the old one is deleted."""
    tmp, old = dst.with_name(f".{dst.name}.tmp"), dst.with_name(f".{dst.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_tree(src, tmp)
        sync_tree(tmp)  # on disk before its name is: a power loss leaves the old folder or the new
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk left a partial copy (until 2026-12-07)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        os.replace(dst, old)
    os.replace(tmp, dst)
    sync_folder(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(run_dir: str | Path, iteration: int, state: RunState, keep: int) -> Path:
    """Copy policy, optimizer, C-MLFQ tree and state into checkpoints/iter_N; keep the `keep` newest."""
    layout = RunLayout(Path(run_dir))
    ckpt = layout.checkpoint(iteration)
    staging = ckpt.with_name(f".{ckpt.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _stage_checkpoint(layout, iteration, state, staging)
    except BaseException:
        # A failed copy (a full disk) left the partial copy holding the space until a resume, and
        # raised shutil.Error's list of tuples (until 2026-12-07).
        shutil.rmtree(staging, ignore_errors=True)
        raise
    aside = ckpt.with_name(f".{ckpt.name}.old")  # the same iteration saved again (a redone one)
    if ckpt.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(ckpt, aside)  # deleted only once the new copy has its name
    os.replace(staging, ckpt)
    sync_folder(layout.checkpoints)
    shutil.rmtree(aside, ignore_errors=True)
    for old in checkpoint_dirs(run_dir)[:-keep]:
        _delete_dir(old)
    return ckpt


def _delete_dir(path: Path) -> None:
    """Delete a checkpoint folder: renamed aside first, so a kill mid-delete leaves `.NAME.old`
    (which a resume clears) rather than a half-deleted checkpoint under its real name, which a
    resume refuses as incomplete (until 2026-12-07)."""
    aside = path.with_name(f".{path.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    shutil.rmtree(aside)


def _copy_tree(src: Path, dst: Path) -> None:
    """`shutil.copytree`, its failure one readable OSError (shutil.Error's message is the repr of
    a list of (source, destination, reason) tuples)."""
    try:
        shutil.copytree(src, dst)
    except shutil.Error as err:
        failures = err.args[0] if err.args and isinstance(err.args[0], list) else []
        first = failures[0] if failures and len(failures[0]) == 3 else None
        why = f"{first[0]} -> {first[1]}: {first[2]}" if first else str(err)
        more = f" (and {len(failures) - 1} more files)" if len(failures) > 1 else ""
        raise OSError(f"copying {src} to {dst} failed: {why}{more}") from err


def _stage_checkpoint(layout: RunLayout, iteration: int, state: RunState, staging: Path) -> None:
    staging.mkdir(parents=True)
    _copy_tree(layout.policy, staging / "policy")
    if layout.trainer.exists():
        _copy_tree(layout.trainer, staging / "trainer")
    # C-MLFQ's statistics as of this iteration's rollout: in async mode the next rollout, which
    # a resume redoes, has already added its trajectories to the live tree.
    tree = layout.scheduler_tree_at(iteration)
    tree = tree if tree.exists() else layout.scheduler_tree
    if tree.exists():
        (staging / "scheduler").mkdir()
        shutil.copy2(tree, staging / "scheduler" / layout.scheduler_tree.name)
    (staging / "state.json").write_text(json.dumps(asdict(state), indent=2))
    sync_tree(staging)  # a checkpoint that is named is whole, after a power loss too


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """The run's checkpoint folders, oldest first, by iteration number: by name, `iter_100000`
    came before `iter_99999` (the names are padded to five digits), so the newest was deleted
    as the oldest and a resume started from the one before it (until 2026-12-06)."""
    found = []
    for path in RunLayout(Path(run_dir)).checkpoints.glob("iter_*"):
        m = _CHECKPOINT_NAME.fullmatch(path.name)
        if m is not None and path.is_dir():
            found.append((int(m.group(1)), path))
    return [path for _, path in sorted(found)]


def checkpoint_iteration(ckpt: Path) -> int:
    """The iteration a checkpoint folder (`iter_NNNNN`, from `checkpoint_dirs`) was taken after."""
    m = _CHECKPOINT_NAME.fullmatch(ckpt.name)
    assert m is not None, f"{ckpt} is not a checkpoint folder"
    return int(m.group(1))
