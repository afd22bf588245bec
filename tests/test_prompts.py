"""The one prompt builder and the answer extractor."""

from __future__ import annotations

import pytest

from distill.rewoo.plan import parse_plan
from distill.rewoo.prompts import (
    PROMPT_KINDS, FEWSHOT_EXEMPLARS, extract_answer, planner_messages, prompt_kind_of, solver_messages,
)
from distill.tools.registry import TOOL_DESCRIPTIONS, tool_descriptions


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


@pytest.mark.parametrize("kind", PROMPT_KINDS)
def test_static_text_first_and_question_last(kind):
    a = planner_messages("Who wrote Dracula?", TOOL_DESCRIPTIONS, kind)
    b = planner_messages("Where is Ulm?", TOOL_DESCRIPTIONS, kind)
    assert a[:-1] == b[:-1]  # all but the question is shared: a server's prefix cache reuses it
    assert a[-1] == {"role": "user", "content": "Question: Who wrote Dracula?"} and a[0]["role"] == "system"
    assert planner_messages("Who wrote Dracula?", TOOL_DESCRIPTIONS, kind) == a  # deterministic


def test_full_student_prompt_has_no_exemplars_but_lists_tools():
    student = planner_messages("Q?", TOOL_DESCRIPTIONS, "full")
    teacher = planner_messages("Q?", TOOL_DESCRIPTIONS, "fewshot")
    assert [m["role"] for m in student] == ["system", "user"] and student[0] == teacher[0]
    assert all(f"{name}[input]" in student[0]["content"] for name in TOOL_DESCRIPTIONS)
    assert sum(len(m["content"]) for m in student) < sum(len(m["content"]) for m in teacher) / 2


def test_compact_prompt_names_the_tools_in_config_order_and_nothing_else():
    tools = tool_descriptions(["calculator", "Wikipedia"])
    system = planner_messages("Q?", tools, "compact")[0]["content"]
    assert system == "Tools: Calculator, Wikipedia"
    full = planner_messages("Q?", tools, "full")[0]["content"]
    assert all(desc not in system for desc in tools.values()) and all(desc in full for desc in tools.values())


def test_an_unknown_prompt_kind_is_refused_not_guessed():
    with pytest.raises(ValueError, match="unknown planner prompt kind 'zeroshot'; known: fewshot, full, compact"):
        planner_messages("Q?", TOOL_DESCRIPTIONS, "zeroshot")  # the old name is read as `full` by configs only


def test_configs_read_the_old_name_zeroshot_as_full_and_refuse_unknown_kinds():
    from distill.core.config import AgentConfig, validate
    from distill.core.errors import DistillError
    from distill.evaluate import PlannerEntry
    from distill.sft_data import SftDataConfig

    assert validate(AgentConfig, {"planner_prompt": "zeroshot"}).planner_prompt == "full"
    assert validate(AgentConfig, {"planner_prompt": "compact"}).planner_prompt == "compact"
    assert validate(SftDataConfig, {"student_prompt": "zeroshot"}).student_prompt == "full"
    entry = {"name": "s", "spec": {"model": "m"}}
    assert validate(PlannerEntry, entry | {"prompt": "zeroshot"}).prompt == "full"
    for bad in ("short", ["full"]):
        with pytest.raises(DistillError, match="planner_prompt") as info:
            validate(AgentConfig, {"planner_prompt": bad})
        assert "\n" not in str(info.value)


def test_compact_prompt_is_at_most_a_fifth_of_the_teachers_in_tokens():
    """Prompt tokens as the server counts them: the real SmolLM2 tokenizer with its chat template, on the
    demo's own questions and tools."""
    from pathlib import Path

    from distill.core.data import load_examples
    from distill.sft_data import load_tokenizer, prompt_tokens

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    root = Path(__file__).resolve().parents[1]
    tools = tool_descriptions(["Wikipedia", "LLM"])
    for example in load_examples(str(root / "data" / "demo" / "dev.jsonl"), "hotpotqa", "dev", limit=3):
        n = {kind: prompt_tokens(planner_messages(example.question, tools, kind), tokenizer) for kind in PROMPT_KINDS}
        assert n["compact"] * 5 <= n["fewshot"] and n["compact"] < n["full"] < n["fewshot"]


def test_exemplars_are_valid_canonical_plans():
    for _, plan in FEWSHOT_EXEMPLARS:
        assert parse_plan(plan, tools=TOOL_DESCRIPTIONS).valid


def test_exemplars_needing_a_missing_tool_are_left_out():
    messages = planner_messages("Q?", {"Wikipedia": TOOL_DESCRIPTIONS["Wikipedia"], "LLM": TOOL_DESCRIPTIONS["LLM"]}, "fewshot")
    content = "\n".join(m["content"] for m in messages)
    assert "Calculator[" not in content and "Wikipedia[Danube]" in content


def test_fewshot_exemplars_are_earlier_turns_answered_by_the_assistant():
    """Chat models copy a turn they answered; the question stays the last message, after the static prefix."""
    messages = planner_messages("Q?", TOOL_DESCRIPTIONS, "fewshot")
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * len(FEWSHOT_EXEMPLARS) + ["user"]
    assert [m["content"] for m in messages[2:-1:2]] == [plan for _, plan in FEWSHOT_EXEMPLARS]
    assert messages[-1]["content"] == "Question: Q?" and "Question:" not in messages[0]["content"]


def test_prompt_kind_is_read_back_from_recorded_messages():
    tools = {"Wikipedia": TOOL_DESCRIPTIONS["Wikipedia"], "LLM": TOOL_DESCRIPTIONS["LLM"]}
    for kind in PROMPT_KINDS:
        assert prompt_kind_of(planner_messages("Q?", tools, kind)) == kind
    # a record written when the exemplars sat inside the system message
    full = planner_messages("Q?", tools, "full")
    older = [{"role": "system", "content": full[0]["content"] + "\n\nFor example:\n\nQuestion: x\nPlan: y"}, full[1]]
    assert prompt_kind_of(older) == "fewshot"
    assert prompt_kind_of([{"role": "user", "content": "Q?"}]) is None


def test_solver_sees_every_step_with_its_evidence():
    plan = parse_plan("Plan: a\n#E1 = Wikipedia[x]\nPlan: b\n#E2 = LLM[#E1]")
    msgs = solver_messages("Q?", plan.steps, [{"id": "#E1", "output": "ev one"}])
    text = msgs[0]["content"]
    assert "Plan: a\nEvidence: ev one" in text and "Plan: b\nEvidence: No evidence found" in text
    assert text.rstrip().endswith("Question: Q?")


@pytest.mark.slow  # loads the real SmolLM2 in-process
@pytest.mark.parametrize("kind", ["full", "compact"])
def test_student_prompt_bytes_are_the_same_in_sft_data_eval_and_ask(tmp_path, capsys, kind):
    """The student is served exactly the prompt it was trained on, in either student prompt kind: one config
    (tools mis-cased, as hand-written configs are), each stage's real code path, the real SmolLM2 as planner
    and solver (one token each)."""
    import asyncio
    import json
    from pathlib import Path

    from distill.cli import main as cli_main
    from distill.core.config import validate
    from distill.evaluate import EvalConfig, build_method, methods_of
    from distill.rewoo.agent import Question

    root = Path(__file__).resolve().parents[1]
    question = "Which river is longer, the Danube or the Rhine?"
    tools = ["wikipedia", "LLM"]
    model = {"backend": "transformers", "model": "smollm2-135m-instruct", "max_tokens": 1}
    corpus = str(root / "data" / "demo" / "corpus.jsonl")

    kept = tmp_path / "kept.jsonl"
    output = "Plan: Find both lengths.\n#E1 = Wikipedia[Danube]\nPlan: Compare.\n#E2 = LLM[Which is longer? #E1]"
    from distill.rewoo.plan import parse_plan

    record = {"id": "q1", "dataset": "hotpotqa", "question": question, "answers": ["the Danube"],
              "planner": {"output": output}, "plan": parse_plan(output).to_dict()}  # a kept record
    kept.write_text(json.dumps(record))
    out = tmp_path / "sft"
    argv = ["sft-data", str(kept), "--out", str(out), "--tools", ",".join(tools), "--tokenizer", "none"]
    assert cli_main(argv + ["--student-prompt", kind]) == 0
    trained = json.loads((out / "preview.jsonl").read_text().splitlines()[0])["prompt"]

    cfg = validate(EvalConfig, {
        "planners": [{"name": "student", "prompt": kind, "spec": model}], "solver": model, "tools": tools,
        "wikipedia_corpus": corpus, "baselines": ["direct"],
    })
    agent = build_method(cfg, methods_of(cfg)[0])
    evaluated = asyncio.run(agent.run(Question(question)))["planner"]["messages"]

    capsys.readouterr()
    sets = [f"tools=[{', '.join(tools)}]", f"planner_prompt={kind}", "planner.max_tokens=1", "solver.max_tokens=1",
            f"wikipedia_corpus={corpus}"]
    argv = ["ask", question, "--config", str(root / "configs" / "ask_smollm2_local.yaml"), "--json"]
    assert cli_main(argv + [arg for s in sets for arg in ("--set", s)]) == 0
    asked = json.loads(capsys.readouterr().out)["planner"]["messages"]

    as_bytes = [json.dumps(m, ensure_ascii=False).encode() for m in (trained, evaluated, asked)]
    assert as_bytes[0] == as_bytes[1] == as_bytes[2]
    system = trained[0]["content"]
    if kind == "compact":
        assert system == "Tools: Wikipedia, LLM"
    else:
        assert "Wikipedia[input]" in system and "LLM[input]" in system and "Calculator" not in system
    assert "For example" not in system and trained[-1]["content"].endswith(question)


def test_an_eval_config_under_the_old_name_resumes_as_full_but_not_as_compact():
    """Configs written before `compact` existed say `zeroshot`: the same student prompt as `full`, so records made
    with one resume under the other (the same fingerprint); `compact` is another prompt."""
    from distill.core.config import validate
    from distill.evaluate import EvalConfig, methods_of, run_fingerprints

    spec = {"model": "smollm2-135m-instruct"}
    fps = {}
    for kind in ("zeroshot", "full", "compact"):
        cfg = validate(EvalConfig, {"planners": [{"name": "student", "prompt": kind, "spec": spec}]})
        fps[kind] = run_fingerprints(cfg, methods_of(cfg))["student"]["fingerprint"]
    assert fps["zeroshot"] == fps["full"] != fps["compact"]
