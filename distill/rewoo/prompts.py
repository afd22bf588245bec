"""The one place where planner and solver prompts are built.

Generation (teacher), training (student), evaluation and `distill ask` all call `planner_messages`, so the
student is served exactly the prompt it was trained on. Static text comes first and the question last, so a
server's prefix cache reuses the instructions, tool list and exemplars across questions.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Mapping, Sequence, get_args

from distill.rewoo.plan import Plan, render_plan
from distill.rewoo.worker import NO_EVIDENCE

# The planner prompt kinds, by what the planner must be told:
#   fewshot  the teacher: instructions, tool descriptions, format and worked exemplars
#   full     a student without exemplars: instructions, tool descriptions and format
#   compact  a trained student: the tool names and the question; instructions, descriptions and format are
#            what fine-tuning taught it, so sending them again costs prompt tokens on every call
PromptKind = Literal["fewshot", "full", "compact"]
PROMPT_KINDS: tuple[str, ...] = get_args(PromptKind)

PLANNER_INSTRUCTIONS = (
    "For the following task, make plans that can solve the problem step by step. For each plan, indicate "
    "which external tool together with tool input to retrieve evidence. You can store the evidence into a "
    "variable #E that can be called by later tools. (Plan, #E1, Plan, #E2, Plan, ...)"
)

PLANNER_FORMAT = (
    "Write each step as two lines:\n"
    "Plan: <what this step finds out>\n"
    "#E<n> = <Tool>[<tool input, which may use earlier evidence such as #E1>]\n"
    "Describe your plans with rich details. Each Plan should be followed by only one #E. "
    "Write only the plan: no answer, no other text."
)

# Exemplars written for this project (facts checked; no demo question), in the canonical format the parser
# renders. They are sent as earlier chat turns, not inside the system message: chat models copy a turn they
# answered, and the last turns weigh most, so the bridge shape (HotpotQA's commonest) comes last. Plan lines
# are short so a four-step plan fits the planners' 128 tokens. In the demo's generate stage (96 train questions x 2
# samples, SmolLM2-135M at temperature 0.5) 154 of 192 plans were valid, against 91 with the exemplars inside
# the system message (BENCHMARKS.md, "The few-shot teacher's prompt").
FEWSHOT_EXEMPLARS: list[tuple[str, str]] = [
    (
        "Which river is longer, the Danube or the Rhine?",
        "Plan: Find the Danube's length.\n"
        "#E1 = Wikipedia[Danube]\n"
        "Plan: Find the Rhine's length.\n"
        "#E2 = Wikipedia[Rhine]\n"
        "Plan: Compare them.\n"
        "#E3 = LLM[Which river is longer, the Danube or the Rhine? Given context: #E1 and #E2]",
    ),
    (
        "How many years passed between the founding of Harvard University and the signing of the United States "
        "Declaration of Independence?",
        "Plan: Find when Harvard was founded.\n"
        "#E1 = Wikipedia[Harvard University]\n"
        "Plan: Extract the founding year.\n"
        "#E2 = LLM[In which year was Harvard University founded? Answer with the year only. Given context: #E1]\n"
        "Plan: Count the years to 1776.\n"
        "#E3 = Calculator[1776 - #E2]",
    ),
    (
        "Which country is the birthplace of the physicist who proposed the theory of general relativity?",
        "Plan: Find who proposed general relativity.\n"
        "#E1 = Wikipedia[general relativity]\n"
        "Plan: Name the physicist.\n"
        "#E2 = LLM[Who proposed the theory of general relativity? Given context: #E1]\n"
        "Plan: Find where he was born.\n"
        "#E3 = Wikipedia[#E2]\n"
        "Plan: Name the country.\n"
        "#E4 = LLM[In which country was #E2 born? Given context: #E3]",
    ),
    (
        "What is the capital of the country where Angkor Wat stands?",
        "Plan: Find where Angkor Wat is.\n"
        "#E1 = Wikipedia[Angkor Wat]\n"
        "Plan: Name the country.\n"
        "#E2 = LLM[In which country does Angkor Wat stand? Given context: #E1]\n"
        "Plan: Find that country.\n"
        "#E3 = Wikipedia[#E2]\n"
        "Plan: Name its capital.\n"
        "#E4 = LLM[What is the capital of #E2? Given context: #E3]",
    ),
]

SOLVER_INSTRUCTIONS = (
    "Solve the following task or problem. To assist you, we provide some plans and corresponding evidence "
    "that might be helpful. Notice that some of this information contains noise, so you should trust it "
    "with caution."
)

SOLVER_SUFFIX = (
    "Now begin to solve the task or problem. Respond with the answer directly, as a short phrase "
    "(a name, a number, yes or no), with no extra words."
)


_TOOL_USE = re.compile(r"= (\w+)\[")


def tool_list(tools: Mapping[str, str]) -> str:
    return "\n".join(f"({i}) {name}[input]: {desc}" for i, (name, desc) in enumerate(tools.items(), 1))


def canonical_prompt_kind(kind):
    """The kind an alias stands for; anything else unchanged (validation says what is wrong with it).
    `zeroshot` was the name of `full` before `compact` existed: configs and records written then keep working."""
    return {"zeroshot": "full"}.get(kind, kind) if isinstance(kind, str) else kind


def planner_messages(question: str, tools: Mapping[str, str], kind: PromptKind) -> list[dict]:
    """A system message, the fewshot kind's exemplars as earlier turns, then the question, the only part that
    varies. Even the compact prompt has a system message: without one, chat templates insert their own default
    (SmolLM2's and Qwen2.5's do)."""
    if kind not in PROMPT_KINDS:
        raise ValueError(f"unknown planner prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
    turns: list[dict] = []
    if kind == "compact":
        system = "Tools: " + ", ".join(tools)
    else:
        system = "\n\n".join([PLANNER_INSTRUCTIONS, "Tools can be one of the following:\n" + tool_list(tools),
                              PLANNER_FORMAT])
        if kind == "fewshot":
            for q, p in FEWSHOT_EXEMPLARS:
                if set(_TOOL_USE.findall(p)) <= set(tools):
                    turns += [{"role": "user", "content": f"Question: {q}"}, {"role": "assistant", "content": p}]
    return [{"role": "system", "content": system}, *turns, {"role": "user", "content": f"Question: {question.strip()}"}]


def prompt_kind_of(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The planner prompt kind a recorded planner call was sent, read back from its messages (records keep the
    messages, not the kind): what the SFT data says its teacher was prompted with. None: a prompt distill's
    builder did not write. Records written when the exemplars sat inside the system message read as fewshot."""
    system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
    if system.startswith("Tools: "):
        return "compact"
    if system.startswith(PLANNER_INSTRUCTIONS):
        shots = any(m.get("role") == "assistant" for m in messages) or "\n\nFor example:\n\n" in system
        return "fewshot" if shots else "full"
    return None


def solver_messages(question: str, steps: Sequence, evidence: Sequence) -> list[dict]:
    """Plan steps with their evidence (by id), then the task; steps with no evidence say so."""
    outputs = dict((e["id"], e["output"]) if isinstance(e, Mapping) else (e.id, e.output) for e in evidence)
    blocks = [f"Plan: {step.description}\nEvidence: {outputs.get(step.id, NO_EVIDENCE)}" for step in steps]
    body = "\n\n".join(blocks) if blocks else "(no plan was made)"
    content = f"{SOLVER_INSTRUCTIONS}\n\n{body}\n\n{SOLVER_SUFFIX}\n\nQuestion: {question.strip()}"
    return [{"role": "user", "content": content}]


_PREFIX = re.compile(
    r"^(final answer|answer|response|the (final |correct )?answer( to (this|the) (question|task|problem))? is)"
    r"\s*[:\-]?\s*",
    re.I,
)


def extract_answer(text: str) -> str:
    """A short, direct answer: the first non-empty line, without 'Answer:' prefixes, quotes or a final period."""
    for line in text.strip().splitlines():
        line = _PREFIX.sub("", line.replace("**", "").strip())
        if line:
            line = line.strip().strip('"').strip("'").strip()
            return line[:-1].strip() if line.endswith(".") and not line.endswith("..") else line
    return ""


def replan_messages(
    planner_messages: Sequence[dict], steps: Sequence, evidence: Sequence, trigger: Mapping[str, str], next_id: int
) -> list[dict]:
    """The Planner's own prompt continued with its plan so far, each step's evidence and what went wrong,
    asking for the steps that remain. Continuing the first prompt keeps its prefix cacheable and serves the
    student the prompt it was trained on."""
    notes = ["" if ev.status == "ok" else f" ({ev.status}: {ev.error})" for ev in evidence]
    blocks = [f"Evidence {ev.id} from {ev.tool}[{ev.input}]{note}: {ev.output}" for ev, note in zip(evidence, notes)]
    content = (
        "Evidence so far:\n\n" + "\n\n".join(blocks) + "\n\n"
        f"Step {trigger['step']} gave no usable evidence ({trigger['kind']}). Write a new plan for what the "
        f"task still needs, in the same format. Number its steps from #E{next_id} on; they may use the "
        f"evidence of {', '.join(dict.fromkeys(s.id for s in steps))} by its id. Do not repeat a step that "
        "already gave evidence."
    )
    plan_so_far = {"role": "assistant", "content": render_plan(Plan(tuple(steps), ())).strip()}
    return [*planner_messages, plan_so_far, {"role": "user", "content": content}]
