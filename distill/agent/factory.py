"""The one factory from a config to an agent, above both the ReWOO core and the baselines.

`build_agent(cfg, kind=rewoo/react/direct, ...)` builds any agent kind (ReWOO, or a baseline eval measures it
against), so every method gets its Solver and tools wired the same way; `make_tools_for` is the per-question
tool set (Wikipedia scoped to the question, tool calls cached); `distill ask` answers one question with it.
Generate, eval, improve and serve-agent import it from here. It lives here, not in `distill.rewoo`, because it
needs the baselines (which import the ReWOO core), the config and the model factory (`distill.llm.build_chat`):
the core imports none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping

from distill.agent.baselines import DirectAgent, ReActAgent
from distill.core.config import AgentConfig, add_config_args, load_config
from distill.core.errors import DistillError
from distill.core.metrics import METRICS
from distill.llm import build_chat
from distill.llm.cached import CachedTool
from distill.rewoo.agent import Question, ReWOOAgent
from distill.rewoo.worker import WorkerConfig
from distill.tools.registry import build_tools, tool_descriptions
from distill.tools.wikipedia import LocalWikipedia, OnlineWikipedia


def build_wikipedia(cfg, tools: Mapping[str, str]):
    """The shared Wikipedia backend; per-question scoping happens in `tools_for`."""
    if "Wikipedia" not in tools:
        return None

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
    names = list(tool_descriptions(cfg.tools))
    wiki = wiki if wiki is not None else build_wikipedia(cfg, names)
    llm_max_tokens = (cfg.llm_tool or cfg.solver).max_tokens

    def tools_for(example) -> dict:
        w, scope = wiki, ""
        if cfg.wikipedia_scope == "question" and "Wikipedia" in names:
            if example.context:
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
    react_max_tokens: int = 256, replan: bool | None = None, solve: bool = True, run_unread_steps: bool = True,
):
    """The one factory from an AgentConfig to an agent (rewoo, or a baseline eval measures it against), so
    every method gets its Solver and tools wired the same way. `planner`, `planner_prompt` and `replan`
    override the config's own (eval has one per row); `wrap_tools` is eval's injected failures."""
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
        solve=solve, run_unread_steps=run_unread_steps,
    )
    return _with_endpoints(agent, planner_model, solver, llm_tool_model, wiki)


def with_planner(agent, spec, prices: dict | None = None):
    """A copy of a ReWOO agent that plans with `spec`'s model, sharing everything else (Solver, tools, the
    Wikipedia index, Worker settings): a served agent switches its planner in the time one model client takes
    to build, and requests already running on the old agent finish on it untouched."""
    if not isinstance(agent, ReWOOAgent):
        raise DistillError(f"only a ReWOO agent has a planner to switch (this one is {type(agent).__name__})")
    planner = build_chat(spec, prices)
    new = copy.copy(agent)
    new.planner = planner
    new.planner_temperature, new.planner_max_tokens, new.planner_stop = spec.temperature, spec.max_tokens, spec.stop
    old = getattr(agent, "endpoints", ())
    # the old planner leaves the endpoints, unless the same object also serves as the Solver (one in-process model)
    return _with_endpoints(new, planner, *(e for e in old if e is not agent.planner or e is agent.solver))


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


if __name__ == "__main__":  # `python -m distill.agent.factory` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
