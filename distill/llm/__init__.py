"""Model backends behind one async chat interface (`ChatModel`)."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import urlsplit

from distill.core.errors import DistillError
from distill.llm.base import ChatModel, Price, identity_of, openai_urls
from distill.llm.cached import CachedChat
from distill.llm.openai_backend import OpenAIChat


def _price_entry(spec, prices: dict | None) -> dict | None:
    entry = (prices or {}).get(spec.model)
    if entry is None and spec.backend == "openai" and not spec.base_url:
        entry = (prices or {}).get(spec.model.split("/")[-1])
    return entry


def price_for(spec, prices: dict[str, dict[str, float]] | None = None) -> Price:
    if spec.prompt_per_mtok is not None or spec.completion_per_mtok is not None:
        return Price(spec.prompt_per_mtok or 0.0, spec.completion_per_mtok or 0.0)
    entry = _price_entry(spec, prices)
    return Price(**entry) if entry else Price()


LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


def endpoint_urls(spec) -> list[str]:
    """The URLs an endpoint's calls go to; none for an in-process model."""
    return openai_urls(spec.base_urls) if spec.backend == "openai" else []


def is_local(url: str) -> bool:
    if url == "@server":  # distill.core.config's SERVER_PLACEHOLDER: a server the stage itself starts on this machine
        return True
    host = (urlsplit(url).hostname or "").lower()
    return host in LOCAL_HOSTS or host.startswith("127.")


def unpriced_url(spec, prices: dict | None) -> str | None:
    """The URL off this machine an endpoint calls with no price known (its calls would count as $0), or None."""
    remote = [u for u in endpoint_urls(spec) if not is_local(u)]
    known = spec.prompt_per_mtok is not None or spec.completion_per_mtok is not None or _price_entry(spec, prices)
    return remote[0] if remote and not known else None


def no_price_line(where: str, spec, url: str, takers: list[str] | tuple[str, ...] = ()) -> str:
    """The line for an unpriced endpoint named `where`; `takers`: the endpoints that take their price from it."""
    taken = f" ({', '.join(takers)} take{'s' * (len(takers) == 1)} it)" if takers else ""
    return (f"{where}: model {spec.model!r} at {url} has no price{taken}: set {where}.prompt_per_mtok and "
            f"{where}.completion_per_mtok (dollars per million tokens, 0 if it is free), or add the model to `prices:`")


def unpriced_endpoints(endpoints: dict, prices: dict | None, prefix: str = "") -> list[str]:
    """One line per endpoint that goes off this machine with no price known: its calls would count as $0, so
    `max_cost_usd`, the estimate and the report's cost columns would all be wrong without a word."""
    return [no_price_line(f"{prefix}{where}", spec, url) for where, spec in endpoints.items()
            if (url := unpriced_url(spec, prices)) is not None]


_LOADED: dict[tuple, ChatModel] = {}


def build_chat(spec, prices: dict | None = None, cache=None) -> ChatModel:
    """Build a backend from a ModelSpec. In-process models are loaded once per process and shared."""
    price = price_for(spec, prices)
    if spec.backend == "transformers":
        from distill.llm.transformers_backend import TransformersChat  # torch and transformers: only when asked

        key = (spec.model, spec.dtype, spec.device, price)
        if key not in _LOADED:
            _LOADED[key] = TransformersChat(spec.model, price=price, dtype=spec.dtype, device=spec.device)
        model = _LOADED[key]
    else:
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
    model = OpenAIChat(spec.model, spec.base_urls, spec.api_key_env, timeout_s=spec.timeout_s,
                       max_retries=spec.max_retries, max_retry_after_s=spec.max_retry_after_s)
    return await model.identity()


def check_prices(cfg) -> None:
    """A run's paid endpoints without a price are refused before any call, every one named."""
    if lines := unpriced_endpoints(cfg.endpoints(), cfg.prices):
        raise DistillError("; ".join(lines))
