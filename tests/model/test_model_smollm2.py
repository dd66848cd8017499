"""The SmolLM2 converter's argument checks (the conversion itself: tests/envs/test_smollm2_smoke.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from libra_core.model.smollm2 import convert_gguf, main


def test_a_missing_gguf_file_is_named_not_looked_up_on_the_hub(tmp_path: Path) -> None:
    # transformers took the missing file's folder for a Hub repository id and failed with hub errors.
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(FileNotFoundError, match=re.escape(f"GGUF file {missing} does not exist")):
        convert_gguf(missing, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_line_refuses_a_missing_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "out"), "--gguf", str(tmp_path / "BAD")])
    assert exit_info.value.code == 2
    assert f"--gguf {tmp_path / 'BAD'}: no such file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
