"""chatml: a `<tool_call>` without its `</tool_call>` is prose that mentions the tag, not a call.
Generation stops only at `<|im_end|>`/`<|endoftext|>` (no stop string eats the closing tag), so
until 2026-12-07 a final answer naming the tag was read as a call to the end of the turn and lost."""

from __future__ import annotations

from libra_core.envs.protocol import CHATML, SEVERAL_CALLS

TOOLS = ("python", "calculator")
CALL = '<tool_call>\n{"name": "calculator", "arguments": "48/2"}\n</tool_call>'


def test_an_answer_mentioning_an_unclosed_tag_is_the_answer() -> None:
    text = "No tool needed (I could emit <tool_call> but 48/2 is easy): the answer is \\boxed{24}."
    action = CHATML.parse(f"{text}<|im_end|>", TOOLS, code_block_tool="python")
    assert (action.kind, action.tool, action.answer) == ("answer", None, text)


def test_a_code_answer_mentioning_an_unclosed_tag_is_the_answer() -> None:
    # The code environment parses without a code-block tool: the turn is its solution.
    text = "Final solution (no <tool_call> required):\n```python\ndef add(a, b):\n    return a + b\n```"
    action = CHATML.parse(f"{text}<|endoftext|>", TOOLS)
    assert (action.kind, action.answer) == ("answer", text)


def test_an_unclosed_tag_before_a_closed_call_leaves_that_call() -> None:
    action = CHATML.parse(f"Calling <tool_call> now:\n{CALL}<|im_end|>", TOOLS)
    assert (action.kind, action.tool, action.arguments) == ("tool_call", "calculator", "48/2")


def test_an_unclosed_tag_after_a_closed_call_is_no_second_call() -> None:
    action = CHATML.parse(f"{CALL}\n<tool_call><|im_end|>", TOOLS)
    assert (action.kind, action.tool, action.arguments) == ("tool_call", "calculator", "48/2")


def test_closed_calls_read_as_before() -> None:
    one = CHATML.parse(f"{CALL}<|im_end|>", TOOLS)
    assert (one.kind, one.tool, one.arguments) == ("tool_call", "calculator", "48/2")
    two = CHATML.parse(f"{CALL}{CALL}<|im_end|>", TOOLS)
    assert (two.kind, two.tool) == ("tool_call", SEVERAL_CALLS)
