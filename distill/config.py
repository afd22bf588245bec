"""Typed configs: flat YAML whose keys are pydantic field names; `--set key=value` flags override them.

Nested objects are used only where a config names a model endpoint (`planner`, `solver`, ...), since one
endpoint has several settings of its own. Every bad key is reported, on one line, with its path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from distill.errors import DistillError
from distill.rewoo.plan import DEFAULT_MAX_PLAN_CHARS
from distill.rewoo.prompts import PromptKind, canonical_prompt_kind
from distill.rewoo.worker import SURPRISES, Surprise
from distill.tools.registry import DEFAULT_TOOLS

C = TypeVar("C", bound=BaseModel)
# A planner prompt kind in a config (fewshot | full | compact); the old name `zeroshot` reads as `full`.
PlannerPrompt = Annotated[PromptKind, BeforeValidator(canonical_prompt_kind)]

# Dollars per million tokens. Local models cost nothing; API prices change: override in config.
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "gpt-4o-mini": {"prompt_per_mtok": 0.15, "completion_per_mtok": 0.60},
    "gpt-4o": {"prompt_per_mtok": 2.50, "completion_per_mtok": 10.00},
    "gpt-4.1-mini": {"prompt_per_mtok": 0.40, "completion_per_mtok": 1.60},
    "gpt-4.1": {"prompt_per_mtok": 2.00, "completion_per_mtok": 8.00},
    "gpt-3.5-turbo": {"prompt_per_mtok": 0.50, "completion_per_mtok": 1.50},
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ModelSpec(Strict):
    """One chat endpoint: an OpenAI-compatible server (vLLM, OpenAI, ...) or an in-process transformers model."""

    backend: Literal["transformers", "openai"] = "transformers"
    model: str = "smollm2-135m-instruct"
    base_url: str | list[str] | None = None  # several URLs spread the load across servers
    api_key_env: str | None = None  # the *name* of the env var that holds the key, never the key
    temperature: float = 0.0
    max_tokens: int = 512
    stop: list[str] | None = None  # e.g. ["\nQuestion:"] so a few-shot planner stops after its plan
    max_concurrency: int = 8
    timeout_s: float = 120.0
    max_retries: int = 5  # per call, on 429/5xx/timeouts/dropped connections/bad 200 bodies
    max_retry_after_s: float = 60.0  # a server's Retry-After is honoured up to this; beyond it, this is waited
    prompt_per_mtok: float | None = None  # price override, dollars per million tokens
    completion_per_mtok: float | None = None
    tokenizer: str | None = None  # counts tokens when a server returns no usage
    dtype: str = "float32"  # transformers backend
    device: str = "cpu"  # transformers backend: cpu, cuda, auto

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.backend == "openai" and not self.base_url and not self.api_key_env:
            raise ValueError("an openai backend needs base_url (a local server) or api_key_env (a hosted API)")
        return self

    @property
    def base_urls(self) -> list[str]:
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url or [])


class AgentConfig(Strict):
    """What `distill ask` needs; generation and evaluation configs extend it."""

    planner: ModelSpec = Field(default_factory=ModelSpec)
    solver: ModelSpec = Field(default_factory=lambda: ModelSpec(max_tokens=64))
    llm_tool: ModelSpec | None = None  # the LLM tool's model; defaults to the solver's
    planner_prompt: PlannerPrompt = "fewshot"
    tools: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLS))
    wikipedia_backend: Literal["local", "online"] = "local"
    wikipedia_corpus: str | None = "data/demo/corpus.jsonl"
    wikipedia_scope: Literal["corpus", "question"] = "corpus"  # question: only the example's own paragraphs
    wikipedia_top_k: int = 1
    wikipedia_max_chars: int = 800
    # online backend: a URL or email for the User-Agent (Wikimedia's policy asks for one); requests in flight;
    # retries on rate limits and server faults; seconds per request; the longest wait between two tries
    wikipedia_contact: str | None = None
    wikipedia_max_concurrency: int = 4
    wikipedia_max_retries: int = 5
    wikipedia_timeout_s: float = 10.0
    wikipedia_max_wait_s: float = 20.0
    worker_max_concurrency: int = 8
    tool_timeout_s: float = 30.0
    evidence_max_chars: int = 1500
    max_plan_chars: int = Field(default=DEFAULT_MAX_PLAN_CHARS, ge=1)  # planner output read; the rest: too_long
    max_plan_steps: int = Field(default=6, ge=1)  # HotpotQA needs 2-4; more is too_many_steps, not tool calls
    # re-planning on surprise (off: plain ReWOO): a step whose evidence has a status in replan_on asks the
    # Planner again with the evidence so far, at most max_replans times per question
    replan: bool = False
    replan_on: list[Surprise] = Field(default_factory=lambda: list(SURPRISES))
    max_replans: int = Field(default=1, ge=1)
    cache: str | None = None  # SQLite call cache path; None turns it off
    prices: dict[str, dict[str, float]] = Field(default_factory=lambda: dict(DEFAULT_PRICES))


def parse_overrides(pairs: list[str] | None) -> dict:
    """`key=value` pairs, values read as YAML (so `3`, `true`, `[a, b]` keep their types)."""
    out: dict = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise DistillError(f"--set expects key=value, got {pair!r}")
        dotted, raw = pair.split("=", 1)
        *parents, last = dotted.strip().split(".")
        data = out
        for key in parents:
            data = data.setdefault(key, {})
            if not isinstance(data, dict):
                raise DistillError(f"--set {dotted.strip()}: {key} is not a mapping")
        try:
            data[last] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            data[last] = raw
    return out


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise DistillError(f"config not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise DistillError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise DistillError(f"{path}: a config must be a mapping of keys to values")
    return data


def validate(cls: type[C], data: dict, source: str = "config") -> C:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']}" for err in exc.errors())
        raise DistillError(f"{source}: {problems}") from None


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None) -> C:
    data = _merge(read_yaml(path) if path else {}, parse_overrides(overrides))
    return validate(cls, data, str(path or "config"))


def add_config_args(parser, default: str | None = None) -> None:
    parser.add_argument("--config", default=default, help="YAML config (keys are the config's field names)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override a config key (repeatable; dotted for nested)")


def add_fresh_arg(parser) -> None:
    parser.add_argument("--fresh", action="store_true",
                        help="records in the output folder made with other settings are set aside (renamed, not "
                             "deleted) and made anew; without it such a folder is refused")
