"""OpenAI-compatible HTTP backend (vLLM, OpenAI, any compatible server) over plain httpx.

The retry loop is ours, not the SDK's: the SDK retries 429/5xx but cannot see a 200 whose body is HTML,
truncated JSON, `choices: []` or `content: null`, which overloaded proxies and servers do send, and it caps
`Retry-After` where it likes. Every failure, once retries are spent, is one `DistillError` naming the server,
the model and the fault. A concurrency cap bounds requests in flight; several base URLs share the load.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import Counter

import httpx

from distill.core.errors import DistillError, ServerUnreachable, clip
from distill.llm.base import Completion, Price, Usage, openai_urls, weights_fingerprint
from distill.core.retry import Fault, bind, retry_after_s, with_retries
from distill.core.secrets import IN_API_KEY_ENV, remember, url_refusal

# Statuses that mean "not now" rather than "never": rate limits, timeouts and server errors.
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ServerError(DistillError):
    """A model server failed for good; `retryable` tells a caller whether it was the server's fault (and
    might pass) or a refusal of the request (4xx)."""

    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


class ServerDown(ServerError, ServerUnreachable):
    """The server cannot serve this run: retries ran out on its own faults (5xx, timeouts, dropped connections,
    bad bodies), or it refuses every request alike (401/403/404: key, permission, model name). A run stops
    on it at once; a refusal of one request (400: e.g. a prompt over the context) stays that question's error."""


RUN_STOPPING_STATUS = frozenset({"401", "403", "404"})


def _api_key(env_name: str | None) -> str:
    if env_name is None:
        return "EMPTY"  # local servers (vLLM) accept any key
    key = os.environ.get(env_name)
    if not key:
        raise DistillError(f"environment variable {env_name} is not set (it should hold the API key)")
    remember(key)  # whatever the variable is called, a server echoing the key back gets it masked
    return key


def _error_message(resp) -> str:
    """The server's own words, through `clip` (which masks secrets: some servers echo the Authorization header)."""
    try:
        err = resp.json().get("error")
        msg = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        msg = None
    return clip(msg if isinstance(msg, str) and msg else resp.text, 200)


def _parse_json(resp):
    try:
        return resp.json()
    except ValueError:
        raise Fault("malformed body", f"malformed body (not JSON: {clip(resp.text, 80)!r})", retry=True) from None


def _parse_chat(resp) -> tuple[str, object]:
    """The reply text and usage from a 200; a body that is not a chat completion is a retryable fault."""
    body = _parse_json(resp)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices:
        raise Fault("no choices", "no choices in the reply", retry=True)
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise Fault("null content", "the reply's message has no text content", retry=True)
    return content, body.get("usage")  # chat() counts the tokens itself when this is missing or malformed


class OpenAIChat:
    def __init__(
        self, model: str, base_urls: list[str] | None = None, api_key_env: str | None = None, price: Price = Price(),
        max_concurrency: int = 8, timeout_s: float = 120.0, max_retries: int = 5, tokenizer: str | None = None,
        max_retry_after_s: float = 60.0, backoff_s: float = 0.5,
    ):
        self._key = _api_key(api_key_env)  # read now, so a missing key fails before any work starts
        self._urls = openai_urls(base_urls)
        # httpx would send a URL's user:password as Basic auth in place of the key, and every fault line would
        # name the URL: refused here too, for a backend built in code rather than from a checked config
        for url in self._urls:
            if refusal := url_refusal("base_url" if base_urls else "OPENAI_BASE_URL", url, IN_API_KEY_ENV):
                raise DistillError(refusal)
        self._timeout_s, self.max_concurrency = timeout_s, max_concurrency
        self.max_retries, self.max_wait_s, self.backoff_s = max_retries, max_retry_after_s, backoff_s
        self.name, self.price = model, price
        self._next = itertools.cycle(range(len(self._urls)))
        self._inflight = [0] * len(self._urls)
        self.sent = [0] * len(self._urls)  # requests per base URL, to see the load spread
        self.retries = 0  # attempts beyond the first, for a run's summary
        self.faults: Counter[str] = Counter()  # failed attempts by kind ("503", "timeout", "no choices", ...)
        self._tokenizer_name = tokenizer
        self._tokenizer = None

    def _pick(self) -> int:
        """Least-loaded server, ties broken round-robin, so one slow server does not stall the run."""
        start, n = next(self._next), len(self._urls)
        return min(range(n), key=lambda i: (self._inflight[i], (i - start) % n))

    async def _attempt(self, i: int, method: str, path: str, body: dict | None, parse):
        url = self._urls[i]
        async with self._sem:
            self._inflight[i] += 1
            self.sent[i] += 1
            try:
                resp = await self._client.request(method, f"{url}{path}", json=body)
            except httpx.TimeoutException:
                raise Fault("timeout", f"no answer within {self._timeout_s:g}s (timeout_s)", retry=True) from None
            except httpx.ConnectError as exc:
                raise Fault("connect", f"cannot reach it ({clip(str(exc), 120)})", retry=True) from None
            except httpx.HTTPError as exc:  # reset, dropped mid-reply, bad HTTP
                detail = clip(str(exc) or type(exc).__name__, 120)
                raise Fault("dropped", f"connection dropped ({detail})", retry=True) from None
            finally:
                self._inflight[i] -= 1
        if (status := resp.status_code) != 200:
            retry = status in RETRY_STATUS or status >= 500
            wait = retry_after_s(resp.headers.get("retry-after")) if retry else None
            raise Fault(str(status), f"HTTP {status}: {_error_message(resp)}", retry=retry, wait_s=wait)
        return parse(resp)

    async def _call(self, method: str, path: str, body: dict | None, parse, server: int | None = None):
        """One request with bounded retries; a new attempt may go to another base URL unless `server` fixes it."""
        await bind(self, timeout=self._timeout_s, headers={"Authorization": f"Bearer {self._key}"})
        tried: list[int] = []

        async def attempt():
            tried.append(self._pick() if server is None else server)
            return await self._attempt(tried[-1], method, path, body, parse)

        try:
            return await with_retries(self, attempt)
        except Fault as fault:
            stops_run = fault.retry or fault.kind in RUN_STOPPING_STATUS
            raise (ServerDown if stops_run else ServerError)(
                f"model server {self._urls[tried[-1]]} (model {self.name}): {fault.describe()}", fault.retry
            ) from None

    def _count(self, text: str) -> int:
        if self._tokenizer_name and self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_name)
        if self._tokenizer is not None:
            return len(self._tokenizer.encode(text))
        return max(1, round(len(text) / 4))  # rough; only when the server reports no usage and no tokenizer is set

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        body = {"model": self.name, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if stop:
            body["stop"] = stop
        if seed is not None:
            body["seed"] = seed
        t0 = time.perf_counter()
        text, usage = await self._call("POST", "/chat/completions", body, _parse_chat)
        latency = time.perf_counter() - t0
        try:
            used = Usage(int(usage["prompt_tokens"]), int(usage["completion_tokens"]))
        except (TypeError, KeyError, ValueError):
            used = Usage(sum(self._count(str(m.get("content") or "")) for m in messages), self._count(text))
        return Completion(text, used, latency, self.price.cost(used), self.name)

    async def models(self, server: int = 0):
        """GET /models of one base URL: the cheapest call a server answers, so also what `--check` sends."""
        return await self._call("GET", "/models", None, _parse_json, server)

    async def identity(self) -> dict:
        """What is served under this name (CachedChat asks once per run), not where: the pipeline starts its
        servers on a free port, and the same teacher on another port must replay from the cache. vLLM's
        /v1/models gives each model's `root` (the model folder or hub id, a LoRA module's adapter folder);
        where that folder is readable here a hash of its weights goes in too, so an adapter retrained and
        served again as `planner` gets new keys. A server that does not say what it serves (a hosted API) is
        known by its URL and the name alone."""
        served = []
        for url in sorted(set(self._urls)):
            entry: dict = {"base_url": url}
            try:
                models = await self.models(self._urls.index(url))
            except ServerError as exc:
                if exc.retryable:
                    raise  # the server is down: the chat call would fail the same way
                models = None  # a server without /models: its URL and the name are all we know
            data = models.get("data") if isinstance(models, dict) else None
            for m in data if isinstance(data, list) else []:
                if isinstance(m, dict) and m.get("id") == self.name and isinstance(m.get("root"), str):
                    weights = await asyncio.to_thread(weights_fingerprint, m["root"])
                    entry = {"root": m["root"], "parent": m.get("parent"), "weights": weights}
            if entry not in served:
                served.append(entry)
        return {"model": self.name, "servers": served}
