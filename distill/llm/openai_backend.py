"""OpenAI-compatible HTTP backend (vLLM, OpenAI, any compatible server) through the official `openai` SDK.

The SDK already retries 429/5xx/timeouts with exponential backoff and jitter (`max_retries`), so we do not
wrap our own loop around it; we add a concurrency cap and spread requests over several base URLs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time

from distill.errors import DistillError
from distill.llm.base import Completion, Price, Usage


def _api_key(env_name: str | None) -> str:
    if env_name is None:
        return "EMPTY"  # local servers (vLLM) accept any key
    key = os.environ.get(env_name)
    if not key:
        raise DistillError(f"environment variable {env_name} is not set (it should hold the API key)")
    return key


class OpenAIChat:
    def __init__(
        self,
        model: str,
        base_urls: list[str] | None = None,
        api_key_env: str | None = None,
        price: Price = Price(),
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        tokenizer: str | None = None,
    ):
        self._key = _api_key(api_key_env)  # read now, so a missing key fails before any work starts
        self._urls = base_urls or [None]
        self._timeout_s, self._max_retries, self._max_concurrency = timeout_s, max_retries, max_concurrency
        self.name = model
        self.price = price
        self._loop = None
        self._next = itertools.cycle(range(len(self._urls)))
        self._inflight = [0] * len(self._urls)
        self.sent = [0] * len(self._urls)  # requests per base URL, to see the load spread
        self._tokenizer_name = tokenizer
        self._tokenizer = None

    def _bind(self) -> None:
        """HTTP clients and the semaphore belong to one event loop; a new `asyncio.run` gets fresh ones.

        The clients get openai's plain `DefaultAsyncHttpxClient`: the wrapper it uses by default closes itself
        from `__del__` on whatever loop is running then, so clients left by an earlier `asyncio.run` (eval runs
        one per method) printed 'Event loop is closed' tracebacks in the next one."""
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        self._clients = [
            AsyncOpenAI(
                base_url=url, api_key=self._key, timeout=self._timeout_s, max_retries=self._max_retries,
                http_client=DefaultAsyncHttpxClient(),
            )
            for url in self._urls
        ]
        self._sem = asyncio.Semaphore(self._max_concurrency)

    def _pick(self) -> int:
        """Least-loaded server, ties broken round-robin, so one slow server does not stall the run."""
        start = next(self._next)
        order = [(start + i) % len(self._clients) for i in range(len(self._clients))]
        return min(order, key=lambda i: self._inflight[i])

    def _count(self, text: str) -> int:
        if self._tokenizer_name and self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_name)
        if self._tokenizer is not None:
            return len(self._tokenizer.encode(text))
        return max(1, round(len(text) / 4))  # rough; only when the server reports no usage and no tokenizer is set

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        from openai import APIConnectionError, APIStatusError

        self._bind()
        async with self._sem:
            i = self._pick()
            self._inflight[i] += 1
            self.sent[i] += 1
            t0 = time.perf_counter()
            try:
                resp = await self._clients[i].chat.completions.create(
                    model=self.name,
                    messages=messages,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    stop=stop or None,
                    seed=seed,
                )
            except APIConnectionError as exc:
                raise DistillError(f"cannot reach {self._clients[i].base_url}: {exc}") from exc
            except APIStatusError as exc:
                if exc.status_code in (400, 401, 403, 404):
                    raise DistillError(f"{self._clients[i].base_url} refused {self.name}: {exc.message}") from exc
                raise
            finally:
                self._inflight[i] -= 1
            latency = time.perf_counter() - t0
        text = resp.choices[0].message.content or ""
        if resp.usage is not None:
            usage = Usage(resp.usage.prompt_tokens, resp.usage.completion_tokens)
        else:
            usage = Usage(sum(self._count(m["content"]) for m in messages), self._count(text))
        return Completion(text, usage, latency, self.price.cost(usage), self.name)
