"""The one prompt builder and the answer extractor."""

from __future__ import annotations

import pytest

from distill.rewoo.plan import parse_plan
from distill.rewoo.prompts import FEWSHOT_EXEMPLARS, extract_answer, planner_messages, solver_messages
from distill.tools.registry import TOOL_DESCRIPTIONS


@pytest.mark.parametrize(
    "text,answer",
    [
        ("Paris", "Paris"),
        ("Answer: Paris.", "Paris"),
        ("The answer to this question is no", "no"),
        ("The answer is: 1776", "1776"),
        ("**Final answer:** Barcelona", "Barcelona"),
        ("\n\n  Danube\nBecause it flows through Budapest.", "Danube"),
        ("J. R. R. Tolkien...", "J. R. R. Tolkien..."),
        ("", ""),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_static_text_first_and_question_last():
    a = planner_messages("Who wrote Dracula?", TOOL_DESCRIPTIONS, fewshot=True)
    b = planner_messages("Where is Ulm?", TOOL_DESCRIPTIONS, fewshot=True)
    assert a[0] == b[0]  # the whole system message is shared: a server's prefix cache reuses it
    assert a[1]["content"].endswith("Who wrote Dracula?")


def test_zero_shot_student_prompt_has_no_exemplars_but_lists_tools():
    student = planner_messages("Q?", TOOL_DESCRIPTIONS, fewshot=False)[0]["content"]
    teacher = planner_messages("Q?", TOOL_DESCRIPTIONS, fewshot=True)[0]["content"]
    assert "For example" not in student and "For example" in teacher
    assert all(f"{name}[input]" in student for name in TOOL_DESCRIPTIONS)
    assert len(student) < len(teacher) / 2


def test_exemplars_are_valid_canonical_plans():
    for _, plan in FEWSHOT_EXEMPLARS:
        assert parse_plan(plan, tools=TOOL_DESCRIPTIONS).valid


def test_exemplars_needing_a_missing_tool_are_left_out():
    content = planner_messages("Q?", {"Wikipedia": TOOL_DESCRIPTIONS["Wikipedia"], "LLM": TOOL_DESCRIPTIONS["LLM"]}, True)[0]["content"]
    assert "Calculator[" not in content and "Wikipedia[Danube]" in content


def test_solver_sees_every_step_with_its_evidence():
    plan = parse_plan("Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n#E2 = LLM[#E1]")
    msgs = solver_messages("Q?", plan.steps, [{"id": "#E1", "output": "ev one"}])
    text = msgs[0]["content"]
    assert "Plan: a\nEvidence: ev one" in text and "Plan: b\nEvidence: No evidence found" in text
    assert text.rstrip().endswith("Question: Q?")
