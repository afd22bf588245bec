"""Plan -> work -> solve, producing one trajectory record (distill.rewoo.record), and `build_agent`, the one
factory from a config to any agent kind (this one or a baseline), so every method is wired the same way.

The agent fills every field of the record whether or not the run went well: a failed plan is data for the filter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

from distill.baselines import DirectAgent, ReActAgent
from distill.config import AgentConfig, add_config_args, load_config
from distill.errors import DistillError
from distill.llm.base import Completion
from distill.metrics import METRICS
from distill.rewoo import prompts
from distill.rewoo.plan import DEFAULT_MAX_PLAN_CHARS, Plan, parse_plan
from distill.rewoo.record import call_record, make_record, sample_seed
from distill.rewoo.worker import SURPRISES, Evidence, WorkerConfig, run_plan
from distill.tools.registry import build_tools, tool_descriptions


@dataclass
class Question:
    """What the agent needs of an example; `distill.data.Example` satisfies it."""

    question: str
    id: str = "adhoc"
    dataset: str = "adhoc"
    answers: list[str] = field(default_factory=list)
    context: list | None = None
    metric: str = "hotpotqa"  # the scoring rules of `answers` (distill.metrics.METRICS)


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

    def __post_init__(self) -> None:
        if unknown := set(self.replan_on) - set(SURPRISES):
            raise DistillError(f"replan_on: unknown surprise {sorted(unknown)[0]!r}; known: {', '.join(SURPRISES)}")

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
        evidence = await run_plan(plan, tools, self.worker, t0=work_t0, on_step=on_step)
        plan, evidence, replans, r_outs = await self.replan(p_messages, plan, evidence, tools, seed, work_t0, on_event)
        extra = {"replans": replans} if self.max_replans > 0 else {}  # plain ReWOO keeps today's record shape
        solver, prediction, solver_calls = {}, None, []
        if self.solve:
            s_messages = prompts.solver_messages(example.question, plan.steps, evidence)
            s_out = await self.solver.chat(s_messages, temperature=0.0, max_tokens=self.solver_max_tokens, seed=seed)
            solver, prediction, solver_calls = call_record(s_messages, s_out), prompts.extract_answer(s_out.text), [s_out]
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


def build_wikipedia(cfg, tools: Mapping[str, str]):
    """The shared Wikipedia backend; per-question scoping happens in `tools_for`."""
    if "Wikipedia" not in tools:
        return None
    from distill.tools.wikipedia import LocalWikipedia, OnlineWikipedia

    if cfg.wikipedia_backend == "online":
        return OnlineWikipedia.from_config(cfg)
    if cfg.wikipedia_scope == "question" and not cfg.wikipedia_corpus:
        return None
    if not cfg.wikipedia_corpus or not Path(cfg.wikipedia_corpus).exists():
        raise DistillError(f"wikipedia_corpus not found: {cfg.wikipedia_corpus} (a JSONL of {{title, text}} records)")
    return LocalWikipedia(cfg.wikipedia_corpus, top_k=cfg.wikipedia_top_k, max_chars=cfg.wikipedia_max_chars)


def make_tools_for(cfg, llm_tool_model, cache=None, wiki=None, wrap=None) -> Callable[[Any], dict]:
    """A per-question tool set: fresh LLM-tool call log, and Wikipedia scoped to the question when asked.
    `wrap(tools, example)` is applied outside the call cache, so eval's injected failures are never cached."""
    from distill.llm.cached import CachedTool

    names = list(tool_descriptions(cfg.tools))
    wiki = wiki if wiki is not None else build_wikipedia(cfg, names)
    llm_max_tokens = (cfg.llm_tool or cfg.solver).max_tokens

    def tools_for(example) -> dict:
        w, scope = wiki, ""
        if cfg.wikipedia_scope == "question" and "Wikipedia" in names:
            if example.context:
                from distill.tools.wikipedia import LocalWikipedia

                paragraphs = [(title, " ".join(sents)) for title, sents in example.context]
                w = LocalWikipedia.scoped(paragraphs, top_k=cfg.wikipedia_top_k, max_chars=cfg.wikipedia_max_chars)
                scope = f"question:{example.id}"
            elif wiki is None:
                raise DistillError(f"example {example.id} has no context and no wikipedia_corpus is set")
        tools = build_tools(cfg.tools, wikipedia=w, llm_model=llm_tool_model, llm_max_tokens=llm_max_tokens)
        if cache is not None:
            tools = {
                name: CachedTool(t, cache, scope=scope if name == "Wikipedia" else "")
                if name != "LLM" and getattr(t, "cacheable", True) else t
                for name, t in tools.items()
            }
        return wrap(tools, example) if wrap is not None else tools

    return tools_for


def build_agent(
    cfg, cache=None, *, kind: str = "rewoo", planner=None, planner_prompt: str | None = None, method: str = "rewoo",
    seed: int = 0, wrap_tools: Callable[[dict, Any], dict] | None = None, react_max_steps: int = 6,
    react_max_tokens: int = 256, replan: bool | None = None, solve: bool = True,
):
    """The one factory from an AgentConfig to an agent (rewoo, or a baseline eval measures it against), so
    every method gets its Solver and tools wired the same way. `planner`, `planner_prompt` and `replan`
    override the config's own (eval has one per row); `wrap_tools` is eval's injected failures."""
    from distill.llm import build_chat

    if kind == "direct":
        solver = build_chat(cfg.solver, cfg.prices, cache)
        return _with_endpoints(DirectAgent(solver, max_tokens=cfg.solver.max_tokens, method=method, seed=seed), solver)
    descriptions = tool_descriptions(cfg.tools)
    wiki = build_wikipedia(cfg, descriptions)  # before loading any model: a bad corpus path should fail in a second
    solver = build_chat(cfg.solver, cfg.prices, cache)
    llm_tool_model = build_chat(cfg.llm_tool, cfg.prices, cache) if cfg.llm_tool else solver
    tools_for = make_tools_for(cfg, llm_tool_model, cache, wiki, wrap_tools)
    worker = WorkerConfig(cfg.worker_max_concurrency, cfg.tool_timeout_s, cfg.evidence_max_chars)
    if kind == "react":
        react = ReActAgent(
            solver, tools_for, descriptions, max_steps=react_max_steps, max_tokens=react_max_tokens,
            worker=worker, method=method, seed=seed,
        )
        return _with_endpoints(react, solver, llm_tool_model, wiki)
    if kind != "rewoo":
        raise DistillError(f"unknown agent kind {kind!r}; known: rewoo, react, direct")
    spec = planner or cfg.planner
    planner_model = build_chat(spec, cfg.prices, cache)
    agent = ReWOOAgent(
        planner_model, solver, tools_for, descriptions, planner_prompt=planner_prompt or cfg.planner_prompt,
        planner_temperature=spec.temperature, planner_max_tokens=spec.max_tokens, planner_stop=spec.stop,
        solver_max_tokens=cfg.solver.max_tokens, worker=worker, method=method, seed=seed,
        max_plan_chars=cfg.max_plan_chars, max_plan_steps=cfg.max_plan_steps,
        max_replans=cfg.max_replans if (cfg.replan if replan is None else replan) else 0, replan_on=cfg.replan_on,
        solve=solve,
    )
    return _with_endpoints(agent, planner_model, solver, llm_tool_model, wiki)


def _with_endpoints(agent, *endpoints):
    """Remember the agent's models and tools once each, so a run can say how often they had to retry."""
    agent.endpoints = tuple({id(e): e for e in endpoints if e is not None}.values())
    return agent


def retries_of(agent) -> dict:
    """Retries the agent's model servers and online tools made in this process, and their failed attempts by
    kind ("429", "timeout", ...): a run summary's figures, where a rate-limited API shows before it shows as
    failed steps, and where a timeout set below the server's real latency shows as timeouts."""
    endpoints = getattr(agent, "endpoints", ())
    faults = sum((getattr(e, "faults", Counter()) for e in endpoints), Counter())
    return {"retries": sum(getattr(e, "retries", 0) for e in endpoints), "faults": dict(sorted(faults.items()))}


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="the question to answer")
    add_config_args(parser, default=None)
    parser.add_argument("--answer", action="append", default=[], help="gold answer(s), to score the prediction")
    parser.add_argument("--dataset", default="hotpotqa", choices=METRICS,
                        help="scoring rules for --answer (hotpotqa | triviaqa | em_f1)")
    parser.add_argument("--json", action="store_true", help="print the whole trajectory record as JSON")


def main(args: argparse.Namespace) -> int:
    if not args.question.strip():
        raise DistillError("the question is empty")
    cfg = load_config(AgentConfig, args.config, args.set)
    agent = build_agent(cfg)
    example = Question(args.question, dataset=args.dataset, answers=args.answer, metric=args.dataset)
    record = asyncio.run(agent.run(example))
    if args.json:
        print(json.dumps(record, indent=2, ensure_ascii=False))
        return 0
    for step, ev in zip(record["plan"]["steps"], record["evidence"]):
        print(f"{step['id']} = {step['tool']}[{ev['input']}]  ({ev['status']}, {ev['end_s'] - ev['start_s']:.2f}s)")
    for err in record["plan"]["errors"]:
        print(f"plan error {err['code']} {err['step'] or ''}: {err['message']}")
    print(f"Answer: {record['prediction']}")
    extra = f", EM {record['scores']['em']} F1 {record['scores']['f1']:.2f}" if record["scores"] else ""
    print(f"({record['tokens']['total']} tokens, ${record['cost_usd']:.4f}, {record['wall_s']:.1f}s{extra})")
    return 0
