"""Plan -> work -> solve, producing one trajectory record (distill.rewoo.record).

The agent fills every field of the record whether or not the run went well: a failed plan is data for the filter.
Building one from a config (models, tools, the baselines beside it) and `distill ask` are `distill.agent.factory`'s:
the ReWOO core imports nothing above it.
"""

from __future__ import annotations

import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable, Collection, Mapping

from distill.core.errors import DistillError
from distill.core.metrics import gold_titles
from distill.llm.base import Completion
from distill.rewoo import prompts
from distill.rewoo.plan import DEFAULT_MAX_PLAN_CHARS, Plan, parse_plan
from distill.rewoo.record import call_record, make_record, sample_seed
from distill.rewoo.worker import SURPRISES, Evidence, WorkerConfig, kept_part, needed_by, run_plan
from distill.tools.llm_tool import LLMTool


@dataclass
class Question:
    """What the agent needs of an example; `distill.core.data.Example` satisfies it."""

    question: str
    id: str = "adhoc"
    dataset: str = "adhoc"
    answers: list[str] = field(default_factory=list)
    context: list | None = None
    metric: str = "hotpotqa"  # the scoring rules of `answers` (distill.core.metrics.METRICS)


@dataclass
class ReWOOAgent:
    planner: Any
    solver: Any
    tools_for: Callable[[Any], Mapping[str, Any]]
    tool_descriptions: Mapping[str, str]
    _: KW_ONLY
    planner_prompt: prompts.PromptKind = "fewshot"
    planner_temperature: float = 0.0
    planner_max_tokens: int = 512
    planner_stop: list[str] | None = None
    solver_max_tokens: int = 64
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    method: str = "rewoo"
    seed: int = 0
    max_plan_chars: int | None = DEFAULT_MAX_PLAN_CHARS
    max_plan_steps: int | None = None
    max_replans: int = 0
    replan_on: Collection[str] = SURPRISES
    # False: plan and evidence only. Rejection sampling by evidence (the filter's `evidence` criterion, like the
    # planner reward) never reads the answer, and the Solver's prompt (plan + evidence) is most of a trajectory's
    # prompt tokens that no prefix cache can share.
    solve: bool = True
    # False: for a question with gold pages, an LLM step that nothing reads (no other tool's step, directly or
    # through others; no Solver, as with solve False; no re-plan) is not run: the filter's `evidence` criterion cannot
    # see its output. The record names those steps (`not_run`), so the filter does not count them as failed.
    run_unread_steps: bool = True

    def __post_init__(self) -> None:
        if unknown := set(self.replan_on) - set(SURPRISES):
            raise DistillError(f"replan_on: unknown surprise {sorted(unknown)[0]!r}; known: {', '.join(SURPRISES)}")

    @property
    def skips_unread(self) -> bool:
        """The Solver and a re-plan read every step, so only a run with neither has steps nothing reads."""
        return not self.run_unread_steps and not self.solve and self.max_replans == 0

    async def plan(self, messages: list[dict], seed: int | None = None) -> Completion:
        return await self.planner.chat(
            messages, temperature=self.planner_temperature, max_tokens=self.planner_max_tokens,
            stop=self.planner_stop, seed=seed,
        )

    def parse(self, text: str, known_ids: Collection[str] = ()) -> Plan:
        return parse_plan(
            text, tools=list(self.tool_descriptions),
            max_plan_chars=self.max_plan_chars, max_plan_steps=self.max_plan_steps, known_ids=known_ids,
        )

    async def run(self, example, sample: int = 0, on_event: Callable[[str, dict], None] | None = None) -> dict:
        """`on_event(kind, payload)` hears of each plan ("plan") and each finished step ("step") as it happens,
        so a served agent can stream progress; the record is the same with or without it."""
        t0 = time.perf_counter()
        seed = sample_seed(example.id, sample, self.seed)
        p_messages = prompts.planner_messages(example.question, self.tool_descriptions, self.planner_prompt)
        p_out = await self.plan(p_messages, seed)
        plan = self.parse(p_out.text)
        on_step = None
        if on_event is not None:
            on_event("plan", plan.to_dict())
            on_step = lambda e: on_event("step", e.to_dict())  # noqa: E731
        tools = self.tools_for(example)
        work_t0 = time.perf_counter()
        not_run: list[str] = []
        run = plan
        if self.skips_unread and gold_titles(getattr(example, "supporting_facts", None)):
            # only model calls are left out: a cheap tool's failure (a Calculator given text) still drops the sample
            keep = needed_by(plan.steps, lambda step: step.tool != LLMTool.name)
            not_run = [step.id for step, kept in zip(plan.steps, keep) if not kept]
            run = kept_part(plan, keep)
        evidence = await run_plan(run, tools, self.worker, t0=work_t0, on_step=on_step)
        plan, evidence, replans, r_outs = await self.replan(p_messages, plan, evidence, tools, seed, work_t0, on_event)
        extra = {"replans": replans} if self.max_replans > 0 else {}  # plain ReWOO keeps today's record shape
        if self.skips_unread:  # ids of the steps deliberately not run, in plan order (a repeated id twice)
            extra["not_run"] = not_run
        solver, prediction, solver_calls = {}, None, []
        if self.solve:
            s_messages = prompts.solver_messages(example.question, plan.steps, evidence)
            s_out = await self.solver.chat(s_messages, temperature=0.0, max_tokens=self.solver_max_tokens, seed=seed)
            solver, prediction, solver_calls = (call_record(s_messages, s_out), prompts.extract_answer(s_out.text),
                                                [s_out])
        return make_record(
            example, self.method, sample, t0, planner=call_record(p_messages, p_out), plan=plan.to_dict(),
            evidence=[e.to_dict() for e in evidence], solver=solver, prediction=prediction,
            planner_calls=[p_out, *r_outs], solver_calls=solver_calls, tools=tools, scored=self.solve, **extra,
        )

    async def replan(
        self, p_messages: list[dict], plan: Plan, evidence: list[Evidence], tools, seed: int,
        work_t0: float | None = None, on_event: Callable[[str, dict], None] | None = None,
    ) -> tuple[Plan, list[Evidence], list[dict], list[Completion]]:
        """ReWOO plans blind; this is its one chance to change course. When a step of the newest plan meets a
        configured surprise, the Planner is asked once more with the plan and evidence so far, and only its
        new steps run (finished evidence is reused by id, never fetched again), up to `max_replans` times.
        `work_t0` is the clock origin of the first plan's evidence, so every step's times share it."""
        steps, errors, evidence, fresh = list(plan.steps), list(plan.errors), list(evidence), list(evidence)
        replans: list[dict] = []
        outs: list[Completion] = []
        while len(replans) < self.max_replans:
            surprise = next((e for e in fresh if e.status in self.replan_on), None)
            if surprise is None:
                break
            trigger = {"step": surprise.id, "kind": surprise.status, "error": surprise.error}
            next_id = 1 + max((int(s.id[2:]) for s in steps), default=0)
            messages = prompts.replan_messages(p_messages, steps, evidence, trigger, next_id)
            out = await self.plan(messages, seed)
            new = self.parse(out.text, known_ids={s.id for s in steps})
            known = {e.id: e.output for e in evidence}
            on_step = None
            if on_event is not None:
                on_event("plan", new.to_dict() | {"replan": len(replans) + 1})
                on_step = lambda e: on_event("step", e.to_dict())  # noqa: E731
            fresh = await run_plan(new, tools, self.worker, known=known, t0=work_t0, on_step=on_step)
            steps += new.steps
            errors += new.errors
            evidence += fresh
            outs.append(out)
            replans.append({"trigger": trigger, "planner": call_record(messages, out), "plan": new.to_dict()})
        return Plan(tuple(steps), tuple(errors)), evidence, replans, outs
