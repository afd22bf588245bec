"""Served traffic becomes the next round, and the round is served only when it is better.

    distill flywheel --config configs/flywheel_smollm2_cpu.yaml [--set k=v] [--fresh] [--check]
    distill promote --config configs/flywheel_smollm2_cpu.yaml (--round R | --rollback)

One `distill flywheel` is one round r (the next number under `output_dir`, or the last one again when it did not
finish): the questions `distill serve-agent` answered and got a right answer for in its feedback (the `datasets`
traces folders), less those earlier rounds used, less the `eval_sets` questions, one per normalised question, are
split into train and held-out by a hash of the question, so a question never changes side however much traffic
comes. Round r trains one expert-iteration round (`distill.improve.run_round`) from the adapter in service on the
train side; then one vLLM server serves both adapters (`round_<k>`, the one in service, and `round_<r>`; on a CPU
the server that sampled the round, given `round_<r>` at runtime), and `distill.evaluate` runs each as a ReWOO
planner, with the same Solver, tools and Worker, on the held-out side, which training never saw. The gate
promotes r only when the paired bootstrap interval of the chosen measure (candidate minus incumbent, per question)
lies above 0 and no guard (valid plans, tokens, repeated steps) got worse
past its margin: more traffic must not slowly make the service worse, so a round that is not shown better is kept
out. Every decision is a line of `promotions.jsonl` (append-only; the adapter in service is its last promote or
rollback), every round's numbers are `round_<r>/report.json`, and with `service:` a promotion swaps the running
agents' planner (`promote`): the adapter is loaded into the planner's vLLM server as a LoRA module at runtime, then
each agent's `POST /v1/admin/planner` switches to it; requests in flight finish with the planner they began with.
`distill promote --round R` does that swap alone; `--rollback` returns to the adapter served before the last
promotion.

The question building (`build_questions`, `split_of`) and the gate (`decide`) are pure functions of their inputs,
so they are tested without servers.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import distill.evaluate
import distill.improve
from distill.agent.reward import RewardConfig, answer_in_evidence
from distill.core import layout, stage, traces
from distill.core.config import (AgentConfig, ModelSpec, Strict, add_config_args, check_base_url, fill_server,
                                 load_config, read_json_model, validate)
from distill.core.data import load_source, normalize_question, question_set, rows_to_examples
from distill.core.errors import DistillError, clip
from distill.core.metrics import answer_in_text, evidence_recall, metric_of, paired_bootstrap, score
from distill.core.retry import KEEPALIVE_EXPIRY_S, Fault, retry_after_s, with_retries
from distill.core.run import MAX_BOOTSTRAP_SAMPLES, folder_lock
from distill.core.secrets import mask, remember
from distill.core.store import JsonlStore, iter_jsonl, read_jsonl, write_json, write_jsonl
from distill.evaluate import EvalConfig, EvalRecord
from distill.improve import ImproveConfig, base_model_of, check_run
from distill.llm import build_chat
from distill.rewoo.plan import duplicate_steps, parse_plan
from distill.rewoo.prompts import planner_messages
from distill.rewoo.record import sample_seed
from distill.serving.serve import ServeConfig, platform_of
from distill.tools.registry import tool_descriptions
from distill.training.merge import check_as_trained

PROMOTIONS = "promotions.jsonl"
QUESTIONS = "questions.jsonl"  # a round's questions, both sides
HELDOUT = "heldout.jsonl"  # the held-out side as a dataset file eval reads
ROUND_INFO = "round.json"  # a round whose questions are written: where it started from, the question counts
REPORT = "report.json"
EVAL = "eval"
SERVED = "served"  # the dataset name of a round's questions: answers from feedback, scored by plain EM/F1
SERVED_METRIC = "em_f1"
MEASURES = ("f1", "em", "answer_in_evidence", "recall", "reward")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def module_name(round_: int) -> str:
    """A round's LoRA module name on vLLM (round 0: the config's `adapter`)."""
    return f"round_{round_}"


# ------------------------------------------------------------------------------------------ settings

class MaxWorse(Strict):
    """How much worse than the adapter in service a candidate may be on each guard and still be promoted; null
    turns a guard off. A better measure bought with invalid plans, longer prompts or repeated calls is no gain."""

    plan_valid: float | None = Field(default=0.05, ge=0, le=1)
    """valid-plan rate: the most it may fall (absolute, 0.05 = 5 points)"""
    tokens: float | None = Field(default=0.10, ge=0, le=1)
    """tokens per question: the most they may rise (relative, 0.10 = 10%)"""
    duplicate_steps: float | None = Field(default=0.10, ge=0, le=1)
    """steps repeating an earlier step's call, per plan: the most they may rise (absolute)"""


class GateConfig(Strict):
    """When a round is promoted: the paired bootstrap interval of `measure` (candidate minus the adapter in
    service, per held-out question) at `confidence` lies above 0, and no guard is worse past its margin."""

    measure: Literal["f1", "em", "answer_in_evidence", "recall", "reward"] = "f1"
    """f1, em: the answer against the feedback's answer; answer_in_evidence: a gold answer found in the evidence;
    reward: the planner reward computed from the eval's evidence; recall: gold pages found (needs gold pages,
    which served traffic has none of: refused)"""
    confidence: float = Field(default=0.95, ge=0.5, le=0.999)
    """the level of the interval (alpha = 1 - confidence)"""
    bootstrap_samples: int = Field(default=1000, ge=100, le=MAX_BOOTSTRAP_SAMPLES)
    """bootstrap resamples of the held-out questions"""
    max_worse: MaxWorse = Field(default_factory=MaxWorse)
    """the guards' margins (plan_valid, tokens, duplicate_steps); null turns one off"""

    @field_validator("measure")
    @classmethod
    def _measurable(cls, value: str) -> str:
        if value == "recall":
            raise ValueError("recall needs each question's gold supporting pages, and served traffic has none "
                             "(its answers come from feedback); use f1, em, answer_in_evidence or reward")
        return value


class ServiceConfig(Strict):
    """What a promotion switches: the planner's vLLM server (the round's adapter is loaded into it at runtime;
    start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1) and the agents whose planner it becomes."""

    vllm_url: str
    """the planner's vLLM server, e.g. http://127.0.0.1:8000/v1 (http or https, no credentials)"""
    agents: list[str] = Field(min_length=1)
    """the base URLs of the `distill serve-agent` servers to switch, e.g. [http://127.0.0.1:8080]"""
    token_env: str | None = None
    """the NAME of the environment variable holding the agents' bearer token (their auth_token_env); null: none"""
    timeout_s: float = Field(default=30.0, ge=1, le=600)
    """seconds one request to a server may take"""
    max_retries: int = Field(default=2, ge=0, le=10)
    """retries of a request that timed out, could not connect, or got 429/5xx"""

    @field_validator("vllm_url")
    @classmethod
    def _vllm(cls, value: str) -> str:
        check_base_url(value, example="http://127.0.0.1:8000/v1")
        return value.rstrip("/")

    @field_validator("agents")
    @classmethod
    def _agents(cls, value: list[str]) -> list[str]:
        for url in value:
            check_base_url(url, example="http://127.0.0.1:8080")
        value = [url.rstrip("/") for url in value]
        if len(set(value)) < len(value):
            raise ValueError("an agent is listed twice")
        return value

    @field_validator("token_env")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError("the name of an environment variable (letters, digits, _), never the token itself")
        return value


class FlywheelConfig(ImproveConfig):
    """`distill flywheel` and `distill promote`: improve's keys for the round's training (one expert-iteration
    round; `server` is required, as the evaluation serves both adapters on it), plus the split, the gate and where
    a promotion goes. `adapter` is round 0, the adapter in service before any promotion."""

    method: Literal["expert_iteration"] = "expert_iteration"
    """expert_iteration only: a round trains on its own train side between two evaluations"""
    rounds: int = Field(default=1, ge=1, le=1)
    """1: each `distill flywheel` is one round"""
    output_dir: str = "runs/flywheel"
    """round_<r>/ (questions, samples, adapter, eval, report.json) and promotions.jsonl"""
    leak_policy: Literal["refuse", "exclude"] = "exclude"
    """exclude: traffic questions also in eval_sets are left out (and counted); refuse: stop the round"""
    holdout_fraction: float = Field(default=0.3, ge=0.05, le=0.9)
    """the share of new questions held out for the gate, each side decided by a hash of the normalised question and
    `seed`, so no question ever moves between sides"""
    min_train_questions: int = Field(default=8, ge=1, le=100_000)
    """fewer new train questions: no round (one line, exit 0)"""
    min_holdout_questions: int = Field(default=8, ge=2, le=100_000)
    """fewer new held-out questions: no round (one line, exit 0)"""
    gate: GateConfig = Field(default_factory=GateConfig)
    """when a round is promoted (measure, confidence, bootstrap_samples, max_worse)"""
    diversity_samples: int = Field(default=4, ge=0, le=16)
    """plans sampled per held-out question from each adapter at the planner's temperature, to report how many
    distinct plans (by their steps' tool and input) each writes; 0: not measured"""
    service: ServiceConfig | None = None
    """where a promotion goes ({vllm_url, agents, token_env, timeout_s, max_retries}); null: promotions are only
    logged (swap them in later with distill promote)"""

    @model_validator(mode="after")
    def _flywheel(self) -> "FlywheelConfig":
        if self.server is None:
            raise ValueError("server: the flywheel serves the adapter in service and the new round side by side on "
                             "a vLLM server of its own; give its settings (e.g. {base_model: ..., max_model_len: ...})")
        if not self.datasets:
            raise ValueError("datasets: name the traces folders of the served agents (serve-agent's traces_dir)")
        return self


# what a FlywheelConfig adds to improve's keys: left out of the round's ImproveConfig
FLYWHEEL_KEYS = frozenset(set(FlywheelConfig.model_fields) - set(ImproveConfig.model_fields))


# ------------------------------------------------------------------------------------------ files' schemas

class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _OneLineReason(_Record):
    reason: str

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str) -> str:
        """A reason is printed and read as one line: a line break would split it in two."""
        if "\n" in value or "\r" in value:
            raise ValueError("must be one line")
        return value


class QuestionRow(_Record):
    """A line of round_<r>/questions.jsonl: one question of the round, its answer from feedback, its side and
    where it was read (`traces-000001.jsonl:12`)."""

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answers: list[str] = Field(min_length=1)
    split: Literal["train", "heldout"]
    source: str


class Promotion(_OneLineReason):
    """A line of promotions.jsonl (append-only): what was decided for a round, or swapped by hand."""

    at: str
    action: Literal["promote", "keep", "rollback"]
    round: int = Field(ge=0)
    from_round: int = Field(ge=0)
    model: str
    adapter: str
    measure: str | None = None
    diff: float | None = None
    lo: float | None = None
    hi: float | None = None
    reason: str
    agents: list[str] = Field(default_factory=list)


class QuestionCounts(_Record):
    with_feedback: int = Field(ge=0)
    new: int = Field(ge=0)
    train: int = Field(ge=0)
    heldout: int = Field(ge=0)
    left_out_eval: int = Field(ge=0)
    sources: list[str]


class RoundStart(_Record):
    """round_<r>/round.json: written once the round's questions are, so a rerun resumes the same round with the
    same questions from the same adapter even if traffic or the service changed meanwhile."""

    round: int = Field(ge=1)
    at: str
    from_round: int = Field(ge=0)
    adapter_in: str
    questions: QuestionCounts


class TrainPart(_Record):
    samples: int = Field(ge=0)
    kept: int = Field(ge=0)
    mean_reward: float | None
    global_step: int | None


class Verdict(_Record):
    measure: str
    n: int = Field(ge=0)
    candidate: float
    incumbent: float
    diff: float
    lo: float
    hi: float
    p_value: float
    confidence: float


class Guard(_Record):
    incumbent: float
    candidate: float
    max_worse: float
    ok: bool


class Diversity(_Record):
    samples: int = Field(ge=0)
    incumbent: float | None
    candidate: float | None


class Cost(_Record):
    wall_s: dict[Literal["questions", "train", "eval", "diversity", "total"], float]
    tokens: int = Field(ge=0)
    cost_usd: float = Field(ge=0)


class RoundReport(_OneLineReason):
    """round_<r>/report.json, as the flywheel writes it and `read_round_report` (the report page) reads it."""

    round: int = Field(ge=1)
    at: str
    from_round: int = Field(ge=0)
    adapter_in: str
    adapter: str | None
    questions: QuestionCounts
    train: TrainPart
    verdict: Verdict
    guards: dict[Literal["plan_valid", "tokens", "duplicate_steps"], Guard]
    diversity: Diversity
    decision: Literal["promote", "keep"]
    reason: str
    promoted_to: list[str]
    cost: Cost


def read_round_report(path: str | Path) -> RoundReport:
    """A round's report.json, checked: one line naming the file and the first bad field otherwise."""
    found = read_json_model(Path(path), RoundReport, "flywheel round report", "rerun distill flywheel to remake it")
    if found is None:
        raise DistillError(f"file not found: {path}")
    return found


def read_promotions(path: str | Path) -> list[Promotion]:
    """Every line of promotions.jsonl, each checked; the first bad one is one line naming file:line. None yet:
    an empty log (round 0 in service)."""
    path = Path(path)
    if not path.exists():
        return []
    return [Promotion.model_validate(rec) for _, rec in iter_jsonl(path, Promotion)]


def append_promotion(path: Path, line: Promotion) -> None:
    """One durable line (the store's append: written whole and fsynced, or not at all)."""
    with JsonlStore(path, schema=Promotion) as log:
        log.append(line.model_dump(mode="json"))


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------ the service

def service_stack(cfg_adapter: str, lines: Sequence[Promotion]) -> list[tuple[int, str]]:
    """The adapters served in turn, (round, adapter), the one in service last: round 0 (the config's adapter), each
    promote pushing its round, each rollback returning to the one below. A keep changes nothing."""
    stack = [(0, cfg_adapter)]
    for line in lines:
        if line.action == "promote":
            stack.append((line.round, line.adapter))
        elif line.action == "rollback":
            if len(stack) > 1:
                stack.pop()
            if stack[-1][0] != line.round:  # the log names where it went: believe it over the replay
                stack[-1] = (line.round, line.adapter)
    return stack


def in_service(cfg_adapter: str, lines: Sequence[Promotion]) -> tuple[int, str]:
    """(round, adapter) in service: the last promote or rollback line's, else round 0."""
    return service_stack(cfg_adapter, lines)[-1]


def round_adapter(cfg: FlywheelConfig, round_: int) -> str:
    """The adapter folder of a round (0: the config's `adapter`), refused in one line when it was never trained."""
    if round_ == 0:
        return cfg.adapter
    path = layout.round_dir(Path(cfg.output_dir), round_) / layout.ADAPTER
    if not (path / "adapter_model.safetensors").is_file():
        raise DistillError(f"round {round_} has no trained adapter at {path}; `distill flywheel` trains a round")
    return str(path)


# ------------------------------------------------------------------------------------------ questions

def split_of(question: str, seed: int, holdout_fraction: float) -> Literal["train", "heldout"]:
    """A question's side: a hash of its normalised text and the seed, never of the traffic around it, so adding
    traffic never moves a question from one side to the other."""
    digest = hashlib.blake2b(f"{seed}\x1f{normalize_question(question)}".encode(), digest_size=8).digest()
    return "heldout" if int.from_bytes(digest, "big") / 2**64 < holdout_fraction else "train"


@dataclass
class RoundQuestions:
    """What build_questions made: the round's rows (both sides) and how many were left out for what."""

    rows: list[dict]
    with_feedback: int
    new: int
    left_out_eval: int
    sources: list[str] = field(default_factory=list)

    def side(self, split: str) -> list[dict]:
        return [r for r in self.rows if r["split"] == split]

    def counts(self) -> QuestionCounts:
        return QuestionCounts(with_feedback=self.with_feedback, new=self.new, train=len(self.side("train")),
                              heldout=len(self.side("heldout")), left_out_eval=self.left_out_eval,
                              sources=self.sources)


def build_questions(candidates: Iterable[tuple[str, Any]], used: set[str], eval_keys: set[str], seed: int,
                    holdout_fraction: float, leak_policy: str = "exclude",
                    sources: Sequence[str] = ()) -> RoundQuestions:
    """The round's questions from (where, Example) pairs in reading order: the first of each normalised question,
    those earlier rounds used (`used`, normalised) left out, those of the eval sets (`eval_keys`) left out (or
    refused, leak_policy refuse), each given its side by `split_of`."""
    first: dict[str, tuple[str, Any]] = {}
    for where, ex in candidates:
        first.setdefault(normalize_question(ex.question), (where, ex))
    fresh = {key: item for key, item in first.items() if key not in used}
    leaked = [item[1].question for key, item in fresh.items() if key in eval_keys]
    if leaked and leak_policy == "refuse":
        shown = "; ".join(repr(q) for q in leaked[:3])
        raise DistillError(f"{len(leaked)} served question(s) also appear in eval_sets, e.g. {shown} "
                           "(leak_policy exclude leaves them out)")
    rows = [{"id": ex.id, "question": ex.question, "answers": list(ex.answers),
             "split": split_of(ex.question, seed, holdout_fraction), "source": where}
            for key, (where, ex) in fresh.items() if key not in eval_keys]
    if twice := [i for i, n in Counter(r["id"] for r in rows).items() if n > 1]:
        raise DistillError(f"served id {twice[0]!r} is the id of two different questions across the traces folders; "
                           "ids key the records")
    return RoundQuestions(rows, len(first), len(fresh), len(leaked), list(sources))


def traced_questions(datasets: Sequence[Any]) -> list[tuple[str, Any]]:
    """(traces-file:line, Example) of every served question whose feedback gives a right answer, in the datasets'
    order, read by the loaders improve reads traces with (distill.core.traces, distill.core.data's row checks)."""
    out = []
    for ds in datasets:
        path = Path(ds.source)
        if ds.source.startswith("hub:") or not traces.is_traces_folder(path):
            raise DistillError(f"datasets: {ds.source} is not a traces folder (traces-NNNNNN.jsonl files, what "
                               "`distill serve-agent` writes to its traces_dir): the flywheel learns from served "
                               "traffic")
        numbered = list(traces.training_rows(path))
        where = {}
        for at, row in numbered:
            where.setdefault(row["id"], at)
        examples = rows_to_examples([row for _, row in numbered], SERVED, "train", origin=str(path),
                                    max_question_chars=ds.max_question_chars, metric=SERVED_METRIC)
        out += [(where[ex.id], ex) for ex in examples]
    return out


def used_questions(out: Path, before: int) -> set[str]:
    """The normalised questions of every round before `before` (both sides): a question trains or judges one
    round only."""
    used: set[str] = set()
    for n in round_numbers(out):
        if n < before and (path := layout.round_dir(out, n) / QUESTIONS).is_file():
            used |= {normalize_question(rec["question"]) for _, rec in iter_jsonl(path, QuestionRow)}
    return used


def eval_questions(cfg: FlywheelConfig) -> set[str]:
    return question_set(ex for ds in cfg.eval_sets for ex in load_source(ds))


def round_numbers(out: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in out.glob("round_*") if (m := re.fullmatch(r"round_(\d+)", p.name))
                  and p.is_dir())


def next_round(out: Path) -> tuple[int, RoundStart | None]:
    """The round to run and, when it is resumed, how it started: the last round again when it has no report (with
    its own questions and starting adapter when its round.json says they were written; made anew when a run
    stopped before), else the next number."""
    numbers = round_numbers(out)
    if not numbers:
        return 1, None
    last = layout.round_dir(out, numbers[-1])
    if (last / REPORT).exists():
        return numbers[-1] + 1, None
    return numbers[-1], read_json_model(last / ROUND_INFO, RoundStart, "flywheel round start",
                                        "delete the round's folder to start it anew")


def plan_questions(cfg: FlywheelConfig, r: int) -> RoundQuestions:
    """Round r's questions from the traces, the earlier rounds' questions and the eval sets (read only)."""
    out = Path(cfg.output_dir)
    return build_questions(traced_questions(cfg.datasets), used_questions(out, r), eval_questions(cfg), cfg.seed,
                           cfg.holdout_fraction, cfg.leak_policy, [ds.source for ds in cfg.datasets])


def too_few(cfg: FlywheelConfig, qs: RoundQuestions) -> str | None:
    """The one line saying why no round runs yet, or None when there are enough questions."""
    train, heldout = len(qs.side("train")), len(qs.side("heldout"))
    if train >= cfg.min_train_questions and heldout >= cfg.min_holdout_questions:
        return None
    return (f"flywheel: not enough new questions for a round yet: {train} train and {heldout} held-out of the "
            f"{qs.with_feedback} with usable feedback ({qs.with_feedback - qs.new} used by earlier rounds, "
            f"{qs.left_out_eval} in eval_sets); a round needs {cfg.min_train_questions} train and "
            f"{cfg.min_holdout_questions} held-out (min_train_questions, min_holdout_questions)")


def examples_of(rows: Iterable[dict], split: str, origin: str) -> list:
    mine = [{k: r[k] for k in ("id", "question", "answers")} for r in rows if r["split"] == split]
    return rows_to_examples(mine, SERVED, split, origin=origin, metric=SERVED_METRIC) if mine else []


# ------------------------------------------------------------------------------------------ the gate

def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _gold_pages(rec: Mapping[str, Any]) -> list[str]:
    return list((rec.get("evidence_recall") or {}).get("gold") or [])


def record_reward(rec: Mapping[str, Any], cfg) -> float:
    """The planner reward (distill.agent.reward's formula, `cfg` its RewardConfig) of an eval record, from the evidence
    the eval's Worker found: no tool is called again."""
    plan = rec.get("plan") or {}
    steps = plan.get("steps") or []
    if not plan.get("valid") or not steps:
        return 0.0
    evidence = rec.get("evidence") or []
    ran = sum(e.get("status") == "ok" for e in evidence) / len(evidence) if evidence else 0.0
    golds = _gold_pages(rec)
    extra = max(0, len(steps) - (len(golds) or cfg.free_steps))
    total = cfg.valid_weight + cfg.ran_weight * ran - cfg.step_cost * extra
    if golds:
        total += cfg.recall_weight * evidence_recall(golds, evidence)["recall"]
    else:
        total += cfg.answer_weight * float(answer_in_evidence(rec.get("answers") or [], evidence))
    return total - min(cfg.duplicate_step_penalty * duplicate_steps(steps), max(total, 0.0))


def measure_of(rec: Mapping[str, Any], measure: str, reward_cfg=None) -> float | None:
    """One record's value of the gate's measure; None where it cannot be measured (recall without gold pages)."""
    if measure in ("f1", "em"):
        return float(score(metric_of(rec), rec.get("prediction"), rec["answers"])[measure])
    if measure == "answer_in_evidence":
        text = "\n".join(str(e.get("output") or "") for e in rec.get("evidence") or [] if e.get("status") == "ok")
        return float(answer_in_text(metric_of(rec), rec["answers"], text))
    if measure == "recall":
        golds = _gold_pages(rec)
        return float(evidence_recall(golds, rec.get("evidence") or [])["recall"]) if golds else None
    if measure == "reward":
        return record_reward(rec, reward_cfg or RewardConfig())
    raise DistillError(f"unknown measure {measure!r}; expected one of {', '.join(MEASURES)}")


def guard_values(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The guards' measures over records: valid-plan rate, tokens per question, repeated steps per plan."""
    return {"plan_valid": _mean([float(bool((r.get("plan") or {}).get("valid"))) for r in records]),
            "tokens": _mean([float((r.get("tokens") or {}).get("total", 0)) for r in records]),
            "duplicate_steps": _mean([float(duplicate_steps((r.get("plan") or {}).get("steps") or []))
                                      for r in records])}


def _worse(name: str, incumbent: float, candidate: float, margin: float) -> bool:
    if name == "plan_valid":  # a rate: worse is lower, by points
        return candidate < incumbent - margin - 1e-12
    if name == "tokens":  # worse is higher, relative to the incumbent's
        return candidate > incumbent * (1 + margin) + 1e-9
    return candidate > incumbent + margin + 1e-12  # duplicate steps per plan: worse is higher, absolute


def _g(x: float) -> str:
    return f"{x:.3g}"


def _guard_text(name: str, g: Guard) -> str:
    if name == "plan_valid":
        return f"plan_valid fell {_g(g.incumbent)} -> {_g(g.candidate)} (at most -{_g(g.max_worse)})"
    if name == "tokens":
        rise = (g.candidate / g.incumbent - 1) * 100 if g.incumbent else float("inf")
        return (f"tokens per question rose {g.incumbent:.0f} -> {g.candidate:.0f} (+{rise:.0f}%, at most "
                f"+{g.max_worse * 100:.0f}%)")
    return f"duplicate_steps per plan rose {_g(g.incumbent)} -> {_g(g.candidate)} (at most +{_g(g.max_worse)})"


@dataclass
class Decision:
    decision: Literal["promote", "keep"]
    reason: str
    verdict: Verdict
    guards: dict[str, Guard]


def decide(incumbent: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]], gate: GateConfig,
           from_round: int, seed: int = 0, reward_cfg=None) -> Decision:
    """The gate over two adapters' eval records of the same held-out questions (paired by id; a question only one
    of them answered is left out): promote when the paired bootstrap interval of the measure (candidate minus
    incumbent) at `gate.confidence` lies above 0 and every guard that is on is within its margin."""
    incumbent_by = {r["id"]: r for r in incumbent}
    pairs = [(incumbent_by[r["id"]], r) for r in candidate if r["id"] in incumbent_by]
    values = [(measure_of(a, gate.measure, reward_cfg), measure_of(b, gate.measure, reward_cfg)) for a, b in pairs]
    values = [(a, b) for a, b in values if a is not None and b is not None]
    before = module_name(from_round)
    inc_g, cand_g = guard_values([a for a, _ in pairs]), guard_values([b for _, b in pairs])
    guards = {name: Guard(incumbent=round(inc_g[name], 6), candidate=round(cand_g[name], 6), max_worse=margin,
                          ok=not _worse(name, inc_g[name], cand_g[name], margin))
              for name, margin in gate.max_worse.model_dump().items() if margin is not None}
    inc, cand = [a for a, _ in values], [b for _, b in values]
    boot = paired_bootstrap(cand, inc, n=gate.bootstrap_samples, seed=seed, alpha=1 - gate.confidence) if values \
        else {"diff": 0.0, "lo": 0.0, "hi": 0.0, "p_value": 1.0}
    verdict = Verdict(measure=gate.measure, n=len(values), candidate=round(_mean(cand), 6),
                      incumbent=round(_mean(inc), 6), diff=round(boot["diff"], 6), lo=round(boot["lo"], 6),
                      hi=round(boot["hi"], 6), p_value=round(boot["p_value"], 6), confidence=gate.confidence)
    shown = f"{gate.measure} {verdict.diff:+.3g} [{_g(verdict.lo)}, {_g(verdict.hi)}]"
    if len(values) < 2:  # (the eval failed on the others) no interval to speak of
        return Decision("keep", f"keep {before}: only {len(values)} held-out question(s) measured for both adapters, "
                                "too few to compare", verdict, guards)
    failed = [_guard_text(name, g) for name, g in guards.items() if not g.ok]
    if boot["lo"] > 0 and not failed:
        return Decision("promote", f"{shown} over {before}, guards ok", verdict, guards)
    if boot["lo"] > 0:
        why = f"{shown} over {before} but {'; '.join(failed)}"
    else:
        why = f"{shown} {'is below' if boot['hi'] < 0 else 'includes'} 0" + (f"; {'; '.join(failed)}" if failed else "")
    return Decision("keep", f"keep {before}: {why}", verdict, guards)


def distinct_plans(plans: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]) -> float | None:
    """Mean over questions of how many different plans were sampled for it, a plan being its steps' (tool,
    input) up to case and spacing (text that parses to no step counts as one plan, the empty one)."""
    def key(steps: Sequence[Mapping[str, Any]]) -> tuple:
        return tuple((str(s.get("tool") or "").casefold(), " ".join(str(s.get("input") or "").split()).casefold())
                     for s in steps)

    counts = [len({key(steps) for steps in samples}) for samples in plans.values() if samples]
    return round(_mean(counts), 6) if counts else None


# ------------------------------------------------------------------------------------------ one round

def improve_config(cfg: FlywheelConfig, questions: Path) -> ImproveConfig:
    """The round's ImproveConfig: improve's keys of the flywheel config, its questions file as the dataset (whose
    digest is part of the round's fingerprint), so run_round trains as `distill improve` would."""
    data = cfg.model_dump(mode="json", exclude=set(FLYWHEEL_KEYS))
    data["datasets"] = [{"name": SERVED, "source": str(questions), "metric": SERVED_METRIC}]
    return validate(ImproveConfig, data, "flywheel (its improve keys)")


def eval_config(cfg: FlywheelConfig, url: str, rows_file: Path, out: Path, names: Sequence[str]) -> Any:
    """An EvalConfig of the held-out side: one ReWOO row per module (the first, in service, is the reference),
    greedy as an agent serves, with the round's Solver, tools, Wikipedia and Worker settings."""
    shared = cfg.model_dump(mode="json", include=set(AgentConfig.model_fields) -
                            {"planner", "planner_prompt", "replan", "cache"})
    planner = cfg.planner.model_dump(mode="json") | {"backend": "openai", "base_url": url, "temperature": 0.0}
    data = fill_server(shared, url) | {
        "planners": [{"name": name, "prompt": cfg.planner_prompt, "spec": planner | {"model": name}}
                     for name in names],
        "datasets": [{"name": SERVED, "source": str(rows_file), "split": "heldout", "metric": SERVED_METRIC}],
        "output_dir": str(out), "seed": cfg.seed, "concurrency": cfg.concurrency,
        "bootstrap_samples": cfg.gate.bootstrap_samples}
    return validate(EvalConfig, data, "flywheel (its evaluation)")


def round_server(cfg: FlywheelConfig, adapters: Mapping[str, str], log_path: Path, later: int = 0):
    """The round's vLLM server (improve's, with each adapter as its round's module; `later` runtime modules)."""
    print(f"[flywheel] starting vLLM with {', '.join(adapters)} (log: {log_path})", flush=True)
    return distill.improve.round_server(cfg, adapters, log_path, later)


def server_outlives_training(cfg: FlywheelConfig) -> bool:
    """On a CPU one server samples the round, waits out its training and then evaluates it (a vLLM start is half
    a minute there, and its memory is the machine's); on a GPU the sampling server stops before training, which
    needs the GPU memory the server holds, and a second one evaluates."""
    return platform_of(validate(ServeConfig, cfg.server, "server")) == "cpu"


def sample_diversity(cfg: FlywheelConfig, url: str, names: Sequence[str], examples: Sequence[Any]) -> dict:
    """`diversity_samples` plans per held-out question from each module, at the planner's own sampling settings:
    {name: distinct plans per question, "tokens": int, "cost_usd": float}."""
    descriptions = tool_descriptions(cfg.tools)
    spec_of = {n: ModelSpec.model_validate(cfg.planner.model_dump() | {"backend": "openai", "base_url": url,
                                                                       "model": n}) for n in names}

    async def run() -> dict:
        totals = {"tokens": 0, "cost_usd": 0.0}
        sem = asyncio.Semaphore(cfg.concurrency)
        out: dict[str, Any] = {}
        for name in names:
            spec = spec_of[name]
            chat = build_chat(spec, cfg.prices, None)

            async def one(ex, k):
                async with sem:
                    done = await chat.chat(planner_messages(ex.question, descriptions, cfg.planner_prompt),
                                           temperature=spec.temperature, max_tokens=spec.max_tokens, stop=spec.stop,
                                           seed=sample_seed(ex.id, k, cfg.seed))
                totals["tokens"] += done.usage.total_tokens
                totals["cost_usd"] += done.cost_usd
                plan = parse_plan(done.text, tools=list(descriptions), max_plan_chars=cfg.max_plan_chars,
                                  max_plan_steps=cfg.max_plan_steps)
                return ex.id, [{"tool": s.tool, "input": s.input} for s in plan.steps]

            got = await asyncio.gather(*(one(ex, k) for ex in examples for k in range(cfg.diversity_samples)))
            plans: dict[str, list] = {}
            for qid, steps in got:
                plans.setdefault(qid, []).append(steps)
            out[name] = distinct_plans(plans)
        return out | totals

    return asyncio.run(run())


def eval_records(out: Path, name: str) -> list[dict]:
    """One method's eval records, the first per question (as the eval's own store keeps them)."""
    path = layout.records(out, name)
    first: dict[str, dict] = {}
    for rec in read_jsonl(path, EvalRecord) if path.exists() else []:
        first.setdefault(rec["id"], rec)
    return list(first.values())


def _usage(records: Iterable[Mapping[str, Any]]) -> tuple[int, float]:
    tokens = cost = 0
    for rec in records:
        total = (rec.get("tokens") or {}).get("total")
        if total is None:  # improve's samples: the planner call only
            usage = (rec.get("planner") or {}).get("usage") or {}
            total = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        tokens += int(total)
        cost += float(rec.get("cost_usd") or (rec.get("planner") or {}).get("cost_usd") or 0.0)
    return tokens, cost


def conclude(cfg: FlywheelConfig, r: int, start: RoundStart, adapter: str | None, train: Mapping[str, Any],
             incumbent: list[dict], candidate: list[dict], diversity: Mapping[str, Any], wall_s: dict[str, float],
             tokens: int, cost_usd: float) -> RoundReport:
    """The gate, round_<r>/report.json and the promotions line (a keep, or a promote with no agents when no
    `service` is set: `_promote` writes the line of a swap). Returns the report."""
    out = Path(cfg.output_dir)
    made = decide(incumbent, candidate, cfg.gate, start.from_round, cfg.seed, cfg.reward)
    report = RoundReport(
        round=r, at=now(), from_round=start.from_round, adapter_in=start.adapter_in, adapter=adapter,
        questions=start.questions,
        train=TrainPart(samples=int(train.get("samples") or 0), kept=int(train.get("kept") or 0),
                        mean_reward=train.get("mean_reward"),
                        global_step=(train.get("train") or {}).get("global_step")),
        verdict=made.verdict, guards=made.guards,
        diversity=Diversity(samples=cfg.diversity_samples, incumbent=diversity.get(module_name(start.from_round)),
                            candidate=diversity.get(module_name(r))),
        decision=made.decision, reason=made.reason, promoted_to=[],
        cost=Cost(wall_s={k: round(v, 2) for k, v in wall_s.items()}, tokens=tokens, cost_usd=round(cost_usd, 6)))
    write_report(out, report)
    if made.decision == "keep" or cfg.service is None:
        v = made.verdict
        append_promotion(out / PROMOTIONS, Promotion(
            at=now(), action=made.decision, round=r, from_round=start.from_round, model=module_name(r),
            adapter=adapter or "", measure=cfg.gate.measure, **_numbers(v), reason=made.reason, agents=[]))
    return report


def _numbers(v: Verdict | None) -> dict:
    """A promotions line's diff, lo and hi: the verdict's, or none when there was no verdict."""
    return {k: getattr(v, k) if v is not None else None for k in ("diff", "lo", "hi")}


def write_report(out: Path, report: RoundReport) -> None:
    write_json(layout.round_dir(out, report.round) / REPORT, report.model_dump(mode="json"))


def start_round(cfg: FlywheelConfig, out: Path, r: int, qs: RoundQuestions) -> RoundStart:
    """Write the round's questions (both sides), its held-out dataset file and round.json, in that order: a round
    with round.json has all of them."""
    k, adapter_in = in_service(cfg.adapter, read_promotions(out / PROMOTIONS))
    folder = layout.round_dir(out, r)
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / QUESTIONS, [QuestionRow.model_validate(row).model_dump() for row in qs.rows])
    write_jsonl(folder / HELDOUT, [{k_: row[k_] for k_ in ("id", "question", "answers")} for row in qs.side("heldout")])
    start = RoundStart(round=r, at=now(), from_round=k, adapter_in=adapter_in, questions=qs.counts())
    write_json(folder / ROUND_INFO, start.model_dump(mode="json"))
    return start


def check_adapter(cfg: FlywheelConfig, adapter: str) -> None:
    """The adapter a round starts from must exist and have been trained on the config's prompt and tools."""
    base_model_of(adapter)
    check_as_trained(adapter, cfg.planner_prompt, tool_descriptions(cfg.tools), "flywheel")


def flywheel(cfg: FlywheelConfig, config_path: str | None = None, fresh: bool = False) -> dict | None:
    """One round (see the module's docstring); None when there are too few new questions (one line said so)."""
    out = Path(cfg.output_dir)
    t0 = time.perf_counter()
    r, start = next_round(out)
    if start is None:  # read before the folder is made or locked: too few questions writes nothing
        qs = plan_questions(cfg, r)
        if (line := too_few(cfg, qs)) is not None:
            print(line, flush=True)
            return None
    wall = {"questions": 0.0, "train": 0.0, "eval": 0.0, "diversity": 0.0}
    with folder_lock(out):
        r, start = next_round(out)
        if start is None:
            qs = plan_questions(cfg, r)  # again, under the lock: another run may have taken some meanwhile
            if (line := too_few(cfg, qs)) is not None:
                print(line, flush=True)
                return None
            start = start_round(cfg, out, r, qs)
            print(f"[flywheel] round {r} from {module_name(start.from_round)} ({start.adapter_in}): "
                  f"{start.questions.train} train, {start.questions.heldout} held-out questions", flush=True)
        else:
            print(f"[flywheel] round {r}: resumed (its questions and starting adapter as written)", flush=True)
        folder = layout.round_dir(out, r)
        rows = read_jsonl(folder / QUESTIONS, QuestionRow)
        wall["questions"] = time.perf_counter() - t0
        check_adapter(cfg, start.adapter_in)

        names = [module_name(start.from_round), module_name(r)]
        icfg, train = improve_config(cfg, folder / QUESTIONS), examples_of(rows, "train", str(folder / QUESTIONS))
        heldout = examples_of(rows, "heldout", str(folder / HELDOUT))

        def judge(server) -> dict:
            """Both modules on the held-out side: the paired evaluation, then the diversity samples."""
            t = time.perf_counter()
            distill.evaluate.evaluate(eval_config(cfg, server.base_url, folder / HELDOUT, folder / EVAL, names),
                                      config_path, fresh)
            wall["eval"] = time.perf_counter() - t
            t = time.perf_counter()
            diversity = sample_diversity(cfg, server.base_url, names, heldout) if cfg.diversity_samples else {}
            wall["diversity"] = time.perf_counter() - t
            return diversity

        t = time.perf_counter()
        if server_outlives_training(cfg):
            with round_server(cfg, {names[0]: start.adapter_in}, folder / "vllm.log", later=1) as server:
                summary = distill.improve.run_round(icfg, r, start.adapter_in, train, fresh, server, names[0])
                wall["train"] = time.perf_counter() - t
                adapter = summary["adapter"]
                server.load_adapter(names[1], adapter)
                diversity = judge(server)
        else:
            summary = distill.improve.run_round(icfg, r, start.adapter_in, train, fresh)
            wall["train"] = time.perf_counter() - t
            adapter = summary["adapter"]
            with round_server(cfg, dict(zip(names, [start.adapter_in, adapter])), folder / "eval.vllm.log") as server:
                diversity = judge(server)
        incumbent, candidate = (eval_records(folder / EVAL, n) for n in names)
        samples = read_jsonl(folder / "samples.jsonl") if (folder / "samples.jsonl").exists() else []
        tokens, cost = _usage([*incumbent, *candidate, *samples])
        wall["total"] = time.perf_counter() - t0
        report = conclude(cfg, r, start, adapter, summary, incumbent, candidate, diversity, wall,
                          tokens + int(diversity.get("tokens", 0)), cost + float(diversity.get("cost_usd", 0.0)))
        shown = report.reason if report.decision == "keep" else f"promote: {report.reason}"
        print(f"[flywheel] round {r}: {shown}", flush=True)
        if report.decision == "promote" and cfg.service is not None:
            line = _promote(cfg, r, report.reason, report)
            report = report.model_copy(update={"promoted_to": line.agents})
            write_report(out, report)
    return {"round": r, "report": str(folder / REPORT), "decision": report.decision, "reason": report.reason,
            "promoted_to": report.promoted_to}


# ------------------------------------------------------------------------------------------ promote, rollback

class _Settings:
    """What distill.core.retry's loop reads of a client: its retry settings and the counts it keeps."""

    def __init__(self, service: ServiceConfig):
        self.max_retries, self.backoff_s, self.max_wait_s, self.budget_s = service.max_retries, 0.5, 10.0, None
        self.retries, self.faults = 0, Counter()


def _error_detail(response) -> str:
    """A server's error body in one short line: the OpenAI error shape's code and message, else its text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        text = ": ".join(str(err[k]) for k in ("code", "message") if err.get(k))
    else:
        text = response.text
    return clip(" ".join(str(text).split()), 200)


async def _call(http, settings: _Settings, method: str, url: str, body: dict | None = None,
                headers: dict | None = None) -> Any:
    """One request with bounded retries (timeouts, refused connections, 429 and 5xx); its JSON, or its text when
    it is not JSON (vLLM's load answers in words). A failure is one DistillError naming the URL."""
    async def attempt():
        try:
            response = await http.request(method, url, json=body, headers=headers)
        except httpx.TimeoutException:
            raise Fault("timeout", f"no answer within {http.timeout.read:g}s", retry=True) from None
        except httpx.TransportError as exc:
            raise Fault("connection", f"cannot connect ({type(exc).__name__})", retry=True) from None
        code = response.status_code
        if code == 429 or code >= 500:
            raise Fault(f"http_{code}", f"HTTP {code} ({_error_detail(response)})", retry=True,
                        wait_s=retry_after_s(response.headers.get("retry-after")))
        if code >= 400:
            raise Fault(f"http_{code}", f"HTTP {code} ({_error_detail(response)})", retry=False)
        try:
            return response.json()
        except ValueError:
            return response.text

    try:
        return await with_retries(settings, attempt)
    except Fault as fault:
        raise DistillError(mask(f"{method} {url}: {fault.describe()}")) from None


def _token(service: ServiceConfig) -> str | None:
    """The agents' bearer token from the environment (remembered, so every message masks it); never in a file."""
    if service.token_env is None:
        return None
    token = os.environ.get(service.token_env, "")
    if not token.strip():
        raise DistillError(f"service.token_env: the environment variable {service.token_env} is not set or empty "
                           "(it should hold the agents' bearer token)")
    remember(token)
    return token


async def _swap(service: ServiceConfig, name: str, adapter: str, round_: int, token: str | None
                ) -> tuple[list[str], list[str]]:
    """Load `adapter` as module `name` into the planner's vLLM (unless /v1/models lists it from that folder), then
    switch each agent to it: (agents switched, one line per agent that failed)."""
    settings = _Settings(service)
    folder = Path(adapter).resolve()
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)  # under the agents' and vLLM's idle close
    async with httpx.AsyncClient(timeout=service.timeout_s, limits=limits) as http:
        listed = await _call(http, settings, "GET", f"{service.vllm_url}/models")
        modules = {m.get("id"): m for m in (listed.get("data") or [] if isinstance(listed, dict) else [])
                   if isinstance(m, dict)}
        served = modules.get(name)
        if served is not None and Path(str(served.get("root"))).resolve() != folder:
            raise DistillError(f"{service.vllm_url} already serves {name} from {served.get('root')}, not {folder}; "
                               "restart that server (vLLM cannot replace a loaded module's folder)")
        if served is None:
            await _call(http, settings, "POST", f"{service.vllm_url}/load_lora_adapter",
                        {"lora_name": name, "lora_path": str(folder)})
            print(f"[promote] {service.vllm_url}: loaded {folder} as {name}", flush=True)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        switched, failed = [], []
        for agent in service.agents:
            try:
                await _call(http, settings, "POST", f"{agent}/v1/admin/planner",
                            {"model": name, "adapter": str(folder), "round": round_}, headers)
                switched.append(agent)
                print(f"[promote] {agent}: planner is now {name}", flush=True)
            except DistillError as exc:
                failed.append(str(exc))
    return switched, failed


def _require_service(cfg: FlywheelConfig) -> ServiceConfig:
    if cfg.service is None:
        raise DistillError("promote: `service` is not set: give {vllm_url, agents} (the planner's vLLM server and "
                           "the agents to switch)")
    return cfg.service


def _switch(cfg: FlywheelConfig, action: Literal["promote", "rollback"], to: tuple[int, str], reason: str,
            report: RoundReport | None = None) -> Promotion:
    """Swap the service to `to` (round, adapter) and log it; when an agent failed, the line names those switched
    and the failures are one line, exit 2."""
    service = _require_service(cfg)
    out = Path(cfg.output_dir)
    current, _ = in_service(cfg.adapter, read_promotions(out / PROMOTIONS))
    round_, adapter = to
    switched, failed = asyncio.run(_swap(service, module_name(round_), adapter, round_, _token(service)))
    v = report.verdict if report is not None else None
    line = Promotion(at=now(), action=action, round=round_, from_round=current, model=module_name(round_),
                     adapter=adapter, measure=v.measure if v is not None else None, **_numbers(v), reason=reason,
                     agents=switched)
    if switched:
        append_promotion(out / PROMOTIONS, line)
    if failed:
        done = f" ({len(switched)} switched, logged)" if switched else " (none switched, nothing logged)"
        raise DistillError(f"{action} to {module_name(round_)}: " + "; ".join(failed) + done)
    return line


def _promote(cfg: FlywheelConfig, round_: int, reason: str, report: RoundReport | None = None) -> Promotion:
    return _switch(cfg, "promote", (round_, round_adapter(cfg, round_)), reason, report)


def promote(cfg: FlywheelConfig, round_: int) -> Promotion:
    """`distill promote --round R`: serve round R (0: the config's adapter) whatever its gate said, and log it."""
    out = Path(cfg.output_dir)
    adapter = round_adapter(cfg, round_)  # before the folder is made: a round never trained is one line
    report_path = layout.round_dir(out, round_) / REPORT
    report = read_round_report(report_path) if round_ and report_path.exists() else None
    gate = f" (its gate: {report.decision}: {report.reason})" if report else ""
    with folder_lock(out):
        return _switch(cfg, "promote", (round_, adapter), f"by hand: distill promote --round {round_}{gate}", report)


def rollback(cfg: FlywheelConfig) -> Promotion:
    """`distill promote --rollback`: back to the adapter served before the last promotion (promotions.jsonl)."""
    out = Path(cfg.output_dir)
    with folder_lock(out):
        stack = service_stack(cfg.adapter, read_promotions(out / PROMOTIONS))
        if len(stack) < 2:
            raise DistillError(f"nothing to roll back: {out / PROMOTIONS} holds no promotion still in service "
                               f"({module_name(stack[-1][0])} is, the config's adapter)")
        return _switch(cfg, "rollback", stack[-2],
                       f"rollback from {module_name(stack[-1][0])} to {module_name(stack[-2][0])}")


# ------------------------------------------------------------------------------------------ command line

def _check(cfg: FlywheelConfig, check) -> None:
    """`--check`: improve's check of the round's training, where the round would start from and its question
    counts (traces and eval sets are read; no model is loaded, no server started or called)."""
    out = Path(cfg.output_dir)
    try:
        lines = read_promotions(out / PROMOTIONS)
        r, start = next_round(out)
    except DistillError as exc:
        check.problem(str(exc))
        return
    k, adapter_in = (start.from_round, start.adapter_in) if start else in_service(cfg.adapter, lines)
    check_run(improve_config(cfg.model_copy(update={"adapter": adapter_in}), layout.round_dir(out, r) / QUESTIONS),
              check,
              prefix="flywheel.")
    print(f"flywheel: round {r} would train from {module_name(k)} ({adapter_in})"
          + (" (resumed: its questions are written)" if start else ""))
    if start is None:
        try:
            qs = plan_questions(cfg, r)
        except DistillError as exc:
            check.problem(f"flywheel.datasets: {exc}")
        else:
            c = qs.counts()
            print(f"flywheel: {c.with_feedback} served question(s) with usable feedback, {c.new} new, "
                  f"{c.left_out_eval} left out (in eval_sets): {c.train} train, {c.heldout} held-out")
            if line := too_few(cfg, qs):
                print(line)
    if cfg.service is not None:
        print(f"flywheel: a promotion loads the adapter into {cfg.service.vllm_url} and switches "
              f"{', '.join(cfg.service.agents)}")
        try:
            _token(cfg.service)
        except DistillError as exc:
            check.problem(str(exc))
    else:
        print("flywheel: no `service`: a promotion is logged only (distill promote swaps it in later)")


def _report(cfg: FlywheelConfig, result: dict | None) -> None:
    if result is None:
        return
    print(f"report: {result['report']}")
    if result["decision"] == "promote" and not result["promoted_to"]:
        print(f"next: distill promote --config FILE --round {result['round']} (no `service` is set)")


STAGE = stage.Stage("flywheel", FlywheelConfig, "configs/flywheel_smollm2_cpu.yaml", run=flywheel, check=_check,
                    report=_report)


def configure_promote_parser(parser: argparse.ArgumentParser) -> None:
    """`distill promote` (its module, distill.serving.promote, hands its command line to these two)."""
    add_config_args(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--round", type=int, metavar="R", help="serve round R's adapter (0: the config's adapter)")
    which.add_argument("--rollback", action="store_true",
                       help="serve again the adapter served before the last promotion (promotions.jsonl)")


def promote_main(args: argparse.Namespace) -> int:
    if not args.config:
        raise DistillError("--config is required (e.g. configs/flywheel_smollm2_cpu.yaml)")
    cfg = load_config(FlywheelConfig, args.config, args.set)
    if args.round is None and not args.rollback:
        raise DistillError("give --round R (the round to serve) or --rollback")
    if args.round is not None and args.round < 0:
        raise DistillError(f"--round {args.round}: rounds are numbered from 0 (the config's adapter)")
    line = rollback(cfg) if args.rollback else promote(cfg, args.round)
    print(f"{line.action}: {line.model} ({line.adapter}) now serves {', '.join(line.agents)}; "
          f"logged in {Path(cfg.output_dir) / PROMOTIONS}")
    return 0


if __name__ == "__main__":  # `python -m distill.flywheel` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
