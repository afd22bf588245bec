"""The baselines ReWOO is measured against, each writing the same trajectory record (`make_record`).

- `DirectAgent`: one Solver call that answers from the model's own knowledge (no plan, no tools).
- `ReActAgent`: the Thought / Action / Observation loop of Yao et al. (2023). Every step is a new call with
  the whole history, which is why ReAct's tokens grow with the hops while ReWOO's planner sees the question
  once. Actions are parsed by the plan parser and tools run through the ReWOO Worker, so a call and a tool
  failure mean exactly what they do for ReWOO; both baselines use the Solver model and the same per-question
  tools, so differences in the report come from the method, not from the model or the evidence.
"""

from __future__ import annotations

import re
import time
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any, Callable, Mapping

from distill.core.errors import DistillError
from distill.llm.base import Completion, Usage
from distill.rewoo import prompts
from distill.rewoo.plan import Plan, Step, parse_plan
from distill.rewoo.record import call_record, make_record, sample_seed
from distill.rewoo.worker import WorkerConfig, run_plan

FINISH = "Finish"

DIRECT_INSTRUCTIONS = (
    "Answer the following question from your own knowledge. Respond with the answer directly, as a short "
    "phrase (a name, a number, yes or no), with no extra words."
)

REACT_INSTRUCTIONS = (
    "Solve a question answering task with interleaving Thought, Action and Observation steps. Thought reasons "
    "about the current situation. Action calls one tool, written as Tool[input], or ends the task with "
    "Finish[answer], where the answer is a short phrase (a name, a number, yes or no). After each Action you "
    "will be given its Observation."
)

REACT_FORMAT = (
    "Write exactly one Thought and one Action per turn:\n"
    "Thought: <your reasoning>\n"
    "Action: <Tool>[<input>]\n"
    "Do not write the Observation yourself."
)

# Exemplars written for this project (facts checked); observations are in the `Title: text` form the
# Wikipedia tool returns. Both use Wikipedia, so they are shown only when it is configured.
REACT_EXEMPLARS: list[str] = [
    "Question: Which country is the birthplace of the physicist who proposed the theory of general relativity?\n"
    "Thought: I need to find out who proposed the theory of general relativity.\n"
    "Action: Wikipedia[general relativity]\n"
    "Observation: General relativity: General relativity is the geometric theory of gravitation published "
    "by Albert Einstein in 1915.\n"
    "Thought: Albert Einstein proposed it. Now I need to find where he was born.\n"
    "Action: Wikipedia[Albert Einstein]\n"
    "Observation: Albert Einstein: Albert Einstein was a German-born theoretical physicist. He was born in "
    "Ulm, in the Kingdom of Württemberg in the German Empire, in 1879.\n"
    "Thought: Einstein was born in Ulm, which is in Germany. So the answer is Germany.\n"
    "Action: Finish[Germany]",

    "Question: Which river is longer, the Danube or the Rhine?\n"
    "Thought: I need the length of the Danube and the length of the Rhine.\n"
    "Action: Wikipedia[Danube]\n"
    "Observation: Danube: The Danube is the second-longest river in Europe, after the Volga. It is about "
    "2,850 km long.\n"
    "Thought: The Danube is about 2,850 km long. Now the Rhine.\n"
    "Action: Wikipedia[Rhine]\n"
    "Observation: Rhine: The Rhine is a river that rises in the Swiss Alps and flows into the North Sea. "
    "It is about 1,230 km long.\n"
    "Thought: 2,850 km is more than 1,230 km, so the Danube is longer.\n"
    "Action: Finish[Danube]",
]

# A model must not invent the observation; everything from here on is cut off.
REACT_STOP = ["Observation:"]

# "Action:", "Action 2:", "**Action:**", "Action: `Tool[x]`": the label, then the call.
_ACTION_RE = re.compile(
    r"\bAction(?:[ \t]*\d+)?[ \t]*(?:\*\*|__)?[ \t]*[:：][ \t]*(?:\*\*|__)?[ \t]*`?[ \t]*", re.IGNORECASE
)
_THOUGHT_RE = re.compile(r"^\W*Thought(?:[ \t]*\d+)?[ \t]*[:：][ \t]*", re.IGNORECASE)
_BARE_FINISH_RE = re.compile(r"\bFinish[ \t]*\[", re.IGNORECASE)
_REF = "#E1"  # the id the action is parsed under; its deps and ref errors are ignored


def direct_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": f"{DIRECT_INSTRUCTIONS}\n\nQuestion: {question.strip()}"}]


@dataclass
class DirectAgent:
    """One call to the Solver model, no tools: the floor every tool-using method has to beat."""

    solver: Any
    _: KW_ONLY
    max_tokens: int = 64
    method: str = "direct"
    seed: int = 0

    async def run(self, example, sample: int = 0) -> dict:
        t0 = time.perf_counter()
        messages = direct_messages(example.question)
        seed = sample_seed(example.id, sample, self.seed)
        out = await self.solver.chat(messages, temperature=0.0, max_tokens=self.max_tokens, seed=seed)
        return make_record(
            example, self.method, sample, t0, evidence=[], solver=call_record(messages, out),
            prediction=prompts.extract_answer(out.text), solver_calls=[out], tools={}, recall=False,
        )


@dataclass(frozen=True)
class Action:
    """What one ReAct turn asked for: a tool call, `Finish[answer]`, or nothing usable (`error` says why)."""

    thought: str
    tool: str | None
    input: str
    error: str | None = None

    @property
    def finish(self) -> bool:
        return self.tool == FINISH


def parse_action(text: str, tools) -> Action:
    """Read `Thought: ...` and `Action: Tool[input]` from one model turn; never raises. The call is parsed as
    the plan step `#E1 = Tool[input]`, so tool names and brackets mean exactly what they do in plans. A bare
    `Finish[answer]` without `Action:` is accepted: small models often drop the label on the last turn."""
    label = _ACTION_RE.search(text)
    match = label or _BARE_FINISH_RE.search(text)
    if match is None:
        return Action(_thought(text), None, "", "no 'Action: Tool[input]' line")
    thought = _thought(text[: match.start()])
    raw = text[match.end() if label else match.start() :]
    plan = parse_plan(f"{_REF} = {raw}", tools=[*tools, FINISH])
    first = plan.steps[0] if plan.steps and plan.steps[0].id == _REF else None
    if first is None:
        found = raw.strip().splitlines()[0][:80] if raw.strip() else ""
        return Action(thought, None, "", f"not of the form Tool[input]: {found!r}")
    if any(e.step == _REF and e.code in ("malformed_step", "unknown_tool") for e in plan.errors):
        return Action(thought, None, first.input, f"unknown tool {first.tool!r}")
    return Action(thought, first.tool, first.input)


def _thought(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return _THOUGHT_RE.sub("", " ".join(lines)).strip()


def react_system_prompt(tools: Mapping[str, str]) -> str:
    listed = dict(tools) | {FINISH: "Ends the task. Input is the final answer, as a short phrase."}
    parts = [REACT_INSTRUCTIONS, "Tools can be one of the following:\n" + prompts.tool_list(listed), REACT_FORMAT]
    if "Wikipedia" in tools:
        parts.append("For example:\n\n" + "\n\n".join(REACT_EXEMPLARS))
    return "\n\n".join(parts)


def react_messages(question: str, tools: Mapping[str, str], turns: list[tuple[str, str | None]]) -> list[dict]:
    """A chat: static instructions and exemplars first (prefix-cacheable), the question, then one assistant
    message per earlier turn (its Thought and Action) answered by a user message with its Observation."""
    messages = [
        {"role": "system", "content": react_system_prompt(tools)},
        {"role": "user", "content": f"Question: {question.strip()}"},
    ]
    for turn, observation in turns:
        messages.append({"role": "assistant", "content": turn})
        if observation is not None:
            messages.append({"role": "user", "content": f"Observation: {observation}"})
    return messages


@dataclass
class ReActAgent:
    """Thought/Action/Observation with the Solver model, at most `max_steps` model calls. At the step cap the
    answer is empty, as in the original ReAct code, which gives up rather than guessing."""

    model: Any
    tools_for: Callable[[Any], Mapping[str, Any]]
    tool_descriptions: Mapping[str, str]
    _: KW_ONLY
    max_steps: int = 6
    max_tokens: int = 256
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    method: str = "react"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise DistillError(f"react_max_steps must be at least 1, got {self.max_steps}")

    async def run(self, example, sample: int = 0) -> dict:
        t0 = time.perf_counter()
        seed = sample_seed(example.id, sample, self.seed)
        tools = self.tools_for(example)
        turns: list[tuple[str, str | None]] = []
        steps: list[dict] = []
        evidence: list[dict] = []
        outs: list[Completion] = []
        for _ in range(self.max_steps):
            messages = react_messages(example.question, self.tool_descriptions, turns)
            out = await self.model.chat(
                messages, temperature=0.0, max_tokens=self.max_tokens, stop=REACT_STOP, seed=seed
            )
            outs.append(out)
            action = parse_action(out.text, self.tool_descriptions)
            observation, evidence_id = None, None
            if action.tool is None:  # an unusable action gets a hint instead, and no evidence
                names = ", ".join([*self.tool_descriptions, FINISH])
                observation = f"Invalid action ({action.error}). Write Action: Tool[input] with a tool from: {names}."
            elif not action.finish:  # through the Worker, so a tool fails exactly as it would for ReWOO
                evidence_id = f"#E{len(evidence) + 1}"
                plan = Plan((Step(evidence_id, action.thought, action.tool, action.input, ()),), ())
                (found,) = await run_plan(plan, tools, self.worker, t0=t0)
                evidence.append(found.to_dict())
                observation = found.output
            # The history shows canonical Thought/Action lines, whatever decoration the model wrote.
            act = f"{action.tool}[{action.input}]" if action.tool is not None else "(invalid)"
            turns.append((f"Thought: {action.thought}\nAction: {act}", observation))
            steps.append({
                "output": out.text, "thought": action.thought,
                "action": {"tool": action.tool, "input": action.input, "error": action.error},
                "observation": observation, "evidence_id": evidence_id, "usage": asdict(out.usage),
                "latency_s": round(out.latency_s, 4), "cost_usd": out.cost_usd, "cached": out.cached,
            })
            if action.finish:
                break
        finished = action.finish
        prediction = prompts.extract_answer(action.input) if finished else ""
        # The solver's usage, latency and cost are those of all its turns; the messages those of the last.
        total = Completion(
            outs[-1].text, sum((o.usage for o in outs), Usage()), sum(o.latency_s for o in outs),
            sum(o.cost_usd for o in outs), outs[-1].model, all(o.cached for o in outs),
        )
        stop_reason = "finish" if finished else "max_steps"
        react = {"steps": steps, "finished": finished, "stop_reason": stop_reason, "max_steps": self.max_steps}
        return make_record(
            example, self.method, sample, t0, evidence=evidence, prediction=prediction, solver_calls=outs,
            solver=call_record(messages, total) | {"calls": len(outs)}, tools=tools, react=react,
        )
