"""The planner reward's exact values on hand-made plans, run by the real Worker over the real BM25 index of the
demo corpus (and the real Calculator, whose refusal of text is the failed step)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from distill.core.data import Example, load_examples
from distill.agent.reward import RewardConfig, score_group, score_plan
from distill.tools.calculator import Calculator
from distill.tools.wikipedia import LocalWikipedia

ROOT = Path(__file__).resolve().parents[1]
JAWS = "Plan: the film.\n#E1 = Wikipedia[Jaws (film)]\n"
SPIELBERG = "Plan: its director.\n#E2 = Wikipedia[Steven Spielberg]\n"


@pytest.fixture(scope="module")
def tools() -> dict:
    return {"Wikipedia": LocalWikipedia(ROOT / "data" / "demo" / "corpus.jsonl", top_k=1), "Calculator": Calculator()}


@pytest.fixture(scope="module")
def jaws() -> Example:
    """`In which city was the director of the 1975 film Jaws born?`: gold pages Jaws (film), Steven Spielberg."""
    example = next(e for e in load_examples(ROOT / "data" / "demo" / "dev.jsonl", "hotpotqa", "dev")
                   if e.id == "demo-q004")
    assert [t for t, _ in example.supporting_facts] == ["Jaws (film)", "Steven Spielberg"]
    return example


def reward(output: str, example: Example, tools: dict, **weights):
    return asyncio.run(score_plan(output, example, tools, RewardConfig(**weights)))


def test_both_gold_pages_found(jaws, tools):
    r = reward(JAWS + SPIELBERG, jaws, tools)
    assert r.parts == {"valid": 1.0, "ran": 1.0, "recall": 1.0, "answer_in_evidence": None, "extra_steps": 0.0,
                       "duplicate_steps": 0.0}
    assert r.total == pytest.approx(0.2 + 0.2 + 1.0)
    assert [e["status"] for e in r.evidence] == ["ok", "ok"]


def test_one_gold_page_and_a_failed_step(jaws, tools):
    r = reward(JAWS + "Plan: add one.\n#E2 = Calculator[#E1 + 1]\n", jaws, tools)
    assert r.parts["ran"] == 0.5 and r.parts["recall"] == 0.5 and r.evidence[1]["status"] == "error"
    assert r.total == pytest.approx(0.2 + 0.2 * 0.5 + 0.5)


def test_steps_beyond_the_gold_pages_cost(jaws, tools):
    extra = "".join(f"Plan: more.\n#E{i} = Wikipedia[Jaws novel {i}]\n" for i in (3, 4))
    r = reward(JAWS + SPIELBERG + extra, jaws, tools, step_cost=0.1)
    assert r.parts["extra_steps"] == 2.0 and r.parts["recall"] == 1.0
    assert r.total == pytest.approx(0.2 + 0.2 + 1.0 - 0.1 * 2)


@pytest.mark.parametrize("output", [
    "#E1 = Google[Jaws (film)]",  # unknown tool
    "I think it is Cincinnati.",  # no plan
    "".join(f"Plan: step.\n#E{i} = Wikipedia[Jaws (film)]\n" for i in range(1, 8)),  # 7 steps, over the bound 6
])
def test_an_invalid_plan_earns_nothing_and_runs_no_tool(jaws, tools, output):
    r = reward(output, jaws, tools)
    assert r.total == 0.0 and r.parts["valid"] == 0.0 and r.evidence == []


def test_without_gold_pages_an_answer_alias_in_the_evidence_counts(tools):
    paris = Example("t1", "triviaqa", "dev", "What is the capital of France?", ["Paris", "Paris, France"])
    berlin = Example("t2", "triviaqa", "dev", "What is the capital of Germany?", ["Berlin"])
    plan = "Plan: look up France.\n#E1 = Wikipedia[France]\n"
    hit, miss = reward(plan, paris, tools), reward(plan, berlin, tools)
    assert hit.parts == {"valid": 1.0, "ran": 1.0, "recall": None, "answer_in_evidence": 1.0, "extra_steps": 0.0,
                         "duplicate_steps": 0.0}
    assert hit.total == pytest.approx(1.4) and miss.total == pytest.approx(0.4)
    three = plan + "Plan: more.\n#E2 = Wikipedia[Paris]\nPlan: more.\n#E3 = Wikipedia[Seine]\n"
    assert reward(three, paris, tools, free_steps=2).parts["extra_steps"] == 1.0


def test_a_group_is_scored_at_once_in_its_order(jaws, tools):
    outputs = [JAWS + SPIELBERG, "no plan", JAWS]
    rewards = asyncio.run(score_group(outputs, jaws, tools))
    assert [round(r.total, 6) for r in rewards] == [1.4, 0.0, 0.9]


def test_a_repeated_call_costs_the_duplicate_penalty_only_when_it_is_on(jaws, tools):
    """The third step asks Wikipedia for Jaws (film) again, in other case and spacing: it finds nothing new, so
    recall cannot tell it from the two-step plan; only its extra-step cost and, when on, the penalty can."""
    again = JAWS + SPIELBERG + "Plan: check the film again.\n#E3 = Wikipedia[  jaws   (FILM) ]\n"
    off, on = reward(again, jaws, tools), reward(again, jaws, tools, duplicate_step_penalty=0.1)
    assert off.parts == on.parts == {"valid": 1.0, "ran": 1.0, "recall": 1.0, "answer_in_evidence": None,
                                     "extra_steps": 1.0, "duplicate_steps": 1.0}
    assert off.total == pytest.approx(0.2 + 0.2 + 1.0 - 0.05)  # the default: as before the setting existed
    assert on.total == pytest.approx(off.total - 0.1)
    clean = reward(JAWS + SPIELBERG, jaws, tools, duplicate_step_penalty=0.1)
    assert clean.parts["duplicate_steps"] == 0.0 and clean.total == pytest.approx(1.4)  # no repeat, no cost


def test_the_duplicate_penalty_takes_a_plan_down_to_an_invalid_plans_zero_at_most(tools):
    berlin = Example("t2", "triviaqa", "dev", "What is the capital of Germany?", ["Berlin"])
    four = "".join(f"Plan: look up France.\n#E{i} = Wikipedia[France]\n" for i in range(1, 5))
    plain = reward(four, berlin, tools)  # 0.2 + 0.2 - 0.05 * 2 extra steps, no answer
    assert plain.parts["duplicate_steps"] == 3.0 and plain.total == pytest.approx(0.3)
    assert reward(four, berlin, tools, duplicate_step_penalty=0.05).total == pytest.approx(0.3 - 0.15)
    assert reward(four, berlin, tools, duplicate_step_penalty=1.0).total == 0.0  # not -2.7
    costly = reward(four, berlin, tools, step_cost=1.0, duplicate_step_penalty=1.0)  # already below 0: left there
    assert costly.total == pytest.approx(0.4 - 2.0)


@pytest.mark.parametrize("penalty", [-0.1, 1.5])
def test_the_duplicate_penalty_is_bounded(penalty):
    with pytest.raises(ValidationError, match="duplicate_step_penalty"):
        RewardConfig(duplicate_step_penalty=penalty)


def test_without_unread_steps_only_the_searches_and_what_they_read_run(jaws, tools):
    """#E2 feeds the search #E3, so it runs; #E4 (a Calculator step on #E1 that fails) feeds no search, so with
    run_unread_steps false it is not run: recall is the same, `ran` counts the three steps run."""
    plan = (JAWS + "Plan: a year.\n#E2 = Calculator[1974 + 1]\n"
            "Plan: search with it.\n#E3 = Wikipedia[Steven Spielberg #E2]\n"
            "Plan: unread.\n#E4 = Calculator[#E1 + 1]\n")
    every, read = reward(plan, jaws, tools), reward(plan, jaws, tools, run_unread_steps=False)
    assert [e["id"] for e in every.evidence] == ["#E1", "#E2", "#E3", "#E4"]
    assert [e["id"] for e in read.evidence] == ["#E1", "#E2", "#E3"]
    def found(evidence):
        return [(e["id"], e["input"], e["output"], e["status"]) for e in evidence]

    assert found(read.evidence) == found(every.evidence)[:3]
    assert every.parts["ran"] == 0.75 and read.parts["ran"] == 1.0
    assert read.parts["recall"] == every.parts["recall"] and read.parts["extra_steps"] == every.parts["extra_steps"]
    nothing_read = reward("Plan: add.\n#E1 = Calculator[1 + 1]\n", jaws, tools, run_unread_steps=False)
    assert nothing_read.evidence == [] and nothing_read.parts["ran"] == 0.0
    assert nothing_read.total == pytest.approx(0.2)


def test_without_gold_pages_every_step_runs_whatever_run_unread_steps_says(tools):
    """The answer may be in any step's evidence, so a TriviaQA question's plan always runs whole."""
    paris = Example("t1", "triviaqa", "dev", "What is the capital of France?", ["Paris"])
    plan = "Plan: look up France.\n#E1 = Wikipedia[France]\nPlan: a sum.\n#E2 = Calculator[1 + 1]\n"
    assert [e["id"] for e in reward(plan, paris, tools, run_unread_steps=False).evidence] == ["#E1", "#E2"]


def test_run_unread_steps_at_its_default_leaves_a_fingerprint_as_it_was():
    """Added after runs were recorded: at its default it is not digested, so adding it redoes no finished work."""
    assert "run_unread_steps" not in RewardConfig().first_named_dump()
    assert RewardConfig(run_unread_steps=False).first_named_dump()["run_unread_steps"] is False
    assert RewardConfig().first_named_dump() == RewardConfig().model_dump(mode="json", exclude={"run_unread_steps"})
