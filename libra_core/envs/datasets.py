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

import ast
import builtins
import gzip
import hashlib
import io
import json
import random
import re
import tokenize
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from libra_core.envs.code_harness import answer_names, bound_names

REPO_ROOT = Path(__file__).resolve().parents[2]
_GSM8K_CALL = re.compile(r"<<([^=<>]*)=([^<>]*)>>")
_LEVEL = re.compile(r"\d+")
R = TypeVar("R")


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
    `visible_test` is the one test shown in the prompt; `solution` a reference solution or "".
    `answer_names`: the names the tests take from an answer (HumanEval: the entry point only);
    `setup`: trusted code the tests run after (HumanEval: the prompt, whose helpers they call)."""

    id: str
    prompt: str
    tests: str
    visible_test: str
    solution: str
    difficulty: int
    answer_names: tuple[str, ...] = ()
    setup: str = ""


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
    """The JSON objects of a plain or .gz JSONL file, blank lines skipped. A damaged file (invalid
    JSON, not UTF-8, a truncated or corrupt .gz) raises ValueError naming `path:line`."""
    for _, record in _numbered_records(path):
        yield record


def _numbered_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) per non-blank line of `path`; see `read_jsonl`."""
    opener = gzip.open if path.suffix == ".gz" else open
    line_no = 0
    try:
        with opener(path, "rb") as f:
            for line_no, raw_line in enumerate(f, 1):
                try:
                    # a BOM on the first line (Windows editors write one) was "Unexpected UTF-8 BOM"
                    line = raw_line.decode("utf-8-sig" if line_no == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(
                        f"{path}:{line_no}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                    ) from exc
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{path}:{line_no}: invalid JSON ({exc.msg} at column {exc.colno})"
                    ) from exc
                except (ValueError, RecursionError) as exc:  # a 4,301-digit number, deep nesting
                    raise ValueError(
                        f"{path}:{line_no}: unreadable JSON ({type(exc).__name__}: {exc})"
                    ) from exc
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{line_no}: expected a JSON object per line")
                yield line_no, record
    except (EOFError, OSError, zlib.error) as exc:  # truncated or corrupt .gz, unreadable file
        raise ValueError(f"{path}:{line_no + 1}: cannot read the file ({type(exc).__name__}: {exc})") from exc


def _parse_file(path: Path, kind: str, parse: Callable[[dict[str, Any], str, int], R]) -> list[R]:
    """`parse(record, "path:line", record index)` for every record of `path`. A record `parse` cannot
    read (a missing field, a value of the wrong type) raises ValueError naming `path:line`."""
    out: list[R] = []
    for index, (line_no, raw) in enumerate(_numbered_records(path)):
        where = f"{path}:{line_no}"
        try:
            out.append(parse(raw, where, index))
        except (
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            OverflowError,
        ) as exc:  # Overflow: int(Infinity)
            if isinstance(exc, ValueError) and str(exc).startswith(where):  # located by `parse`
                raise
            problem = f"missing field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"{where}: not a valid {kind} record ({problem}); keys {sorted(raw)}") from exc
    return out


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_text(value: object, numbers: bool) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str) or (numbers and number)


def _text(
    raw: dict[str, Any], key: str, where: str, *, numbers: bool = False, default: str | None = None
) -> str:
    """`raw[key]`, a string (or with `numbers`, a JSON number written as text); `default` when the
    key is absent and a default is given. A wrong type is an error: `str()` turned an `answer: null`
    into the answer "None" and a list into "['10']" (until 2026-12-07)."""
    if default is not None and key not in raw:
        return default
    value = raw[key]
    if not _is_text(value, numbers):
        expected = "a string or a number" if numbers else "a string"
        raise ValueError(f"{where}: field {key!r} must be {expected}, not {_kind(value)}")
    return str(value)


def _texts(
    raw: dict[str, Any], key: str, where: str, *, single: bool = False, numbers: bool = False
) -> tuple[str, ...]:
    """`raw[key]`, a list of strings (with `single`, a lone string too; with `numbers`, JSON numbers
    as items). Iterating a string gave one MBPP test or calculator step per character."""
    value = raw[key]
    expected = "a string or a list of strings" if single else "a list of strings"
    if single and isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        raise ValueError(f"{where}: field {key!r} must be {expected}, not {_kind(value)}")
    wrong = [item for item in value if not _is_text(item, numbers)]
    if wrong:
        raise ValueError(f"{where}: field {key!r} must be {expected}, not a list holding {_kind(wrong[0])}")
    return tuple(str(item) for item in value)


def stable_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


# -- math -----------------------------------------------------------------------------------------
def _level(value: object) -> int:
    """A MATH difficulty: an int, or the original dataset's "Level 5" ("Level ?" and absent: 1)."""
    if isinstance(value, int):
        return value
    found = _LEVEL.search(str(value))
    return int(found.group()) if found else 1


def _math_record(raw: dict[str, Any], where: str, index: int = 0) -> MathRecord:
    if "problem" in raw:  # MATH / MATH-500: problem, solution, answer, level
        problem, answer = _text(raw, "problem", where), _text(raw, "answer", where, numbers=True)
        return MathRecord(stable_id("math", problem), problem, answer, _level(raw.get("level", 1)), ())
    question = raw.get("question")
    if not isinstance(question, str) or "answer" not in raw:
        raise ValueError(
            f"{where}: a math record needs question+answer (or problem+answer); got {sorted(raw)}"
        )
    answer = _text(raw, "answer", where, numbers=True)
    if "####" in answer:  # GSM8K: worked solution with <<expr=value>> calls, final '#### N'
        steps = tuple(expr.strip() for expr, _ in _GSM8K_CALL.findall(answer))
        final = answer.rsplit("####", 1)[1].strip().replace(",", "")
        return MathRecord(stable_id("gsm8k", question), question, final, max(len(steps), 1), steps)
    steps = _texts(raw, "steps", where) if "steps" in raw else ()
    rid = _text(raw, "id", where, numbers=True) if raw.get("id") else stable_id("math", question)
    return MathRecord(rid, question, answer, int(raw.get("difficulty", max(len(steps), 1))), steps)


@lru_cache(maxsize=8)
def load_math(data_dir: str, files: tuple[str, ...]) -> tuple[MathRecord, ...]:
    out: list[MathRecord] = []
    for file in files:
        out += _parse_file(resolve_data_path(data_dir, file), "math", _math_record)
    return tuple(out)


# -- search ---------------------------------------------------------------------------------------
def _passage(raw: dict[str, Any], where: str, index: int) -> Passage:
    rid = _text(raw, "id", where, numbers=True, default=str(index))
    if "contents" in raw:  # FlashRAG: '"Title"\ntext'
        title, _, text = _text(raw, "contents", where).partition("\n")
        return Passage(rid, title.strip().strip('"'), text.strip())
    if "text" not in raw:
        raise ValueError(f"{where}: a passage needs text (or FlashRAG contents); got {sorted(raw)}")
    return Passage(rid, _text(raw, "title", where, default=""), _text(raw, "text", where))


def _question(raw: dict[str, Any], where: str, index: int) -> QARecord:
    if "question" not in raw:
        raise ValueError(f"{where}: a question record needs question; got {sorted(raw)}")
    key = next((k for k in ("golden_answers", "answers", "answer") if raw.get(k) is not None), None)
    golds = _texts(raw, key, where, single=True, numbers=True) if key is not None else ()
    if not golds:
        raise ValueError(f"{where}: a question needs golden_answers (or answers/answer)")
    rid = _text(raw, "id", where, numbers=True, default=str(index))
    return QARecord(rid, _text(raw, "question", where), golds)


@lru_cache(maxsize=4)
def load_passages(data_dir: str, file: str) -> tuple[Passage, ...]:
    return tuple(_parse_file(resolve_data_path(data_dir, file), "passage", _passage))


@lru_cache(maxsize=4)
def load_questions(data_dir: str, file: str) -> tuple[QARecord, ...]:
    return tuple(_parse_file(resolve_data_path(data_dir, file), "question", _question))


# -- code -----------------------------------------------------------------------------------------
def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _top_level_names(code: str) -> set[str]:
    """Names a module defines at top level (functions, classes, imports, globals); empty if it does
    not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        else:
            names |= bound_names(stmt)
    return names


def _free_names(node: ast.AST) -> set[str]:
    """Names `node` reads that it does not bind itself (a comprehension's variables are bound)."""
    loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - bound_names(node)


def _rename(code: str, old: str, new: str) -> str:
    """`code` with the identifier `old` (not strings or comments containing it) renamed to `new`."""
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    renamed = [t._replace(string=new) if t.type == tokenize.NAME and t.string == old else t for t in tokens]
    return tokenize.untokenize(renamed)


def _humaneval_visible(test: str, entry: str, solution: str) -> str:
    """The first assert of a HumanEval `check` that calls `candidate` and stands on its own, renamed
    to the entry point: a complete statement (asserts span several lines: HumanEval/1, /87) using only
    builtins and names the solution (prompt + reference) defines - not the test's own variables
    (HumanEval/38 asserts on loop variables). "" if there is none."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return ""
    test_names = bound_names(tree) - {"candidate"}  # check's locals, METADATA, test helpers
    known = set(dir(builtins)) | _top_level_names(solution) | {"candidate"}
    asserts = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Assert)), key=lambda n: (n.lineno, n.col_offset)
    )
    for node in asserts:
        free = _free_names(node)
        segment = ast.get_source_segment(test, node)
        if segment is None or "candidate" not in free or free & test_names or not free <= known:
            continue  # skips `assert True, "..."` too: a visible test must call the function
        visible = _rename(segment, "candidate", entry).strip()
        if _parses(visible):
            return visible
    return ""


def _mbpp_visible(test_list: list[str], setup: str) -> str:
    """The first MBPP test that parses, preceded by the test setup code when it uses names the
    setup defines (mbpp-367 and -927 assert on a tree `root` built there). "" if there is none."""
    setup = "\n".join(line.rstrip() for line in setup.replace("\r\n", "\n").splitlines()).strip()
    for test in test_list:
        try:
            tree = ast.parse(test)
        except (SyntaxError, ValueError):
            continue
        if setup and _free_names(tree) & _top_level_names(setup):
            return f"{setup}\n{test}"
        return test
    return ""


def _through_first_assert(tests: str) -> str:
    """The statements of `tests` up to and including its first top-level assert (so the setup
    lines it needs come with it); the first line if it has none or does not parse."""
    first_line = tests.strip().splitlines()[0] if tests.strip() else ""
    try:
        tree = ast.parse(tests)
    except (SyntaxError, ValueError):
        return first_line
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, ast.Assert):
            segments = [ast.get_source_segment(tests, s) for s in tree.body[: i + 1]]
            return "\n".join(s for s in segments if s is not None)
    return first_line


def _code_record(raw: dict[str, Any], where: str, index: int = 0) -> CodeRecord:
    if "entry_point" in raw and "prompt" in raw and "test" in raw:  # HumanEval
        entry, test = _text(raw, "entry_point", where), _text(raw, "test", where)
        asserts = [ln.strip() for ln in test.splitlines() if ln.strip().startswith("assert candidate")]
        prompt = _text(raw, "prompt", where)
        solution = prompt + _text(raw, "canonical_solution", where, default="")
        visible = _humaneval_visible(test, entry, solution)
        tests = f"{test}\n\ncheck({entry})\n"
        difficulty = max(len(asserts), 1)
        rid = _text(raw, "task_id", where, numbers=True)
        return CodeRecord(rid, prompt, tests, visible, solution, difficulty, (entry,), prompt)
    if "test_list" in raw:  # MBPP
        test_list = _texts(raw, "test_list", where)
        setup = _text(raw, "test_setup_code", where) if raw.get("test_setup_code") else ""
        visible = _mbpp_visible(list(test_list), setup)
        shown = f"\n{visible}" if "\n" in visible else f" {visible}"
        text = _text(raw, "text", where)
        prompt = f"{text}\nYour code should pass:{shown}" if visible else text
        tests = "\n".join([setup, *test_list]).strip() + "\n"
        solution = _text(raw, "code", where, default="").replace("\r\n", "\n")
        names = answer_names(tests, solution)
        rid = f"mbpp-{_text(raw, 'task_id', where, numbers=True)}"
        return CodeRecord(rid, prompt, tests, visible, solution, len(test_list), names)
    if "question" in raw and "tests" in raw:  # Libra code format
        tests = "\n".join(_texts(raw, "tests", where, single=True))
        visible = _text(raw, "visible_test", where, default=_through_first_assert(tests))
        question = _text(raw, "question", where)
        rid = _text(raw, "id", where, numbers=True) if raw.get("id") else stable_id("code", question)
        n_asserts = max(tests.count("assert"), 1)
        solution = _text(raw, "solution", where, default="")
        names = answer_names(tests, solution)
        return CodeRecord(rid, question, tests, visible, solution, n_asserts, names)
    raise ValueError(f"{where}: not a MBPP, HumanEval or Libra code record; keys {sorted(raw)}")


@lru_cache(maxsize=8)
def load_code(data_dir: str, files: tuple[str, ...]) -> tuple[CodeRecord, ...]:
    out: list[CodeRecord] = []
    for file in files:
        out += _parse_file(resolve_data_path(data_dir, file), "code", _code_record)
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
