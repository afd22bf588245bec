"""Cache wrappers: a model or tool call seen before (same model, messages, sampling, seed) is not paid twice.
A model's key holds its identity (`identity_of`): what it serves, not just its name, so a retrained adapter served
again under the same name is never answered from the old cache; and not where it listens, so the same model on
another port (the pipeline starts its servers on a free one) is."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from distill.llm.base import Completion, Usage, identity_of
from distill.core.store import CallCache, stable_hash


class CachedChat:
    """Forwards every other member (`name`, the `retries` a run's summary reads) to the model it caches."""

    def __init__(self, inner, cache: CallCache):
        self.inner = inner
        self.cache = cache
        self.calls = 0  # calls that reached the model
        self._identity: dict | None = None
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    async def identity(self) -> dict:
        """Computed once (it may ask the server and hash weights); concurrent first calls wait for one."""
        if self._identity is None:
            loop = asyncio.get_running_loop()
            if self._lock is None or self._lock[0] is not loop:
                self._lock = (loop, asyncio.Lock())
            async with self._lock[1]:
                if self._identity is None:
                    self._identity = await identity_of(self.inner)
        return self._identity

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        key = stable_hash(
            {"model": await self.identity(), "messages": messages, "temperature": temperature, "max_tokens": max_tokens,
             "stop": stop, "seed": seed}
        )
        hit = self.cache.get(key)
        if hit is not None:
            return Completion(hit["text"], Usage(**hit["usage"]), hit["latency_s"], hit["cost_usd"], hit["model"], True)
        self.calls += 1
        out = await self.inner.chat(messages, temperature=temperature, max_tokens=max_tokens, stop=stop, seed=seed)
        self.cache.put(key, asdict(out), kind="model")
        return out

    def __getattr__(self, item):
        return getattr(self.inner, item)


class CachedTool:
    """Forwards every other member (`name`, `description`, the LLM tool's `calls`) to the tool it caches. The key
    holds the tool's `cache_settings` where it has them (Wikipedia's corpus, top_k, max_chars): a rerun with
    other settings is never answered with the old paragraphs."""

    def __init__(self, inner, cache: CallCache, scope: str = ""):
        self.inner = inner
        self.cache = cache
        self.scope = scope  # e.g. the question id for a per-question Wikipedia

    async def run(self, query: str) -> str:
        key = stable_hash({"tool": self.name, "scope": self.scope, "input": query,
                           "settings": getattr(self.inner, "cache_settings", None)})
        hit = self.cache.get(key, kind="tool")
        if hit is not None:
            return hit
        out = await self.inner.run(query)
        self.cache.put(key, out, kind="tool")
        return out

    def __getattr__(self, item):
        return getattr(self.inner, item)
