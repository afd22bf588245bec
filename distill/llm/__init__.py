"""Model backends behind one async chat interface (`ChatModel`)."""

from __future__ import annotations

from types import SimpleNamespace

from distill.llm.base import ChatModel, Price, identity_of
from distill.llm.cached import CachedChat


def price_for(spec, prices: dict[str, dict[str, float]] | None = None) -> Price:
    if spec.prompt_per_mtok is not None or spec.completion_per_mtok is not None:
        return Price(spec.prompt_per_mtok or 0.0, spec.completion_per_mtok or 0.0)
    entry = (prices or {}).get(spec.model)
    if entry is None and spec.backend == "openai" and not spec.base_url:
        entry = (prices or {}).get(spec.model.split("/")[-1])
    return Price(**entry) if entry else Price()


_LOADED: dict[tuple, ChatModel] = {}


def build_chat(spec, prices: dict | None = None, cache=None) -> ChatModel:
    """Build a backend from a ModelSpec. In-process models are loaded once per process and shared."""
    price = price_for(spec, prices)
    if spec.backend == "transformers":
        from distill.llm.transformers_backend import TransformersChat

        key = (spec.model, spec.dtype, spec.device, price)
        if key not in _LOADED:
            _LOADED[key] = TransformersChat(spec.model, price=price, dtype=spec.dtype, device=spec.device)
        model = _LOADED[key]
    else:
        from distill.llm.openai_backend import OpenAIChat

        model = OpenAIChat(
            spec.model, spec.base_urls, spec.api_key_env, price, spec.max_concurrency, spec.timeout_s, spec.max_retries,
            spec.tokenizer, spec.max_retry_after_s,
        )
    return model if cache is None else CachedChat(model, cache)



async def spec_identity(spec) -> dict:
    """What a ModelSpec's endpoint serves, as the call cache keys it (`identity_of`), without loading any
    weights: a run's fingerprint needs it before its first call."""
    if spec.backend == "transformers":
        return await identity_of(SimpleNamespace(name=spec.model))
    from distill.llm.openai_backend import OpenAIChat

    model = OpenAIChat(spec.model, spec.base_urls, spec.api_key_env, timeout_s=spec.timeout_s,
                       max_retries=spec.max_retries, max_retry_after_s=spec.max_retry_after_s)
    return await model.identity()
