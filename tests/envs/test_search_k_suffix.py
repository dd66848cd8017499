"""search tool: the `| k=N` suffix never raises, whatever N is (no service or shared data needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_core.config.environments import SearchEnvConfig
from libra_core.envs.base import TurnAction
from libra_core.envs.search import SearchEnv


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SearchEnv, list[tuple[str, int]]]:
    passage = {"id": "1", "title": "Nobel Prize", "text": "The Nobel Prize is awarded every year."}
    (tmp_path / "passages.jsonl").write_text(json.dumps(passage) + "\n")
    cfg = SearchEnvConfig(
        type="search",
        data_dir=str(tmp_path),
        passages_file="passages.jsonl",
        question_sources=("passage_titles",),
        max_top_k=5,
    )
    search_env = SearchEnv(cfg)
    calls: list[tuple[str, int]] = []

    def fake_search(query: str, k: int, deadline: float) -> list[dict]:
        calls.append((query, k))
        return [{"title": "Nobel Prize", "text": "The Nobel Prize is awarded every year."}]

    monkeypatch.setattr(search_env, "_search", fake_search)
    return search_env, calls


@pytest.mark.parametrize(
    ("k_text", "expected_k"),
    [("9" * 5000, 5), ("0" * 5000 + "3", 3)],  # int() of over 4,300 digits raises
)
def test_k_suffix_is_clamped_and_never_raises(env, k_text: str, expected_k: int) -> None:  # noqa: ANN001
    search_env, calls = env
    result = search_env.run_tool(
        TurnAction("tool_call", tool="search", arguments=f"nobel prize | k={k_text}")
    )
    assert result.status == "success"
    assert calls == [("nobel prize", expected_k)]
