"""Loaders for the JSONL datasets behind the data-backed environments, and deterministic sampling.

Each environment names its files in config (`environment.data_dir` + `files`); this module reads
them (plain or .gz JSONL) into typed records, recognising per record the public formats (GSM8K,
MATH, NQ/FlashRAG, MBPP, HumanEval) and the Libra formats documented in datasets/README.md, so
users can add their own data without code. Nothing is downloaded. Loads are cached per process:
several stages of an iteration build the same environment.

Relative paths are resolved against the repository root first, then the working directory, so
the default `../shared/data` finds the shared data folder beside the checkout from anywhere.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[2]
_GSM8K_CALL = re.compile(r"<<([^=<>]*)=([^<>]*)>>")


@dataclass(frozen=True)
class MathRecord:
    """A word problem. `steps`: calculator expressions of a worked solution (may be empty)."""

    id: str
    question: str
    answer: str
    difficulty: int
    steps: tuple[str, ...]


@dataclass(frozen=True)
class QARecord:
    id: str
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class CodeRecord:
    """A programming problem. `tests` is Python that raises (AssertionError) when the solution is wrong;
    `visible_test` is the one test shown in the prompt; `solution` a reference solution or ""."""

    id: str
    prompt: str
    tests: str
    visible_test: str
    solution: str
    difficulty: int


def resolve_data_path(data_dir: str, file: str) -> Path:
    """Absolute path of `data_dir/file`: repository root first, then the working directory."""
    relative = Path(data_dir).expanduser() / file
    candidates = [relative] if relative.is_absolute() else [REPO_ROOT / relative, Path.cwd() / relative]
    for path in candidates:
        if path.is_file():
            return path.resolve()
    tried = ", ".join(str(p) for p in candidates)
    raise FileNotFoundError(
        f"dataset file {file!r} not found under data_dir {data_dir!r} (tried {tried}); set "
        "environment.data_dir to the folder holding it (see datasets/README.md)"
    )


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{line_no}: expected a JSON object per line")
                yield record


def stable_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


# -- math -----------------------------------------------------------------------------------------
def _math_record(raw: dict[str, Any], where: str) -> MathRecord:
    if "problem" in raw:  # MATH / MATH-500: problem, solution, answer, level
        question, answer = raw["problem"], str(raw["answer"])
        return MathRecord(stable_id("math", question), question, answer, int(raw.get("level", 1)), ())
    question = raw.get("question")
    if not isinstance(question, str) or "answer" not in raw:
        raise ValueError(
            f"{where}: a math record needs question+answer (or problem+answer); got {sorted(raw)}"
        )
    answer = str(raw["answer"])
    if "####" in answer:  # GSM8K: worked solution with <<expr=value>> calls, final '#### N'
        steps = tuple(expr.strip() for expr, _ in _GSM8K_CALL.findall(answer))
        final = answer.rsplit("####", 1)[1].strip().replace(",", "")
        return MathRecord(stable_id("gsm8k", question), question, final, max(len(steps), 1), steps)
    steps = tuple(str(s) for s in raw.get("steps", ()))
    rid = str(raw.get("id") or stable_id("math", question))
    return MathRecord(rid, question, answer, int(raw.get("difficulty", max(len(steps), 1))), steps)


@lru_cache(maxsize=8)
def load_math(data_dir: str, files: tuple[str, ...]) -> tuple[MathRecord, ...]:
    out = []
    for file in files:
        path = resolve_data_path(data_dir, file)
        out += [_math_record(r, f"{path}:{i + 1}") for i, r in enumerate(read_jsonl(path))]
    return tuple(out)


# -- search ---------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def load_passages(data_dir: str, file: str) -> tuple[Passage, ...]:
    out = []
    for i, raw in enumerate(read_jsonl(resolve_data_path(data_dir, file))):
        if "contents" in raw:  # FlashRAG: '"Title"\ntext'
            title, _, text = str(raw["contents"]).partition("\n")
            out.append(Passage(str(raw.get("id", i)), title.strip().strip('"'), text.strip()))
        else:
            out.append(Passage(str(raw.get("id", i)), str(raw.get("title", "")), str(raw["text"])))
    return tuple(out)


@lru_cache(maxsize=4)
def load_questions(data_dir: str, file: str) -> tuple[QARecord, ...]:
    out = []
    for i, raw in enumerate(read_jsonl(resolve_data_path(data_dir, file))):
        golds = raw.get("golden_answers", raw.get("answers", raw.get("answer")))
        golds = [golds] if isinstance(golds, str) else list(golds or [])
        if not golds:
            raise ValueError(f"{file}:{i + 1}: a question needs golden_answers (or answers/answer)")
        out.append(QARecord(str(raw.get("id", i)), str(raw["question"]), tuple(str(g) for g in golds)))
    return tuple(out)


# -- code -----------------------------------------------------------------------------------------
def _code_record(raw: dict[str, Any], where: str) -> CodeRecord:
    if "entry_point" in raw and "prompt" in raw and "test" in raw:  # HumanEval
        entry, test = raw["entry_point"], raw["test"]
        asserts = [ln.strip() for ln in test.splitlines() if ln.strip().startswith("assert candidate")]
        visible = asserts[0].replace("candidate", entry, 1) if asserts else ""
        solution = raw["prompt"] + raw.get("canonical_solution", "")
        tests = f"{test}\n\ncheck({entry})\n"
        return CodeRecord(str(raw["task_id"]), raw["prompt"], tests, visible, solution, max(len(asserts), 1))
    if "test_list" in raw:  # MBPP
        test_list = [str(t) for t in raw["test_list"]]
        setup = str(raw.get("test_setup_code") or "")
        prompt = f"{raw['text']}\nYour code should pass: {test_list[0]}" if test_list else str(raw["text"])
        tests = "\n".join([setup, *test_list]).strip() + "\n"
        solution = str(raw.get("code", "")).replace("\r\n", "\n")
        return CodeRecord(
            f"mbpp-{raw['task_id']}",
            prompt,
            tests,
            test_list[0] if test_list else "",
            solution,
            len(test_list),
        )
    if "question" in raw and "tests" in raw:  # Libra code format
        tests = raw["tests"] if isinstance(raw["tests"], str) else "\n".join(raw["tests"])
        visible = str(raw.get("visible_test", tests.strip().splitlines()[0] if tests.strip() else ""))
        rid = str(raw.get("id") or stable_id("code", raw["question"]))
        n_asserts = max(tests.count("assert"), 1)
        return CodeRecord(rid, raw["question"], tests, visible, str(raw.get("solution", "")), n_asserts)
    raise ValueError(f"{where}: not a MBPP, HumanEval or Libra code record; keys {sorted(raw)}")


@lru_cache(maxsize=8)
def load_code(data_dir: str, files: tuple[str, ...]) -> tuple[CodeRecord, ...]:
    out = []
    for file in files:
        path = resolve_data_path(data_dir, file)
        out += [_code_record(r, f"{path}:{i + 1}") for i, r in enumerate(read_jsonl(path))]
    return tuple(out)


# -- sampling -------------------------------------------------------------------------------------
class _HasDifficulty(Protocol):
    @property
    def difficulty(self) -> int: ...


T = TypeVar("T", bound=_HasDifficulty)


def sample_records(records: Sequence[T], n: int, seed: int, min_difficulty: int | None = None) -> list[T]:
    """`n` records drawn deterministically from `seed`, without repeats while the pool lasts.

    `min_difficulty` keeps records at least that hard, clamped to the hardest record present, so
    the default `rollout.min_difficulty` never empties a dataset whose difficulty scale is shorter.
    """
    if not records:
        raise ValueError("the dataset is empty; check environment.files / data_dir")
    pool = list(records)
    if min_difficulty is not None:
        floor = min(min_difficulty, max(r.difficulty for r in pool))
        pool = [r for r in pool if r.difficulty >= floor]
    rng = random.Random(seed)
    out: list[T] = []
    while len(out) < n:
        out += rng.sample(pool, min(len(pool), n - len(out)))
    return out
