"""The filter keeps valid, fully run, correct trajectories, best sample per question, and accounts for all."""

from __future__ import annotations

import json

from distill.cli import main
from distill.filter import FilterConfig, build_report, filter_records


def rec(id, sample=0, *, valid=True, steps=2, status="ok", em=1, f1=1.0, dataset="hotpotqa", tokens=100, deps=True):
    plan_steps = [
        {"id": f"#E{i}", "description": "d", "tool": "Wikipedia", "input": f"x #E{i - 1}" if (deps and i > 1) else "x",
         "deps": [f"#E{i - 1}"] if (deps and i > 1) else []}
        for i in range(1, steps + 1)
    ]
    return {
        "id": id, "sample": sample, "dataset": dataset, "question": f"q{id}", "answers": ["a"],
        "plan": {"valid": valid, "steps": plan_steps, "errors": [] if valid else [{"code": "empty_plan"}]},
        "evidence": [{"id": s["id"], "status": status} for s in plan_steps],
        "scores": {"em": em, "f1": f1}, "tokens": {"total": tokens},
    }


def test_each_reason_and_best_sample():
    records = [
        rec("1", 0, valid=False),
        rec("2", 0, status="timeout"),
        rec("3", 0, em=0, f1=0.5),
        rec("4", 0, em=0, f1=0.85),  # hotpotqa F1 >= 0.8 counts as correct
        rec("5", 0, em=0, f1=0.85, dataset="triviaqa"),  # but TriviaQA needs EM
        rec("6", 0, steps=3), rec("6", 1, steps=2), rec("6", 2, steps=2, tokens=50),
    ]
    kept, dropped = filter_records(records, FilterConfig())
    assert [(r["id"], r["sample"]) for r in kept] == [("4", 0), ("6", 2)]
    reasons = {(r["id"], r["sample"]): why for r, why in dropped}
    assert reasons == {
        ("1", 0): "invalid_plan", ("2", 0): "step_failed", ("3", 0): "incorrect", ("5", 0): "incorrect",
        ("6", 0): "not_best_sample", ("6", 1): "not_best_sample",
    }
    report = build_report(records, kept, dropped)
    assert report["accounted"] and report["kept"] + sum(report["dropped"].values()) == len(records)
    assert report["by_dataset"]["triviaqa"] == {"incorrect": 1}
    assert report["by_steps"]["3"] == {"not_best_sample": 1}


def test_optional_rules():
    records = [rec("1", steps=5), rec("2", steps=3, deps=False)]
    kept, dropped = filter_records(records, FilterConfig(max_steps=4, reject_unused_evidence=True))
    assert not kept
    assert sorted(why for _, why in dropped) == ["too_many_steps", "unused_evidence"]


def test_cli_writes_kept_and_report(tmp_path, capsys):
    inp = tmp_path / "t.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in [rec("1"), rec("2", em=0, f1=0.0)]))
    out = tmp_path / "kept.jsonl"
    assert main(["filter", str(inp), "--out", str(out), "--set", "min_f1=0.9"]) == 0
    assert [json.loads(l)["id"] for l in out.read_text().splitlines()] == ["1"]
    report = json.loads((tmp_path / "kept.report.json").read_text())
    assert report["kept"] == 1 and report["dropped"]["incorrect"] == 1 and report["config"]["min_f1"] == 0.9
    assert "1 kept" in capsys.readouterr().out


def test_cli_bad_input_is_one_line_error(tmp_path, capsys):
    assert main(["filter", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "k.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def test_contained_answer_is_opt_in():
    r = rec("1", em=0, f1=0.33)
    r["prediction"], r["answers"] = "The Volga is longer than the Rhine", ["Volga"]
    assert filter_records([r], FilterConfig())[0] == []
    assert filter_records([r], FilterConfig(accept_contained_answer=True))[0] == [r]
    r["prediction"] = "Volgograd"  # whole tokens only
    assert filter_records([r], FilterConfig(accept_contained_answer=True))[0] == []


def with_recall(r, found, gold=("A", "B")):
    r["evidence_recall"] = {"recall": len(found) / len(gold), "all": len(found) == len(gold), "gold": list(gold),
                            "found": list(found)}
    return r


def test_each_criterion_on_records_built_to_pass_or_fail_it():
    both = with_recall(rec("1"), ["A", "B"])  # right answer, every gold page
    answer_only = with_recall(rec("2"), ["A"])  # right answer, a page missed
    evidence_only = with_recall(rec("3", em=0, f1=0.0), ["A", "B"])  # every page, the Solver still wrong
    neither = with_recall(rec("4", em=0, f1=0.0), [])
    trivia_right = rec("5", dataset="triviaqa")  # no gold pages: judged by its answer under every criterion
    trivia_wrong = rec("6", dataset="triviaqa", em=0, f1=0.0)
    records = [both, answer_only, evidence_only, neither, trivia_right, trivia_wrong]

    def kept_ids(criterion):
        kept, dropped = filter_records(records, FilterConfig(criterion=criterion))
        return [r["id"] for r in kept], {r["id"]: why for r, why in dropped}

    assert kept_ids("answer")[0] == ["1", "2", "5"]
    ids, why = kept_ids("evidence")
    assert ids == ["1", "3", "5"] and why == {"2": "evidence_missed", "4": "evidence_missed", "6": "incorrect"}
    ids, why = kept_ids("answer_and_evidence")
    assert ids == ["1", "5"] and why["3"] == "incorrect" and why["2"] == "evidence_missed"
    report = build_report(records, *filter_records(records, FilterConfig()), FilterConfig())
    assert report["kept_by_criterion"] == {"answer": 3, "evidence": 3, "answer_and_evidence": 2}
    assert report["evidence_recall"]["input"]["hotpotqa"] == {"n": 4, "recall": (1 + 0.5 + 1 + 0) / 4, "all": 0.5}
    assert "triviaqa" not in report["evidence_recall"]["input"]


def test_a_filter_that_keeps_nothing_is_one_line_exit_2_and_keeps_its_report(tmp_path, capsys):
    inp = tmp_path / "t.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in [rec("1", em=0, f1=0.0), rec("2", valid=False)]))
    out = tmp_path / "kept.jsonl"
    assert main(["filter", str(inp), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "filter kept 0 of 2 records (dropped: invalid_plan 1, incorrect 1;" in err
    assert json.loads((tmp_path / "kept.report.json").read_text())["kept"] == 0  # what was dropped, and why
