"""Typed config of the data-backed environments (`environment.type` in stages.yaml).

`math_tools` (GSM8K / MATH-500 with calculator and Python tools), `search` (BM25 retrieval over a
local passage corpus, NQ questions) and `code` (MBPP / HumanEval with a sandboxed test runner).
The embedded default `arithmetic` lives in models.py. Paths are plain strings: validation stays
pure, and relative paths are resolved when an environment is built (libra_core/envs/datasets.py:
first against the repository root, then against the working directory).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from libra_core.config.base import Frozen

PromptFormat = Literal["markers", "chatml"]
LatencyMs = Annotated[float, Field(ge=0)]
_FORMAT_DOC = (
    "Text protocol: `markers` (<|call|>...<|/call|>, for the locally trained tiny tokenizer) or "
    "`chatml` (<|im_start|>/<|im_end|> turns and <tool_call> tags, for instruct models like SmolLM2)."
)


class EnvRewardWeights(Frozen):
    correct: float = Field(1.0, description="Reward for a correct final answer (all tests pass, EM).")
    well_formed: float = Field(
        0.1,
        description="Reward for a parseable but wrong final answer. search: a floor; a partial answer "
        "gets max(well_formed, min(token F1, 0.99) x correct).",
    )
    malformed: float = Field(0.0, description="Reward when no final answer could be parsed.")

    @model_validator(mode="after")
    def _correct_is_highest(self) -> EnvRewardWeights:
        # Accuracy counts a reward >= `correct` as correct: with `well_formed` or `malformed` at or
        # above it, wrong or missing answers counted as correct (accuracy 1.0) until 2026-12-06.
        if self.correct <= max(self.well_formed, self.malformed):
            raise ValueError(
                f"correct ({self.correct}) must be above well_formed ({self.well_formed}) and "
                f"malformed ({self.malformed}): accuracy counts a reward >= correct as a correct answer"
            )
        return self


class SandboxConfig(Frozen):
    """Limits for running untrusted code (libra_core/envs/sandbox.py; guarantees in docs/environments.md)."""

    isolation: Literal["auto", "namespaces", "rlimits"] = Field(
        "auto",
        description="`namespaces`: unshare net/mount/pid + unprivileged uid (needs root); `rlimits`: "
        "resource limits + Python audit hook only; `auto`: namespaces when available.",
    )
    cpu_time_s: int = Field(3, ge=1, le=600, description="CPU-time limit per execution (RLIMIT_CPU).")
    wall_time_s: float = Field(6.0, gt=0, le=600, description="Wall-clock limit per execution.")
    memory_mib: int = Field(
        512, ge=64, description="Address-space limit per process of an execution (RLIMIT_AS), MiB."
    )
    max_output_bytes: int = Field(
        65536, ge=1024, description="Cap on each of stdout/stderr and on any file written (RLIMIT_FSIZE)."
    )
    max_processes: int = Field(
        16,
        ge=1,
        description="Processes/threads the code may run at once (RLIMIT_NPROC): namespace mode, under its "
        "own uid; rlimits mode when not root too, where it counts all of the user's processes (as root "
        "it does not apply and the audit hook refuses forks).",
    )
    max_workdir_mib: int = Field(
        64,
        ge=1,
        le=4096,
        description="Namespace mode: size of the working folder, a tmpfs (held in memory), which bounds "
        "the total disk use of one execution; rlimits mode bounds each file only.",
    )
    max_workdir_files: int = Field(
        4096,
        ge=16,
        le=1_000_000,
        description="Namespace mode: files and folders the code may create in its working folder "
        "(the tmpfs's inodes; each costs ~1 KiB of kernel memory, which `max_workdir_mib` does not "
        "count); one more fails with ENOSPC. rlimits mode: unbounded.",
    )
    workdir_root: str | None = Field(
        None, description="Where per-run temporary folders are created; null: the system temp folder."
    )


class MathToolsEnvConfig(Frozen):
    """GSM8K / MATH-500 word problems solved with a calculator and a sandboxed Python tool."""

    type: Literal["math_tools"] = Field(description="Math word problems with calculator and Python tools.")
    data_dir: str = Field(
        "../shared/data",
        min_length=1,
        description="Folder the `files` are relative to (see datasets/README.md).",
    )
    files: tuple[str, ...] = Field(
        ("gsm8k/train.jsonl",),
        min_length=1,
        description="JSONL files of problems: GSM8K (question/answer '#### N'), MATH (problem/answer) "
        "or the Libra format (id/question/answer).",
    )
    prompt_format: PromptFormat = Field("markers", description=_FORMAT_DOC)
    max_turns: int = Field(8, ge=1, description="Most model turns (tool calls + answer) per trajectory.")
    max_observation_chars: int = Field(400, ge=16, description="Tool output longer than this is truncated.")
    tool_timeout_s: float = Field(2.0, gt=0, description="Calculator calls slower than this return timeout.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Limits of the Python tool.")
    reward: EnvRewardWeights = Field(default_factory=EnvRewardWeights, description="Reward levels.")
    answer_check_timeout_s: float | None = Field(
        10.0,
        gt=0,
        description="Deadline of one final-answer check, run in a worker process "
        "(libra_core/envs/answer_worker.py); a slower check counts as a well-formed wrong answer. "
        "null: check in-process, with only the lexical screen against huge expressions.",
    )

    def data_files(self) -> tuple[str, ...]:
        """The files (relative to `data_dir`) the environment reads; their contents shape a warm-up."""
        return self.files


class SearchEnvConfig(Frozen):
    """Open-domain QA with a BM25 search tool served over HTTP by a local process."""

    type: Literal["search"] = Field(description="Question answering with a local BM25 search service.")
    data_dir: str = Field("../shared/data", min_length=1, description="Folder the files are relative to.")
    passages_file: str = Field(
        "search/wiki_passages_flashrag.jsonl",
        description="JSONL passages: {id, contents} ('\"Title\"\\ntext').",
    )
    questions_file: str = Field(
        "search/nq_test_sample.jsonl", description="JSONL questions: {id, question, golden_answers}."
    )
    question_sources: tuple[Literal["nq", "passage_titles"], ...] = Field(
        ("nq", "passage_titles"),
        min_length=1,
        description="`nq`: the questions file; `passage_titles`: 'which article says <snippet>?' "
        "questions generated from the passages (answerable from the corpus, used for SFT warm-up).",
    )
    prompt_format: PromptFormat = Field("markers", description=_FORMAT_DOC)
    top_k: int = Field(
        3, ge=1, le=20, description="Default passages per search (a call may ask for 1..max_top_k)."
    )
    max_top_k: int = Field(5, ge=1, le=50, description="Most passages one call may request.")

    @model_validator(mode="after")
    def _top_k_fits(self) -> SearchEnvConfig:
        if self.top_k > self.max_top_k:  # the service capped it silently until 2026-12-06
            raise ValueError(f"top_k ({self.top_k}) must be at most max_top_k ({self.max_top_k})")
        return self

    max_passage_chars: int = Field(
        300, ge=32, description="Each returned passage is cut to this many characters."
    )
    latency_ms: tuple[LatencyMs, LatencyMs] = Field(
        (5.0, 40.0),
        description="Extra service latency per request, drawn uniformly from [lo, hi] ms, each >= 0 (models "
        "a remote index; (0, 0) disables it). Only the service Libra starts itself: ignored with "
        "service_url.",
    )
    service_url: str | None = Field(
        None, description="Use an already running service at this URL instead of starting one."
    )
    request_timeout_s: float = Field(5.0, gt=0, description="HTTP timeout of one search; beyond it: timeout.")
    max_turns: int = Field(4, ge=1, description="Most model turns (searches + answer) per trajectory.")
    reward: EnvRewardWeights = Field(default_factory=EnvRewardWeights, description="Reward levels.")

    def data_files(self) -> tuple[str, ...]:
        """The files (relative to `data_dir`) the environment reads; their contents shape a warm-up."""
        questions = (self.questions_file,) if "nq" in self.question_sources else ()
        return (self.passages_file, *questions)


class CodeEnvConfig(Frozen):
    """MBPP / HumanEval: write a function, run it against tests in the sandbox."""

    type: Literal["code"] = Field(description="Python programming problems checked by sandboxed tests.")
    data_dir: str = Field("../shared/data", min_length=1, description="Folder the files are relative to.")
    files: tuple[str, ...] = Field(
        ("code/mbpp.jsonl",),
        min_length=1,
        description="JSONL(.gz) files: MBPP (text/code/test_list), HumanEval (prompt/test/entry_point) "
        "or the Libra code format (id/question/tests).",
    )
    prompt_format: PromptFormat = Field("markers", description=_FORMAT_DOC)
    max_turns: int = Field(4, ge=1, description="Most model turns (test runs + final answer) per trajectory.")
    max_observation_chars: int = Field(
        400, ge=16, description="Execution output longer than this is truncated."
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Limits of code execution.")
    reward: EnvRewardWeights = Field(default_factory=EnvRewardWeights, description="Reward levels.")

    def data_files(self) -> tuple[str, ...]:
        """The files (relative to `data_dir`) the environment reads; their contents shape a warm-up."""
        return self.files


def default_environment_type(value: object) -> object:
    """Before-validator of `LibraConfig.environment`: a mapping without `type` is the embedded task.

    Keeps `environment: {max_ops: 6}` meaning the arithmetic task, as before the union existed.
    """
    if isinstance(value, dict) and "type" not in value:
        return {"type": "arithmetic", **value}
    return value
