"""Text protocols shared by the data-backed environments: how prompts, tool calls, tool results and
answers are written, and how a model turn is read back.

Two formats (`environment.prompt_format`):

`markers` - the embedded task's special tokens, for the tiny model whose tokenizer is trained on
the environment's demonstrations (every marker is one token):

    <|user|>QUESTION<|assistant|><|call|>calculator:48/2<|/call|><|result|>24<|/result|>
    <|answer|>72<|eos|>

`chatml` - the chat template of instruct models such as SmolLM2 (`<|im_start|>`/`<|im_end|>` are
single tokens of their vocabulary; tool calls use Hermes-style `<tool_call>` tags):

    <|im_start|>system\\nSYSTEM<|im_end|>\\n<|im_start|>user\\nQUESTION<|im_end|>\\n<|im_start|>assistant\\n
    <tool_call>\\n{"name": "calculator", "arguments": "48/2"}\\n</tool_call><|im_end|>
    \\n<|im_start|>user\\n<tool_response>\\n24\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n
    The answer is \\boxed{72}.<|im_end|>

A chatml turn without a tool call is the final answer (its whole text; the environment's checker
extracts what it needs). Optionally a fenced ```python block counts as a call of the Python tool,
which is how small instruct models tend to ask for computation.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
import textwrap
from dataclasses import dataclass

from libra_core.envs.arithmetic import (
    ANSWER,
    ASSISTANT,
    CALL,
    END_CALL,
    END_RESULT,
    EOS,
    RESULT,
    SPECIAL_TOKENS,
    USER,
)
from libra_core.envs.base import TurnAction

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"

ARGUMENT_KEYS = ("code", "expression", "query")  # what the python, calculator and search tools take
# A word before the first ':' that reads as a tool name (not `x = {1` or `for i in range(3)`).
_TOOL_NAME = re.compile(r"[A-Za-z_][\w.-]*")
_MARKER_CALL = re.compile(re.escape(CALL) + r"(.*?)" + re.escape(END_CALL), re.S)
_MARKER_ANSWER = re.compile(re.escape(ANSWER) + r"(.*?)" + re.escape(EOS), re.S)
# A call is a `<tool_call>` closed by `</tool_call>`, with no other `<tool_call>` inside. Generation
# stops only at `<|im_end|>`/`<|endoftext|>`, so no stop string eats the closing tag: a tag left open
# is prose mentioning it (until 2026-12-07 it read as a call to the end of the turn, and a final
# answer that named the tag was lost to a failed tool call).
_CHATML_CALL = re.compile(
    re.escape(TOOL_CALL) + r"((?:(?!" + re.escape(TOOL_CALL) + r").)*?)" + re.escape(END_TOOL_CALL), re.S
)
# Every fenced block (info string, body), Windows line ends too; `_python_blocks` keeps those with
# no info string or a Python one, in any case (```Python, ```python3, ```py3). One pattern that
# only opened at a Python fence also opened at another block's closing fence: after a ```text
# block, the prose up to the python block's opening fence was "the code" (until 2026-12-06).
_FENCE = re.compile(r"```([^\r\n`]*)\r?\n(.*?)```", re.S)
_PYTHON_INFO = re.compile(r"(?:python3?|py3?)?[ \t]*", re.I)


def _python_blocks(text: str) -> list[str]:
    """The bodies of the text's Python (or unlabelled) fenced blocks, in order, with `\n` line ends."""
    return [body.replace("\r\n", "\n") for info, body in _FENCE.findall(text) if _PYTHON_INFO.fullmatch(info)]


# Names no tool has, so the environment answers these calls as unknown tools (a `failure`). Until
# 2026-12-06 they reached the python tool as a literal, which printed nothing and reported success.
SEVERAL_CALLS = "(several calls in one; make one call per turn)"
CODE_TOOL = "python"  # the tool that runs a program (envs/python_tool.py)
MALFORMED_CALL = "(call arguments that are neither text nor an object)"


def split_call(body: str, tools: tuple[str, ...]) -> tuple[str, str]:
    """Split a call body `name:arguments` (or JSON {"name", "arguments"}) into name and arguments.

    A `name:arguments` body whose name is a word no tool has (`shell:ls`) keeps that name, so the
    environment answers it as an unknown tool (a `failure` keyed `unknown`, docs/environments.md).
    A body that is a Python program beginning with an annotation (`x: int = 5`) goes to the python
    tool where there is one. A body with no recognisable name (bad JSON, bare code) goes to the
    first tool, so a malformed call still reaches a tool and comes back as a tool return (a real
    one, as C-MLFQ expects).
    """
    text = body.strip()
    if text.startswith(("{", "[")):
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):  # bad JSON, a 4,301-digit number, 1,000 nested brackets
            obj = None
        if isinstance(obj, list) and len(obj) == 1:  # a list of one call, as some chat models write
            obj = obj[0]
        elif isinstance(obj, list) and len(obj) > 1 and all(_looks_like_call(o) for o in obj):
            return SEVERAL_CALLS, ""  # one call per turn: none of them runs
        if isinstance(obj, dict) and "name" not in obj and isinstance(obj.get("function"), dict):
            obj = obj["function"]  # OpenAI's {"type": "function", "function": {name, arguments}}
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments")
            if args is not None and not isinstance(args, str | dict):
                return MALFORMED_CALL, ""  # a list or a number of arguments: no tool reads it
            # A JSON escape like \ud800 decodes to a lone surrogate, which no tool can encode.
            return _valid_text(obj["name"]), _valid_text(_arguments_text(args or ""))
    for sep in (":", "\n"):
        name, found, rest = text.partition(sep)
        if found and name.strip() in tools:
            # `python: print(1)`: the space after the colon is no indentation of the program
            return name.strip(), rest.removeprefix(" ").strip("\n") if sep == ":" else rest
    name = text.partition(":")[0].strip()
    if _TOOL_NAME.fullmatch(name) and not keyword.iskeyword(name):
        if CODE_TOOL in tools and _is_annotated_program(text):
            return CODE_TOOL, text  # `x: int = 5` is code for the python tool, not a call of `x`
        return name, text.partition(":")[2].strip("\n")
    return tools[0], text


def _is_annotated_program(text: str) -> bool:
    """Whether `name:rest` is a Python program rather than a call of tool `name`: it parses, and it
    is more than one bare annotation (`x: int = 5`, or `x: int` followed by more statements). A lone
    `shell:ls` parses too (an annotation), but does nothing as code: it stays an unknown tool. Only
    asked where a python tool exists (elsewhere the call stays unknown: the search tool would have
    searched for the program's text). Until 2026-12-07 `x: int = 5` was answered as a call of an
    unknown tool `x`."""
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # not Python, a NUL, too deep
        return False
    first = body[0] if body else None
    return len(body) > 1 or (isinstance(first, ast.AnnAssign) and first.value is not None)


def _looks_like_call(obj: object) -> bool:
    return isinstance(obj, dict) and ("name" in obj or isinstance(obj.get("function"), dict))


def _arguments_text(args: object) -> str:
    """The text a tool gets from JSON `arguments`: a string as is, unless it is itself a JSON object
    (OpenAI's function calls encode `arguments` so); from an object, the value of a known argument
    key (`code`, `expression`, `query`), else its single value, else the JSON. Until 2026-12-06 a
    list of one call and string-encoded arguments reached the python tool as a literal, which ran,
    printed nothing and reported success."""
    if isinstance(args, str) and args.lstrip().startswith("{"):
        try:
            decoded = json.loads(args)
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            args = decoded
    if isinstance(args, dict):
        for key in ARGUMENT_KEYS:
            if isinstance(args.get(key), str):
                return args[key]
        args = next(iter(args.values()), "") if len(args) == 1 else json.dumps(args)
    return str(args)


def _valid_text(text: str) -> str:
    """`text` with each lone surrogate (what a JSON escape like \\ud800 decodes to) as `?`: neither
    a tool nor a tokenizer can encode one."""
    return text.encode("utf-8", "replace").decode("utf-8")


@dataclass(frozen=True)
class TextFormat:
    """One text protocol. Stateless; shared by all threads of the agent loop."""

    name: str
    special_tokens: tuple[str, ...]
    stop_tokens: tuple[str, ...]

    def prompt(self, system: str, question: str) -> str:
        if self.name == "markers":
            return f"{USER}{question}{ASSISTANT}"  # the tiny model learns the task from demonstrations
        return (
            f"{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"
        )

    def call(self, tool: str, arguments: str) -> str:
        if self.name == "markers":
            return f"{CALL}{tool}:{arguments}{END_CALL}"
        payload = json.dumps({"name": tool, "arguments": arguments})
        return f"{TOOL_CALL}\n{payload}\n{END_TOOL_CALL}{IM_END}"

    def observation(self, text: str) -> str:
        # Every data-backed environment's tool output passes here on its way to the tokenizer, which
        # raises on a lone surrogate (a search service's JSON `\ud800`): until 2026-12-07 that lost
        # the iteration.
        text = _valid_text(text)
        # A tool's output is data: a special token in it (a program printing `<|eos|>`, a passage
        # quoting `<|im_end|>`) must not end the observation or the turn, or forge an answer.
        for token in self.special_tokens:
            if token in text:
                text = text.replace(token, token[:1] + " " + token[1:])
        if self.name == "markers":
            return f"{RESULT}{text}{END_RESULT}"
        return f"\n{IM_START}user\n<tool_response>\n{text}\n</tool_response>{IM_END}\n{IM_START}assistant\n"

    def answer(self, text: str) -> str:
        return f"{ANSWER}{text}{EOS}" if self.name == "markers" else f"{text}{IM_END}"

    def parse(
        self, turn_text: str, tools: tuple[str, ...], *, code_block_tool: str | None = None
    ) -> TurnAction:
        """Read one model turn (decoded with special tokens) as a tool call, an answer or invalid."""
        if self.name == "markers":
            call = _MARKER_CALL.search(turn_text)
            if call is not None and turn_text.rstrip().endswith(END_CALL):
                tool, args = split_call(call.group(1), tools)
                return TurnAction("tool_call", tool=tool, arguments=args)
            answer = _MARKER_ANSWER.search(turn_text)
            if answer is not None:
                return TurnAction("answer", answer=answer.group(1).strip())
            return TurnAction("invalid")
        stripped = turn_text.rstrip()
        if not stripped.endswith((IM_END, ENDOFTEXT)):
            return TurnAction("invalid")  # cut off by the token limit
        text = stripped.removesuffix(IM_END).removesuffix(ENDOFTEXT)
        calls = _CHATML_CALL.findall(text)
        if len(calls) > 1:  # as a JSON list of calls is answered: none runs (the second was dropped)
            return TurnAction("tool_call", tool=SEVERAL_CALLS, arguments="")
        if calls:
            tool, args = split_call(calls[0], tools)
            return TurnAction("tool_call", tool=tool, arguments=args)
        if code_block_tool is not None and "\\boxed" not in text:
            blocks = _python_blocks(text)
            if blocks:
                return TurnAction("tool_call", tool=code_block_tool, arguments=blocks[0])
        return TurnAction("answer", answer=text.strip())


MARKERS = TextFormat("markers", SPECIAL_TOKENS, (END_CALL, EOS))
# `<|eos|>`/`<|pad|>` are listed too so a tiny tokenizer can still be trained on chatml text.
CHATML = TextFormat("chatml", (*SPECIAL_TOKENS, IM_START, IM_END, ENDOFTEXT), (IM_END, ENDOFTEXT))


def text_format(name: str) -> TextFormat:
    formats = {f.name: f for f in (MARKERS, CHATML)}
    try:
        return formats[name]
    except KeyError:
        raise ValueError(f"unknown prompt_format {name!r}; valid: {sorted(formats)}") from None


def extract_code(answer: str) -> str:
    """The program in an answer: the last fenced code block, else the whole text."""
    blocks = _python_blocks(answer)
    return blocks[-1] if blocks else answer


def python_source(arguments: str) -> str:
    """The program a python tool call runs: its fenced block if it has one, dedented. The code and
    math_tools environments both run this (math_tools ran the arguments as written until
    2026-12-06, so a fenced call was a SyntaxError there and ran in the code environment)."""
    return textwrap.dedent(extract_code(arguments)).strip("\n")
