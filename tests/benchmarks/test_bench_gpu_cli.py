"""`gpu_decode_step.py` and `gpu_train_step.py`: `--smoke` measures the tiny model (a CPU builds
it in a moment), `--out` is checked before any model is built, and the JSON is written atomically."""

from __future__ import annotations

import json
import os

import pytest

from tests.benchmarks.support import call_main, load_script


@pytest.fixture(params=["gpu_decode_step", "gpu_train_step"])
def script(request, monkeypatch):
    """The script with `measure` replaced by a recorder of the models it was asked for."""
    module = load_script(request.param)
    calls: list[list[str]] = []
    monkeypatch.setattr(module, "measure", lambda models, *a, **k: calls.append(list(models)))
    module.calls = calls
    return module


@pytest.mark.parametrize(
    ("flags", "models"),
    [
        (["--smoke"], ["tiny"]),
        (["--smoke", "--models", "qwen3-8b"], ["qwen3-8b"]),  # --models given: kept under --smoke
    ],
)
def test_smoke_measures_the_tiny_model_unless_models_are_named(
    script, tmp_path, monkeypatch, flags, models
) -> None:
    assert call_main(script, monkeypatch, "--out", str(tmp_path / "o.json"), "--device", "cpu", *flags) == 0
    assert script.calls == [models]


def test_without_smoke_the_default_models_are_measured(script, tmp_path, monkeypatch) -> None:
    # --device cpu: the default, cuda, is refused up front on a machine without one
    call_main(script, monkeypatch, "--out", str(tmp_path / "o.json"), "--device", "cpu")
    assert script.calls and "tiny" not in script.calls[0]


@pytest.mark.parametrize("where", ["under_a_file", "a_folder", "missing_folder"])
def test_a_bad_out_path_exits_2_before_anything_is_measured(
    script, tmp_path, capsys, monkeypatch, where
) -> None:
    (tmp_path / "file").write_text("x")
    out = {
        "under_a_file": tmp_path / "file" / "o.json",
        "a_folder": tmp_path,
        "missing_folder": tmp_path / "no" / "o.json",
    }[where]
    with pytest.raises(SystemExit) as exc:
        call_main(script, monkeypatch, "--out", str(out), "--smoke", "--device", "cpu")
    assert exc.value.code == 2
    assert script.calls == []
    assert f"--out {out}" in capsys.readouterr().err


def test_an_unknown_model_exits_2_before_anything_is_measured(script, tmp_path, monkeypatch) -> None:
    with pytest.raises(SystemExit) as exc:
        call_main(script, monkeypatch, "--out", str(tmp_path / "o.json"), "--models", "no-such-model")
    assert exc.value.code == 2 and script.calls == []


def test_the_json_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch) -> None:
    args = load_script("_args")
    path = tmp_path / "o.json"
    args.atomic_write_text(path, json.dumps({"a": 1}))
    assert json.loads(path.read_text()) == {"a": 1}

    def fail(*_a: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        args.atomic_write_text(path, json.dumps({"a": 2}))
    assert json.loads(path.read_text()) == {"a": 1}  # the old file, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["o.json"]  # no temp file left behind


def test_decode_step_keeps_free_of_libra_core_imports() -> None:
    """It runs on a CUDA machine with torch and pyyaml alone: its measuring path (the script and the
    helpers it imports) imports no libra_core module (only `--compare`, run here, does)."""
    import ast

    from tests.benchmarks.support import BENCH

    for name in ("gpu_decode_step.py", "_args.py", "_gpu_common.py"):
        tree = ast.parse((BENCH / name).read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        mods = [n.module if isinstance(n, ast.ImportFrom) else n.names[0].name for n in top]
        assert not [m for m in mods if m and m.startswith(("libra_core", "flows"))], (name, mods)
