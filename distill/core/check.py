"""`--check` (of `distill pipeline`, `generate` and `eval`): what a run will need and what it will cost, before any
of it is paid for.

A teacher run costs real money and hours, and it is the wrong moment to learn of a missing key, a server that is
not up or a tracker that is not installed when the first question fails, or after training, when the report_to
integration is imported. A check validates every section, prints each stage's resolved config and the commands it
would launch, then asks of the world what the run will ask of it: the API keys named by `api_key_env`, one cheap
call to each endpoint (GET /models; `--offline` skips them; servers the pipeline starts itself are not called),
the `report_to` integrations, the GPUs against the launcher, and the disk under the run folder. Every missing
prerequisite is one line, all of them listed; the estimate of questions, model calls, tokens and dollars counts
the real prompts the agents' own builders make. A check writes nothing and calls no model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from distill.core.errors import DistillError, one_line
from distill.core.secrets import masked_mapping
from distill.core.tracking import INTEGRATIONS
from distill.llm import endpoint_urls, no_price_line, price_for, unpriced_endpoints, unpriced_url
from distill.llm.base import Usage
from distill.llm.embedded import resolve_model_path
from distill.llm.openai_backend import OpenAIChat, ServerError

# Records, the call cache, sft data and two LoRA checkpoints take a few hundred MB; below this a long run may die
# on its last write.
MIN_FREE_BYTES = 2 << 30
ENDPOINT_TIMEOUT_S = 5.0  # GET /models answers at once; a server that takes longer is not up


def add_check_args(parser) -> None:
    parser.add_argument("--check", action="store_true",
                        help="validate, print the resolved config, the commands and the estimated cost, and check "
                             "keys, servers, integrations, GPUs and disk; runs nothing, writes nothing")
    parser.add_argument("--offline", action="store_true", help="with --check: do not call any endpoint")


def wants_check(args) -> bool:
    if getattr(args, "offline", False) and not args.check:
        raise DistillError("--offline goes with --check (a run calls its endpoints)")
    return bool(args.check)


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def show_config(title: str, data: Mapping[str, Any]) -> None:
    """A stage's resolved config, as a YAML block, secrets masked."""
    print(f"--- {title}")
    print(yaml.safe_dump(masked_mapping(dict(data)), sort_keys=False, width=110).rstrip())


@dataclass
class CallKind:
    """One kind of model call a stage makes per question: the endpoint, how many (at most, for re-plans and ReAct
    turns), the prompts the agent's own builder makes for the real questions, what the prompt gains during the
    run that no builder can know in advance (the plan in the Solver's prompt: at most the planner's max_tokens),
    and the longest reply."""

    what: str
    spec: Any
    questions: int  # the work items that make this call (questions x samples; a method's questions)
    per_question: int
    prompts: list[list[dict]]
    completion_tokens: int
    grows_by: int = 0


@dataclass
class StageEstimate:
    stage: str
    questions: int
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    unpriced: set[str] = field(default_factory=set)  # models called off this machine with no price known
    notes: list[str] = field(default_factory=list)
    counted: set[str] = field(default_factory=set)  # how its prompt tokens were counted


class TokenCounter:
    """Tokens of a prompt as the endpoint's tokenizer counts them, where one is on this machine (`tokenizer:` of
    the endpoint, or an in-process model's own), else about one per 4 characters, as the line says."""

    def __init__(self):
        self._loaded: dict[str, Any] = {}

    def _tokenizer(self, spec):
        name = spec.tokenizer or spec.model
        if not name or name == "none":
            return None
        if name not in self._loaded:
            try:
                from transformers import AutoTokenizer

                self._loaded[name] = AutoTokenizer.from_pretrained(resolve_model_path(name), local_files_only=True)
            except Exception:  # not on this machine (no network here, and a check downloads nothing)
                self._loaded[name] = None
        return self._loaded[name]

    def count(self, spec, prompts: list[list[dict]]) -> tuple[float, str]:
        """Mean tokens per prompt (the message texts) and how they were counted."""
        texts = ["\n".join(str(m.get("content") or "") for m in msgs) for msgs in prompts] or [""]
        tok = self._tokenizer(spec)
        if tok is None:
            return sum(max(1, round(len(t) / 4)) for t in texts) / len(texts), f"chars/4 estimate for {spec.model} " \
                "(no local tokenizer)"
        return sum(len(tok.encode(t)) for t in texts) / len(texts), f"{spec.model}'s tokenizer"


def estimate_stage(stage: str, questions: int, kinds: Iterable[CallKind], prices: Mapping | None,
                   counter: TokenCounter) -> StageEstimate:

    est = StageEstimate(stage, questions)
    for kind in kinds:
        mean, how = counter.count(kind.spec, kind.prompts)
        calls = kind.questions * kind.per_question
        prompt = round((mean + kind.grows_by) * calls)
        completion = kind.completion_tokens * calls
        est.calls += calls
        est.prompt_tokens += prompt
        est.completion_tokens += completion
        est.usd += price_for(kind.spec, prices).cost(Usage(prompt, completion))
        if unpriced_url(kind.spec, prices) is not None:
            est.unpriced.add(kind.spec.model)
        est.counted.add(how)
        est.notes.append(f"{kind.what} ({kind.spec.model}): {kind.questions} x {kind.per_question} calls, prompt "
                         f"~{mean:.0f} tokens{f' + {kind.grows_by} of plan' if kind.grows_by else ''}, "
                         f"reply <= {kind.completion_tokens}")
    return est


def dollars(usd: float, unpriced: Iterable[str]) -> str:
    """The estimate's dollars; with models of no known price, their part is unknown, not $0."""
    if not (unpriced := sorted(set(unpriced))):
        return f"${usd:.2f}"
    models = ", ".join(unpriced)
    return (f"${usd:.2f} + " if usd else "") + f"an unknown price (no price for {models})"


def print_estimates(estimates: list[StageEstimate]) -> None:
    """Per stage and in total. Replies are counted at their max_tokens, but neither the evidence in the Solver's
    prompt nor the LLM-tool calls (one per LLM step of a plan) are known before the run: a scale, not a bill."""
    print("--- estimate (replies at max_tokens; evidence and LLM-tool calls, unknown before the run, not counted)")
    for est in estimates:
        print(f"{est.stage}: {est.questions} questions, {est.calls} model calls, {est.prompt_tokens:,} prompt + "
              f"{est.completion_tokens:,} completion tokens, {dollars(est.usd, est.unpriced)} (prompt tokens: "
              f"{'; '.join(sorted(est.counted))})")
        for note in est.notes:
            print(f"    {note}")
    if len(estimates) > 1:
        print(f"total: {sum(e.calls for e in estimates)} model calls, "
              f"{sum(e.prompt_tokens + e.completion_tokens for e in estimates):,} tokens, "
              f"{dollars(sum(e.usd for e in estimates), (m for e in estimates for m in e.unpriced))}")


class Check:
    """Collects the problems of one check; `finish()` prints them, one line each, and gives the exit status."""

    def __init__(self, offline: bool = False, shared_prices: Mapping[str, str] | None = None):
        self.offline = offline
        # endpoint (named as its lines name it, `generate.planner`) -> the setting it takes its model and price
        # from (the pipeline's `teacher`): one fix for all of them, so one line
        self.shared_prices = dict(shared_prices or {})
        self.problems: list[str] = []
        self._pinged: dict[tuple[str, str | None], str | None] = {}
        self._unpriced: dict[str, tuple[int, list[str]]] = {}  # setting -> (its line's index, the takers)

    def problem(self, line: str) -> None:
        if line not in self.problems:  # a section met by two checks is one problem
            self.problems.append(line)

    def unpriced(self, endpoints: Mapping[str, Any], prices: Mapping | None, prefix: str = "") -> None:
        """One line per endpoint off this machine with no price known (distill.llm.unpriced_endpoints), except
        that those taking their model from one setting (`shared_prices`) are one line naming that setting and
        them, since pricing that setting prices them all."""
        for where, spec in endpoints.items():
            name, setting = f"{prefix}{where}", self.shared_prices.get(f"{prefix}{where}")
            if setting is None:
                for line in unpriced_endpoints({where: spec}, prices, prefix):
                    self.problem(line)
            elif (url := unpriced_url(spec, prices)) is not None:
                index, takers = self._unpriced.get(setting, (len(self.problems), []))
                takers.append(name)
                line = no_price_line(setting, spec, url, takers)
                if index == len(self.problems):
                    self.problems.append(line)
                else:
                    self.problems[index] = line
                self._unpriced[setting] = (index, takers)

    def endpoints(self, endpoints: Mapping[str, Any], prefix: str = "", started: Iterable[str] = ()) -> None:
        """Keys and servers of a stage's endpoints; an endpoint at one of `started` (URLs of servers the
        pipeline itself starts) is not called."""
        started = set(started)
        print("--- endpoints")
        missing: dict[str, list[str]] = {}  # env var -> the settings naming it
        down: dict[str, tuple[str, list[str]]] = {}  # url -> (fault, the settings calling it)
        for where, spec in endpoints.items():
            name = f"{prefix}{where}"
            if spec.backend == "transformers":
                print(f"{name}: {spec.model} in process ({spec.device})")
                continue
            if spec.api_key_env and not os.environ.get(spec.api_key_env):
                missing.setdefault(spec.api_key_env, []).append(f"{name}.api_key_env")
            for url in endpoint_urls(spec):
                if url in started:
                    print(f"{name}: {spec.model} on the server the pipeline starts (not called)")
                elif self.offline:
                    print(f"{name}: {spec.model} at {url} (--offline: not called)")
                else:
                    fault = self._ping(url, spec)
                    print(f"{name}: {spec.model} at {url}: {'answers' if fault is None else 'no answer'}")
                    if fault is not None:
                        down.setdefault(url, (fault, []))[1].append(name)
        for env, settings in missing.items():
            self.problem(f"{', '.join(settings)}: environment variable {env} is not set")
        for url, (fault, settings) in down.items():
            self.problem(f"{', '.join(settings)}: {fault}")

    def _ping(self, url: str, spec) -> str | None:
        """One GET /models (no retries, a short timeout): None when the server answers. A refusal counts as an
        answer without a key (the key is reported missing already), as a problem with one."""
        key_env = spec.api_key_env if spec.api_key_env and os.environ.get(spec.api_key_env) else None
        if (url, key_env) in self._pinged:
            return self._pinged[(url, key_env)]
        model = OpenAIChat(spec.model, [url], key_env, max_retries=0, timeout_s=ENDPOINT_TIMEOUT_S)
        fault = None
        try:
            asyncio.run(model.models())
        except ServerError as exc:
            refused = any(f"HTTP {s}" in str(exc) for s in ("401", "403"))
            if exc.retryable or (refused and key_env):
                fault = one_line(exc)
        self._pinged[(url, key_env)] = fault
        return fault

    def report_to(self, report_to: Iterable[str] | str | None, where: str) -> None:
        """Each `report_to` integration must be importable: the run would fail on it after the work before."""
        for name in [report_to] if isinstance(report_to, str) else report_to or []:
            if name in ("none", "all"):
                continue
            module, package = INTEGRATIONS.get(name, (name, name))
            if not importable(module):
                self.problem(f"{where}.report_to: {name} is not installed (pip install {package})")

    def cost_cap(self, estimate: StageEstimate, cap: float | None, where: str) -> None:
        """An estimate above the stage's `max_cost_usd`: the run would stop `capped` part of the way, after
        spending the cap. Said before, when raising the cap or asking fewer questions costs nothing."""
        if cap is not None and estimate.usd > cap:
            part = cap / estimate.usd
            share = f", {'about ' + format(part, '.0%') if part >= 0.01 else 'less than 1%'} of the way" if cap else ""
            self.problem(f"{where}: the estimate {dollars(estimate.usd, ())} exceeds max_cost_usd ${cap:.2f}: the run "
                         f"would stop capped{share}; raise max_cost_usd or ask fewer questions")

    def gpus(self, where: str, wants_gpu: str | None, gpus: int, what: str) -> None:
        """`wants_gpu`: the setting that sizes the stage for GPUs, if any; without GPUs that stage cannot run as
        configured, while one sized for a CPU (the demo's) runs on the CPU as it should."""
        if gpus == 0:
            print(f"{where}: no GPU visible (torch.cuda.device_count() = 0): {what} would run on the CPU")
            if wants_gpu:
                self.problem(f"{where}: no GPU is visible (torch.cuda.device_count() = 0), but {wants_gpu} sizes it "
                             "for GPUs")

    def disk(self, folder: str | Path) -> None:
        """Free space under the run folder (its nearest existing parent: a check creates nothing)."""
        path = Path(folder).absolute()
        while not path.exists():
            path = path.parent
        free = shutil.disk_usage(path).free
        print(f"--- disk: {free / 2**30:.1f} GiB free under {path}")
        if free < MIN_FREE_BYTES:
            self.problem(f"{folder}: only {free / 2**30:.1f} GiB free on its disk (a run needs at least "
                         f"{MIN_FREE_BYTES / 2**30:.0f} GiB)")

    def finish(self) -> int:
        if not self.problems:
            print("check: everything this run needs is there")
            return 0
        print(f"check: {len(self.problems)} problem(s)", file=sys.stderr)
        for line in self.problems:
            print(f"problem: {line}", file=sys.stderr)
        return 2


def gpu_memory() -> list[int]:
    """The total memory of each visible GPU, in bytes (empty without one): what `--check` counts and what the
    pipeline's `train.config: auto` sizes its choice by. Device properties only: no memory is allocated and no
    kernel runs, so asking leaves the GPUs to the processes that train and serve."""
    try:
        import torch

        return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    except Exception as exc:  # a broken CUDA setup is a problem of its own, not a traceback
        raise DistillError(f"cannot query the GPUs: {one_line(exc)}") from None


def gpu_count() -> int:
    return len(gpu_memory())
