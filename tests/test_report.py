"""The evaluation report from hand-made records: bootstrap CIs, paired tests, per-hop tokens, recomputation."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from distill.core.errors import DistillError
from distill.core.metrics import answer_in_text, bootstrap_ci, evidence_recall, paired_bootstrap, score
from distill.report import (
    answer_reach_of,
    compute,
    hops_of,
    method_metrics,
    paired_vs_reference,
    prompt_budget_summary,
    recompute,
    render_markdown,
    summary_lines,
    tokens_by,
    write_report,
)
from distill.core.store import write_json, write_jsonl


def rec(
    method: str,
    qid: str,
    prediction: str,
    answer: str,
    *,
    kind: str = "rewoo",
    steps: int = 2,
    tokens: int = 100,
    cost: float = 0.0,
    wall: float = 1.0,
    valid: bool = True,
    gold_hops: int | None = 2,
    judge: bool | None | str = "absent",
    dataset: str = "hotpotqa",
    planner_prompt_tokens: int = 50,
    evidence_status: str = "ok",
    gold: list[str] | None = None,
    titles: tuple[str, ...] = (),
    plan_errors: tuple[str, ...] = (),
) -> dict:
    """A record in the trajectory format with just what the report reads; scores and evidence recall as the
    agents store them. `gold`: the question's supporting pages; `titles`: the pages the first step retrieved."""
    plan_steps = [{"id": f"#E{i}", "description": "", "tool": "Wikipedia", "input": f"x{i}", "deps": []} for i in
                  range(1, steps + 1)]
    found = "\n\n".join(f"{t}: a paragraph about {t}." for t in titles)
    evidence = [{"id": s["id"], "tool": "Wikipedia", "input": "x", "output": found if i == 0 and found else "y",
                 "status": evidence_status, "error": None, "start_s": 0.0, "end_s": 0.1}
                for i, s in enumerate(plan_steps)]
    r = {
        "format_version": 1, "id": qid, "dataset": dataset, "question": f"q {qid}?", "answers": [answer],
        "method": method, "sample": 0, "kind": kind, "planner_prompt": "zeroshot" if kind == "rewoo" else None,
        "planner": {"model": "p", "usage": {"prompt_tokens": planner_prompt_tokens, "completion_tokens": 10}}
        if kind == "rewoo" else None,
        "plan": {"valid": valid and not plan_errors, "steps": plan_steps,
                 "errors": [{"code": c, "step": None, "message": c} for c in plan_errors]} if kind == "rewoo"
        else {"valid": None, "steps": [], "errors": []},
        "evidence": evidence if kind != "direct" else [],
        "solver": {"model": "s", "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
        "prediction": prediction,
        "scores": dict(score(dataset, prediction, [answer])),
        "tokens": {"planner": tokens // 2 if kind == "rewoo" else 0, "solver": tokens - (tokens // 2 if kind == "rewoo"
                   else 0), "tools": 0, "total": tokens},
        "llm_calls": 2 if kind == "rewoo" else (steps + 1 if kind == "react" else 1),
        "cost_usd": cost, "wall_s": wall, "gold_hops": gold_hops, "tool_failure_rate": 0.0,
    }
    r["evidence_recall"] = evidence_recall(gold, r["evidence"]) if gold else None
    if kind == "react":
        actions = [{"action": {"tool": "Wikipedia", "input": "x", "error": None}} for _ in range(steps)]
        r["react"] = {"steps": actions + [{"action": {"tool": "Finish", "input": prediction, "error": None}}],
                      "finished": True}
    if judge != "absent":
        r["scores"]["judge"] = judge
    return r


def test_em_f1_ci_are_the_bootstrap_of_the_rescored_predictions():
    preds = [("Paris", "Paris"), ("Lyon", "Paris"), ("the Danube river", "Danube"), ("no", "no"), ("x", "y")]
    records = [rec("m", f"q{i}", p, a) for i, (p, a) in enumerate(preds)]
    records[1]["scores"] = {"em": 1, "f1": 1.0}  # a wrong stored score must not leak into the report
    m = method_metrics(records, samples=500, seed=3)
    em = [float(score("hotpotqa", p, [a])["em"]) for p, a in preds]
    f1 = [float(score("hotpotqa", p, [a])["f1"]) for p, a in preds]
    assert (m["em"]["mean"], m["em"]["lo"], m["em"]["hi"]) == pytest.approx(bootstrap_ci(em, n=500, seed=3))
    assert (m["f1"]["mean"], m["f1"]["lo"], m["f1"]["hi"]) == pytest.approx(bootstrap_ci(f1, n=500, seed=3))
    assert m["em"]["mean"] == pytest.approx(0.4) and m["em"]["lo"] <= 0.4 <= m["em"]["hi"]
    assert m["n"] == 5 and m["n_scored"] == 5


def test_method_metrics_cost_latency_judge_validity():
    records = [
        rec("m", "a", "Paris", "Paris", cost=0.02, wall=1.0, judge=True, valid=True),
        rec("m", "b", "Rome", "Paris", cost=0.04, wall=2.0, judge=False, valid=False),
        rec("m", "c", "Paris", "Paris", cost=0.06, wall=10.0, judge=None, valid=True, evidence_status="error"),
    ]
    m = method_metrics(records)
    assert m["cost_per_question_usd"] == pytest.approx(0.04)
    assert m["cost_per_correct_usd"] == pytest.approx(0.12 / 2)  # two EM-correct answers
    assert m["judge"] == {"accuracy": 0.5, "n_judged": 2, "unparsed": 1}
    assert m["plan_valid_rate"] == pytest.approx(2 / 3)
    assert m["latency_s"]["p50"] == pytest.approx(2.0)
    assert m["latency_s"]["p95"] == pytest.approx(float(np.percentile([1.0, 2.0, 10.0], 95)))
    assert m["tool_failures"]["rate"] == pytest.approx(2 / 6)
    records[2]["evidence"][0]["injected"] = True  # eval's made failure; the other one is the tool's own
    assert method_metrics(records)["tool_failures"] == {"rate": pytest.approx(2 / 6), "failed": 2, "injected": 1,
                                                        "calls": 6}
    assert m["planner_prompt_tokens_mean"] == 50
    none_right = method_metrics([rec("m", "a", "Rome", "Paris", cost=0.5)])
    assert none_right["cost_per_correct_usd"] is None


def test_kinds_hops_and_non_rewoo_fields():
    direct = method_metrics([rec("direct", "a", "x", "x", kind="direct", steps=0)])
    assert direct["plan_valid_rate"] is None and direct["planner_prompt_tokens_mean"] is None
    assert direct["hops_mean"] == 0 and direct["tool_calls_mean"] == 0
    react = rec("react", "a", "x", "x", kind="react", steps=3)
    assert hops_of(react) == 3  # tool actions, Finish not counted
    m = method_metrics([react])
    assert m["steps_mean"] == 4 and m["tool_calls_mean"] == 3 and m["react_finished_rate"] == 1.0


def test_tokens_by_hops_groups_and_orders_numerically():
    rewoo = [rec("t", f"r{i}", "x", "x", steps=s, tokens=t) for i, (s, t) in
             enumerate([(2, 300), (2, 310), (3, 305), (10, 320), (1, 290)])]
    react = [rec("react", f"r{i}", "x", "y", kind="react", steps=s, tokens=t) for i, (s, t) in
             enumerate([(1, 800), (2, 1500), (2, 1700), (3, 2600)])]
    by = tokens_by(rewoo, hops_of)
    assert list(by) == ["1", "2", "3", "10"]  # numeric order, string keys (JSON-stable)
    assert by["2"] == {"n": 2, "tokens_mean": 305.0, "llm_calls_mean": 2.0, "em": 1.0}
    assert tokens_by(react, hops_of) == {
        "1": {"n": 1, "tokens_mean": 800.0, "llm_calls_mean": 2.0, "em": 0.0},
        "2": {"n": 2, "tokens_mean": 1600.0, "llm_calls_mean": 3.0, "em": 0.0},
        "3": {"n": 1, "tokens_mean": 2600.0, "llm_calls_mean": 4.0, "em": 0.0},
    }
    mixed = [rec("t", "a", "x", "x", gold_hops=2), rec("t", "b", "x", "x", gold_hops=None, dataset="triviaqa"),
             rec("t", "c", "x", "x", gold_hops=3, tokens=200)]
    assert tokens_by(mixed, lambda r: r["gold_hops"]) == {
        "2": {"n": 1, "tokens_mean": 100.0, "llm_calls_mean": 2.0, "em": 1.0},
        "3": {"n": 1, "tokens_mean": 200.0, "llm_calls_mean": 2.0, "em": 1.0},
    }


def test_paired_uses_common_questions_in_a_fixed_order():
    answers = {f"q{i}": "Paris" for i in range(30)}
    rng = random.Random(0)
    ref = [rec("teacher", q, "Paris" if rng.random() < 0.7 else "Rome", a) for q, a in answers.items()]
    mine = [rec("student", q, "Paris" if rng.random() < 0.5 else "Rome", a) for q, a in answers.items()]
    mine.append(rec("student", "only-mine", "Paris", "Paris"))  # not answered by the reference: left out
    out = paired_vs_reference(mine, ref, samples=400, seed=1)
    keys = sorted(("hotpotqa", q) for q in answers)
    pick = lambda rs: {("hotpotqa", r["id"]): r for r in rs}  # noqa: E731
    a = [float(pick(mine)[k]["scores"]["em"]) for k in keys]
    b = [float(pick(ref)[k]["scores"]["em"]) for k in keys]
    assert out["n"] == 30
    assert out["em"] == pytest.approx(paired_bootstrap(a, b, n=400, seed=1))
    shuffled = mine[:]
    random.Random(5).shuffle(shuffled)
    assert paired_vs_reference(shuffled, ref, samples=400, seed=1) == out
    assert paired_vs_reference([rec("x", "zz", "a", "a")], ref) is None


def test_evidence_recall_is_recomputed_from_gold_pages_and_evidence_with_a_bootstrap_ci():
    records = [
        rec("m", "a", "x", "x", gold=["Ed Wood", "Tim Burton"], titles=("Ed Wood", "Tim Burton")),  # 1, all
        rec("m", "b", "x", "x", gold=["Ed Wood", "Tim Burton"], titles=("ed_wood", "Johnny Depp")),  # 1/2
        rec("m", "c", "x", "x", gold=["Scott Derrickson", "Ed Wood", "Doctor Strange"], titles=("Doctor Strange",)),
        rec("m", "d", "x", "x", dataset="triviaqa"),  # no gold pages: left out, never a 0
    ]
    records[2]["evidence_recall"]["recall"] = 1.0  # a wrong stored value must not leak into the report
    m = method_metrics(records, samples=400, seed=2)
    recalls, alls = [1.0, 0.5, 1 / 3], [1.0, 0.0, 0.0]
    assert m["n_evidence"] == 3
    assert m["evidence_recall"]["mean"] == pytest.approx(11 / 18)
    ci = (m["evidence_recall"]["mean"], m["evidence_recall"]["lo"], m["evidence_recall"]["hi"])
    assert ci == pytest.approx(bootstrap_ci(recalls, n=400, seed=2))
    assert (m["evidence_all"]["mean"], m["evidence_all"]["lo"], m["evidence_all"]["hi"]) == pytest.approx(
        bootstrap_ci(alls, n=400, seed=2))
    assert m["by_dataset"]["hotpotqa"]["evidence_recall"] == pytest.approx(11 / 18)
    assert m["by_dataset"]["hotpotqa"]["evidence_all"] == pytest.approx(1 / 3)
    assert m["by_dataset"]["triviaqa"] == {"n": 1, "em": 1.0, "f1": 1.0, "n_evidence": 0, "evidence_recall": None,
                                           "evidence_all": None}


def test_methods_and_datasets_without_gold_pages_show_a_dash_never_zero():
    trivia = [rec("trivia", f"t{i}", "x", "y", dataset="triviaqa", gold_hops=None) for i in range(3)]
    hotpot = [rec("hotpot", "h", "x", "y", gold=["Ed Wood"], titles=())]  # measured, and a real 0
    results = compute({"hotpot": hotpot, "trivia": trivia}, methods=["hotpot", "trivia"], samples=50)
    pm = results["per_method"]["trivia"]
    assert pm["evidence_recall"] is None and pm["evidence_all"] is None and pm["n_evidence"] == 0
    assert results["per_method"]["hotpot"]["evidence_recall"]["mean"] == 0.0
    assert "evidence" not in results["paired"]["trivia"]  # no question with gold pages in common
    text = render_markdown(results)
    assert "| trivia | rewoo | zeroshot | 0 | – | – |" in text
    assert "| hotpot | rewoo | zeroshot | 1 | 0.000 [0.000, 0.000] | 0.000 [0.000, 0.000] |" in text
    assert "| trivia | triviaqa | 3 | 0.000 | 0.000 | 0 | – | – |" in text
    trivia_line, hotpot_line = summary_lines(results)[1], summary_lines(results)[0]
    assert "recall –" in trivia_line and "recall 0.000" in hotpot_line


def test_paired_evidence_and_steps_differences_have_the_sign_of_the_better_planner():
    qs = [f"q{i}" for i in range(20)]
    gold = {q: [f"{q} A", f"{q} B"] for q in qs}
    # the teacher finds both pages of every question in 2 steps; the student one page of half of them, in 5
    teacher = [rec("teacher", q, "x", "x", steps=2, gold=gold[q], titles=tuple(gold[q])) for q in qs]
    student = [rec("student", q, "x", "x", steps=5, gold=gold[q], titles=tuple(gold[q][:1]) if i % 2 else ())
               for i, q in enumerate(qs)]
    out = paired_vs_reference(student, teacher, samples=300, seed=4)
    mine = [0.5 if i % 2 else 0.0 for i in range(20)]
    assert out["evidence"]["n"] == 20
    assert out["evidence"]["recall"] == pytest.approx(paired_bootstrap(mine, [1.0] * 20, n=300, seed=4))
    assert out["evidence"]["recall"]["diff"] == pytest.approx(-0.75) and out["evidence"]["recall"]["hi"] < 0
    assert out["evidence"]["all"]["diff"] == pytest.approx(-1.0)
    assert out["plan_steps"]["steps"]["diff"] == pytest.approx(3.0)
    back = paired_vs_reference(teacher, student, samples=300, seed=4)
    assert back["evidence"]["recall"]["diff"] == pytest.approx(0.75) and back["plan_steps"]["steps"]["diff"] == -3
    react = [rec("react", q, "x", "x", kind="react", gold=gold[q], titles=tuple(gold[q])) for q in qs]
    assert "plan_steps" not in paired_vs_reference(react, teacher)  # steps per plan compare planners only
    text = render_markdown(compute({"teacher": teacher, "student": student}, methods=["teacher", "student"],
                                   samples=300, seed=4))
    assert "| student | 20 | -0.750 [" in text and "| +3.00 [+3.00, +3.00] |" in text


def test_steps_per_plan_and_the_share_cut_at_max_plan_steps():
    records = [rec("m", "a", "x", "x", steps=1), rec("m", "b", "x", "x", steps=2), rec("m", "c", "x", "x", steps=2),
               rec("m", "d", "x", "x", steps=7, plan_errors=("too_many_steps",)),
               rec("m", "e", "x", "x", steps=0, plan_errors=("empty_plan",))]
    m = method_metrics(records)
    assert m["plan_steps"] == {"mean": 2.4, "p50": 2.0, "max": 7.0}
    assert m["too_many_steps_rate"] == pytest.approx(1 / 5)
    assert m["plan_valid_rate"] == pytest.approx(3 / 5)
    react = method_metrics([rec("react", "a", "x", "x", kind="react", steps=3)])
    assert react["plan_steps"] is None and react["too_many_steps_rate"] is None
    text = render_markdown(compute({"m": records}, samples=50))
    assert "| 0.600 | 2.40 | 2.0 | 7 | 0.200 | 0.00 | 50 |" in text


def repeating(r: dict, *inputs: str) -> dict:
    """`r` with its plan's steps asking Wikipedia for `inputs`, as a planner that repeats itself writes them."""
    steps = [{"id": f"#E{i}", "description": "", "tool": "Wikipedia", "input": text, "deps": []}
             for i, text in enumerate(inputs, 1)]
    return r | {"plan": r["plan"] | {"steps": steps}}


def test_duplicate_steps_per_plan_are_counted_from_each_plan_and_shown_per_method(tmp_path):
    """The served student's four `Wikipedia[Eiffel Tower]` are three duplicates; the mean is over every ReWOO
    plan, counted from its steps, so records written before eval stored the count are counted too."""
    eiffel = ("Eiffel Tower", "eiffel  tower", "Eiffel Tower ", "EIFFEL TOWER")
    looping = [repeating(rec("looping", "a", "x", "x"), *eiffel),
               repeating(rec("looping", "b", "x", "x"), "Paris", "Seine"),
               repeating(rec("looping", "c", "x", "x"), "Louvre", "louvre", "Paris")]
    clean = [repeating(rec("clean", q, "x", "x"), "Paris", "Seine") for q in "abc"]
    react = [rec("react", q, "x", "x", kind="react", steps=3) for q in "abc"]
    assert all("duplicate_steps" not in r for r in looping)  # as older records: no stored count
    m = method_metrics(looping)
    assert m["duplicate_steps_mean"] == pytest.approx((3 + 0 + 1) / 3)
    assert method_metrics(clean)["duplicate_steps_mean"] == 0.0
    assert method_metrics(react)["duplicate_steps_mean"] is None  # not a plan: "–", never 0
    out = write_run(tmp_path, {"clean": clean, "looping": looping, "react": react})
    results = write_report(out)
    assert results["per_method"]["looping"]["duplicate_steps_mean"] == pytest.approx(4 / 3, abs=1e-6)
    report = (out / "report.md").read_text()
    planner = report.split("## The Planner apart from the Solver")[1].split("Paired against")[0].splitlines()
    rows = {line.split(" | ")[0][2:]: line for line in planner if line.startswith("| ")}
    assert rows["method"].endswith("| too many steps | duplicate steps/plan | planner prompt tok |")
    assert rows["looping"].endswith("| 0.000 | 1.33 | 50 |") and rows["clean"].endswith("| 0.000 | 0.00 | 50 |")
    assert rows["react"].endswith("| – | – | – |")
    html = (out / "report.html").read_text()
    assert "duplicate steps/plan" in html and "1.33" in html


def write_run(tmp_path: Path, by_method: dict[str, list[dict]], manifest: dict | None = None) -> Path:
    out = tmp_path / "run"
    for name, records in by_method.items():
        write_jsonl(out / "records" / f"{name}.jsonl", records)
    if manifest is not None:
        write_json(out / "manifest.json", manifest)
    return out


def sample_run() -> dict[str, list[dict]]:
    rng = random.Random(7)
    qs = [f"q{i}" for i in range(12)]
    gold = {q: rng.choice(["Paris", "yes", "Danube", "1879"]) for q in qs}

    def guess(q: str, p: float) -> str:
        return gold[q] if rng.random() < p else "wrong"

    def pages(q: str, p: float) -> dict:
        """The question's two gold pages, each retrieved with probability p."""
        both = [f"{q} page A", f"{q} page B"]
        return {"gold": both, "titles": tuple(t for t in both if rng.random() < p)}

    return {
        "teacher": [rec("teacher", q, guess(q, 0.8), gold[q], steps=rng.randint(1, 4), tokens=rng.randint(600, 900),
                        cost=0.001, wall=rng.uniform(1, 3), **pages(q, 0.8)) for q in qs],
        "student": [rec("student", q, guess(q, 0.7), gold[q], steps=rng.randint(1, 4), tokens=rng.randint(300, 400),
                        wall=rng.uniform(1, 2), **pages(q, 0.6)) for q in qs],
        "react": [rec("react", q, guess(q, 0.6), gold[q], kind="react", steps=(s := rng.randint(1, 4)),
                      tokens=700 * s, wall=rng.uniform(2, 6), **pages(q, 0.7)) for q in qs],
        "direct": [rec("direct", q, guess(q, 0.3), gold[q], kind="direct", steps=0, tokens=60, wall=0.3)
                   for q in qs],
    }


def planner_rows(name: str, prompt: str, prompt_tokens: int, titles: tuple[str, ...], n: int = 4, **kw) -> list[dict]:
    """n HotpotQA questions, each with gold pages A and B, whose evidence holds `titles`."""
    rows = [rec(name, f"q{i}", "x", "x", planner_prompt_tokens=prompt_tokens, gold=["Alpha", "Beta"], titles=titles,
                **kw) for i in range(n)]
    for r in rows:
        r["planner_prompt"] = prompt
    return rows


BUDGET = {"reference": "teacher", "methods": ["student", "student_compact", "base_compact", "trivia", "direct"],
          "max_prompt_fraction": 0.2}


def test_prompt_budget_sets_each_named_planner_against_the_reference():
    by_method = {
        "direct": [rec("direct", f"q{i}", "x", "x", kind="direct", steps=0) for i in range(4)],
        "teacher": planner_rows("teacher", "fewshot", 500, ("Alpha",)),  # recall 0.5
        "student": planner_rows("student", "full", 300, ("Alpha", "Beta")),  # recall 1, but 0.6 of the prompt
        "student_compact": planner_rows("student_compact", "compact", 100, ("Alpha",)),  # 0.5 at exactly 1/5: met
        "base_compact": planner_rows("base_compact", "compact", 90, ()),  # tiny prompt, recall 0
        "trivia": [dict(r, planner_prompt="compact") for r in
                   (rec("trivia", f"t{i}", "x", "x", dataset="triviaqa", planner_prompt_tokens=80) for i in range(2))],
        "teacher2": planner_rows("teacher2", "fewshot", 400, ("Alpha", "Beta")),  # not named: no row
    }
    methods = list(by_method)
    results = compute(by_method, methods=methods, reference="direct", samples=50, budget=BUDGET)
    budget = results["prompt_budget"]
    assert budget["reference"] == "teacher"  # the budget's own reference, though the paired one is Direct
    assert (budget["reference_evidence_recall"], budget["reference_planner_prompt_tokens"]) == (0.5, 500)
    assert budget["max_prompt_fraction"] == 0.2
    assert list(budget["rows"]) == ["student", "student_compact", "base_compact", "trivia"]  # Direct has no prompt
    rows = budget["rows"]
    assert rows["student"] == {"prompt": "full", "planner_prompt_tokens": 300, "prompt_fraction": 0.6,
                               "evidence_recall": 1.0, "n_paired": 4, "recall_diff": 0.5,
                               "recall_diff_ci": rows["student"]["recall_diff_ci"], "plan_valid_rate": 1.0, "em": 1.0,
                               "f1": 1.0, "met": False}
    assert rows["student"]["recall_diff_ci"]["lo"] == rows["student"]["recall_diff_ci"]["hi"] == 0.5  # no spread
    assert (rows["student_compact"]["prompt_fraction"], rows["student_compact"]["recall_diff"]) == (0.2, 0.0)
    assert rows["student_compact"]["met"] is True  # equal recall at exactly a fifth meets it
    assert rows["base_compact"]["prompt_fraction"] == 0.18 and rows["base_compact"]["recall_diff"] == -0.5
    assert rows["base_compact"]["met"] is False
    assert rows["trivia"]["evidence_recall"] is None and rows["trivia"]["met"] is None  # unmeasured, not missed

    text = render_markdown(results)
    assert "## Prompt budget: evidence recall against teacher at a fraction of its prompt" in text
    assert "evidence recall of **teacher** (0.500) with at most 0.2 of its planner prompt tokens (500)" in text
    assert "| planner | prompt | planner prompt tok | × teacher's | evidence recall | n | Δ recall vs teacher" in text
    assert ("| student | full | 300 | 0.60 | 1.000 | 4 | +0.500 [+0.500, +0.500] | 1.000 | 1.000 | 1.000 | no |"
            in text)
    assert ("| student_compact | compact | 100 | 0.20 | 0.500 | 4 | +0.000 [+0.000, +0.000] | 1.000 | 1.000 | 1.000 "
            "| yes |" in text)
    assert ("| base_compact | compact | 90 | 0.18 | 0.000 | 4 | -0.500 [-0.500, -0.500] | 1.000 | 1.000 | 1.000 "
            "| no |" in text)
    assert "| trivia | compact | 80 | 0.16 | – | 0 | – | 1.000 | 1.000 | 1.000 | – |" in text
    lines = prompt_budget_summary(results)
    assert len(lines) == 4 and lines[1].endswith(": yes") and "recall 0.500 vs 0.500" in lines[1]
    assert "x0.20" in lines[1] and lines[0].endswith(": no") and lines[3].endswith(": –")

    # the fraction is the setting's, not the report's: at 0.6 the full student, which beats the recall, meets it
    wider = compute(by_method, methods=methods, reference="direct", samples=50,
                    budget=BUDGET | {"max_prompt_fraction": 0.6})
    assert wider["prompt_budget"]["max_prompt_fraction"] == 0.6 and wider["prompt_budget"]["rows"]["student"]["met"]
    assert "with at most 0.6 of its planner prompt tokens" in render_markdown(wider)


def test_prompt_budget_pairs_an_unfinished_row_on_the_questions_it_answered():
    """A student that answered 2 of 4 questions is set against the reference on those 2, not on all 4."""
    by_method = {"teacher": planner_rows("teacher", "fewshot", 500, ("Alpha",)),  # recall 0.5 everywhere
                 "student": planner_rows("student", "compact", 50, ("Alpha", "Beta"), n=2)}
    by_method["teacher"][0]["evidence"] = by_method["teacher"][1]["evidence"] = []  # recall 0 on q0 and q1
    row = compute(by_method, methods=["teacher", "student"], reference="teacher", samples=50,
                  budget=BUDGET)["prompt_budget"]["rows"]["student"]
    assert row["n_paired"] == 2 and row["recall_diff"] == 1.0  # 1 - 0 on q0, q1 (unpaired: 1 - 0.25 = 0.75)
    assert row["met"] is True


def test_no_prompt_budget_unless_one_is_set_and_measurable():
    by_method = {"teacher": planner_rows("teacher", "full", 400, ("Alpha", "Beta")),
                 "student": planner_rows("student", "compact", 50, ("Alpha", "Beta"))}
    unset = compute(by_method, methods=["teacher", "student"], reference="teacher", samples=50)
    assert unset["prompt_budget"] is None and "Prompt budget" not in render_markdown(unset)
    assert prompt_budget_summary(unset) == []
    budget = compute(by_method, samples=50, budget=BUDGET)["prompt_budget"]  # a zero-shot reference is fine too
    assert budget["reference"] == "teacher" and budget["rows"]["student"]["prompt_fraction"] == 0.125
    assert budget["rows"]["student"]["met"] is True
    assert compute({"teacher": by_method["teacher"]}, samples=50, budget=BUDGET)["prompt_budget"] is None  # no row
    direct = {"direct": [rec("direct", "q0", "x", "x", kind="direct", steps=0)], "student": by_method["student"]}
    assert compute(direct, samples=50, budget=BUDGET | {"reference": "direct"})["prompt_budget"] is None
    assert compute(by_method, samples=50, budget=BUDGET | {"reference": "gone"})["prompt_budget"] is None


def test_write_report_equals_recompute_and_has_every_section(tmp_path):
    runs = sample_run()
    manifest = {"methods": [{"name": n} for n in ("teacher", "student", "react", "direct")], "reference": "teacher",
                "bootstrap_samples": 300, "seed": 0, "prompt_budget": BUDGET,
                "examples": [["hotpotqa", r["id"]] for r in runs["teacher"]]}
    out = write_run(tmp_path, runs, manifest)
    results = write_report(out)
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk == results == recompute(out)
    assert results["methods"] == ["teacher", "student", "react", "direct"]
    assert set(results["paired"]) == {"student", "react", "direct"}
    assert results["bootstrap_samples"] == 300 and results["questions"] == 12
    for name in results["plots"].values():
        assert (out / name).stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert results["per_method"]["teacher"]["evidence_recall"]["mean"] > 0
    assert results["per_method"]["direct"]["evidence_recall"] is None  # Direct retrieves nothing to measure
    assert set(results["paired"]["student"]["evidence"]) == {"n", "recall", "all"}
    for needle in ("## Accuracy", "EM [95% CI]", "F1 [95% CI]", "plan valid", "LLM calls", "$ / correct (EM)",
                   "latency p95 s", "ΔEM [95% CI]", "by hops taken", "by gold hops", "Planner prompt size",
                   "## The Planner apart from the Solver", "evidence recall [95% CI]", "all gold pages [95% CI]",
                   "Δrecall [95% CI]", "Δsteps/plan [95% CI]", "too many steps", "## Prompt budget",
                   "](accuracy_vs_tokens.png)", "](tokens_by_hops.png)", "](latency.png)",
                   "](recall_vs_prompt.png)"):
        assert needle in report, needle
    for name in results["methods"]:
        assert f"| {name} |" in report
    assert list(results["prompt_budget"]["rows"]) == ["student"]  # the manifest's budget: only named planners


def test_the_demo_intro_opens_report_md_and_report_html_and_no_intro_is_the_default(tmp_path):
    """A newcomer reads what the run is and is not before any number; a run that sets no intro gets none."""
    from distill.report import INTROS

    out = write_run(tmp_path, sample_run(), {"reference": "teacher", "bootstrap_samples": 50})
    plain = write_report(out)
    text, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "What this demo is" not in text and 'class="intro"' not in page and "__INTRO__" not in page

    results = write_report(out, intro="demo")
    assert results == plain == recompute(out)  # the intro is words for the reader, not a result
    text, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert text.startswith("# Evaluation report\n\n**What this demo is.** SmolLM2-135M distilling planning from "
                           "its own few-shot self")
    assert text.index("**What it is not.**") < text.index("## Verdict")
    for words in ("rejection sampling", "expert iteration", "retrieve the gold pages",
                  "EM and F1 are not the point here", "a 7B student matching a large teacher",
                  "`configs/pipeline_hotpot_trivia_7b.yaml`"):
        assert words in INTROS["demo"], words
    assert '<p class="intro"><strong>What this demo is.</strong> SmolLM2-135M' in page
    assert "<code>configs/pipeline_hotpot_trivia_7b.yaml</code>" in page and "**" not in page.split("<script")[0]
    assert page.index('class="intro"') < page.index('id="summary"')


def test_an_unknown_intro_is_one_line_naming_the_known_ones(tmp_path, capsys):
    from distill import cli

    out = write_run(tmp_path, sample_run(), {"reference": "teacher", "bootstrap_samples": 50})
    with pytest.raises(DistillError, match="report: intro: .*unknown intro 'paper'; known: demo"):
        write_report(out, intro="paper")
    assert not (out / "report.md").exists()
    assert cli.main(["report", str(out), "--intro", "demo"]) == 0  # by hand, as the pipeline's setting does
    assert (out / "report.md").read_text().startswith("# Evaluation report\n\n**What this demo is.**")


def test_manifest_selects_questions_and_method_order(tmp_path):
    runs = sample_run()
    runs["teacher"].append(rec("teacher", "stale", "x", "x"))  # from an earlier, larger run
    keep = [["hotpotqa", f"q{i}"] for i in range(12)]
    manifest = {"methods": [{"name": "direct"}, {"name": "teacher"}], "reference": "direct", "examples": keep,
                "bootstrap_samples": 100, "seed": 2}
    results = recompute(write_run(tmp_path, runs, manifest))
    assert results["methods"][:2] == ["direct", "teacher"]  # manifest order, then the rest alphabetically
    assert results["methods"][2:] == ["react", "student"]
    assert results["reference"] == "direct" and results["per_method"]["teacher"]["n"] == 12


def test_without_manifest_methods_are_alphabetical(tmp_path):
    results = recompute(write_run(tmp_path, sample_run()))
    assert results["methods"] == sorted(results["methods"]) and results["reference"] == results["methods"][0]


def test_no_records_is_a_clear_error(tmp_path):
    with pytest.raises(DistillError, match="no per-example records"):
        recompute(tmp_path)


def test_report_on_a_pipeline_run_folder_points_to_its_eval_folder(tmp_path, capsys):
    from distill import cli

    evals = write_run(tmp_path, sample_run())  # as a pipeline's run_dir holds eval/records
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"`distill report {evals}`" in err and "distill eval` first" not in err
    assert cli.main(["report", str(evals)]) == 0


def test_markdown_renders_missing_values_as_dashes():
    results = compute({"direct": [rec("direct", "a", "x", "y", kind="direct", steps=0)]})
    text = render_markdown(results)
    assert "| direct | direct | – | 1 |" in text and "nan" not in text.lower()


def test_distill_report_writes_elsewhere_from_the_records_alone(tmp_path, capsys):
    from distill import cli

    runs = sample_run()
    manifest = {"methods": [{"name": n} for n in ("teacher", "student", "react", "direct")], "reference": "teacher",
                "bootstrap_samples": 200, "seed": 1, "examples": [["hotpotqa", r["id"]] for r in runs["teacher"]],
                "prompt_budget": BUDGET}
    run = write_run(tmp_path, runs, manifest)
    out = tmp_path / "published"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3:] == [f"viewer: {out / 'report.html'}", f"report: {out / 'report.md'}",
                          f"results: {out / 'results.json'}"]
    assert [line.split()[0] for line in lines[:4]] == ["teacher", "student", "react", "direct"]
    assert [line.split(":")[0] for line in lines[4:-3]] == ["prompt budget vs teacher"]  # the one named student
    results = json.loads((out / "results.json").read_text())
    assert results == recompute(run) and results["bootstrap_samples"] == 200
    assert all((out / name).stat().st_size > 1000 for name in results["plots"].values())
    assert "## Accuracy" in (out / "report.md").read_text()
    assert (out / "report.html").stat().st_size > 1000
    assert not (run / "results.json").exists() and not (run / "report.md").exists()
    assert not (run / "report.html").exists()


def test_distill_report_on_bad_input_is_one_line_exit_2(tmp_path, capsys):
    from distill import cli

    assert cli.main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no per-example records under")
    trajectory = rec("teacher", "a", "x", "x")
    del trajectory["kind"]  # a generation record, not an evaluation one
    run = write_run(tmp_path, {"teacher": [trajectory]})
    assert cli.main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert "teacher.jsonl:1: field `kind`: Field required" in err and "not an evaluation record" in err


# ---------------------------------------------------------------------------------------- robustness


def swept(r: dict, rate: float, base: str, llm_calls: int) -> dict:
    """A record of eval's robustness sweep: its own method name, rate and model calls."""
    return r | {"method": f"{base}@fail{rate:g}", "tool_failure_rate": rate, "robustness_of": base,
                "llm_calls": llm_calls}


def robustness_run() -> dict[str, list[dict]]:
    """teacher on q1-q3 at rate 0, and on q1-q2 (the sweep's first n) at 0.3 and 1.0; react at 0 and 1.0."""
    gold = {"q1": ["q1 A", "q1 B"], "q2": ["q2 A", "q2 B"], "q3": ["q3 A", "q3 B"]}

    def t(q: str, pred: str, titles: tuple[str, ...] = (), **kw) -> dict:
        return rec("teacher", q, pred, "Paris", gold=gold[q], titles=titles, **kw)

    return {
        "teacher": [t("q1", "Paris", ("q1 A", "q1 B")), t("q2", "wrong", ("q2 A",)), t("q3", "Paris", ("q3 A",))],
        "teacher@fail0.3": [swept(t("q1", "Paris", ("q1 A",)), 0.3, "teacher", 2),
                            swept(t("q2", "wrong", evidence_status="error"), 0.3, "teacher", 3)],
        "teacher@fail1": [swept(t("q1", "wrong", evidence_status="error"), 1.0, "teacher", 3),
                          swept(t("q2", "wrong", evidence_status="error"), 1.0, "teacher", 3)],
        "react": [rec("react", q, "Paris", "Paris", kind="react", steps=1) for q in ("q1", "q2", "q3")],
        "react@fail1": [swept(rec("react", q, "wrong", "Paris", kind="react", steps=3, evidence_status="error"), 1.0,
                              "react", 4) for q in ("q1", "q2")],
    }


def test_robustness_rows_compare_each_method_across_rates_on_the_same_questions():
    results = compute(robustness_run(), methods=["teacher", "react"], samples=200)
    assert results["methods"] == ["teacher", "react"]  # sweep runs are no methods of the main tables
    assert set(results["per_method"]) == {"teacher", "react"} and set(results["paired"]) == {"react"}
    assert results["tool_failure_rate"] == 0.0 and results["plots"]["accuracy_vs_calls"] == "accuracy_vs_calls.png"
    rob = results["robustness"]
    assert rob["methods"] == ["teacher", "react"]
    table = [(r["method"], r["run"], r["tool_failure_rate"], r["n"], r["em"]["mean"], r["f1"]["mean"],
              r["llm_calls_mean"], r["tool_calls_mean"], r["tool_failures"]["rate"]) for r in rob["rows"]]
    assert table == [  # the main run is rate 0, cut to the sweep's questions q1, q2
        ("teacher", "teacher", 0.0, 2, 0.5, 0.5, 2.0, 2.0, 0.0),
        ("teacher", "teacher@fail0.3", 0.3, 2, 0.5, 0.5, 2.5, 2.0, 0.5),
        ("teacher", "teacher@fail1", 1.0, 2, 0.0, 0.0, 3.0, 2.0, 1.0),
        ("react", "react", 0.0, 2, 1.0, 1.0, 2.0, 1.0, 0.0),
        ("react", "react@fail1", 1.0, 2, 0.0, 0.0, 4.0, 3.0, 1.0),
    ]
    recall = [r["evidence_recall"] and r["evidence_recall"]["mean"] for r in rob["rows"]]
    assert recall == [0.75, 0.25, 0.0, None, None]  # react's records name no gold pages here
    assert results["per_method"]["teacher"]["n"] == 3  # the main table keeps every question


def test_robustness_table_and_plot_in_the_report(tmp_path):
    runs = robustness_run()
    names = ["teacher", "react", "teacher@fail0.3", "teacher@fail1", "react@fail1"]
    manifest = {"methods": [{"name": n} for n in names], "reference": "teacher", "bootstrap_samples": 100,
                "seed": 0, "examples": [["hotpotqa", q] for q in ("q1", "q2", "q3")]}
    out = write_run(tmp_path, runs, manifest)
    results = write_report(out)
    assert results == recompute(out) == json.loads((out / "results.json").read_text())
    assert (out / "accuracy_vs_calls.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    block = report[report.index("## Robustness: tool failures"):report.index("## Plots")]
    assert "| teacher | 0.3 | 2 | 0.500 [" in block and "| react | 1 | 2 | 0.000 [" in block
    assert "](accuracy_vs_calls.png)" in block
    assert "@fail" not in report  # sweep runs appear as method and rate, never as methods of their own
    assert summary_lines(results)[0].startswith("teacher") and len(summary_lines(results)) == 2


def test_no_sweep_no_robustness_section():
    results = compute(sample_run(), samples=50)
    assert "robustness" not in results and "accuracy_vs_calls" not in results["plots"]
    assert "Robustness" not in render_markdown(results)


def test_a_report_of_a_stopped_evaluation_says_so(tmp_path):
    runs = sample_run()
    runs.pop("direct")
    manifest = {"methods": [{"name": n} for n in ("teacher", "student", "react", "direct")], "reference": "teacher",
                "status": "interrupted", "examples": [["hotpotqa", r["id"]] for r in runs["teacher"]]}
    results = write_report(write_run(tmp_path, runs, manifest))
    assert results["incomplete"] == {"status": "interrupted", "methods_without_records": ["direct"]}
    text = (tmp_path / "run" / "report.md").read_text()
    assert "**This evaluation is not complete (run status: interrupted; no records yet for direct)" in text
    manifest["status"] = "complete"
    assert "incomplete" not in write_report(write_run(tmp_path / "done", sample_run(), manifest))


def test_answer_in_evidence_splits_what_the_planner_fetched_from_what_the_solver_read(tmp_path):
    """Better evidence, worse answers: the report tells a Planner that never fetched the answer from a Solver
    that could not read it out."""
    fetched = rec("m", "q1", "Leipzig, Saxony", "Saxony", titles=("Leipzig is a city in Saxony",))
    missed = rec("m", "q2", "Bavaria", "Saxony", titles=("Richard Wagner",))
    direct = rec("d", "q1", "Saxony", "Saxony", kind="direct")
    assert answer_reach_of(fetched)["in_evidence"] == 1.0 and answer_reach_of(missed)["in_evidence"] == 0.0
    assert answer_reach_of(direct) is None
    # whole words, by the dataset's normaliser: TriviaQA's splits "Saxony-Anhalt" at the hyphen, HotpotQA's joins it
    assert answer_in_text("triviaqa", ["Anhalt"], "Saxony-Anhalt is a state") is True
    assert answer_in_text("hotpotqa", ["Anhalt"], "Saxony-Anhalt is a state") is False
    assert answer_in_text("hotpotqa", ["Saxon"], "Saxony is a state") is False
    answers = method_metrics([fetched, missed])["answers"]
    assert answers["in_evidence_rate"] == 0.5 and answers["n_in_evidence"] == 1
    assert answers["f1_in_evidence"] == pytest.approx(score("hotpotqa", "Leipzig, Saxony", ["Saxony"])["f1"])
    assert answers["f1_not_in_evidence"] == 0.0 and answers["ends_in_llm_rate"] == 0.0
    ends_llm = rec("m", "q3", "x", "y")
    ends_llm["plan"]["steps"][-1]["tool"] = "LLM"
    assert answer_reach_of(ends_llm)["ends_in_llm"] == 1.0
    md = render_markdown(compute({"m": [fetched, missed], "d": [direct]}, reference="m"))
    assert "## Answers: what the evidence held, what the Solver made of it" in md
    assert "| m | 2 | 0.500 | 1 | 0.667 | 0.000 | 0.000 | 1.5 |" in md and "| d |" not in md.split("## Answers")[1].split("##")[0]
