"""`libra run --resume RUN --set model.type=...`: switching the model's variant is refused like any
other model change, naming `model.type` (it raised KeyError: the old variant's keys were looked up
with the new one's), and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main
from libra_core.config import load_config, write_resolved_config
from libra_core.pipeline.resume import ResumeError, plan_resume
from libra_core.pipeline.run_dir import RunLayout, RunState, new_run_dir, write_state

HF_LOCAL = ["model.type=hf_local", "model.path=/models/x"]


def _run(tmp_path: Path, overrides: list[str]) -> RunLayout:
    cfg = load_config(None, [f"experiment.output_dir={tmp_path}", *overrides])
    layout = RunLayout(new_run_dir(cfg))
    write_resolved_config(cfg, layout.root)
    layout.policy.mkdir()
    (layout.policy / "config.json").write_text("{}")
    write_state(layout.root, RunState(1, 1, "failed"))
    return layout


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("made_with", "resumed_with"),
    [
        ([], HF_LOCAL),  # tiny -> hf_local: KeyError 'path'
        (["model={type: hf_local, path: /models/x}"], ["model.type=tiny_qwen2"]),  # hf_local -> tiny
        (["model={type: hf_local, path: /models/x}"], ["model={type: tiny_qwen2, num_layers: 2}"]),
    ],
)
def test_another_model_variant_is_refused_naming_model_type(
    tmp_path: Path, made_with: list[str], resumed_with: list[str]
) -> None:
    layout = _run(tmp_path, made_with)
    before = _snapshot(layout.root)
    with pytest.raises(ResumeError) as info:
        plan_resume(layout.root, resumed_with)
    assert str(info.value) == (
        f"{layout.root}: model.type cannot change on resume (the run's policy is that model, its "
        "tokenizer trained for that environment); start a new run instead"
    )
    assert _snapshot(layout.root) == before


def test_the_same_variant_still_names_each_changed_key(tmp_path: Path) -> None:
    layout = _run(tmp_path, ["model={type: hf_local, path: /models/x}"])
    with pytest.raises(ResumeError, match=r": model.path, model.dtype cannot change on resume"):
        plan_resume(layout.root, ["model.path=/models/y", "model.dtype=float32"])


def test_libra_run_resume_refuses_it_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = _run(tmp_path, [])
    argv = ["run", "--resume", str(layout.root)] + [a for item in HF_LOCAL for a in ("--set", item)]
    assert main(argv) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "error: " in err and "model.type cannot change on resume" in err
