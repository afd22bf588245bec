"""One async chat interface for every model backend, with usage, latency and cost on every call."""

from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from distill.core.errors import DistillError
from distill.core.secrets import IN_API_KEY_ENV, url_refusal
from distill.core.store import file_digest
from distill.llm.embedded import resolve_model_path


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)


@dataclass
class Completion:
    text: str
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    cost_usd: float = 0.0
    model: str = ""
    cached: bool = False


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens; zero for local models."""

    prompt_per_mtok: float = 0.0
    completion_per_mtok: float = 0.0

    def cost(self, usage: Usage) -> float:
        return (usage.prompt_tokens * self.prompt_per_mtok + usage.completion_tokens * self.completion_per_mtok) / 1e6


class ChatModel(Protocol):
    name: str

    async def chat(
        self, messages: list[dict], *, temperature: float = 0.0, max_tokens: int = 512,
        stop: list[str] | None = None, seed: int | None = None,
    ) -> Completion: ...


def openai_urls(base_urls: list[str] | None) -> list[str]:
    """Where an OpenAI-compatible endpoint's calls go: its base URLs, else the SDK's own default (the
    OPENAI_BASE_URL variable, else OpenAI's API)."""
    default = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    if not base_urls and (refusal := url_refusal("OPENAI_BASE_URL", default, IN_API_KEY_ENV)):
        raise DistillError(refusal)  # before `--check` prints it or a client sends it as Basic auth
    return [u.rstrip("/") for u in (base_urls or [default])]


# Weight files that say which model a folder holds; a retrained adapter changes its adapter_model file.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
def weights_fingerprint(location: str | None) -> str | None:
    """A hash of the weight files under a local folder (or of one file); None when it is not readable here
    (a hub id, a path on the server's machine), in which case the caller's identity keeps only the name."""
    if not location:
        return None
    path = Path(location).expanduser()
    try:
        files = sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES) if path.is_dir() else [path]
        if not files or not all(p.is_file() for p in files):
            return None
        digest = hashlib.sha256()
        for p in files:
            digest.update(f"{p.name}:{file_digest(p)}\n".encode())
        return digest.hexdigest()
    except OSError:
        return None


async def identity_of(model) -> dict:
    """What a cache key must hold so that another model, or retrained weights under the same name, is never
    answered from an old entry. Backends that know more (a server's adapter) define `async identity()`."""
    own = getattr(model, "identity", None)
    if own is not None:
        return await own()

    path = resolve_model_path(model.name)
    weights = await asyncio.to_thread(weights_fingerprint, path)
    return {"model": model.name, "path": str(Path(path).resolve()) if weights else path, "weights": weights}
