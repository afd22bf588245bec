"""ReAct and Direct: action parsing on written text, and the loops run on the real in-process SmolLM2."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from distill.agent.factory import make_tools_for
from distill.agent.baselines import (
    FINISH,
    Action,
    DirectAgent,
    ReActAgent,
    direct_messages,
    parse_action,
    react_messages,
    react_system_prompt,
)
from distill.core.config import AgentConfig
from distill.core.data import load_examples
from distill.core.errors import DistillError
from distill.core.metrics import score
from distill.rewoo.prompts import extract_answer
from distill.tools.registry import TOOL_DESCRIPTIONS, tool_descriptions

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl"
TOOLS = tool_descriptions(["Wikipedia", "LLM"])


# ------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, tool, arg",
    [
        ("Thought: find the opera.\nAction: Wikipedia[Carmen (opera)]", "Wikipedia", "Carmen (opera)"),
        ("Action: wikipedia[Carmen]", "Wikipedia", "Carmen"),  # registry spelling
        ("Action 3: LLM[Who wrote [the] opera?]", "LLM", "Who wrote [the] opera?"),  # nested brackets
        ("**Action:** Wikipedia[Georges Bizet]", "Wikipedia", "Georges Bizet"),
        ("Action: `Wikipedia[Bizet]`", "Wikipedia", "Bizet"),
        ("Action: LLM[line one\nline two]", "LLM", "line one\nline two"),  # input across lines
        ("Action: Finish[France]", FINISH, "France"),
        ("Action: finish[yes]", FINISH, "yes"),
        ("Thought: done. Finish[Paris]", FINISH, "Paris"),  # bare Finish without the label
        ("Thought: x\nAction: Wikipedia[Carmen]\nAction: Finish[France]", "Wikipedia", "Carmen"),  # first only
    ],
)
def test_parse_action_reads_the_call_with_the_plan_parser_rules(text, tool, arg):
    action = parse_action(text, TOOLS)
    assert (action.tool, action.input, action.error) == (tool, arg, None)
    assert action.finish == (tool == FINISH)


def test_parse_action_keeps_the_thought():
    action = parse_action("Thought 2: Bizet was French.\nAction 2: Finish[France]", TOOLS)
    assert action == Action("Bizet was French.", FINISH, "France")


@pytest.mark.parametrize(
    "text, error",
    [
        ("The answer is France.", "no 'Action: Tool[input]' line"),
        ("Action: Search[Carmen]", "unknown tool 'Search'"),
        ("Action: Wikipedia[Carmen", "not of the form Tool[input]"),
        ("Action: look it up", "not of the form Tool[input]"),
        ("", "no 'Action: Tool[input]' line"),
    ],
)
def test_unusable_actions_say_why_and_never_raise(text, error):
    action = parse_action(text, TOOLS)
    assert action.tool is None and not action.finish
    assert error in action.error


def test_react_prompt_lists_tools_finish_and_only_usable_exemplars():
    system = react_system_prompt(TOOLS)
    assert "(1) Wikipedia[input]" in system and "(3) Finish[input]" in system and "Action: Finish[Germany]" in system
    assert "For example" not in react_system_prompt({"LLM": TOOL_DESCRIPTIONS["LLM"]})  # exemplars need Wikipedia


def test_react_history_grows_one_exchange_per_turn():
    turns = [("Thought: a\nAction: Wikipedia[Carmen]", "Carmen: an opera."), ("Thought: b\nAction: Finish[x]", None)]
    messages = react_messages("Q?", TOOLS, turns)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[3]["content"] == "Observation: Carmen: an opera."
    assert react_messages("Q?", TOOLS, turns[:1])[:4] == messages[:4]  # earlier prompt is a prefix


def test_step_cap_must_be_positive():
    with pytest.raises(DistillError, match="at least 1"):
        ReActAgent(None, lambda ex: {}, TOOLS, max_steps=0)


# ------------------------------------------------------------------------------------ real SmolLM2


@pytest.fixture(scope="module")
def mini():
    return {ex.id: ex for ex in load_examples(str(MINI), "hotpotqa", "dev")}


def react_agent(model, max_steps: int, max_tokens: int) -> ReActAgent:
    cfg = AgentConfig(tools=["Wikipedia", "LLM"], wikipedia_scope="question", wikipedia_corpus=None)
    return ReActAgent(model, make_tools_for(cfg, model), TOOLS, max_steps=max_steps, max_tokens=max_tokens)


def check_react_record(rec: dict, max_steps: int) -> None:
    steps = rec["react"]["steps"]
    assert 1 <= len(steps) <= max_steps
    finished = steps[-1]["action"]["tool"] == FINISH
    assert rec["react"]["finished"] == finished
    assert rec["react"]["stop_reason"] == ("finish" if finished else "max_steps")
    if not finished:
        assert len(steps) == max_steps and rec["prediction"] == ""
    else:
        assert rec["prediction"] == extract_answer(steps[-1]["action"]["input"])
    assert all(s["action"]["tool"] != FINISH for s in steps[:-1])  # Finish ends the loop
    for step in steps:  # what the model wrote is what was parsed
        assert parse_action(step["output"], TOOLS).tool == step["action"]["tool"]
    prompts = [s["usage"]["prompt_tokens"] for s in steps]
    assert prompts == sorted(prompts) and len(set(prompts)) == len(prompts)  # the history grows every turn
    usage = rec["solver"]["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == rec["tokens"]["solver"]
    assert rec["tokens"]["solver"] == sum(s["usage"]["prompt_tokens"] + s["usage"]["completion_tokens"] for s in steps)
    tool_steps = [s for s in steps if s["action"]["tool"] not in (None, FINISH)]
    assert len(rec["evidence"]) == len(tool_steps) == rec["tool_calls"]
    assert [s["evidence_id"] for s in tool_steps] == [e["id"] for e in rec["evidence"]]
    llm_tool_calls = rec["llm_calls"] - len(steps)
    assert llm_tool_calls == sum(1 for s in tool_steps if s["action"]["tool"] == "LLM")
    assert (rec["tokens"]["tools"] > 0) == (llm_tool_calls > 0)
    assert rec["planner"] is None and rec["plan"] == {"valid": None, "steps": [], "errors": []}
    assert rec["scores"] == score(rec["dataset"], rec["prediction"], rec["answers"])


@pytest.mark.slow
def test_react_stops_at_finish(smollm2, mini):
    """Greedy SmolLM2 answers this one with Action: Finish[...] on its second turn (the first has no action).
    Slow: two full turns with the growing history (about a minute on a busy 2-core machine)."""
    rec = asyncio.run(react_agent(smollm2, 3, 40).run(mini["mini-3"]))
    check_react_record(rec, 3)
    assert rec["react"]["stop_reason"] == "finish" and len(rec["react"]["steps"]) < 3
    assert rec["llm_calls"] == len(rec["react"]["steps"])


def test_react_stops_at_the_step_cap(smollm2, mini):
    rec = asyncio.run(react_agent(smollm2, 1, 8).run(mini["mini-1"]))
    check_react_record(rec, 1)
    assert rec["react"]["stop_reason"] == "max_steps" and len(rec["react"]["steps"]) == 1
    assert rec["prediction"] == "" and rec["scores"]["em"] == 0
    recall = rec["evidence_recall"]  # ReAct's evidence is measured as a plan's is, for the report to compare
    assert recall["gold"] == ["Carmen", "Georges Bizet"] and recall["recall"] == len(recall["found"]) / 2


def test_direct_is_one_solver_call(smollm2, mini):
    example = mini["mini-1"]
    rec = asyncio.run(DirectAgent(smollm2, max_tokens=8, method="direct").run(example))
    assert rec["method"] == "direct" and rec["planner"] is None and rec["evidence"] == []
    assert rec["plan"] == {"valid": None, "steps": [], "errors": []}
    assert rec["solver"]["messages"] == direct_messages(example.question)
    assert example.question in rec["solver"]["messages"][0]["content"]
    assert rec["prediction"] == extract_answer(rec["solver"]["output"])
    usage = rec["solver"]["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 8
    assert rec["tokens"] == {"planner": 0, "solver": usage["prompt_tokens"] + usage["completion_tokens"], "tools": 0,
                             "total": usage["prompt_tokens"] + usage["completion_tokens"]}
    assert rec["llm_calls"] == 1 and rec["tool_calls"] == 0
    assert rec["scores"] == score("hotpotqa", rec["prediction"], example.answers)
