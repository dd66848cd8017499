"""Text protocol: code fences as models write them, and tool-call bodies with extra keys or names."""

from __future__ import annotations

import pytest

from libra_core.envs.base import UNKNOWN_TOOL
from libra_core.envs.protocol import (
    CHATML,
    MALFORMED_CALL,
    MARKERS,
    SEVERAL_CALLS,
    extract_code,
    python_source,
    split_call,
)

TOOLS = ("python", "calculator")
CODE = "def f(x):\n    return x + 1\n"


@pytest.mark.parametrize(
    "info", ["", "python", "py", "Python", "PYTHON", "python3", "py3", "Py3", "python  "]
)
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_python_like_fences_are_code_blocks(info: str, newline: str) -> None:
    fenced = f"Here it is:{newline}```{info}{newline}{CODE.replace(chr(10), newline)}```{newline}Done."
    assert extract_code(fenced) == CODE
    action = CHATML.parse(f"{fenced}<|im_end|>", TOOLS, code_block_tool="python")
    assert (action.kind, action.tool, action.arguments) == ("tool_call", "python", CODE)


def test_other_languages_are_not_python_blocks() -> None:
    text = "```bash\nls -la\n```"
    assert extract_code(text) == text
    assert extract_code("```pythonic\nx\n```") == "```pythonic\nx\n```"


def test_a_fence_in_another_language_before_the_python_block_is_skipped() -> None:
    # The pattern opened at the ```text block's closing fence and ran the prose up to the python
    # block's opening fence: a correct code answer scored as a wrong one, and math_tools ran prose.
    text = f"Output:\n```text\n42\n```\nHere is my solution:\n```python\n{CODE}```\n"
    assert extract_code(text) == CODE
    action = CHATML.parse(f"{text}<|im_end|>", TOOLS, code_block_tool="python")
    assert (action.kind, action.tool, action.arguments) == ("tool_call", "python", CODE)
    assert extract_code(f"```\n{CODE}```\n```bash\nls\n```") == CODE  # the last Python block


def test_two_tool_call_tags_in_one_turn_are_several_calls() -> None:
    # Only the first ran and the model was not told; a JSON list of two calls was refused already.
    calc = '<tool_call>{"name": "calculator", "arguments": "48/2"}</tool_call>'
    python = '<tool_call>{"name": "python", "arguments": "print(1)"}</tool_call>'
    action = CHATML.parse(f"{calc}{python}<|im_end|>", TOOLS)
    assert (action.kind, action.tool, action.arguments) == ("tool_call", SEVERAL_CALLS, "")
    one = CHATML.parse(f"{calc}<|im_end|>", TOOLS)
    assert (one.tool, one.arguments) == ("calculator", "48/2")


def test_json_arguments_with_several_keys_use_the_known_one() -> None:
    assert split_call('{"name": "python", "arguments": {"code": "print(42)", "timeout": 5}}', TOOLS) == (
        "python",
        "print(42)",
    )
    assert split_call(
        '{"name": "calculator", "arguments": {"precision": 3, "expression": "1+2"}}', TOOLS
    ) == (
        "calculator",
        "1+2",
    )
    assert split_call('{"name": "python", "arguments": {"src": "print(1)"}}', TOOLS) == ("python", "print(1)")
    assert split_call('{"name": "python", "arguments": {"a": 1, "b": 2}}', TOOLS) == (
        "python",
        '{"a": 1, "b": 2}',
    )


def test_string_encoded_arguments_and_a_list_of_one_call_reach_the_tool() -> None:
    # OpenAI-style `arguments` (a JSON string holding an object) and a list of one call reached the
    # python tool as a literal, which ran, printed nothing and reported success.
    want = ("python", "print(6*7)")
    assert split_call('{"name": "python", "arguments": "{\\"code\\": \\"print(6*7)\\"}"}', TOOLS) == want
    assert split_call('[{"name": "python", "arguments": {"code": "print(6*7)"}}]', TOOLS) == want
    assert split_call('{"name": "python", "arguments": "print(1)"}', TOOLS) == ("python", "print(1)")
    assert split_call("[1, 2]", TOOLS) == ("python", "[1, 2]")  # no call in it: the first tool


def test_call_shapes_no_tool_reads_are_failures_and_openais_nested_form_runs() -> None:
    # each reached the python tool as a literal, which printed nothing and reported success
    two = '[{"name": "python", "arguments": "print(1)"}, {"name": "python", "arguments": "print(2)"}]'
    assert split_call(two, TOOLS) == (SEVERAL_CALLS, "")
    assert split_call('{"name": "python", "arguments": ["print(1)"]}', TOOLS) == (MALFORMED_CALL, "")
    assert SEVERAL_CALLS not in TOOLS and MALFORMED_CALL not in TOOLS  # answered as unknown tools
    nested = (
        '{"type": "function", "function": {"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}}'
    )
    assert split_call(nested, TOOLS) == ("python", "print(1)")
    assert split_call('{"name": "python", "arguments": null}', TOOLS) == ("python", "")  # as if absent


def test_a_space_after_the_colon_is_no_indentation_and_fenced_arguments_run() -> None:
    assert split_call("python: print(1)", TOOLS) == ("python", "print(1)")
    assert split_call("python:\n    x = 1\n    print(x)", TOOLS) == ("python", "    x = 1\n    print(x)")
    assert python_source("```python\nprint(6*7)\n```") == "print(6*7)"
    assert python_source("    x = 1\n    print(x)") == "x = 1\nprint(x)"


@pytest.mark.parametrize("body", ["shell:1", "bash:ls -la", "search:capital of France", "web-search: x"])
def test_an_unknown_tool_name_is_kept_so_the_call_is_keyed_unknown(body: str) -> None:
    name, _ = split_call(body, TOOLS)
    assert name == body.split(":")[0] and name not in TOOLS
    action = MARKERS.parse(f"<|call|>{body}<|/call|>", TOOLS)
    assert action.tool == name


def test_bodies_without_a_name_still_go_to_the_first_tool() -> None:
    for body in (
        "48/2",
        "x = {1: 2}\nprint(x)",
        "for i in range(3):\n    print(i)",
        "try:\n    pass\nexcept: pass",
    ):
        assert split_call(body, TOOLS) == ("python", body)
    # A program that begins with an annotation is code for the python tool, not a call of a tool `x`
    for body in ("x: int = 5", "total: float = 0.0\nprint(total)", "x: int\nx = 5\nprint(x)"):
        assert split_call(body, TOOLS) == ("python", body)
        assert split_call(body, ("calculator", "python")) == ("python", body)  # math_tools' order
    # Without a python tool such a body stays a call of an unknown tool (it would have searched)
    assert split_call("lookup: q = 'Eiffel Tower'", ("search",))[0] == "lookup"
    assert split_call("calculator:48/2", TOOLS) == ("calculator", "48/2")


def test_environments_answer_an_unknown_name_as_unknown(tmp_path) -> None:  # noqa: ANN001
    import json

    from libra_core.config.environments import CodeEnvConfig
    from libra_core.envs.registry import build_environment

    record = {"id": "add", "question": "Write add(a, b).", "tests": "assert add(1, 2) == 3\n"}
    (tmp_path / "code.jsonl").write_text(json.dumps(record) + "\n")
    env = build_environment(CodeEnvConfig(type="code", data_dir=str(tmp_path), files=("code.jsonl",)))
    result = env.run_tool(env.parse_turn("<|call|>shell:1<|/call|>"))
    assert (result.tool, result.status, result.observation) == (
        UNKNOWN_TOOL,
        "failure",
        "error: unknown tool 'shell'",
    )
