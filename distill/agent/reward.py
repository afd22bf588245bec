"""The planner reward: a Planner's output for a question, scored by what the real Worker finds with it.

A ReWOO Planner writes its whole plan in one generation, so training it on its own plans (expert iteration,
GRPO) is a single-turn problem: run the plan's tool calls and score the evidence, with no Solver call. The
parts are the report's own measures, through the same functions (`metrics.evidence_recall`, the TriviaQA
normaliser), so a reward gain is a gain the report can show:

- `valid`: the plan parses with no error (within `max_plan_steps`). A plan the parser refuses earns nothing
  at all and runs no tool, so a policy never learns that malformed text pays.
- `ran`: the share of steps whose tool returned evidence.
- `recall`: evidence recall of the question's gold supporting pages (HotpotQA).
- `answer_in_evidence`: for a question without gold pages (TriviaQA), 1 when a normalised answer alias
  appears in the evidence, else 0.
- `extra_steps`: steps beyond what the question needs (its gold page count, else `free_steps`), each costing
  `step_cost`: the paper's point is few calls.
- Steps no part reads: with `run_unread_steps: false`, a question with gold pages runs only its retrieval steps
  and the steps whose output they take in (directly or through others); `ran` is then the share of the steps
  run. An LLM step that no search reads changes neither recall nor anything else the reward sees, and in an
  improve round on a CPU such steps were four in five of the LLM tool's calls.
- `duplicate_steps`: steps repeating an earlier step's call (`rewoo.plan.duplicate_steps`: same tool, same
  input up to case and whitespace), each costing `duplicate_step_penalty` (off by default). A repeat adds no
  evidence, so recall cannot see it, yet the Worker runs it and the Solver reads it again.

`total = valid_weight + ran_weight * ran + (recall_weight * recall | answer_weight * answer_in_evidence)
- step_cost * extra_steps - duplicate_step_penalty * duplicate_steps`, where the duplicate penalty takes a plan
down at most to 0, an invalid plan's reward: a valid plan that repeats a call must not pay less than text that
does not parse. Every part is returned beside the total, so a run logs what moved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from distill.core.config import Strict
from distill.core.data import Example
from distill.core.metrics import evidence_recall, gold_titles, trivia_normalize
from distill.rewoo.plan import DEFAULT_MAX_PLAN_STEPS, duplicate_steps, parse_plan
from distill.rewoo.worker import WorkerConfig, retrieval_part, run_plan


class RewardConfig(Strict):
    """Weights of the reward's parts; the defaults make evidence the main signal and validity a floor."""

    valid_weight: float = Field(default=0.2, ge=0, le=10)
    """reward for a plan that parses"""
    ran_weight: float = Field(default=0.2, ge=0, le=10)
    """reward for a plan whose every step ran"""
    recall_weight: float = Field(default=1.0, ge=0, le=10)
    """weight of the gold pages' evidence recall (HotpotQA)"""
    answer_weight: float = Field(default=1.0, ge=0, le=10)
    """weight of an answer alias found in the evidence (TriviaQA)"""
    step_cost: float = Field(default=0.05, ge=0, le=10)
    """cost per step beyond what the question needs"""
    free_steps: int = Field(default=2, ge=1, le=64)
    """steps a question without gold pages may take for free"""
    max_plan_steps: int = Field(default=DEFAULT_MAX_PLAN_STEPS, ge=1, le=64)
    """steps a plan may have; more is invalid"""
    duplicate_step_penalty: float = Field(default=0.0, ge=0, le=1)
    """cost per step repeating an earlier step's tool and input (case and whitespace aside); never below 0"""
    run_unread_steps: bool = True
    """false: for a question with gold pages, run only the retrieval steps and the steps they read (the rest cannot
    move recall); `ran` is then the share of the steps run"""

    ADDED = frozenset({"run_unread_steps"})


# The reward's parts, in the order `score_plan` returns them: what a run logs per part.
REWARD_PARTS = ("valid", "ran", "recall", "answer_in_evidence", "extra_steps", "duplicate_steps")


@dataclass(frozen=True)
class Reward:
    total: float
    parts: dict[str, float | None]
    evidence: list[dict[str, Any]] = field(default_factory=list)


def answer_in_evidence(answers: Sequence[str], evidence: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a normalised alias appears, as whole words, in the text of the steps that returned evidence."""
    text = f" {trivia_normalize(' '.join(ev.get('output') or '' for ev in evidence if ev.get('status') == 'ok'))} "
    aliases = {trivia_normalize(a) for a in answers}
    return any(alias and f" {alias} " in text for alias in aliases)


async def score_plan(output: str, example: Example, tools: Mapping[str, Any], cfg: RewardConfig | None = None,
                     worker: WorkerConfig | None = None) -> Reward:
    """The reward of one Planner output; its tool calls go through `tools` (the caller's, e.g. cached)."""
    cfg = cfg or RewardConfig()
    plan = parse_plan(output, tools=list(tools), max_plan_steps=cfg.max_plan_steps)
    golds = gold_titles(example.supporting_facts)
    if not plan.valid:
        parts = {"valid": 0.0, "ran": 0.0, "recall": 0.0 if golds else None,
                 "answer_in_evidence": None if golds else 0.0, "extra_steps": 0.0, "duplicate_steps": 0.0}
        return Reward(0.0, parts)
    scored = plan if cfg.run_unread_steps or not golds else retrieval_part(plan)
    evidence = [e.to_dict() for e in await run_plan(scored, tools, worker)] if scored.steps else []
    ran = sum(e["status"] == "ok" for e in evidence) / len(evidence) if evidence else 0.0
    needed = len(golds) or cfg.free_steps
    extra = float(max(0, len(plan.steps) - needed))
    repeats = float(duplicate_steps(plan.steps))
    parts: dict[str, float | None] = {"valid": 1.0, "ran": ran, "recall": None, "answer_in_evidence": None,
                                      "extra_steps": extra, "duplicate_steps": repeats}
    total = cfg.valid_weight + cfg.ran_weight * ran - cfg.step_cost * extra
    if golds:
        parts["recall"] = evidence_recall(golds, evidence)["recall"]
        total += cfg.recall_weight * parts["recall"]
    else:
        parts["answer_in_evidence"] = float(answer_in_evidence(example.answers, evidence))
        total += cfg.answer_weight * parts["answer_in_evidence"]
    # down to 0 at most, never up: a total already below 0 (step costs) stays where it is
    total -= min(cfg.duplicate_step_penalty * repeats, max(total, 0.0))
    return Reward(total, parts, evidence)


async def score_group(outputs: Sequence[str], example: Example, tools: Mapping[str, Any],
                      cfg: RewardConfig | None = None, worker: WorkerConfig | None = None) -> list[Reward]:
    """The rewards of a group of completions for one question, their plans run at once (the Worker is async
    and bounds its own tool concurrency), in the order given."""
    return list(await asyncio.gather(*(score_plan(o, example, tools, cfg, worker) for o in outputs)))
