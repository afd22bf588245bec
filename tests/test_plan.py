"""Tests for the ReWOO plan parser (distill/rewoo/plan.py) and `distill plan check`."""

from __future__ import annotations

import argparse
import io
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distill.cli import main as cli_main
from distill.rewoo import plan as plan_check
from distill.core.errors import DistillError
from distill.rewoo.plan import (
    ERROR_CODES,
    Plan,
    PlanError,
    Step,
    duplicate_steps,
    find_refs,
    parse_plan,
    render_plan,
    substitute,
)

TOOLS = ("Wikipedia", "LLM", "Calculator")
HYPOTHESIS = settings(deadline=None, max_examples=200)


def triples(plan: Plan) -> list[tuple[str, str, str, str]]:
    return [(s.id, s.description, s.tool, s.input) for s in plan.steps]


def codes(plan: Plan) -> list[tuple[str, str | None]]:
    return [(e.code, e.step) for e in plan.errors]


CANONICAL = """Plan: Find out who directed Titanic.
#E1 = Wikipedia[Titanic (1997 film)]
Plan: Find the director's birth year.
#E2 = LLM[In what year was the director named in #E1 born?]
"""
CANONICAL_STEPS = [
    ("#E1", "Find out who directed Titanic.", "Wikipedia", "Titanic (1997 film)"),
    ("#E2", "Find the director's birth year.", "LLM", "In what year was the director named in #E1 born?"),
]
TWELVE = "\n".join(f"Plan: step {n}\n#E{n} = LLM[use #E{n - 1}]" for n in range(2, 13))
TWELVE = "Plan: step 1\n#E1 = Wikipedia[start]\n" + TWELVE

PARSE_CASES = [
    ("canonical", CANONICAL, CANONICAL_STEPS),
    ("colon id", "Plan: a\n#E1: Wikipedia[x]\nPlan: b\n#E2: LLM[y #E1]", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y #E1")]),
    ("bold plan colon inside", "**Plan:** look up\n#E1 = Wikipedia[x]", [("#E1", "look up", "Wikipedia", "x")]),
    ("bold plan colon outside", "**Plan**: look up\n#E1 = Wikipedia[x]", [("#E1", "look up", "Wikipedia", "x")]),
    ("bold whole line", "**Plan: look up**\n#E1 = Wikipedia[x]", [("#E1", "look up", "Wikipedia", "x")]),
    ("bold numbered", "**Plan 1:** look up\n#E1 = Wikipedia[x]", [("#E1", "look up", "Wikipedia", "x")]),
    ("numbered list", "1. Plan: a\n#E1 = Wikipedia[x]\n2. Plan: b\n#E2 = LLM[y]", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y")]),
    ("plan n colon", "Plan 1: a\n#E1 = Wikipedia[x]\nPlan 2: b\n#E2 = LLM[y]", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y")]),
    ("bullets", "- Plan: a\n- #E1 = Wikipedia[x]\n* Plan: b\n* #E2 = LLM[y]", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y")]),
    ("heading", "### Plan: a\n#E1 = Wikipedia[x]", [("#E1", "a", "Wikipedia", "x")]),
    ("upper case", "PLAN: a\n#E1 = Wikipedia[x]", [("#E1", "a", "Wikipedia", "x")]),
    ("bold and code ids", "Plan: a\n**#E1** = Wikipedia[x]\nPlan: b\n`#E2 = LLM[y]`", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y")]),
    ("code fence", "Here is my plan:\n```text\n" + CANONICAL + "```\nI hope this helps.", CANONICAL_STEPS),
    ("tilde fence", "~~~\n" + CANONICAL + "~~~", CANONICAL_STEPS),
    ("blank lines", "\n\nPlan: a\n\n\n#E1 = Wikipedia[x]\n\n\nPlan: b\n\n#E2 = LLM[y]\n\n", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y")]),
    ("multi-line input", "Plan: compare\n#E1 = LLM[Compare these:\n- first\n- second\n]", [
        ("#E1", "compare", "LLM", "Compare these:\n- first\n- second")]),
    ("nested brackets", "Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n#E2 = LLM[Compare [a] with #E1]", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "Compare [a] with #E1")]),
    ("deeply nested", "#E1 = LLM[[[a]] [b [c]] d]", [("#E1", "", "LLM", "[[a]] [b [c]] d")]),
    ("ten-plus steps", TWELVE, [("#E1", "step 1", "Wikipedia", "start")]
        + [(f"#E{n}", f"step {n}", "LLM", f"use #E{n - 1}") for n in range(2, 13)]),
    ("no plan line", "#E1 = Wikipedia[x]\nPlan: b\n#E2 = LLM[y]\n#E3 = LLM[z]", [
        ("#E1", "", "Wikipedia", "x"), ("#E2", "b", "LLM", "y"), ("#E3", "", "LLM", "z")]),
    ("whitespace", "   Plan:   a b  \n\t  #E1 =Wikipedia [ x ]  \n  #E2=LLM[y]", [
        ("#E1", "a b", "Wikipedia", "x"), ("#E2", "", "LLM", "y")]),
    ("trailing ramble", CANONICAL + "\nThis plan first finds the director, then [maybe] #E2 gives the year.\n"
        "Let me know if you need anything else!", CANONICAL_STEPS),
    ("trailing text on step line", "Plan: a\n#E1 = Wikipedia[x] (this finds x)\nPlan: b\n#E2 = LLM[y]**", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y")]),
    ("plans listed first", "Plan: a\nPlan: b\n#E1 = Wikipedia[x]\n#E2 = LLM[y]", [
        ("#E1", "a", "Wikipedia", "x"), ("#E2", "b", "LLM", "y")]),
    ("inline step", "Plan: look it up. #E1 = Wikipedia[x]\nPlan: then use it #E2 = LLM[y #E1]", [
        ("#E1", "look it up.", "Wikipedia", "x"), ("#E2", "then use it", "LLM", "y #E1")]),
    ("ref mention in plan", "Plan: use #E1 to answer\n#E1 = LLM[q]", [("#E1", "use #E1 to answer", "LLM", "q")]),
    ("wrapped description", "Plan: find the\ndirector first\n#E1 = Wikipedia[x]", [
        ("#E1", "find the director first", "Wikipedia", "x")]),
    ("crlf", CANONICAL.replace("\n", "\r\n"), CANONICAL_STEPS),
    ("empty input", "Plan: a\n#E1 = LLM[]", [("#E1", "a", "LLM", "")]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_parse_forms(text: str, expected: list[tuple[str, str, str, str]]) -> None:
    plan = parse_plan(text, tools=TOOLS)
    assert triples(plan) == expected
    assert plan.errors == ()
    assert plan.valid


def test_deps_are_unique_in_order_of_first_use() -> None:
    plan = parse_plan("#E1 = A[a]\n#E2 = B[b]\n#E3 = C[#E2 then #E1 and #E2 again]")
    assert plan.steps[2].deps == ("#E2", "#E1")
    assert plan.valid


def test_steps_past_e9_keep_their_inputs() -> None:
    """The reference implementation turns #E10+ into 'No evidence found'; we keep them whole."""
    plan = parse_plan(TWELVE, tools=TOOLS)
    assert len(plan.steps) == 12
    assert plan.steps[9] == Step("#E10", "step 10", "LLM", "use #E9", ("#E9",))
    assert plan.steps[11].deps == ("#E11",)


ERROR_CASES = [
    ("empty text", "", None, [("empty_plan", None)]),
    ("prose only", "I think the answer is Paris.\nPlan: nothing to do", None, [("empty_plan", None)]),
    ("unknown tool", "#E1 = Google[x]\n#E2 = LLM[#E1]", TOOLS, [("unknown_tool", "#E1")]),
    ("tools not checked without registry", "#E1 = Google[x]", None, []),
    ("undefined ref", "#E1 = Wikipedia[x]\n#E2 = LLM[#E1 and #E7]", TOOLS, [("undefined_ref", "#E2")]),
    ("forward ref", "#E1 = LLM[#E2]\n#E2 = Wikipedia[x]", TOOLS, [("forward_ref", "#E1")]),
    ("self ref", "#E1 = Wikipedia[x]\n#E2 = LLM[#E2]", TOOLS, [("forward_ref", "#E2")]),
    ("duplicate id", "#E1 = Wikipedia[x]\n#E1 = Wikipedia[y]", TOOLS, [("duplicate_id", "#E1")]),
    ("no brackets", "#E1 = Wikipedia[x]\n#E2 = Wikipedia\n#E3 = LLM[#E1]", TOOLS, [("malformed_step", "#E2")]),
    ("unclosed bracket", "#E1 = Wikipedia[x\nPlan: next\n#E2 = LLM[y]", TOOLS, [("malformed_step", "#E1")]),
    ("unclosed at end", "#E1 = Wikipedia[x]\n#E2 = LLM[compare [a] with #E1", TOOLS, [("malformed_step", "#E2")]),
    ("no tool after colon", "#E1: the population of Paris", TOOLS, [("empty_plan", None), ("malformed_step", "#E1")]),
    ("tool call inside an input", "#E1 = Wikipedia[x]\n#E2 = Wikipedia[LLM[Lemoine] Wozniak]", TOOLS,
        [("malformed_step", "#E2")]),
    ("nested call, then a ref to it", "#E1 = LLM[Wikipedia[x]]\n#E2 = LLM[#E1]", TOOLS,
        [("malformed_step", "#E1"), ("undefined_ref", "#E2")]),
    ("brackets in prose are input", "#E1 = LLM[Answer as [number]: 2+2]", TOOLS, []),
    ("ref to malformed step", "#E1 = Wikipedia\n#E2 = LLM[#E1]", TOOLS,
        [("malformed_step", "#E1"), ("undefined_ref", "#E2")]),
    ("errors in text order", "#E1 = Foo[#E2]\n#E2 = Wikipedia[x]\n#E3 = Calculator", TOOLS,
        [("unknown_tool", "#E1"), ("forward_ref", "#E1"), ("malformed_step", "#E3")]),
]


@pytest.mark.parametrize("text,tools,expected", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_error_codes(text: str, tools: tuple[str, ...] | None, expected: list[tuple[str, str | None]]) -> None:
    plan = parse_plan(text, tools=tools)
    assert codes(plan) == expected
    assert plan.valid is (not expected)
    assert all(e.message for e in plan.errors)


def test_malformed_step_is_left_out_but_its_neighbours_parse() -> None:
    plan = parse_plan("Plan: a\n#E1 = Wikipedia[x\nPlan: b\n#E2 = LLM[y]\nPlan: c\n#E3 = Calculator", tools=TOOLS)
    assert triples(plan) == [("#E2", "b", "LLM", "y")]
    assert codes(plan) == [("malformed_step", "#E1"), ("malformed_step", "#E3")]


def test_missing_bracket_does_not_swallow_the_next_step() -> None:
    """Without the new-line stop, the stray `]]` below would close #E1 and eat #E2 into its input."""
    plan = parse_plan("Plan: a\n#E1 = Wikipedia[Paris\nPlan: b\n#E2 = LLM[x]]\n#E3: LLM[#E2]]", tools=TOOLS)
    assert triples(plan) == [("#E2", "b", "LLM", "x"), ("#E3", "", "LLM", "#E2")]
    assert codes(plan) == [("malformed_step", "#E1")]


def test_duplicate_is_kept_and_refs_resolve_to_the_first_definition() -> None:
    plan = parse_plan("#E1 = Wikipedia[x]\n#E2 = LLM[#E3]\n#E3 = LLM[a]\n#E2 = LLM[#E2]", tools=TOOLS)
    assert [s.id for s in plan.steps] == ["#E1", "#E2", "#E3", "#E2"]
    assert codes(plan) == [("forward_ref", "#E2"), ("duplicate_id", "#E2")]


def test_tool_names_normalised_to_registered_spelling() -> None:
    plan = parse_plan("#E1 = wikipedia[x]\n#E2 = llm[#E1]\n#E3 = CALCULATOR[1+1]", tools=TOOLS)
    assert [s.tool for s in plan.steps] == ["Wikipedia", "LLM", "Calculator"]
    assert plan.valid
    assert parse_plan("#E1 = wikipedia[x]").steps[0].tool == "wikipedia"  # no registry, no renaming


def test_tools_may_be_objects_with_a_name() -> None:
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    plan = parse_plan("#E1 = wikipedia[x]\n#E2 = Search[y]", tools=[Named("Wikipedia")])
    assert plan.steps[0].tool == "Wikipedia"
    assert codes(plan) == [("unknown_tool", "#E2")]


def test_to_dict_shape() -> None:
    plan = parse_plan("Plan: a\n#E1 = Wikipedia[x]\n#E2 = LLM[#E1 #E5]", tools=TOOLS)
    assert plan.to_dict() == {
        "valid": False,
        "steps": [
            {"id": "#E1", "description": "a", "tool": "Wikipedia", "input": "x", "deps": []},
            {"id": "#E2", "description": "", "tool": "LLM", "input": "#E1 #E5", "deps": ["#E1", "#E5"]},
        ],
        "errors": [{"code": "undefined_ref", "step": "#E2", "message": plan.errors[0].message}],
    }
    json.dumps(plan.to_dict())


# --- duplicate steps ---------------------------------------------------------------------------------------

EIFFEL = "".join(f"Plan: look it up.\n#E{i} = Wikipedia[Eiffel Tower]\n" for i in range(1, 5))


@pytest.mark.parametrize("text, expected", [
    (EIFFEL, 3),  # what the served student wrote: one call and three repeats
    (CANONICAL, 0),  # every step a call of its own
    ("#E1 = Wikipedia[Eiffel Tower]\n#E2 = wikipedia[  eiffel   TOWER ]\n#E3 = Wikipedia[Eiffel\tTower]", 2),
    ("#E1 = Wikipedia[Eiffel Tower]\n#E2 = LLM[Eiffel Tower]", 0),  # the same input to another tool is another call
    ("#E1 = Wikipedia[Paris]\n#E2 = Wikipedia[Paris, France]\n#E3 = Wikipedia[Pari s]", 0),  # inner words count
    ("#E1 = Wikipedia[a]\n#E2 = LLM[sum #E1]\n#E3 = LLM[Sum  #e1]\n#E4 = LLM[sum #E2]", 1),  # refs as written
    ("#E1 = Wikipedia[a]\n#E2 = Wikipedia[b]\n#E3 = Wikipedia[A]\n#E4 = Wikipedia[B]\n#E5 = Wikipedia[a]", 3),
    ("no plan at all", 0),
])
def test_duplicate_steps_count_repeats_of_an_earlier_call(text: str, expected: int) -> None:
    plan = parse_plan(text, tools=TOOLS)
    assert duplicate_steps(plan.steps) == expected
    assert duplicate_steps(plan.to_dict()["steps"]) == expected  # a record's stored steps count the same


def test_duplicate_steps_of_a_long_plan_is_its_steps_less_its_distinct_calls() -> None:
    steps = [Step(f"#E{i}", "", "Wikipedia", f" page {i % 97} ", ()) for i in range(1, 20001)]
    assert duplicate_steps(steps) == 20000 - 97
    assert duplicate_steps([]) == 0
    # without a tool registry the parser keeps the model's spelling: the tool name is compared casefolded too
    assert duplicate_steps(parse_plan("#E1 = wikipedia[x]\n#E2 = WIKIPEDIA[x ]").steps) == 1


def test_types_are_frozen() -> None:
    plan = parse_plan(CANONICAL)
    with pytest.raises(AttributeError):
        plan.steps[0].tool = "LLM"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        PlanError("empty_plan", None, "m").code = "x"  # type: ignore[misc]


# --- references and substitution -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("#E1 and #E10 and #E11", ["#E1", "#E10", "#E11"]),
        ("#E10 #E1 #E10 #E1", ["#E10", "#E1"]),
        ("no refs, E1, #e1, # E1", []),
        ("[#E2][#E3]#E2x", ["#E2", "#E3"]),
    ],
)
def test_find_refs(text: str, expected: list[str]) -> None:
    assert find_refs(text) == expected


@pytest.mark.parametrize(
    "text,evidence,expected",
    [
        ("#E1 vs #E10 vs #E11", {"#E1": "one"}, "one vs #E10 vs #E11"),
        ("#E1 vs #E10 vs #E11", {"#E10": "ten", "#E11": "eleven"}, "#E1 vs ten vs eleven"),
        ("#E1#E1", {"#E1": "a"}, "aa"),
        ("(#E1), [#E1].", {"#E1": "x"}, "(x), [x]."),
        ("#E12 and #E2", {"#E1": "BAD", "#E2": "two"}, "#E12 and two"),
        ("#E3 unknown", {"#E1": "x"}, "#E3 unknown"),
        ("#E1 then #E2", {"#E1": "mentions #E2", "#E2": "two"}, "mentions #E2 then two"),
        ("nothing", {"#E1": "x"}, "nothing"),
    ],
)
def test_substitute_replaces_whole_tokens_only(text: str, evidence: dict[str, str], expected: str) -> None:
    assert substitute(text, evidence) == expected


@HYPOTHESIS
@given(n=st.integers(1, 30), text=st.text(max_size=40))
def test_substitute_never_splices_into_longer_ids(n: int, text: str) -> None:
    longer = f"#E{n}{n % 10}"
    combined = f"{longer} {text} #E{n}"
    result = substitute(combined, {f"#E{n}": "\x00"})
    assert result.startswith(longer + " ")
    assert result.endswith(" \x00")


# --- render ----------------------------------------------------------------------------------------------


def test_render_is_canonical() -> None:
    plan = parse_plan("**Plan:** a\n#E1: wikipedia [x]\n1. Plan: b\n#E2 =LLM[y #E1]", tools=TOOLS)
    assert render_plan(plan) == "Plan: a\n#E1 = Wikipedia[x]\n\nPlan: b\n#E2 = LLM[y #E1]\n"
    assert parse_plan(render_plan(plan), tools=TOOLS) == plan


# --- property tests --------------------------------------------------------------------------------------

FRAGMENTS = [
    "Plan:", "plan 2:", "**Plan:**", "1. ", "- ", "#E", "#E1", "#E2", "#E10", "#E1 = ", "#E2: ", " = ", ": ", "=",
    "Wikipedia", "LLM", "Calculator", "[", "]", "[[", "]]", "\n", "\n\n", "\r\n", "```", "```text\n", "~~~", "**",
    "`", " ", "\t", "x", "Paris", "#", "Plan: a #E1 = LLM[", "]\n#E3 = LLM[#E1 #E2]\n", "é", "١",
]
plan_like_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=40).map("".join)


def check_invariants(plan: Plan) -> None:
    assert plan.valid is (not plan.errors)
    assert all(e.code in ERROR_CODES and e.message for e in plan.errors)
    assert all(re.fullmatch(r"#E[1-9][0-9]*", s.id) for s in plan.steps)
    assert all(s.deps == tuple(find_refs(s.input)) for s in plan.steps)
    assert all("\n" not in s.tool and "[" not in s.tool for s in plan.steps)
    assert ("empty_plan", None) in codes(plan) or plan.steps
    json.dumps(plan.to_dict())


@HYPOTHESIS
@given(text=st.text())
def test_parse_never_raises_on_any_text(text: str) -> None:
    check_invariants(parse_plan(text))
    check_invariants(parse_plan(text, tools=TOOLS))


@HYPOTHESIS
@given(text=plan_like_text)
def test_parse_never_raises_on_plan_like_text(text: str) -> None:
    plan = parse_plan(text, tools=TOOLS)
    check_invariants(plan)
    reparsed = parse_plan(render_plan(plan), tools=TOOLS)
    assert [(s.id, s.tool, s.deps) for s in reparsed.steps] == [(s.id, s.tool, s.deps) for s in plan.steps]


WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789.,?'()-", min_size=1, max_size=8)
DESC_WORD = WORD | st.sampled_from(["#E1", "#E10", "[note]", "what's", "E12"])
REF = "@REF@"  # placeholder, replaced by an id of an earlier step once the step's position is known
# Inputs with balanced (nested) brackets, refs and line breaks; stripped, as the parser strips them.
INPUT_TREE = st.recursive(
    WORD | st.just(REF),
    lambda inner: st.lists(inner, max_size=3).map(lambda xs: "[" + " ".join(xs) + "]"),
    max_leaves=6,
)
INPUT = st.lists(INPUT_TREE | st.just("\n"), max_size=4).map(lambda xs: " ".join(xs).strip())


@st.composite
def valid_plans(draw: st.DrawFn) -> Plan:
    numbers = sorted(draw(st.sets(st.integers(1, 40), min_size=1, max_size=14)))
    steps: list[Step] = []
    for n in numbers:
        earlier = [s.id for s in steps] or ["no-ref"]
        raw = re.sub(REF, lambda _: draw(st.sampled_from(earlier)), draw(INPUT))
        desc = " ".join(draw(st.lists(DESC_WORD, max_size=6)))
        steps.append(Step(f"#E{n}", desc, draw(st.sampled_from(TOOLS)), raw, tuple(find_refs(raw))))
    return Plan(tuple(steps), ())


@HYPOTHESIS
@given(plan=valid_plans())
def test_render_parse_round_trip(plan: Plan) -> None:
    assert parse_plan(render_plan(plan), tools=TOOLS) == plan


# --- CLI -------------------------------------------------------------------------------------------------


@pytest.fixture
def plan_file(tmp_path):
    def write(text: str):
        path = tmp_path / "plan.txt"
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


def test_cli_human_output_valid(plan_file, capsys) -> None:
    assert cli_main(["plan", "check", plan_file(CANONICAL)]) == 0
    out = capsys.readouterr().out
    assert "#E1 = Wikipedia[Titanic (1997 film)]" in out
    assert "deps: #E1" in out
    assert out.strip().endswith("valid: 2 steps")


def test_cli_human_output_invalid(plan_file, capsys) -> None:
    assert cli_main(["plan", "check", plan_file("#E1 = Google[x]\n#E2 = LLM[#E3]")]) == 1
    out = capsys.readouterr().out
    assert "unknown_tool #E1" in out
    assert "undefined_ref #E2" in out
    assert "invalid (2 errors)" in out


def test_cli_json_shape(plan_file, capsys) -> None:
    text = "**Plan:** a\n#E1 = wikipedia[x]\n#E2 = LLM[#E1 #E9]"
    assert cli_main(["plan", "check", plan_file(text), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"valid", "steps", "errors"}
    assert data["valid"] is False
    assert data["steps"][0] == {"id": "#E1", "description": "a", "tool": "Wikipedia", "input": "x", "deps": []}
    assert data["steps"][1]["deps"] == ["#E1", "#E9"]
    assert [set(e) for e in data["errors"]] == [{"code", "step", "message"}]
    assert data["errors"][0]["code"] == "undefined_ref" and data["errors"][0]["step"] == "#E2"


def test_cli_json_empty_plan_has_null_step(plan_file, capsys) -> None:
    assert cli_main(["plan", "check", plan_file("nothing here"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data == {"valid": False, "steps": [], "errors": [{"code": "empty_plan", "step": None,
                                                             "message": data["errors"][0]["message"]}]}


@pytest.mark.parametrize("argv", [["plan", "check", "-", "--json"], ["plan", "check", "--json"]])
def test_cli_reads_stdin(argv: list[str], monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(CANONICAL))
    assert cli_main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True and [s["id"] for s in data["steps"]] == ["#E1", "#E2"]


def test_cli_custom_tools(plan_file, capsys) -> None:
    path = plan_file("#E1 = search[x]\n#E2 = Wikipedia[y]")
    assert cli_main(["plan", "check", path, "--tools", "Search, Calculator", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["steps"][0]["tool"] == "Search"
    assert [(e["code"], e["step"]) for e in data["errors"]] == [("unknown_tool", "#E2")]
    assert cli_main(["plan", "check", path, "--tools", ""]) == 0  # empty list: no tool check
    capsys.readouterr()


def test_cli_missing_file(tmp_path, capsys) -> None:
    missing = str(tmp_path / "nope.txt")
    assert cli_main(["plan", "check", missing]) == 2
    assert capsys.readouterr().err.strip() == f"error: plan file not found: {missing}"
    args = argparse.Namespace(file=missing, tools="LLM", json=False)
    with pytest.raises(DistillError, match="not found"):
        plan_check.main(args)


def test_cli_non_utf8_file(tmp_path, capsys) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"Plan: \xff\xfe\n#E1 = LLM[x]")
    assert cli_main(["plan", "check", str(path)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_cli_checks_the_step_bound_every_stage_uses(plan_file, capsys) -> None:
    from distill.core.config import AgentConfig

    text = "".join(f"Plan: step {i}\n#E{i} = Wikipedia[x{i}]\n" for i in range(1, 9))
    assert AgentConfig().max_plan_steps == 6
    assert cli_main(["plan", "check", plan_file(text)]) == 1
    assert "too_many_steps #E7" in capsys.readouterr().out
    assert cli_main(["plan", "check", plan_file(text), "--max-plan-steps", "8"]) == 0
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["plan", "check", plan_file(text), "--max-plan-steps", "0"])
    assert exit_info.value.code == 2 and "at least 1" in capsys.readouterr().err
