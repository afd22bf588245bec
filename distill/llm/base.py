"""One async chat interface for every model backend, with usage, latency and cost on every call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable


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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["usage"] = asdict(self.usage)
        return d


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens; zero for local models."""

    prompt_per_mtok: float = 0.0
    completion_per_mtok: float = 0.0

    def cost(self, usage: Usage) -> float:
        return (usage.prompt_tokens * self.prompt_per_mtok + usage.completion_tokens * self.completion_per_mtok) / 1e6


@runtime_checkable
class ChatModel(Protocol):
    name: str

    async def chat(
        self,
        messages: list[dict],
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        stop: list[str] | None = None,
        seed: int | None = None,
    ) -> Completion: ...
