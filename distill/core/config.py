"""Typed configs: flat YAML whose keys are pydantic field names; `--set key=value` flags override them.

Nested objects are used only where a config names a model endpoint (`planner`, `solver`, ...), since one
endpoint has several settings of its own. Every bad key is reported, on one line, with its path.
"""

from __future__ import annotations

import difflib
import json
import logging
import types
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Mapping, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from distill.core.errors import DistillError
from distill.core.secrets import IN_API_KEY_ENV, USERINFO, credentials_refusal, mask, url_credentials
from distill.rewoo.plan import DEFAULT_MAX_PLAN_CHARS, DEFAULT_MAX_PLAN_STEPS
from distill.rewoo.prompts import PromptKind, canonical_prompt_kind
from distill.rewoo.worker import SURPRISES, Surprise
from distill.tools.registry import DEFAULT_TOOLS

C = TypeVar("C", bound=BaseModel)
log = logging.getLogger(__name__)
_SAID: set[str] = set()  # deprecation lines already logged: a config read again (each pipeline check) says it once
# A planner prompt kind in a config (fewshot | full | compact); the old name `zeroshot` reads as `full`.
PlannerPrompt = Annotated[PromptKind, BeforeValidator(canonical_prompt_kind)]


def _number_not_switch(annotation: Any) -> bool:
    """Whether a setting of this type is a number (int or float, maybe optional) that is not also a bool."""
    members = set(typing.get_args(annotation)) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else {annotation}
    members = {typing.get_args(m)[0] if typing.get_origin(m) is Annotated else m for m in members}
    return bool(members & {int, float}) and not members & {bool, Any}


# Dollars per million tokens. Local models cost nothing; API prices change: override in config.
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "gpt-4o-mini": {"prompt_per_mtok": 0.15, "completion_per_mtok": 0.60},
    "gpt-4o": {"prompt_per_mtok": 2.50, "completion_per_mtok": 10.00},
    "gpt-4.1-mini": {"prompt_per_mtok": 0.40, "completion_per_mtok": 1.60},
    "gpt-4.1": {"prompt_per_mtok": 2.00, "completion_per_mtok": 8.00},
    "gpt-3.5-turbo": {"prompt_per_mtok": 0.50, "completion_per_mtok": 1.50},
}


class Strict(BaseModel):
    """Unknown keys are errors, and no number is infinite or NaN: no setting means either. The string under each
    field is its description, which the generated config reference (docs/reference/config.md) prints."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False,
                              use_attribute_docstrings=True)
    RENAMED: ClassVar[Mapping[str, str]] = {}
    # {old key: the name it has now}: configs written before a rename keep working, with one line saying so
    ADDED: ClassVar[frozenset[str]] = frozenset()
    # keys added after runs were recorded: a fingerprint leaves one out while it holds its default

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any, info: ValidationInfo) -> Any:
        """An old key reads as its new name, with one warning naming both and where the config came from
        (`validate`'s source, or --set); the two at once are one setting given twice, refused rather than one of
        them silently winning."""
        if not cls.RENAMED or not isinstance(data, Mapping):
            return data
        data = dict(data)
        for old, new in cls.RENAMED.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"{old} and {new} are one setting ({old} is its old name): give {new} only")
            data[new] = data.pop(old)
            context = info.context or {}
            origin = " (from --set)" if old in (context.get("overrides") or {}) else ""
            line = (f"{context.get('source', 'config')}: {old}{origin} is the old name of {new}; write {new} (the "
                    "old name still reads, for now)")
            if line not in _SAID:
                _SAID.add(line)
                log.warning("%s", line)
        return data

    def first_named_dump(self, **kwargs) -> dict:
        """`model_dump(mode="json")` with each renamed key under its old name and each added key at its default
        left out, here and in nested settings (not in lists of them): what a fingerprint digests, as it was
        digested before the rename or the addition, so that neither alone redoes finished work."""
        old_name = {new: old for old, new in self.RENAMED.items()}
        dump = self.model_dump(mode="json", **kwargs)
        for key in list(dump):
            value = getattr(self, key)
            if isinstance(value, Strict):
                dump[key] = value.first_named_dump()
            elif key in self.ADDED and value == type(self).model_fields[key].get_default(call_default_factory=True):
                del dump[key]
        return {old_name.get(k, k): v for k, v in dump.items()}

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads true as 1 for a number: `port: true` would listen on port 1 and `max_tokens: yes`
        allow one token. A setting that is a number (and not also a switch) refuses true/false."""
        if isinstance(value, bool) and info.field_name and _number_not_switch(cls.model_fields[info.field_name]
                                                                               .annotation):
            raise ValueError(f"expected a number, not {str(value).lower()}")
        return value


class ModelSpec(Strict):
    """One chat endpoint: an OpenAI-compatible server (vLLM, OpenAI, ...) or an in-process transformers model."""

    backend: Literal["transformers", "openai"] = "transformers"
    """openai: an OpenAI-compatible server (vLLM, OpenAI, ...); transformers: the model in this process"""
    model: str = "smollm2-135m-instruct"
    """the model name the server serves (a LoRA module's name for a student), or the transformers model: embedded
    alias, folder or hub id"""
    base_url: str | list[str] | None = None
    """the server's address, e.g. http://127.0.0.1:8000/v1 (http or https); a list spreads the load across servers;
    "@server" in a pipeline config: the server the stage starts; unset: OpenAI's API"""
    api_key_env: str | None = None
    """the name of the environment variable that holds the API key, never the key itself"""
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """sampling temperature (OpenAI's range; vLLM's is the same in practice); 0 is greedy"""
    max_tokens: int = Field(default=512, ge=1)
    """the longest reply, in tokens"""
    stop: list[str] | None = None
    """strings that end a reply, e.g. ["\\nQuestion:"] so a few-shot planner stops after its plan"""
    max_concurrency: int = Field(default=8, ge=1)
    """calls in flight to this endpoint at once"""
    timeout_s: float = Field(default=120.0, gt=0)
    """seconds one call may take before it is retried"""
    max_retries: int = Field(default=5, ge=0)
    """retries per call on 429/5xx, timeouts, dropped connections and malformed 200 bodies"""
    max_retry_after_s: float = Field(default=60.0, ge=0)
    """a server's Retry-After is honoured up to this many seconds"""
    prompt_per_mtok: float | None = Field(default=None, ge=0)
    """price override: dollars per million prompt tokens (0 for a free model off this machine)"""
    completion_per_mtok: float | None = Field(default=None, ge=0)
    """price override: dollars per million completion tokens"""
    tokenizer: str | None = None
    """tokenizer that counts tokens when a server returns no usage"""
    dtype: str = "float32"
    """transformers backend: the weights' dtype"""
    device: str = "cpu"
    """transformers backend: cpu, cuda or auto"""

    @field_validator("base_url")
    @classmethod
    def _urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        """A bad address is refused when the config is read, naming the setting, not at the first call with a
        client library's traceback (httpx raises OverflowError on port 99999)."""
        for url in [value] if isinstance(value, str) else value or []:
            check_base_url(url)
        return value

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.backend == "openai" and not self.base_url and not self.api_key_env:
            raise ValueError("an openai backend needs base_url (a local server) or api_key_env (a hosted API)")
        return self

    @property
    def base_urls(self) -> list[str]:
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url or [])


# `base_url: "@server"`: the address of a server the pipeline (or an improve round) starts itself, filled in then.
SERVER_PLACEHOLDER = "@server"


def fill_server(obj: Any, url: str | None) -> Any:
    """`@server` anywhere in a config's data (nested dicts and lists) as `url`, the address of the server the
    stage (or improve's round) starts; with none started, a model that asks for one is one line."""
    if isinstance(obj, dict):
        return {k: fill_server(v, url) for k, v in obj.items()}
    if isinstance(obj, list):
        return [fill_server(v, url) for v in obj]
    if obj == SERVER_PLACEHOLDER:
        if url is None:
            raise DistillError(f"a model says base_url: {SERVER_PLACEHOLDER} but this stage starts no server")
        return url
    return obj


def check_base_url(url: str, example: str | None = None) -> None:
    """http(s)://host[:port][/path], or the @server placeholder of a model's base_url (not where `example`, an
    address of another kind, is given); anything else raises ValueError in words. A URL with credentials is
    refused before any other fault is named, so no message repeats its password."""
    if url == SERVER_PLACEHOLDER:
        if example is None:
            return
        raise ValueError(f"{SERVER_PLACEHOLDER!r} names a model server the pipeline starts, not this address; "
                         f"e.g. {example}")
    what = url_credentials(url) or (USERINFO if "@" in url.split("//", 1)[-1].split("/", 1)[0] else None)
    if what:
        raise ValueError(credentials_refusal(what, IN_API_KEY_ENV))
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of 0-65535 or not a number
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a usable URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        if example is not None:
            raise ValueError(f"{url!r}: the scheme must be http or https, e.g. {example}")
        raise ValueError(f"{url!r}: the scheme must be http or https (or the value {SERVER_PLACEHOLDER!r} in a "
                         "pipeline config), e.g. http://127.0.0.1:8000/v1")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host, e.g. http://127.0.0.1:8000/v1")
    if port == 0:
        raise ValueError(f"{url!r}: port 0 is not an address a server listens on (1-65535)")


def url_credentials_in(data: Any, path: tuple = ()) -> tuple[tuple, str] | None:
    """The first value (or mapping key) anywhere in a config's data that holds a URL with credentials, as
    (path, what): every setting of every config, today's and any added later, without naming them."""
    if isinstance(data, str):
        return (path, what) if (what := url_credentials(data)) else None
    if isinstance(data, Mapping):
        for key, value in data.items():
            if isinstance(key, str) and (what := url_credentials(key)):
                return (*path, mask(key)), what
            if found := url_credentials_in(value, (*path, key)):
                return found
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            if found := url_credentials_in(value, (*path, i)):
                return found
    return None


# The ModelSpec keys that say which model an endpoint is: what it is, where it runs, how it is reached and what it
# costs. The pipeline's `teacher:` replaces them as a whole where an endpoint takes the teacher (half of one
# endpoint's address with half of another's is neither); the other keys (max_tokens, temperature, stop, patience)
# belong to the role, a planner's not being a Solver's.
ENDPOINT_IDENTITY = frozenset({"backend", "model", "base_url", "api_key_env", "prompt_per_mtok", "completion_per_mtok",
                               "tokenizer", "dtype", "device"})


class AgentConfig(Strict):
    """What `distill ask` needs; generation and evaluation configs extend it."""

    planner: ModelSpec = Field(default_factory=ModelSpec)
    """the Planner's endpoint: writes the whole plan up front"""
    solver: ModelSpec = Field(default_factory=lambda: ModelSpec(max_tokens=64))
    """the Solver's endpoint: answers from the plan and its evidence"""
    llm_tool: ModelSpec | None = None
    """the LLM tool's endpoint; unset: the Solver's"""
    planner_prompt: PlannerPrompt = "fewshot"
    """the Planner's prompt: fewshot (with exemplars), full (instructions and tool descriptions) or compact (the
    question and the tool names)"""
    tools: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLS))
    """the tools plans may call: Wikipedia, LLM, Calculator, or module:Class of your own"""
    wikipedia_backend: Literal["local", "online"] = "local"
    """local: BM25 over wikipedia_corpus; online: the Wikipedia API"""
    wikipedia_corpus: str | None = "data/demo/corpus.jsonl"
    """local backend: the paragraphs searched (JSONL)"""
    wikipedia_scope: Literal["corpus", "question"] = "corpus"
    """corpus: search every paragraph; question: only the example's own paragraphs"""
    wikipedia_top_k: int = Field(default=1, ge=1)
    """paragraphs returned per search"""
    wikipedia_max_chars: int = Field(default=800, ge=1)
    """characters kept of each paragraph returned"""
    wikipedia_contact: str | None = None
    """online backend: a URL or email for the User-Agent (Wikimedia's policy asks for one)"""
    wikipedia_api_url: str = "https://en.wikipedia.org/w/api.php"
    """online backend: the MediaWiki API searched (another language's Wikipedia, a mirror)"""
    wikipedia_max_concurrency: int = Field(default=4, ge=1)
    """online backend: requests in flight"""
    wikipedia_max_retries: int = Field(default=5, ge=0)
    """online backend: retries on rate limits and server faults"""
    wikipedia_timeout_s: float = Field(default=10.0, gt=0)
    """online backend: seconds per request"""
    wikipedia_max_wait_s: float = Field(default=20.0, ge=0)
    """online backend: the longest wait between two tries"""
    worker_max_concurrency: int = Field(default=8, ge=1)
    """tool calls of one plan run at once (independent steps run together)"""
    tool_timeout_s: float = Field(default=30.0, gt=0)
    """seconds one tool call may take"""
    evidence_max_chars: int = Field(default=1500, ge=1)
    """characters of a tool's output kept as evidence; the rest is cut"""
    max_plan_chars: int = Field(default=DEFAULT_MAX_PLAN_CHARS, ge=1)
    """characters of the Planner's output read; a longer plan is invalid (too_long)"""
    max_plan_steps: int = Field(default=DEFAULT_MAX_PLAN_STEPS, ge=1)
    """steps a plan may have; more is invalid (too_many_steps) and runs no tool"""
    replan: bool = False
    """re-planning on surprise: a step whose evidence has a status in replan_on asks the Planner again with the
    evidence so far (off: plain ReWOO)"""
    replan_on: list[Surprise] = Field(default_factory=lambda: list(SURPRISES))
    """the evidence statuses that trigger re-planning"""
    max_replans: int = Field(default=1, ge=1)
    """re-plans per question at most"""
    cache: str | None = None
    """SQLite call cache path; null turns it off"""
    prices: dict[str, dict[str, Annotated[float, Field(ge=0)]]] = Field(default_factory=lambda: dict(DEFAULT_PRICES))
    """dollars per million tokens per model name ({model: {prompt_per_mtok, completion_per_mtok}}); gpt-4o-mini,
    gpt-4o, gpt-4.1(-mini) and gpt-3.5-turbo are built in"""

    @field_validator("wikipedia_api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        check_base_url(value, example="https://en.wikipedia.org/w/api.php")
        return value

    def endpoints(self) -> dict[str, ModelSpec]:
        """{setting: endpoint} of every model a run of this config calls: what a check of keys, servers and
        prices goes through, each named as its setting."""
        return {k: v for k, v in {"planner": self.planner, "solver": self.solver, "llm_tool": self.llm_tool}.items()
                if v is not None}


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
        if len(raw) > MAX_CONFIG_BYTES:
            raise DistillError(f"--set {dotted.strip()}: the value is too large for a setting")
        try:
            data[last] = _load(raw, f"--set {dotted.strip()}") if raw != "" else ""
        except _DuplicateKey as exc:
            raise DistillError(f"--set {dotted.strip()}: {exc.problem}") from None
        except yaml.YAMLError:
            data[last] = raw  # not YAML: the text as it is
    return out


def _merge(base: dict, over: dict, path: str = "") -> dict:
    """`over` into `base`, mappings merged key by key; a mapping of indices into a list changes those items
    (`--set generate.datasets.0.n=5` edits the first dataset and keeps the rest)."""
    out = dict(base)
    for key, value in over.items():
        here = f"{path}{key}"
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, here + ".")
        elif isinstance(value, dict) and isinstance(out.get(key), list) and value and all(
                isinstance(k, str) and k.isdigit() for k in value):
            out[key] = _merge_items(out[key], value, here)
        else:
            out[key] = value
    return out


def _merge_items(items: list, over: dict, path: str) -> list:
    out = list(items)
    for index, value in over.items():
        i = int(index)
        if i >= len(out):
            raise DistillError(f"--set {path}.{index}: {path} has {len(out)} item(s), numbered from 0")
        both = isinstance(value, dict) and isinstance(out[i], dict)
        out[i] = _merge(out[i], value, f"{path}.{index}.") if both else value
    return out


# A config is a page of settings: a file beyond this is a mistake (a dataset named as a config), and anchors
# that expand beyond this many values are an attack (`a: &a [x, x]`, `b: &b [*a, *a]`, ... doubles each line).
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000
_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (YAML keeps the last one
    silently); `<<: *base` merges still override as they should."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
                    seen.add(key)
        return super().construct_mapping(node, deep)


def _expanded_size(node, memo: dict[int, int]) -> int:
    """Values the node stands for once every alias is expanded (memoised: linear in the nodes written)."""
    if id(node) not in memo:
        memo[id(node)] = 0  # a recursive alias counts once
        children = node.value if isinstance(node, yaml.SequenceNode) else (
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
        memo[id(node)] = min(1 + sum(_expanded_size(c, memo) for c in children), MAX_CONFIG_VALUES + 1)
    return memo[id(node)]


def _load(text: str, where: str):
    """One YAML document; syntax errors and duplicate keys raise PyYAML's errors, an alias bomb or a nesting
    too deep for a config a DistillError."""
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_CONFIG_VALUES:
            raise DistillError(f"{where}: anchors and aliases expand to more than {MAX_CONFIG_VALUES:,} values; "
                               "write the config out instead")
        return loader.construct_document(node)
    except RecursionError:
        raise DistillError(f"{where}: nested too deeply to be a config") from None
    finally:
        loader.dispose()


def load_yaml_text(text: str, where: str):
    """The one YAML reader of configs (files and `--set` values): duplicate keys and alias bombs refused, every
    problem one line naming `where` and the line."""
    try:
        return _load(text, where)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise DistillError(f"{where}{line}: not valid YAML ({exc.problem or exc.context})") from None
    except yaml.YAMLError as exc:
        raise DistillError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DistillError(f"config not found: {path}" if not path.exists() else f"{path}: not a file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise DistillError(f"{path}: {path.stat().st_size:,} bytes is too large for a config "
                           f"(at most {MAX_CONFIG_BYTES:,})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DistillError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
    data = load_yaml_text(text, str(path)) or {}
    if not isinstance(data, dict):
        raise DistillError(f"{path}: a config must be a mapping of keys to values")
    refuse_url_credentials(data, str(path))  # here too: a stage config a pipeline section names is read here
    return data


def error_label(data: Any, loc: tuple) -> str:
    """Where an error is, as the user wrote it: a list a config may also give as a mapping (eval's `planners:
    {name: ...}`, made a list before it is checked) is named by the entry's key, not by its place in the list."""
    parts = []
    for key in loc:
        if isinstance(data, Mapping) and isinstance(key, int) and key not in data and 0 <= key < len(data):
            key = list(data)[key]
        parts.append(str(key))
        data = data.get(key) if isinstance(data, Mapping) else \
            data[key] if isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data) else None
    return ".".join(parts) or "(top)"


def _model_at(cls: Any, loc: tuple) -> type[BaseModel] | None:
    """The pydantic model whose fields the key at `loc` sits among (list places and mapping keys skipped)."""
    model = cls
    for key in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        if isinstance(key, int) or key not in model.model_fields:
            continue
        found, todo = None, [model.model_fields[key].annotation]
        while todo and found is None:
            hint = todo.pop()
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                found = hint
            todo += [a for a in typing.get_args(hint) if a is not type(None)]
        model = found
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def suggestion(name: str, known: Any) -> str:
    """`; did you mean X?` for a misspelt key, or nothing when no known key is close."""
    known = [str(k) for k in known]
    # a shortened or lengthened spelling (`lora_rank` for `lora_r`) before one a letter or two away
    close = [k for k in known
             if len(k) >= 4 and len(str(name)) >= 4 and (k.startswith(name) or str(name).startswith(k))]
    close = close or difflib.get_close_matches(str(name), known, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def _problem(cls: Any, data: Any, err: dict, overrides: Mapping | None) -> str:
    loc = tuple(err["loc"])
    label = error_label(data, loc)
    label = label.replace("\r", "\\r").replace("\n", "\\n")  # a key with a line break stays one line
    if err["type"] != "extra_forbidden" or not loc:
        return f"{label}: {err['msg']}"
    given = overrides or {}
    for key in loc[:-1]:
        given = given.get(key) if isinstance(given, Mapping) else None
    origin = " (from --set)" if isinstance(given, Mapping) and loc[-1] in given else ""
    model = _model_at(cls, loc[:-1])
    hint = suggestion(loc[-1], model.model_fields) if model else ""
    return f"{label}{origin}: unknown key{hint}"


def refuse_url_credentials(data: Any, source: str, overrides: Mapping | None = None) -> None:
    """One line naming the first setting whose URL carries credentials (and `--set` when it came from there),
    never the credentials themselves."""
    if found := url_credentials_in(data):
        loc, what = found
        given = overrides or {}
        for key in loc:
            given = given.get(key) if isinstance(given, Mapping) else \
                given[key] if isinstance(given, list) and isinstance(key, int) and key < len(given) else None
        origin = " (from --set)" if given is not None else ""
        refusal = credentials_refusal(what, IN_API_KEY_ENV) if "base_url" in loc else credentials_refusal(what)
        raise DistillError(mask(f"{source}: {error_label(data, loc)}{origin}: {refusal}"))


def validate(cls: type[C], data: dict, source: str = "config", overrides: Mapping | None = None) -> C:
    """`cls` from `data`, or one line naming every bad key with where it came from (`overrides`: the `--set`
    part of `data`; the rest came from `source`) and, for an unknown key, the close known one. A URL carrying
    credentials, in any setting at all, is refused first, in a line that does not repeat them: otherwise the
    URL goes on into `--check`'s printout, manifests, lock files and logs, and the HTTP client sends its
    user:password as Basic auth in place of the key."""
    refuse_url_credentials(data, source, overrides)
    try:
        return cls.model_validate(data, context={"source": source, "overrides": overrides})
    except ValidationError as exc:
        problems = "; ".join(_problem(cls, data, err, overrides) for err in exc.errors())
        raise DistillError(f"{source}: {problems}") from None


def read_json_model(path: Path, cls: type[C], what: str, remedy: str) -> C | None:
    """A JSON file a stage wrote (a manifest, a stage marker), checked against its model: None when it is
    missing; unreadable or of another shape, one line naming the file, what it should be and `remedy`."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DistillError(f"{path}: not a readable {what} ({reason}); {remedy}") from None
    return validate(cls, data, f"{path} (not a {what}; {remedy})")


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None) -> C:
    """The file, then `--set` over it. A class that names other files in its config (the pipeline's `config:
    FILE`) has `relative_to_file(data, folder)`: the paths the file holds are read from the file's folder, as a
    user who writes them beside each other means, while `--set` paths stay relative to the working directory,
    as every path typed on a command line is."""
    data = read_yaml(path) if path else {}
    if path and (rebase := getattr(cls, "relative_to_file", None)):
        data = rebase(data, Path(path).parent)
    given = parse_overrides(overrides)
    return validate(cls, _merge(data, given), str(path or "config"), given)


def add_config_args(parser, default: str | None = None) -> None:
    parser.add_argument("--config", default=default, help="YAML config (keys are the config's field names)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override a config key (repeatable; dotted for nested)")


def add_fresh_arg(parser) -> None:
    parser.add_argument("--fresh", action="store_true",
                        help="records in the output folder made with other settings are set aside (renamed, not "
                             "deleted) and made anew; without it such a folder is refused")
