"""Step 5: evaluate ReWOO with different Planners against ReAct and Direct, the Solver fixed.

    distill eval --config configs/eval_hotpot_trivia_7b.yaml [--set tool_failure_rate=1.0]

Every method answers the same questions with the same Solver and per-question tools, so between ReWOO rows
only the Planner changes (teacher few-shot, distilled student and untuned base zero-shot; `replan: true` rows
re-plan on surprise), and between ReWOO and the baselines only how the Solver model is driven. Evaluation
writes records only, to `<output_dir>/records/<method>.jsonl` (resumable, see distill.core.run): `distill report`
recomputes every number from them.

Questions: the first `n` distinct questions of each dataset in file order, not a sample, so every method and
every later, larger run sees the same questions and raising `n` only adds (and resumes).

`tool_failure_rate`: each tool call fails with that probability, decided by a hash of (seed, example id,
tool, input), so a rerun, or another method making the same call, fails the same calls; the Worker turns a
failure into `No evidence found`. The `robustness:` sweep reruns each listed method at each rate as a method
of its own (`teacher@fail0.3`, own records and cache, optionally on the first `n` questions); its records
carry `robustness_of` so the report sets them beside the main run instead of in the main tables.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field, StringConstraints, field_validator, model_validator

from distill.agent.baselines import direct_messages, react_messages
from distill.agent.factory import build_agent
from distill.core import layout, stage
from distill.core.check import CallKind, TokenCounter, estimate_stage, show_config
from distill.core.config import SERVER_PLACEHOLDER, AgentConfig, ModelSpec, PlannerPrompt, Strict, fill_server, validate
from distill.core.data import DatasetSource, check_unique_ids, load_source
from distill.core.errors import DistillError
from distill.core.metrics import JUDGE_MAX_TOKENS, judge_messages
from distill.core.run import (MAX_BOOTSTRAP_SAMPLES, CostCap, add_judgement, build_judge, check_fingerprint,
                              fingerprint, manifest_header, model_identities, read_manifest, run_lifecycle, run_records,
                              settings_of, source_digests, with_identity)
from distill.core.store import CallCache, JsonlStore
from distill.core.tracking import ReportTo, open_tracker, require
from distill.llm import check_prices
from distill.llm.base import weights_fingerprint
from distill.reporting.provenance import served_adapters
from distill.rewoo.plan import duplicate_steps
from distill.rewoo.prompts import planner_messages, solver_messages
from distill.rewoo.record import Count, Seconds, Shape, TokensShape, TrajectoryRecord
from distill.rewoo.worker import InjectedToolFailure
from distill.tools.registry import tool_descriptions
from distill.training import launch
from distill.training.merge import check_as_trained

# An evaluation's output: one JSONL of records per method under RECORDS_DIR (distill.core.layout), a record keyed by
# `record_key`; the report reads them back through these two names.
RECORDS_DIR = layout.RECORDS_DIR
ERRORS = "errors.jsonl"  # failed attempts of every method, keyed (method, id); a rerun retries them
BASELINE_NAMES = ("react", "direct")
_METHOD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # it becomes a file name


def record_key(rec: dict) -> tuple[str, str]:
    """One record per (method, question): a resumed run and the report both keep the first."""
    return (rec["method"], rec["id"])


class ReactActionShape(Shape):
    tool: str | None  # None: an action that did not parse
    input: str = ""
    error: str | None = None


class ReactStepShape(Shape):
    action: ReactActionShape


class ReactShape(Shape):
    steps: list[ReactStepShape]
    finished: bool = False


class FullTokensShape(TokensShape):
    planner: Count
    solver: Count
    tools: Count
    total: Count


class EvalRecord(TrajectoryRecord):
    """One method's answer to one evaluation question: the trajectory record plus what `run_method` adds, as
    `distill report` reads it. Every number the report computes comes from a field required here."""

    method: str = Field(min_length=1)
    kind: Literal["rewoo", "react", "direct"]
    answers: list[Annotated[str, StringConstraints(pattern=r"\S")]] = Field(min_length=1)
    planner_prompt: str | None = None
    tokens: FullTokensShape
    llm_calls: Count
    wall_s: Seconds
    react: ReactShape | None = None
    tool_failure_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    robustness_of: str | None = None
    gold_hops: Count | None = None
    question_type: str | None = None
    # ReWOO: steps repeating an earlier step's tool and input (`rewoo.plan.duplicate_steps`); None for the
    # baselines and in records made before the field (the report counts those from their plan's steps)
    duplicate_steps: Count | None = None

    @model_validator(mode="after")
    def _by_kind(self) -> "EvalRecord":
        if self.kind == "rewoo" and self.planner is None:
            raise ValueError("planner: a rewoo record needs its planner call")
        return self


class PlannerEntry(Strict):
    """One ReWOO row of the report: a Planner endpoint, the prompt it is given, and whether it re-plans on
    surprise (method rewoo+replan, with the config's replan_on and max_replans)."""

    name: str
    """the row's name in the report (teacher and teacher+... rows take a pipeline's teacher)"""
    spec: ModelSpec
    """the planner's endpoint (ModelSpec keys)"""
    prompt: PlannerPrompt
    """the planner prompt: fewshot, full or compact"""
    replan: bool = False
    """re-plan on surprise for this row"""
    compare_to: str | None = None
    """another row's name: the report sets this row against it, paired (an improved student against its SFT self)"""


class RobustnessSweep(Strict):
    """ReWOO, ReWOO+replan and ReAct under tool failures: each method again at each rate (the main run is
    the rate the config's `tool_failure_rate` sets, so that rate is not repeated)."""

    rates: list[float]
    """tool failure rates to run at, e.g. [0.3, 1.0]"""
    methods: list[str]
    """the rows and baselines run at each rate"""
    n: int | None = Field(default=None, ge=1)
    """first n questions of each dataset; null: all of them"""

    @model_validator(mode="after")
    def _check(self) -> "RobustnessSweep":
        if not self.rates or not self.methods:
            raise ValueError("robustness needs both `rates` and `methods`")
        if bad := [r for r in self.rates if not 0.0 < r <= 1.0]:
            raise ValueError(f"robustness.rates: {bad[0]:g} is not in (0, 1] (rate 0 is the main run)")
        for what, values in (("rates", self.rates), ("methods", self.methods)):
            if len(set(values)) < len(values):
                raise ValueError(f"robustness.{what} repeats a value")
        return self


class PromptBudget(Strict):
    """A comparison the report makes only when asked: each of `methods` (ReWOO planners, e.g. students on
    shorter prompts) against the `reference` planner, met when it keeps at least the reference's evidence
    recall with at most `max_prompt_fraction` of its planner prompt tokens."""

    reference: str
    """the planner row whose evidence recall the others are held against"""
    methods: list[str]
    """the rows held against the reference"""
    max_prompt_fraction: float = Field(gt=0.0)
    """the share of the reference's prompt tokens those rows may use"""

    @model_validator(mode="after")
    def _check(self) -> "PromptBudget":
        if not self.methods:
            raise ValueError("prompt_budget.methods: name at least one planner to set against the reference")
        if len(set(self.methods)) < len(self.methods):
            raise ValueError("prompt_budget.methods repeats a value")
        if self.reference in self.methods:
            raise ValueError(f"prompt_budget: {self.reference!r} is the reference; drop it from methods")
        return self


class EvalDatasetSource(DatasetSource):
    """A DatasetSource whose split defaults to the hub's evaluation split rather than `train`."""

    split: str = "validation"
    """the hub split to read (evaluation sets default to validation)"""


class EvalConfig(AgentConfig):
    """`distill eval`. The inherited `solver`, `llm_tool`, tools, `wikipedia_*` and worker settings are shared
    by every method; the inherited `planner`/`planner_prompt` are not used (each entry of `planners` has its own)."""

    planners: list[PlannerEntry] = Field(default_factory=list)
    """the ReWOO planner rows ({name, spec, prompt}), a list or a mapping by name"""
    baselines: list[Literal["react", "direct"]] = Field(default_factory=list)
    """baselines on the same Solver and tools: react, direct"""
    datasets: list[EvalDatasetSource] = Field(default_factory=list)
    """the evaluation questions (see DatasetSource)"""
    output_dir: str = "runs/eval"
    """where records/, the manifest and the report go"""
    seed: int = Field(default=0, ge=0)
    """per-question sampling seeds and the bootstrap's"""
    concurrency: int = Field(default=4, ge=1)
    """questions in flight per method"""
    cache: str | None = "auto"
    """auto: <output_dir>/cache/<method>.sqlite; a path: one shared file; null: off"""
    react_max_steps: int = Field(default=6, ge=1)
    """ReAct baseline: turns per question at most"""
    react_max_tokens: int = Field(default=256, ge=1)
    """ReAct baseline: tokens per turn (a Thought and an Action)"""
    tool_failure_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """share of tool calls made to fail on purpose (robustness)"""
    tool_failure_seed: int = Field(default=0, ge=0)
    """seed of the injected tool failures"""
    judge: ModelSpec | None = None
    """an optional LLM judge of each answer"""
    bootstrap_samples: int = Field(default=1000, ge=1, le=MAX_BOOTSTRAP_SAMPLES)
    """bootstrap resamples behind the report's confidence intervals"""
    robustness: RobustnessSweep | None = None
    """a sweep of tool failure rates after the main run ({rates, methods, n})"""
    prompt_budget: PromptBudget | None = None
    """hold rows against a reference's evidence recall at a fraction of its prompt tokens; off unless set"""
    report_to: ReportTo = Field(default_factory=list)
    """progress figures per method to tensorboard (<output_dir>/tensorboard) and/or wandb; in a pipeline, training's
    report_to applies"""
    max_cost_usd: float | None = Field(default=None, ge=0)
    """dollars for the whole evaluation (every method, earlier runs' records included): it stops (`capped`, exit 2)
    there; none by default"""

    def endpoints(self) -> dict[str, ModelSpec]:
        """The shared models and each planner row's own (the inherited `planner` is not used)."""
        shared = {k: v for k, v in {"solver": self.solver, "llm_tool": self.llm_tool, "judge": self.judge}.items() if v}
        return shared | {f"planners.{p.name}.spec": p.spec for p in self.planners}

    @field_validator("planners", mode="before")
    @classmethod
    def _planners_mapping(cls, value: Any) -> Any:
        """Also accept `{name: {spec, prompt}}`, which `--set planners.student.spec.base_url=...` can reach."""
        if isinstance(value, Mapping):
            return [{"name": name, **(entry or {})} for name, entry in value.items()]
        return value

    @model_validator(mode="after")
    def _check(self) -> "EvalConfig":
        if unused := self.model_fields_set & {"planner", "planner_prompt", "replan"}:
            raise ValueError(
                f"{', '.join(sorted(unused))} is not used by eval: list each planner under `planners:` "
                "with name, spec and prompt (and `replan: true` for ReWOO+replan)"
            )
        names = [p.name for p in self.planners] + list(self.baselines)
        if not names:
            raise ValueError("nothing to evaluate: add `planners:` and/or `baselines:`")
        if bad := [n for n in names if not _METHOD_NAME.match(n)]:
            raise ValueError(f"method name {bad[0]!r} must be letters, digits, '_', '.', '+', '-' (it names a file)")
        if clash := [n for n in (p.name for p in self.planners) if n in BASELINE_NAMES]:
            raise ValueError(f"planner name {clash[0]!r} is reserved for the baseline of that name")
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"method names must be unique; repeated: {', '.join(dupes)}")
        planner_names = [p.name for p in self.planners]
        for p in self.planners:
            if p.compare_to is not None and (p.compare_to not in planner_names or p.compare_to == p.name):
                raise ValueError(f"planners.{p.name}.compare_to: {p.compare_to!r} is not another planner "
                                 "of this config")
        if self.prompt_budget is not None:
            planners = [p.name for p in self.planners]
            if unknown := [m for m in [self.prompt_budget.reference, *self.prompt_budget.methods] if m not in planners]:
                raise ValueError(f"prompt_budget: {unknown[0]!r} is not a planner of this config (only ReWOO "
                                 "planners have a planner prompt)")
        if self.robustness is not None:
            if unknown := [m for m in self.robustness.methods if m not in names]:
                raise ValueError(f"robustness.methods: {unknown[0]!r} is not a planner or baseline of this config")
            if "direct" in self.robustness.methods:
                raise ValueError("robustness.methods: direct calls no tools, so tool failures cannot change it")
            if self.tool_failure_rate in self.robustness.rates:
                raise ValueError(
                    f"robustness.rates: {self.tool_failure_rate:g} is the main run's tool_failure_rate; drop it"
                )
        return self


@dataclass(frozen=True)
class Method:
    name: str
    kind: Literal["rewoo", "react", "direct"]
    prompt: str | None = None  # fewshot | full | compact for ReWOO planners
    spec: ModelSpec | None = None
    replan: bool = False
    tool_failure_rate: float = 0.0
    robustness_of: str | None = None  # a sweep row: the main method it reruns at another failure rate
    compare_to: str | None = None  # a planner row the report pairs this one with, besides the reference


def methods_of(cfg: EvalConfig) -> list[Method]:
    """Planners first, in config order (the first is the reference of the paired comparisons), then baselines,
    then the robustness sweep: each of its methods at each of its rates."""
    rate = cfg.tool_failure_rate
    methods = [Method(p.name, "rewoo", p.prompt, p.spec, p.replan, rate, compare_to=p.compare_to) for p in cfg.planners]
    methods += [Method(b, b, tool_failure_rate=rate) for b in cfg.baselines]
    if cfg.robustness is None:
        return methods
    by_name = {m.name: m for m in methods}
    sweep = [  # `teacher@fail0.3`: configured names may not hold '@', so a derived one never clashes
        replace(by_name[name], name=f"{name}@fail{r:g}", tool_failure_rate=r, robustness_of=name, compare_to=None)
        for name in cfg.robustness.methods
        for r in cfg.robustness.rates
    ]
    return methods + sweep


def tool_fails(rate: float, seed: int, example_id: str, tool: str, query: str) -> bool:
    digest = hashlib.sha256(f"{seed}\x1f{example_id}\x1f{tool}\x1f{query}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


class FailingTool:
    """Wraps a tool so that a deterministic share of its calls fail without reaching it (and cost nothing)."""

    def __init__(self, inner: Any, rate: float, seed: int, example_id: str):
        self.inner = inner
        self.rate, self.seed, self.example_id = rate, seed, example_id
        self.injected = 0

    async def run(self, query: str) -> str:
        if tool_fails(self.rate, self.seed, self.example_id, self.name, query):
            self.injected += 1
            raise InjectedToolFailure(f"injected failure (tool_failure_rate={self.rate:g})")
        return await self.inner.run(query)

    def __getattr__(self, item: str) -> Any:  # name, description, the LLM tool's `calls` (the agents charge them)
        return getattr(self.inner, item)


def with_tool_failures(tools: Mapping[str, Any], rate: float, seed: int, example_id: str) -> dict[str, Any]:
    if rate <= 0.0:
        return dict(tools)
    return {name: FailingTool(tool, rate, seed, example_id) for name, tool in tools.items()}


def gold_hops(example) -> int | None:
    """Hops the dataset says a question needs: the distinct supporting paragraphs when given (HotpotQA:
    2), else 2 for a HotpotQA bridge/comparison type, else unknown (TriviaQA)."""
    if facts := getattr(example, "supporting_facts", None):
        return len({title for title, _ in facts})
    if getattr(example, "type", None) in ("bridge", "comparison"):
        return 2
    return None


def load_eval_examples(cfg: EvalConfig) -> list:
    """The first n distinct questions of each dataset, in file order; an id may occur only once overall."""
    if not cfg.datasets:
        raise DistillError("no datasets configured: add a `datasets:` list with name, source, split and n")
    examples = []
    for ds in cfg.datasets:
        got = load_source(ds, limit=ds.n)
        if ds.n is not None and len(got) < ds.n:
            raise DistillError(f"{ds.source} has only {len(got)} distinct questions, n={ds.n} requested")
        examples.extend(got)
    check_unique_ids(examples, "the datasets")
    return examples


def examples_for(cfg: EvalConfig, method: Method, examples: list) -> list:
    """A sweep row's questions: the first `robustness.n` of each dataset (the main rows get them all)."""
    if method.robustness_of is None or cfg.robustness.n is None:
        return examples
    taken: Counter[str] = Counter()
    kept = []
    for ex in examples:
        taken[ex.dataset] += 1
        if taken[ex.dataset] <= cfg.robustness.n:
            kept.append(ex)
    return kept


def build_method(cfg: EvalConfig, method: Method, cache=None):
    """A fresh agent for one method. Built per method because each method runs under its own event loop,
    and HTTP clients belong to the loop they were first used in (in-process weights are shared anyway)."""
    return build_agent(
        cfg, cache, kind=method.kind, planner=method.spec, planner_prompt=method.prompt, method=method.name,
        seed=cfg.seed, react_max_steps=cfg.react_max_steps, react_max_tokens=cfg.react_max_tokens,
        replan=method.replan,
        wrap_tools=lambda tools, ex: with_tool_failures(tools, method.tool_failure_rate, cfg.tool_failure_seed, ex.id),
    )


# Settings that only the report reads (it takes them from the manifest), and those of one method rather than all:
# left out of the shared part of a method's fingerprint.
_NOT_SHARED = {"planners", "baselines", "robustness", "prompt_budget", "bootstrap_samples", "planner", "planner_prompt",
               "replan", "tool_failure_rate"}
_PLAN_KEYS = {"max_plan_chars", "max_plan_steps", "replan_on", "max_replans"}  # ReWOO's alone
_TOOL_KEYS = {"tools", "llm_tool", "evidence_max_chars", "tool_failure_seed", "wikipedia_backend", "wikipedia_corpus",
              "wikipedia_scope", "wikipedia_top_k", "wikipedia_max_chars"}  # Direct calls no tool


def method_settings(cfg: EvalConfig, method: Method, identities: Mapping[str, Any]) -> dict:
    """What one method's records depend on: its own row, the shared settings it uses (seed, tools, plan limits,
    the Wikipedia scope and corpus, the judge...), each model by what its server serves (a LoRA module by its
    adapter's weights), and the input files. Not `n`: asking for more questions only adds records."""
    data = settings_of(cfg.model_dump(mode="json", exclude=_NOT_SHARED))
    for ds in data["datasets"]:
        ds.pop("n", None)
    drop = set() if method.kind == "react" else {"react_max_steps", "react_max_tokens"}
    drop |= set() if method.kind == "rewoo" else _PLAN_KEYS
    drop |= _TOOL_KEYS if method.kind == "direct" else set()
    data = {k: v for k, v in data.items() if k not in drop}
    for name in ("solver", "llm_tool", "judge"):
        if name in data:
            data[name] = with_identity(data[name], identities.get(name))
    row = {k: v for k, v in asdict(method).items() if k not in ("name", "spec", "compare_to")}
    if method.spec is not None:
        row["planner"] = with_identity(settings_of(method.spec.model_dump(mode="json")), identities[method.name])
    sources = [ds.source for ds in cfg.datasets] + ([cfg.wikipedia_corpus] if method.kind != "direct" else [])
    return data | {"method": row, "inputs": source_digests(sources)}


def run_fingerprints(cfg: EvalConfig, methods: list[Method]) -> dict[str, dict]:
    """{method: {"fingerprint", "settings"}}; every endpoint is asked once what it serves."""
    specs = {"solver": cfg.solver, "llm_tool": cfg.llm_tool, "judge": cfg.judge}
    identities = model_identities(specs | {m.name: m.spec for m in methods if m.spec is not None})
    out = {}
    for method in methods:
        settings = method_settings(cfg, method, identities)
        out[method.name] = {"fingerprint": fingerprint(settings), "settings": settings}
    return out


def records_path(out: Path, method: Method) -> Path:
    return layout.records(out, method.name)


def preflight(cfg: EvalConfig, methods: list[Method], out: Path, runs: dict[str, dict], fresh: bool) -> None:
    """Before any model is loaded: repair torn last lines, and check every existing record file was made with
    this config (its fingerprint), so a mismatch fails at once rather than after the first methods have run."""
    old = read_manifest(layout.manifest(out))
    for method in methods:
        if (path := records_path(out, method)).exists():
            with JsonlStore(path, key=record_key, schema=EvalRecord) as store:  # it says so when it cuts a torn line
                records = store.records()
            made = old.fingerprints.get(method.name) if old else None
            want = runs[method.name]
            check_fingerprint(path, records, want["fingerprint"], want["settings"], made, fresh,
                              f"{method.name} records")


def run_method(cfg: EvalConfig, method: Method, examples: list, out: Path, errors, runs: dict,
               fp: str | None = None, tracker=None, cap=None) -> None:
    """Run (or resume) one method over every example; `runs[method]` gets how it ended, even when it stops.
    `cap` is the run's CostCap, shared by its methods."""

    # cache auto: one file per method, so no method is served another's tool or LLM-tool calls from the cache
    # (which would flatter its latency); reruns of a method still never repeat a call
    with CallCache.open(cfg.cache, out / "cache" / f"{method.name}.sqlite") as cache:
        agent = build_method(cfg, method, cache)
        judge_model = build_judge(cfg, cache)

        async def work(example) -> dict:
            rec = await agent.run(example)
            rec.update(kind=method.kind, planner_prompt=method.prompt, question_type=getattr(example, "type", None),
                       gold_hops=gold_hops(example), tool_failure_rate=method.tool_failure_rate, fingerprint=fp)
            if method.kind == "rewoo":
                rec["duplicate_steps"] = duplicate_steps(rec["plan"]["steps"])
            if method.robustness_of is not None:
                rec["robustness_of"] = method.robustness_of
            await add_judgement(judge_model, example, rec)
            return rec

        items = [((method.name, ex.id), ex) for ex in examples]
        run_records(records_path(out, method), items, work, record_key, errors, concurrency=cfg.concurrency,
                    desc=method.name, keep=lambda result: runs.update({method.name: result.summary()}),
                    schema=EvalRecord, tracker=tracker, cap=cap)


def check_students_as_trained(cfg: EvalConfig, methods: list[Method], fingerprints: Mapping[str, Any]) -> None:
    """A row whose server serves a distill adapter must send it the prompt kind and tools it was trained on (its
    distill_adapter.json says which): otherwise the student is measured on a prompt it never saw, and nothing in
    the numbers would say so."""
    served = served_adapters(fingerprints)
    for method in methods:
        if method.kind == "rewoo" and method.name in served:
            check_as_trained(served[method.name], method.prompt, tool_descriptions(cfg.tools),
                             f"eval planner {method.name}")


def evaluate(cfg: EvalConfig, config_path: str | None = None, fresh: bool = False) -> dict:
    """Run (or resume) every method, writing its records; returns the finished manifest (the report is the
    next stage's job, so it can be rebuilt without running any model). `fresh` sets a method's records made
    with other settings aside instead of refusing them; the methods whose settings match still resume."""
    check_prices(cfg)
    out = Path(cfg.output_dir)
    examples = load_eval_examples(cfg)
    methods = methods_of(cfg)
    manifest = manifest_header("eval", cfg, config_path) | {
        "methods": [{k: v for k, v in asdict(m).items() if k != "spec"} for m in methods],
        "reference": methods[0].name,
        "bootstrap_samples": cfg.bootstrap_samples,
        "seed": cfg.seed,
        "prompt_budget": cfg.prompt_budget.model_dump() if cfg.prompt_budget else None,
        "examples": [[ex.dataset, ex.id] for ex in examples],
    }

    def check() -> None:  # once the folder is ours; the models' servers are asked what they serve
        manifest["fingerprints"] = run_fingerprints(cfg, methods)
        check_students_as_trained(cfg, methods, manifest["fingerprints"])
        preflight(cfg, methods, out, manifest["fingerprints"], fresh)

    require(cfg.report_to)
    with run_lifecycle(out, manifest, check=check), JsonlStore(out / ERRORS) as errors, \
            open_tracker(cfg.report_to, out, "eval") as tracker:
        fps = manifest["fingerprints"]
        t0 = time.perf_counter()
        runs = manifest.setdefault("runs", {})
        cap = CostCap(cfg.max_cost_usd)
        for method in methods:
            run_method(cfg, method, examples_for(cfg, method, examples), out, errors, runs,
                       fps[method.name]["fingerprint"], tracker, cap)
        manifest.update(wall_s_this_run=round(time.perf_counter() - t0, 2))
    return manifest


def check_run(cfg: EvalConfig, check, counter, prefix: str = "", started=()):
    """`--check` of evaluation (the pipeline's too): its config, endpoints and prices, and its estimate, every
    method over its own questions."""
    show_config(f"{prefix.rstrip('.') or 'eval'}: resolved config", cfg.model_dump(mode="json"))
    check.endpoints(cfg.endpoints(), prefix, started)
    check.unpriced(cfg.endpoints(), cfg.prices, prefix)
    examples: list = []
    if not any(ds.source.startswith("hub:") for ds in cfg.datasets):
        try:
            examples = load_eval_examples(cfg)
        except DistillError as exc:
            check.problem(f"{prefix}datasets: {exc}")
    if not examples:
        print(f"{prefix.rstrip('.') or 'eval'}: hub datasets are not read by a check: "
              f"{sum(ds.n or 0 for ds in cfg.datasets)} questions (their `n`), prompts counted without the "
              "question text")
    tools = tool_descriptions(cfg.tools)
    kinds = []
    for method in methods_of(cfg):
        if examples:
            mine = examples_for(cfg, method, examples)
            n, questions = len(mine), [ex.question for ex in mine]
        else:
            per = [ds.n or 0 for ds in cfg.datasets]
            cut = cfg.robustness.n if method.robustness_of is not None and cfg.robustness.n else None
            n, questions = sum(min(p, cut) if cut else p for p in per), [""]
        name = method.name
        if method.kind == "rewoo":
            plans = [planner_messages(q, tools, method.prompt) for q in questions]
            kinds.append(CallKind(f"{name} planner", method.spec, n, 1, plans, method.spec.max_tokens))
            if method.replan:
                kinds.append(CallKind(f"{name} re-plans (at most)", method.spec, n, cfg.max_replans, plans,
                                      method.spec.max_tokens, grows_by=method.spec.max_tokens))
            kinds.append(CallKind(f"{name} solver", cfg.solver, n, 1, [solver_messages(q, (), ()) for q in questions],
                                  cfg.solver.max_tokens, grows_by=method.spec.max_tokens))
        elif method.kind == "react":
            kinds.append(CallKind(f"{name} turns (at most)", cfg.solver, n, cfg.react_max_steps,
                                  [react_messages(q, tools, []) for q in questions], cfg.react_max_tokens))
        else:
            kinds.append(CallKind(f"{name}", cfg.solver, n, 1, [direct_messages(q) for q in questions],
                                  cfg.solver.max_tokens))
        if cfg.judge is not None:
            judged = [judge_messages(q, ex.answers, "") for q, ex in zip(questions, mine)] if examples else \
                [judge_messages("", [""], "")]
            kinds.append(CallKind(f"{name} judge", cfg.judge, n, 1, judged, JUDGE_MAX_TOKENS))
    questions = len(examples) or sum(ds.n or 0 for ds in cfg.datasets)
    estimate = estimate_stage("eval", questions, kinds, cfg.prices, counter)
    check.cost_cap(estimate, cfg.max_cost_usd, prefix.rstrip(".") or "eval")
    if not prefix:  # in a pipeline, training's report_to applies, and the pipeline's check names it
        check.report_to(cfg.report_to, "eval")
    return estimate


# ------------------------------------------------------------------------------------------ command line

def _check(cfg: EvalConfig, check):
    return check_run(cfg, check, TokenCounter())


def _report(cfg: EvalConfig, manifest: dict) -> None:
    for name, run in manifest["runs"].items():
        print(f"{name:<16} {run['records']} records")
    print(f"records: {layout.records_dir(Path(cfg.output_dir))}")
    print(f"next: distill report {cfg.output_dir}")


# ------------------------------------------------------------------------------------------ in the pipeline

def _resolve(p, url: str | None) -> EvalConfig:
    # per-method caches in the output folder: latency stays honest
    section = (launch.trackers(p) | fill_server(p.cfg.eval, url)
               | {"output_dir": str(layout.stage_dir(p.run, layout.EVAL))})
    return validate(EvalConfig, section, "eval")


def _show(p, c):
    """The students' server, then eval's config, endpoints and estimate."""
    p.check_server(c.world, "student_server", c.gpus)
    return check_run(_resolve(p, c.url), c.world, c.counter, "eval.", {c.url})


def _unit(p) -> stage.Unit:
    cfg = _resolve(p, SERVER_PLACEHOLDER)
    settings = settings_of(cfg.model_dump(mode="json")) | {"student_server": p.server_settings("student_server")}
    trained = {n: layout.adapter(p.run, n) for n in p.students()}
    adapters = {layout.in_run(p.run, a): weights_fingerprint(str(a)) for a in trained.values()}
    # an improved adapter is named by its LoRA module under improve/, not by its folder
    adapters |= {f"{layout.IMPROVE}/{m}": weights_fingerprint(a) for m, a in p.improved_adapters().items()}
    sources = [ds.source for ds in cfg.datasets] + [cfg.wikipedia_corpus]
    return stage.Unit(layout.EVAL, layout.stage_dir(p.run, layout.EVAL), settings, adapters | source_digests(sources))


def _work(p) -> dict:
    """Methods whose records were made otherwise (a retrained student) are redone; the others resume."""
    with p.server("student_server") as srv:
        manifest = p.entry("eval")(_resolve(p, srv.base_url if srv else None), p.config_path, fresh=True)
    return {"methods": [m["name"] for m in manifest["methods"]]} | stage.served_by(srv)


STAGE = stage.Stage(layout.EVAL, EvalConfig, "configs/eval_smollm2_cpu.yaml", run=evaluate, check=_check,
                    report=_report, resolve=_resolve, show=_show, unit=_unit, work=_work,
                    after=(layout.TRAIN, layout.IMPROVE))


if __name__ == "__main__":  # `python -m distill.evaluate` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
