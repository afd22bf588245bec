"""The verdict block and the provenance of the report, from hand-made paired records and run folders."""

from __future__ import annotations

import json

import pytest

from distill.report import compute, recompute, render_markdown, write_report
from distill.core.store import write_json
from distill.reporting.verdict import MIN_TRAIN_EXAMPLES, reading
from tests.test_report import rec, sample_run, write_run


def paired_rows(n: int = 20) -> dict[str, list[dict]]:
    """The student finds both gold pages of every question, the teacher none; the teacher answers right, the
    student wrong; both plans valid; the student spends half the tokens and twice the time."""
    gold = {f"q{i}": [f"q{i} A", f"q{i} B"] for i in range(n)}
    teacher = [rec("teacher", q, "Paris", "Paris", gold=g, tokens=400, wall=1.0) for q, g in gold.items()]
    student = [rec("student", q, "Rome", "Paris", gold=g, titles=tuple(g), tokens=200, wall=2.0)
               for q, g in gold.items()]
    return {"teacher": teacher, "student": student}


def test_readings_follow_the_paired_ci():
    assert reading({"diff": 0.2, "lo": 0.05, "hi": 0.4}, 16) == "better"
    assert reading({"diff": -0.2, "lo": -0.4, "hi": -0.01}, 16) == "worse"
    assert reading({"diff": 0.1, "lo": 0.0, "hi": 0.3}, 16) == "no detectable difference at n=16"  # touches 0
    assert reading({"diff": 0.0, "lo": 0.0, "hi": 0.0}, 7) == "no detectable difference at n=7"
    assert reading(None, 0) is None


def test_verdict_on_hand_made_paired_data():
    results = compute(paired_rows(), methods=["teacher", "student"], reference="teacher", samples=200)
    v = results["verdict"]
    assert v["reference"] == "teacher" and list(v["rows"]) == ["student"]
    row = v["rows"]["student"]
    got = {label: m["reading"] for label, m in row["measures"].items()}
    assert got == {"evidence recall": "better", "all gold pages": "better",
                   "plan valid": "no detectable difference at n=20", "EM": "worse", "F1": "worse"}
    assert row["measures"]["evidence recall"]["diff"]["diff"] == 1.0 and row["measures"]["EM"]["n"] == 20
    # the verdict reads the report's own paired test, not a second computation
    assert row["measures"]["F1"]["diff"] == results["paired"]["student"]["f1"]
    assert row["measures"]["plan valid"]["diff"] == results["paired"]["student"]["plan_valid"]["valid"]
    assert (row["tokens_ratio"], row["latency_p50_ratio"]) == (0.5, 2.0)
    assert row["train_examples"] is None and "training set size unknown" in row["warnings"][0]
    text = render_markdown(results)
    assert text.index("## Verdict") < text.index("## Accuracy")
    assert ("**student** against **teacher**: better on evidence recall, all gold pages; worse on EM, F1; "
            "no detectable difference at n=20 on plan valid.") in text
    assert "| evidence recall | 20 | +1.000 [+1.000, +1.000] | better |" in text
    assert "tokens per question ×0.50 teacher's; latency p50 ×2.00 teacher's" in text


def test_direct_and_react_rows_are_not_students_and_missing_measures_read_dash():
    runs = sample_run()
    results = compute(runs, methods=["teacher", "student", "react", "direct"], reference="teacher", samples=100)
    assert list(results["verdict"]["rows"]) == ["student"]
    trivia = {"teacher": [rec("teacher", "t", "x", "x", dataset="triviaqa")],
              "student": [rec("student", "t", "x", "x", dataset="triviaqa")]}
    results = compute(trivia, reference="teacher", samples=50)
    assert results["verdict"]["rows"]["student"]["measures"]["evidence recall"] == {"n": 0, "diff": None,
                                                                                   "reading": None}
    assert "| evidence recall | 0 | – | – |" in render_markdown(results)


def pipeline_folder(tmp_path, train_examples: int = 2) -> tuple:
    """A run folder as the pipeline leaves it: eval/ (records, manifest), generate/, sft-data/ and train/."""
    runs = sample_run()
    manifest = {"methods": [{"name": n} for n in runs], "reference": "teacher", "bootstrap_samples": 100,
                "code_version": "0.1.0+abc1234", "config_file": "configs/demo.yaml",
                "config": {"solver": {"backend": "openai", "model": "solver-m"},
                           "planners": [{"name": "student", "spec": {"model": "stu"}},
                                        {"name": "teacher", "spec": {"model": "p"}}],
                           "datasets": [{"name": "hotpotqa", "split": "dev", "n": 12, "source": "dev.jsonl"}]}}
    evals = write_run(tmp_path, runs, manifest)  # tmp_path/run plays <run_dir>/eval
    write_json(tmp_path / "generate" / "manifest.json",
               {"config": {"planner": {"model": "teacher-7b", "temperature": 0.7}, "planner_prompt": "fewshot",
                           "datasets": [{"name": "hotpotqa", "split": "train", "n": 64}]}})
    write_json(tmp_path / "sft-data" / "stu" / "summary.json",
               {"splits": {"train": {"examples": train_examples}, "validation": {"examples": 1}},
                "student_prompt": "full", "tools": ["Wikipedia", "LLM"]})
    write_json(tmp_path / "train" / "stu" / "distill_adapter.json",
               {"base_model": "smollm2-135m-instruct", "lora_r": 8, "lora_alpha": 16, "global_step": 12,
                "final_train_loss": 0.2276, "final_eval_loss": 0.6969})
    write_json(tmp_path / "train" / "stu" / "loss_history.json",
               {"train": [{"step": s, "loss": 2.0 / s} for s in range(1, 13)],
                "eval": [{"step": 6, "eval_loss": 0.9}, {"step": 12, "eval_loss": 0.7}], "summary": {}})
    return evals, runs


def test_provenance_and_training_size_from_the_run_folder(tmp_path):
    evals, _ = pipeline_folder(tmp_path)
    results = write_report(evals)
    assert json.loads((evals / "results.json").read_text()) == results == recompute(evals)
    assert list(results)[:3] == ["format_version", "verdict", "provenance"]
    p = results["provenance"]
    assert (p["distill_version"], p["commit"], p["config_file"]) == ("0.1.0", "abc1234", "configs/demo.yaml")
    assert p["teacher"] == {"model": "teacher-7b", "prompt": "fewshot", "temperature": 0.7}
    assert p["reference"] == {"method": "teacher", "model": "p", "prompt": "zeroshot"}
    assert p["solver"] == {"model": "solver-m", "backend": "openai"}
    assert p["datasets"]["eval"] == [{"name": "hotpotqa", "split": "dev", "n": 12, "source": "dev.jsonl"}]
    assert p["datasets"]["generate"][0]["split"] == "train"
    assert p["student_rows"] == {"student": "stu"}  # the row's planner model is the LoRA module `stu`
    s = p["students"]["stu"]
    assert (s["base_model"], s["lora_r"], s["lora_alpha"], s["steps"]) == ("smollm2-135m-instruct", 8, 16, 12)
    assert (s["train_examples"], s["validation_examples"], s["final_train_loss"]) == (2, 1, 0.2276)
    row = results["verdict"]["rows"]["student"]
    assert row["student"] == "stu" and row["train_examples"] == 2
    assert row["warnings"] == [f"trained on 2 examples (fewer than {MIN_TRAIN_EXAMPLES}): too few for this "
                               "comparison to say anything about distillation"]
    text = (evals / "report.md").read_text()
    assert "> **Warning:** trained on 2 examples" in text
    assert "- distill 0.1.0, commit abc1234; config configs/demo.yaml" in text
    assert "- teacher (generation): teacher-7b, prompt fewshot, temperature 0.7" in text
    assert "- Solver: solver-m (openai)" in text
    assert "| stu | smollm2-135m-instruct | 8 | 16 | 12 | 2 | 1 | full | 0.2276 | 0.6969 |" in text
    assert results["plots"]["loss"] == "loss.png" and (evals / "loss.png").stat().st_size > 1000
    assert "![Training and validation loss per student](loss.png)" in text


def test_zero_cost_columns_are_left_out_and_kept_where_a_method_costs_something():
    free = {m: [dict(r, cost_usd=0.0) for r in recs] for m, recs in sample_run().items()}
    text = render_markdown(compute(free, samples=50))
    assert "$ / question" not in text and "$0.00000" not in text and "Costs are $0 for every method" in text
    paid = render_markdown(compute(sample_run(), samples=50))  # the teacher costs $0.001 a question
    assert "$ / question" in paid
    assert "| $0.00100 |" in paid and "Costs are $0" not in paid


def test_enough_training_examples_no_warning(tmp_path):
    evals, _ = pipeline_folder(tmp_path, train_examples=MIN_TRAIN_EXAMPLES)
    assert recompute(evals)["verdict"]["rows"]["student"]["warnings"] == []


@pytest.mark.parametrize("damage", ["absent", "corrupt"])
def test_missing_provenance_reads_unknown_never_a_traceback(tmp_path, damage):
    evals, _ = pipeline_folder(tmp_path)
    for path in (tmp_path / "train" / "stu" / "distill_adapter.json", tmp_path / "generate" / "manifest.json"):
        path.unlink() if damage == "absent" else path.write_text("{not json")
    (evals / "manifest.json").write_text(json.dumps({"reference": "teacher", "bootstrap_samples": 50}))
    (tmp_path / "train" / "stu" / "loss_history.json").write_text("[1, 2")
    results = write_report(evals)
    p = results["provenance"]
    assert p["distill_version"] is None and p["teacher"]["model"] is None and p["solver"]["model"] == "s"
    assert p["students"]["stu"]["base_model"] is None and p["students"]["stu"]["train_examples"] == 2
    text = (evals / "report.md").read_text()
    assert "- distill unknown, commit unknown; config unknown" in text
    assert "- teacher (generation): unknown, prompt unknown, temperature unknown" in text
    assert "| stu | unknown | unknown | unknown | unknown | 2 | 1 | full | unknown | unknown |" in text
    # the row's model is no longer named by the manifest: the row named like the folder is not `stu` either
    assert "training set size unknown" in results["verdict"]["rows"]["student"]["warnings"][0]
    assert (evals / "loss.png").exists()  # an unreadable loss history draws no curve, and breaks nothing


def test_an_improved_row_is_set_against_its_sft_row_and_the_rounds_are_reported(tmp_path):
    """`compare_to` pairs the improved student with the SFT student it continued (not only the reference), and the
    improve rounds' summaries give a table and a bar plot; the numbers follow from hand-made records."""
    gold = ["Paris", "France"]
    sft = [rec("sft", f"q{i}", "x", "Paris", gold=gold, titles=("Paris",)) for i in range(8)]  # recall 0.5 each
    better = [rec("improved", f"q{i}", "x", "Paris", gold=gold, titles=("Paris", "France")) for i in range(8)]
    teacher = [rec("teacher", f"q{i}", "x", "Paris", gold=gold, titles=("Paris",)) for i in range(8)]
    runs = {"teacher": teacher, "sft": sft, "improved": better}
    manifest = {"methods": [{"name": "teacher"}, {"name": "sft"}, {"name": "improved", "compare_to": "sft"}],
                "reference": "teacher", "bootstrap_samples": 100}
    evals = write_run(tmp_path, runs, manifest)
    write_json(tmp_path / "train" / "sft" / "distill_adapter.json", {"base_model": "b", "lora_r": 8})
    for i, (mean, best) in enumerate([(0.4, 0.7), (0.55, 0.9)], start=1):
        write_json(tmp_path / "improve" / "sft" / f"round_{i}" / "summary.json",
                   {"samples": 32, "kept": 6 + i, "mean_reward": mean, "mean_best_reward": best,
                    "valid_plan_rate": 0.5, "reward_parts": {"recall": mean - 0.2}})
    results = write_report(evals)
    pair = results["paired_to"]["improved"]
    assert pair["against"] == "sft" and set(results["paired_to"]) == {"improved"}
    recall = pair["measures"]["evidence recall"]
    assert recall["n"] == 8 and recall["diff"]["diff"] == pytest.approx(0.5) and recall["reading"] == "better"
    assert pair["measures"]["plan valid"]["diff"]["diff"] == 0.0
    rounds = results["provenance"]["improve"]["sft"]["rounds"]
    assert [(r["round"], r["kept"], r["mean_reward"]) for r in rounds] == [("1", 7, 0.4), ("2", 8, 0.55)]
    text = (evals / "report.md").read_text()
    assert "## Against the row each improves on" in text
    assert "| evidence recall | 8 | +0.500 [+0.500, +0.500] | better |" in text
    assert "| 2 | 32 | 8 | 0.550 | 0.900 | 0.500 | recall 0.350 |" in text
    assert results["plots"]["reward"] == "reward.png" and (evals / "reward.png").stat().st_size > 1000


def test_an_improved_row_of_a_trained_student_is_in_the_verdict_as_that_student(tmp_path):
    evals, runs = pipeline_folder(tmp_path)
    runs["student_improved"] = [dict(r, method="student_improved") for r in runs["student"]]
    manifest = json.loads((evals / "manifest.json").read_text())
    manifest["methods"].append({"name": "student_improved", "compare_to": "student"})
    write_run(tmp_path, runs, manifest)
    results = write_report(evals)
    assert results["provenance"]["student_rows"] == {"student": "stu", "student_improved": "stu"}
    row = results["verdict"]["rows"]["student_improved"]
    assert row["student"] == "stu" and row["train_examples"] == 2
    assert results["paired_to"]["student_improved"]["measures"]["F1"]["diff"]["diff"] == 0.0  # the same records


def test_an_improved_row_counts_the_plans_its_rounds_kept_beside_its_students_examples(tmp_path):
    """Expert iteration trains the student further on its own kept plans: the verdict's size warning must count
    them, or an improved student trained on hundreds of plans reads as trained on its SFT handful."""
    evals, runs = pipeline_folder(tmp_path)
    runs["student_improved"] = [dict(r, method="student_improved") for r in runs["student"]]
    manifest = json.loads((evals / "manifest.json").read_text())
    manifest["methods"].append({"name": "student_improved", "compare_to": "student"})
    write_run(tmp_path, runs, manifest)
    for i, kept in enumerate([60, 70], start=1):
        write_json(tmp_path / "improve" / "stu" / f"round_{i}" / "summary.json", {"samples": 96, "kept": kept})
    results = write_report(evals)
    rows = results["verdict"]["rows"]
    assert rows["student"]["train_examples"] == 2 and rows["student_improved"]["train_examples"] == 2 + 60 + 70
    assert rows["student_improved"]["student"] == "stu"
    assert rows["student_improved"]["warnings"] == [] and rows["student"]["warnings"]  # 132 is not under 100


def mixed_rows(n: int = 20) -> dict[str, list[dict]]:
    """The student finds both gold pages of every question, the teacher one; each answers right on the questions
    the other gets wrong (the teacher on even ones), so F1 differs on every question and by 0 on the mean."""
    gold = {f"q{i}": [f"q{i} A", f"q{i} B"] for i in range(n)}
    teacher = [rec("teacher", q, "Paris" if i % 2 == 0 else "Rome", "Paris", gold=g, titles=(g[0],))
               for i, (q, g) in enumerate(gold.items())]
    student = [rec("student", q, "Paris" if i % 2 else "Rome", "Paris", gold=g, titles=tuple(g))
               for i, (q, g) in enumerate(gold.items())]
    return {"teacher": teacher, "student": student}


@pytest.mark.parametrize("examples", [MIN_TRAIN_EXAMPLES - 1, MIN_TRAIN_EXAMPLES, 3 * MIN_TRAIN_EXAMPLES])
def test_verdict_words_for_a_ci_above_0_a_ci_across_0_and_the_training_set_size(tmp_path, examples):
    """Records written for the test, in a pipeline's run folder: `better` where the paired CI lies above 0,
    `no detectable difference at n=20` where it spans 0 (F1: every question differs, the mean does not), and
    the warning exactly when the student was trained on fewer than MIN_TRAIN_EXAMPLES examples."""
    evals, _ = pipeline_folder(tmp_path, train_examples=examples)
    manifest = json.loads((evals / "manifest.json").read_text())
    manifest["methods"] = [{"name": "teacher"}, {"name": "student"}]
    (evals / "records" / "react.jsonl").unlink()
    (evals / "records" / "direct.jsonl").unlink()
    write_run(tmp_path, mixed_rows(), manifest)
    results = write_report(evals)
    row = results["verdict"]["rows"]["student"]
    recall, f1 = row["measures"]["evidence recall"], row["measures"]["F1"]
    assert recall["reading"] == "better" and recall["diff"]["lo"] > 0 and recall["diff"]["diff"] == 0.5
    assert f1["reading"] == "no detectable difference at n=20" and f1["diff"]["lo"] < 0 < f1["diff"]["hi"]
    assert row["measures"]["EM"]["reading"] == "no detectable difference at n=20"
    assert len(row["questions"]["better"]) == len(row["questions"]["worse"]) == 10
    text = (evals / "report.md").read_text()
    assert ("**student** against **teacher**: better on evidence recall, all gold pages; no detectable difference "
            "at n=20 on plan valid, EM, F1.") in text
    assert "| evidence recall | 20 | +0.500 [+0.500, +0.500] | better |" in text
    warning = (f"trained on {examples} examples (fewer than {MIN_TRAIN_EXAMPLES}): too few for this comparison to "
               "say anything about distillation")
    if examples < MIN_TRAIN_EXAMPLES:
        assert row["warnings"] == [warning] and f"> **Warning:** {warning}" in text
    else:
        assert row["warnings"] == [] and "> **Warning:**" not in text
    assert f"trained on {examples} examples (" in text  # the verdict line says the size either way


def test_a_stage_by_stage_run_has_full_provenance_from_its_served_adapter(tmp_path):
    """No pipeline run folder: eval ran on its own against a server serving an adapter trained elsewhere. Eval's
    fingerprints name the served adapter's folder (vLLM's /v1/models root), and that folder's own record says
    the rest: the report's provenance is as full as a pipeline's."""
    adapter = tmp_path / "elsewhere" / "student_compact"
    write_json(adapter / "distill_adapter.json", {
        "format_version": 2, "base_model": "smollm2-135m-instruct", "lora_r": 8, "lora_alpha": 16, "global_step": 40,
        "final_train_loss": 0.31, "final_eval_loss": 0.52, "student_prompt": "compact",
        "tools": {"Wikipedia": "Search Wikipedia.", "LLM": "Ask a language model."},
        "train_examples": 120, "train_questions": 60, "validation_examples": 14,
        "teacher": {"models": ["Qwen/Qwen2.5-72B-Instruct"], "prompt": "fewshot"},
        "datasets": {"hotpotqa": {"train": 80, "validation": 10}, "triviaqa": {"train": 40, "validation": 4}},
        "code_version": "0.1.0+abc1234"})
    runs = sample_run()
    served = {"model": "student_compact", "servers": [{"root": str(adapter), "parent": "base", "weights": "w"}]}
    manifest = {"methods": [{"name": n} for n in runs], "reference": "teacher", "bootstrap_samples": 100,
                "config": {"solver": {"backend": "openai", "model": "solver-m"},
                           "datasets": [{"name": "hotpotqa", "split": "dev", "n": 12, "source": "dev.jsonl"}]},
                "fingerprints": {"student": {"fingerprint": "f", "settings": {"method": {"planner": {"serves": served}}}},
                                 "teacher": {"fingerprint": "g", "settings": {"method": {"planner": {"serves": None}}}}}}
    for r in runs["student"]:
        r["planner"]["model"] = "student_compact"
    evals = write_run(tmp_path, runs, manifest)  # tmp_path/run: no generate/, sft-data/ or train/ beside it
    results = write_report(evals)
    p = results["provenance"]
    assert p["run_dir"] is None and p["student_rows"] == {"student": "student_compact"}
    assert (p["distill_version"], p["commit"]) == ("0.1.0", "abc1234")
    assert p["teacher"] == {"model": "Qwen/Qwen2.5-72B-Instruct", "prompt": "fewshot", "temperature": None}
    assert p["datasets"]["generate"] == [{"name": "hotpotqa", "split": "train+validation", "n": 90},
                                         {"name": "triviaqa", "split": "train+validation", "n": 44}]
    s = p["students"]["student_compact"]
    assert (s["train_examples"], s["validation_examples"], s["student_prompt"]) == (120, 14, "compact")
    assert s["tools"] == ["Wikipedia", "LLM"] and s["adapter"] == str(adapter)
    assert results["verdict"]["rows"]["student"]["train_examples"] == 120
    text = (evals / "report.md").read_text()
    assert "Students: unknown" not in text and "training set size unknown" not in text
    assert "- teacher (generation): Qwen/Qwen2.5-72B-Instruct, prompt fewshot" in text
    assert "| student_compact | smollm2-135m-instruct | 8 | 16 | 40 | 120 | 14 | compact | 0.31 | 0.52 |" in text


def test_judge_accuracy_joins_the_verdict_only_where_a_judge_ran():
    rows = paired_rows()
    assert "judge accuracy" not in compute(rows, reference="teacher", samples=100)["verdict"]["rows"]["student"][
        "measures"]
    for r in rows["teacher"]:
        r["scores"]["judge"] = False
    for r in rows["student"]:
        r["scores"]["judge"] = True  # the judge accepts the student's answers, rejects the teacher's
    results = compute(rows, reference="teacher", samples=100)
    judged = results["verdict"]["rows"]["student"]["measures"]["judge accuracy"]
    assert judged["n"] == 20 and judged["diff"]["diff"] == 1.0 and judged["reading"] == "better"
    assert "| judge accuracy | 20 | +1.000 [+1.000, +1.000] | better |" in render_markdown(results)
