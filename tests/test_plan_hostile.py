"""The plan parser and the Worker's dependency code against hostile model output.

Planner output is untrusted and is parsed inside the agent's event loop, so one pathological output must
not stall every question in flight. The named inputs below took 3 s to over 120 s each before parsing was
made linear. Linearity is checked as growth, not as a time budget a loaded machine could miss: the same
shape at n and 8n in one test (tests/scaling.py); scripts/bench_parser.py prints the absolute times.
"""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distill.agent.factory import build_agent
from distill.core.config import AgentConfig, ModelSpec
from distill.llm.base import Completion, Usage
from distill.rewoo.agent import Question
from distill.rewoo.plan import DEFAULT_MAX_PLAN_CHARS, Plan, Step, parse_plan, render_plan
from distill.rewoo.worker import dependency_indices, run_plan_sync
from distill.tools.calculator import Calculator
from scaling import FACTOR, MAX_RATIO, assert_linear, growth
from test_plan import check_invariants

TOOLS = ("Wikipedia", "LLM", "Calculator")
HYPOTHESIS = settings(deadline=None, max_examples=150)


def codes(plan: Plan) -> list[tuple[str, str | None]]:
    return [(e.code, e.step) for e in plan.errors]


# --- the named hostile inputs, each its own test -----------------------------------------------------------

# name -> (the shape at a count c, the count of the named input)
SHAPES = {
    "plan, spaces, x": (lambda c: "plan" + " " * c + "x", 100_000),
    "spaces": (lambda c: " " * c, 100_000),
    "unclosed bracket, lines of 2000 spaces": (lambda c: "#E1 = Wikipedia[" + ("\n" + " " * 2000) * c, 200),
    "Plan line, continuation lines": (lambda c: "Plan: a" + "\nand then a continuation line of plan text" * c, 40_000),
    # Forms that would be quadratic through slicing or rescanning rather than backtracking.
    "steps on one line": (lambda c: "#E1 = LLM[x] " * c, 20_000),
    "inline Plan steps on one line": (lambda c: "Plan: a #E1 = LLM[x] " * c, 20_000),
    "id prefixes on a Plan line": (lambda c: "Plan: " + "#E" * c, 50_000),
    "unclosed brackets": (lambda c: "#E1 = LLM[" + "[" * c, 100_000),
    "unclosed steps": (lambda c: "#E1 = LLM[x\n" * c, 20_000),
    "heading and bullet run": (lambda c: "#" * 6 + " " * c + "-" + " " * c + "Plan", 50_000),
    "control characters before a step": (lambda c: "\x00" * c + "#E1 = LLM[x]", 100_000),
    "a long word in an input": (lambda c: "#E1 = LLM[" + "w" * c + "]", 100_000),
    "nested calls in an input": (lambda c: "#E1 = LLM[" + "a[" * c + "]" * c + "]", 20_000),
}
NAMED = {name: shape(count) for name, (shape, count) in SHAPES.items()}


@pytest.mark.parametrize("text", list(NAMED.values()), ids=list(NAMED))
def test_named_hostile_input_parses(text: str) -> None:
    check_invariants(parse_plan(text, tools=TOOLS, max_plan_chars=None))


@pytest.mark.parametrize("name", list(SHAPES))
def test_named_hostile_shape_parses_in_linear_time(name: str) -> None:
    shape, count = SHAPES[name]
    assert_linear(lambda c: partial(parse_plan, shape(c), tools=TOOLS, max_plan_chars=None), count // FACTOR, name)


@pytest.mark.parametrize("name", list(SHAPES))
def test_named_hostile_input_past_the_cap_is_too_long_and_costs_the_same_however_long(name: str) -> None:
    shape, count = SHAPES[name]
    plan = parse_plan(shape(count), tools=TOOLS)
    assert "too_long" in [e.code for e in plan.errors]
    assert not plan.valid
    # past the cap only the first max_plan_chars are read: 8x the text costs about the same, not 8x
    assert growth(lambda c: partial(parse_plan, shape(c), tools=TOOLS), count, max_n=count) < 3


def test_the_growth_check_tells_quadratic_from_linear() -> None:
    """The measure itself: a quadratic toy function fails it, a linear one passes."""
    linear = lambda c: partial(sum, range(c))
    quadratic = lambda c: partial(lambda n: sum(i for _ in range(n) for i in range(n // 64)), c)
    assert growth(linear, 20_000) < MAX_RATIO
    assert growth(quadratic, 400) > MAX_RATIO


def test_forty_thousand_continuation_lines_join_into_one_description() -> None:
    text = "Plan: a" + "\nmore" * 40_000 + "\n#E1 = LLM[x]"
    plan = parse_plan(text, max_plan_chars=None)
    assert plan.valid
    assert plan.steps[0].description == "a" + " more" * 40_000


def test_twenty_thousand_steps_on_one_line_all_parse() -> None:
    text = "".join(f"#E{i} = LLM[x #E{i - 1}] " for i in range(1, 20_001))
    plan = parse_plan(text, max_plan_chars=None)
    assert [s.id for s in plan.steps] == [f"#E{i}" for i in range(1, 20_001)]
    assert codes(plan) == [("undefined_ref", "#E1")]  # #E0 is never defined


def chained_steps(n: int) -> list[Step]:
    return [Step(f"#E{i}", "", "LLM", f"#E{i - 1}", (f"#E{i - 1}",)) for i in range(1, n + 1)]


def same_id_steps(n: int) -> list[Step]:
    return [Step("#E1", "", "LLM", "#E1", ("#E1",)) for _ in range(n)]


def test_dependency_indices_of_ten_thousand_chained_steps() -> None:
    assert dependency_indices(chained_steps(10_000)) == [[]] + [[i - 1] for i in range(1, 10_000)]
    assert_linear(lambda n: partial(dependency_indices, chained_steps(n)), 1_250, "chained steps")


def test_dependency_indices_of_steps_that_all_share_one_id() -> None:
    assert dependency_indices(same_id_steps(10_000)) == [[]] + [[i - 1] for i in range(1, 10_000)]
    assert_linear(lambda n: partial(dependency_indices, same_id_steps(n)), 1_250, "steps sharing one id")


# --- damaged step lines are malformed, not folded into Plan text ----------------------------------------

MALFORMED = [
    ("#E0", "Plan: a\n#E0 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E0"),
    ("#E00", "Plan: a\n#E00 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E00"),
    ("leading zero", "Plan: a\n#E01 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E01"),
    ("negative id", "Plan: a\n#E-1 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E-1"),
    ("fractional id", "Plan: a\n#E1.5 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E1.5"),
    ("letter id", "Plan: a\n#Ex = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#Ex"),
    ("no number", "Plan: a\n#E = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E"),
    ("lower case", "Plan: a\n#e2 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#e2"),
    ("non-ASCII digit", "Plan: a\n#E\u0661 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E\u0661"),
    ("missing hash", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\nE2 = LLM[#E1]", "#E2"),
    ("missing hash, colon", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\nE2: LLM[#E1]", "#E2"),
    ("missing hash, bulleted", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n- **E2** = LLM[#E1]", "#E2"),
    ("negative id, colon and call", "Plan: a\n#E-1: Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E-1"),
    ("inline negative id", "Plan: a #E-1 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E-1"),
    ("inline #E0", "Plan: a #E0 = Wikipedia[x]\nPlan: b\n#E1 = LLM[y]", "#E0"),
    ("NUL before step", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n\x00#E2 = LLM[#E1]", "#E2"),
    ("escape before step", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n\x1b#E2 = LLM[#E1]", "#E2"),
    ("DEL before step", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n\x7f#E2 = LLM[#E1]", "#E2"),
    ("C1 control before step", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n\x85#E2 = LLM[#E1]", "#E2"),
    ("vertical tab before step", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n\x0b#E2 = LLM[#E1]", "#E2"),
    ("zero-width space before step", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n\u200b#E2 = LLM[#E1]", "#E2"),
    ("byte-order mark before step", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n  \ufeff#E2 = LLM[#E1]", "#E2"),
]


@pytest.mark.parametrize("text,bad_id", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_damaged_step_line_is_malformed(text: str, bad_id: str) -> None:
    plan = parse_plan(text, tools=TOOLS)
    assert not plan.valid
    assert ("malformed_step", bad_id) in codes(plan)
    assert bad_id not in [s.id for s in plan.steps]
    # Nothing of the damaged line leaks into a description (it used to be folded into the Plan text).
    assert all("[" not in s.description and "=" not in s.description for s in plan.steps)
    assert all(e.message for e in plan.errors)


def test_damaged_step_uses_up_its_plan_text() -> None:
    plan = parse_plan("Plan: a\nE1 = Wikipedia[x]\nPlan: b\n#E2 = LLM[y]", tools=TOOLS)
    assert [(s.id, s.description) for s in plan.steps] == [("#E2", "b")]


def test_ref_to_a_damaged_step_says_why_it_is_undefined() -> None:
    plan = parse_plan("E1 = Wikipedia[x]\n#E2 = LLM[#E1]", tools=TOOLS)
    assert codes(plan) == [("malformed_step", "#E1"), ("undefined_ref", "#E2")]
    assert "malformed" in plan.errors[1].message


def test_multi_line_input_of_a_bad_id_is_not_read_as_steps() -> None:
    """`#E0`'s input spans lines; its inner lines must not come back as steps or Plan text."""
    plan = parse_plan("#E0 = LLM[compare\n#E5 and\n#E6]\nPlan: b\n#E1 = LLM[y]", tools=TOOLS)
    assert [s.id for s in plan.steps] == ["#E1"]
    assert codes(plan) == [("malformed_step", "#E0")]


PROSE = [
    ("physics", "Plan: recall that\nE = mc^2 holds\n#E1 = LLM[y]", "recall that E = mc^2 holds"),
    ("example label", "Plan: look it up\nExample: Wikipedia[Paris]\n#E1 = LLM[y]",
        "look it up Example: Wikipedia[Paris]"),
    ("ref in prose", "Plan: combine #E1 and E2 results\n#E1 = LLM[y]", "combine #E1 and E2 results"),
    ("markdown heading", "Plan: a\n# Evidence\n#E1 = LLM[y]", "a # Evidence"),
]


@pytest.mark.parametrize("text,description", [c[1:] for c in PROSE], ids=[c[0] for c in PROSE])
def test_prose_that_mentions_ids_is_not_a_step(text: str, description: str) -> None:
    plan = parse_plan(text, tools=TOOLS)
    assert plan.valid, plan.errors
    assert [(s.id, s.description) for s in plan.steps] == [("#E1", description)]


# --- bounds: max_plan_chars and max_plan_steps -------------------------------------------------------------


def steps_text(n: int) -> str:
    return "\n".join(f"Plan: step {i}\n#E{i} = Calculator[{i} + 1]" for i in range(1, n + 1))


def test_text_at_the_cap_is_read_whole_and_one_char_more_is_too_long() -> None:
    text = steps_text(3)
    assert parse_plan(text, max_plan_chars=len(text)).valid
    plan = parse_plan(text + " ", max_plan_chars=len(text))
    assert codes(plan) == [("too_long", None)]
    assert [s.id for s in plan.steps] == ["#E1", "#E2", "#E3"]
    assert str(len(text) + 1) in plan.errors[0].message


def test_too_long_keeps_the_steps_before_the_cut() -> None:
    text = steps_text(4)
    cut = text.index("#E3 = Calculator[") + len("#E3 = Calculator[")  # the cut falls inside #E3's input
    plan = parse_plan(text, tools=TOOLS, max_plan_chars=cut + 1)
    assert [s.id for s in plan.steps] == ["#E1", "#E2"]
    assert codes(plan) == [("malformed_step", "#E3"), ("too_long", None)]


def test_default_cap_is_the_documented_one() -> None:
    assert AgentConfig().max_plan_chars == DEFAULT_MAX_PLAN_CHARS
    assert parse_plan("x" * DEFAULT_MAX_PLAN_CHARS).errors[0].code == "empty_plan"
    assert "too_long" in [e.code for e in parse_plan("x" * (DEFAULT_MAX_PLAN_CHARS + 1)).errors]


def test_too_many_steps_keeps_the_first_ones() -> None:
    plan = parse_plan(steps_text(8), tools=TOOLS, max_plan_steps=6)
    assert [s.id for s in plan.steps] == [f"#E{i}" for i in range(1, 7)]
    assert codes(plan) == [("too_many_steps", "#E7")]
    assert "8 steps" in plan.errors[0].message and "max_plan_steps=6" in plan.errors[0].message


def test_at_the_step_bound_the_plan_is_valid_and_no_bound_is_the_default() -> None:
    assert parse_plan(steps_text(6), tools=TOOLS, max_plan_steps=6).valid
    assert len(parse_plan(steps_text(40), tools=TOOLS).steps) == 40


def test_a_ref_past_the_step_bound_is_a_forward_ref_and_dropped_steps_are_not_checked() -> None:
    text = "#E1 = LLM[#E3]\n#E2 = LLM[x]\n#E3 = Google[#E9]\n#E2 = LLM[y]"
    plan = parse_plan(text, tools=TOOLS, max_plan_steps=2)
    assert codes(plan) == [("forward_ref", "#E1"), ("too_many_steps", "#E3")]


def test_malformed_steps_do_not_count_towards_the_step_bound() -> None:
    plan = parse_plan("#E1 = LLM[a]\n#E0 = LLM[b]\n#E2 = LLM[c]", tools=TOOLS, max_plan_steps=2)
    assert [s.id for s in plan.steps] == ["#E1", "#E2"]
    assert codes(plan) == [("malformed_step", "#E0")]


class RunawayPlanner:
    """A Planner that repeats itself the way the demo student did (13 steps). It stands in for a model only
    because no real model can be made to misbehave on demand; the Solver and the tools are real."""

    name = "runaway"

    def __init__(self, text: str):
        self.text = text

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        return Completion(self.text, Usage(10, 100), model=self.name)


def test_agent_runs_at_most_max_plan_steps_tool_calls(smollm2) -> None:
    cfg = AgentConfig(
        tools=["Calculator"], wikipedia_corpus=None, solver=ModelSpec(max_tokens=4),
        max_plan_steps=3, max_plan_chars=2000,
    )
    agent = build_agent(cfg)
    agent.planner = RunawayPlanner(steps_text(13))
    record = asyncio.run(agent.run(Question("What is 6 + 1?")))
    assert record["tool_calls"] == 3
    assert [e["output"] for e in record["evidence"]] == ["2", "3", "4"]
    assert record["plan"]["valid"] is False
    assert [(e["code"], e["step"]) for e in record["plan"]["errors"]] == [("too_many_steps", "#E4")]
    cfg = cfg.model_copy(update={"max_plan_steps": 20, "max_plan_chars": 300})
    agent = build_agent(cfg)
    agent.planner = RunawayPlanner(steps_text(13))
    record = asyncio.run(agent.run(Question("What is 6 + 1?")))
    assert "too_long" in [e["code"] for e in record["plan"]["errors"]]
    assert 0 < record["tool_calls"] == len(record["plan"]["steps"]) < 13


# --- property tests ----------------------------------------------------------------------------------------

HOSTILE_FRAGMENTS = [
    "Plan:", "plan 2:", "**Plan:**", "PLAN", "plan", "1. ", "- ", "* ", "### ", "#", "#E", "#E1", "#E2", "#E0",
    "#E-1", "#E01", "E2", "e3", "#E10", "#E1 = ", "#E2: ", "E2 = ", " = ", ": ", "=", "Wikipedia", "LLM",
    "Calculator", "Tool", "[", "]", "[[", "]]", "\n", "\n\n", "\r\n", "\r", "```", "~~~", "**", "__", "`", " ", "\t",
    "x", "é", "\u0661", "\x00", "\x1b", "\x0b", "\x85", "\u200b", "\ufeff", "\u2028", " " * 300, "\t" * 100,
    "\n" + " " * 200, "[" * 50, "]" * 50, "#E" * 40, "Plan: a #E1 = LLM[", "]\n#E3 = LLM[#E1 #E2]\n",
]
step_like_text = st.lists(st.sampled_from(HOSTILE_FRAGMENTS) | st.text(max_size=6), max_size=60).map("".join)


def check_bounded_invariants(plan: Plan, max_plan_steps: int | None = None) -> None:
    check_invariants(plan)
    if max_plan_steps is not None:
        assert len(plan.steps) <= max_plan_steps


def check_dependencies(steps: tuple[Step, ...]) -> None:
    """dependency_indices agrees with its definition (the latest earlier step with the id), on any plan."""
    deps = dependency_indices(steps)
    assert len(deps) == len(steps)
    for index, (step, found) in enumerate(zip(steps, deps)):
        latest = {s.id: i for i, s in enumerate(steps[:index])}
        assert found == [latest[ref] for ref in step.deps if ref in latest]


@HYPOTHESIS
@given(text=st.text(max_size=2000))
def test_any_text_parses_without_crashing(text: str) -> None:
    for kwargs in ({}, {"tools": TOOLS, "max_plan_steps": 3, "max_plan_chars": 500}):
        plan = parse_plan(text, **kwargs)
        check_bounded_invariants(plan, kwargs.get("max_plan_steps"))
        check_dependencies(plan.steps)


@HYPOTHESIS
@given(text=step_like_text, max_plan_steps=st.none() | st.integers(1, 6))
def test_step_like_text_parses_without_crashing(text: str, max_plan_steps: int | None) -> None:
    plan = parse_plan(text, tools=TOOLS, max_plan_steps=max_plan_steps)
    check_bounded_invariants(plan, max_plan_steps)
    check_dependencies(plan.steps)
    reparsed = parse_plan(render_plan(plan), tools=TOOLS)
    assert [(s.id, s.tool, s.deps) for s in reparsed.steps] == [(s.id, s.tool, s.deps) for s in plan.steps]


@settings(deadline=None, max_examples=30)
@given(unit=step_like_text.filter(bool))
def test_parsing_time_is_linear_in_the_text(unit: str) -> None:
    """Repetition is what turns a quadratic parser slow: a generated unit repeated c and 8c times (c grown until
    the shorter text is worth timing, at most ~25k characters) must cost about 8x, parsing and dependencies."""
    max_n = max(1, 25_000 // len(unit))
    check_invariants(parse_plan(unit * max_n, tools=TOOLS, max_plan_chars=None))
    parse = lambda c: partial(parse_plan, unit * c, tools=TOOLS, max_plan_chars=None)
    start = max(1, max_n // 8)
    assert growth(parse, start, max_n=max_n) < MAX_RATIO, f"parse_plan of {unit!r} repeated"
    deps = lambda c: partial(dependency_indices, parse_plan(unit * c, tools=TOOLS, max_plan_chars=None).steps)
    assert growth(deps, start, max_n=max_n) < MAX_RATIO, f"dependency_indices of {unit!r} repeated"


@settings(deadline=None, max_examples=40)
@given(text=step_like_text)
def test_worker_runs_any_parsed_plan(text: str) -> None:
    """Whatever the parser lets through, the Worker finishes with one piece of evidence per step."""
    plan = parse_plan(text, max_plan_steps=6)
    evidence = run_plan_sync(plan, {"Calculator": Calculator()})
    assert [e.id for e in evidence] == [s.id for s in plan.steps]
    assert all(e.status in ("ok", "error", "timeout", "empty") for e in evidence)
