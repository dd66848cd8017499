"""Dataset loaders: a damaged file or record fails with a ValueError naming `path:line`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from libra_core.envs import datasets as ds

GOOD = json.dumps({"question": "q1", "answer": "x <<2+3=5>> #### 5"})


def _write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


CASES: dict[str, tuple[str | bytes, str, str]] = {
    # name: (content, loader, expected message part)
    "bad_json.jsonl": (f"{GOOD}\n\n" + '{"question": "q2", "answer": "#### 6"\n', "math", ":3: invalid JSON"),
    "latin1.jsonl": (
        GOOD + "\n" + json.dumps({"question": "caf\xe9", "answer": "#### 1"}, ensure_ascii=False) + "\n",
        "math-latin1",
        ":2: not UTF-8",
    ),
    "passages.jsonl": (json.dumps({"id": "1", "title": "T"}) + "\n", "passages", ":1: a passage needs text"),
    "questions.jsonl": (
        json.dumps({"id": "1", "query": "q", "golden_answers": ["a"]}) + "\n",
        "questions",
        ":1: a question record needs question",
    ),
    "no_golds.jsonl": (
        json.dumps({"question": "q"}) + "\n",
        "questions",
        ":1: a question needs golden_answers",
    ),
    "math_no_answer.jsonl": (json.dumps({"problem": "p"}) + "\n", "math", ":1: not a valid math record"),
    "math_bad_difficulty.jsonl": (
        json.dumps({"question": "q", "answer": "1", "difficulty": "hard"}) + "\n",
        "math",
        ":1: not a valid math record (ValueError",
    ),
    # each escaped without `path:line` (a bare ValueError, RecursionError or OverflowError)
    "big_number.jsonl": (
        f"{GOOD}\n" + '{"question": "q", "answer": ' + "9" * 5000 + "}\n",
        "math",
        ":2: unreadable JSON",
    ),
    "deep.jsonl": (f"{GOOD}\n" + "[" * 100_000 + "\n", "math", ":2: unreadable JSON (RecursionError"),
    "inf_difficulty.jsonl": (
        '{"question": "q", "answer": "1", "difficulty": Infinity}\n',
        "math",
        ":1: not a valid math record (OverflowError",
    ),
    # a wrong type was read silently until 2026-12-07: one MBPP test per character of a string,
    # an answer "None" or "['10']", one calculator step per character
    "math_null_answer.jsonl": (
        json.dumps({"question": "q", "answer": None}) + "\n",
        "math",
        ":1: field 'answer' must be a string or a number, not null",
    ),
    "math_list_answer.jsonl": (
        json.dumps({"question": "q", "answer": ["10"]}) + "\n",
        "math",
        ":1: field 'answer' must be a string or a number, not list",
    ),
    "math_problem_null_answer.jsonl": (
        json.dumps({"problem": "p", "answer": None}) + "\n",
        "math",
        ":1: field 'answer' must be a string or a number, not null",
    ),
    "math_string_steps.jsonl": (
        json.dumps({"question": "q", "answer": "6", "steps": "3+3"}) + "\n",
        "math",
        ":1: field 'steps' must be a list of strings, not str",
    ),
    "mbpp_string_tests.jsonl": (
        json.dumps({"task_id": 1, "text": "t", "code": "", "test_list": "assert sq(10) == 40"}) + "\n",
        "code",
        ":1: field 'test_list' must be a list of strings, not str",
    ),
    "mbpp_number_in_tests.jsonl": (
        json.dumps({"task_id": 1, "text": "t", "test_list": ["assert 1", 2]}) + "\n",
        "code",
        ":1: field 'test_list' must be a list of strings, not a list holding int",
    ),
    "libra_code_null_tests.jsonl": (
        json.dumps({"question": "q", "tests": None}) + "\n",
        "code",
        ":1: field 'tests' must be a string or a list of strings, not null",
    ),
    "question_dict_answers.jsonl": (
        json.dumps({"question": "q", "golden_answers": {"a": 1}}) + "\n",
        "questions",
        ":1: field 'golden_answers' must be a string or a list of strings, not dict",
    ),
    "code_missing.jsonl": (
        json.dumps({"test_list": ["assert 1"], "text": "t"}) + "\n",
        "code",
        ":1: not a valid code record (missing field 'task_id')",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_damaged_records_name_file_and_line(tmp_path: Path, name: str) -> None:
    content, loader, expected = CASES[name]
    if loader == "math-latin1":
        assert isinstance(content, str)
        content, loader = content.encode("latin-1"), "math"
    _write(tmp_path, name, content)
    load = {
        "math": lambda: ds.load_math(str(tmp_path), (name,)),
        "passages": lambda: ds.load_passages(str(tmp_path), name),
        "questions": lambda: ds.load_questions(str(tmp_path), name),
        "code": lambda: ds.load_code(str(tmp_path), (name,)),
    }[loader]
    with pytest.raises(ValueError) as info:
        load()
    message = str(info.value)
    assert message.startswith(f"{tmp_path / name}:"), message
    assert expected in message, message


def test_numbers_where_text_is_expected_are_still_read(tmp_path: Path) -> None:
    rows = [
        {"question": "q1", "answer": 10, "steps": ["5+5"]},
        {"question": "q2", "answer": 2.5, "steps": []},
        {"problem": "p3", "answer": 7},
    ]
    _write(tmp_path, "math.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    records = ds.load_math(str(tmp_path), ("math.jsonl",))
    assert [(r.answer, r.steps) for r in records] == [("10", ("5+5",)), ("2.5", ()), ("7", ())]
    _write(tmp_path, "q.jsonl", json.dumps({"question": "q", "golden_answers": [1969, "1969 AD"]}) + "\n")
    assert ds.load_questions(str(tmp_path), "q.jsonl")[0].answers == ("1969", "1969 AD")


def test_truncated_gzip_names_the_file(tmp_path: Path) -> None:
    raw = gzip.compress(
        "".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) + "\n" for i in range(5000)).encode()
    )
    _write(tmp_path, "trunc.jsonl.gz", raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"trunc\.jsonl\.gz:\d+: cannot read the file \(EOFError"):
        ds.load_math(str(tmp_path), ("trunc.jsonl.gz",))
    _write(tmp_path, "notgz.jsonl.gz", GOOD.encode())
    with pytest.raises(ValueError, match=r"notgz\.jsonl\.gz:1: cannot read the file"):
        ds.load_math(str(tmp_path), ("notgz.jsonl.gz",))


def test_math_level_in_the_original_format_is_accepted(tmp_path: Path) -> None:
    rows = [
        {"problem": "p1", "answer": "1", "level": "Level 5"},
        {"problem": "p2", "answer": "2", "level": 3},
        {"problem": "p3", "answer": "3", "level": "Level ?"},
        {"problem": "p4", "answer": "4"},
    ]
    _write(tmp_path, "math.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    records = ds.load_math(str(tmp_path), ("math.jsonl",))
    assert [r.difficulty for r in records] == [5, 3, 1, 1]


def test_blank_lines_do_not_shift_ids_or_line_numbers(tmp_path: Path) -> None:
    passages = [json.dumps({"title": f"T{i}", "text": f"text {i}"}) for i in range(3)]
    _write(tmp_path, "p.jsonl", "\n\n".join(passages) + "\n")
    assert [p.id for p in ds.load_passages(str(tmp_path), "p.jsonl")] == ["0", "1", "2"]
    _write(tmp_path, "q.jsonl", "\n" + json.dumps({"question": "q", "answers": "a"}) + "\n\n{}\n")
    with pytest.raises(ValueError, match=r"q\.jsonl:4: a question record needs question"):
        ds.load_questions(str(tmp_path), "q.jsonl")


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    # Windows editors write one; it was "Unexpected UTF-8 BOM" (a damaged file)
    _write(tmp_path, "bom.jsonl", ("\ufeff" + GOOD + "\n").encode("utf-8"))
    (record,) = ds.load_math(str(tmp_path), ("bom.jsonl",))
    assert record.question == "q1" and record.answer == "5"
