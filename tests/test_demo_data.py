"""The shipped demo data passes every check in scripts/check_demo_data.py, and the checker catches each kind of
damage it claims to (a checker that accepts anything would make the first test worthless)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_demo_data", ROOT / "scripts" / "check_demo_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


check = _load_checker()


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


@pytest.fixture
def demo_copy(tmp_path: Path) -> Path:
    for name in ("corpus.jsonl", "train.jsonl", "dev.jsonl"):
        shutil.copy(DEMO / name, tmp_path / name)
    return tmp_path


def _problems_after(data_dir: Path, name: str, edit) -> list[str]:
    records = _read(data_dir / name)
    edit(records)
    _write(data_dir / name, records)
    report = check.check_demo_data(data_dir)
    assert not report.ok
    return report.problems


# ----------------------------------------------------------------------------------------------- the real data


def test_shipped_demo_data_is_valid():
    report = check.check_demo_data(DEMO)
    assert report.problems == []
    summary = report.summary
    assert summary["corpus_paragraphs"] >= 160
    assert summary["train"]["questions"] >= 50 and summary["dev"]["questions"] >= 20
    for split in ("train", "dev"):
        assert summary[split]["type"].get("bridge", 0) > 0 and summary[split]["type"].get("comparison", 0) > 0
        assert summary[split]["yes_no"] > 0


def test_readme_counts_match_the_files():
    """The README quotes counts; a data edit that changes them must update the README too."""
    summary = check.check_demo_data(DEMO).summary
    readme = (DEMO / "README.md").read_text(encoding="utf-8")
    assert f"| `corpus.jsonl` | {summary['corpus_paragraphs']} paragraphs |" in readme
    for split in ("train", "dev"):
        s = summary[split]
        assert f"| `{split}.jsonl` | {s['questions']} questions |" in readme
        row = (
            f"| {split} | {s['type']['bridge']} | {s['type']['comparison']} | {s['level'].get('easy', 0)} | "
            f"{s['level'].get('medium', 0)} | {s['level'].get('hard', 0)} | {s['yes_no']} |"
        )
        assert row in readme


def test_every_supporting_paragraph_is_reachable_by_title():
    """Each supporting title is a corpus title, so a planner's Wikipedia[title] lookup can find it."""
    titles = {r["title"] for r in _read(DEMO / "corpus.jsonl")}
    for name in ("train.jsonl", "dev.jsonl"):
        for rec in _read(DEMO / name):
            assert {t for t, _ in rec["supporting_facts"]} <= titles


def test_main_prints_summary_and_exits_zero(capsys):
    assert check.main(["--data-dir", str(DEMO)]) == 0
    out = capsys.readouterr().out
    assert "corpus: " in out and "train: " in out and out.strip().endswith("ok")


def test_main_json_reports_ok(capsys):
    assert check.main(["--data-dir", str(DEMO), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is True and payload["problems"] == []


# ----------------------------------------------------------------------------------------------- the splitter


def test_split_sentences_keeps_initials_and_abbreviations_together():
    text = (
        "J. R. R. Tolkien was born in 1892. His films include E.T. the Extra-Terrestrial. "
        "Its capital is Washington, D.C., and more. It was built (in 1791). Then 1896 came."
    )
    assert check.split_sentences(text) == [
        "J. R. R. Tolkien was born in 1892.",
        "His films include E.T. the Extra-Terrestrial.",
        "Its capital is Washington, D.C., and more.",
        "It was built (in 1791).",
        "Then 1896 came.",
    ]


def test_split_sentences_needs_an_uppercase_start():
    assert check.split_sentences("It cost 3.5 euros. it was cheap.") == ["It cost 3.5 euros. it was cheap."]


def test_contains_answer_is_whole_word_and_ignores_case_and_punctuation():
    assert check.contains_answer("Tim Berners-Lee", "invented by tim berners lee in 1989")
    assert check.contains_answer("Paris", "It is in Paris, France.")
    assert not check.contains_answer("yen", "a cayenne pepper")
    assert not check.contains_answer("", "anything")


# ----------------------------------------------------------------------------------------------- damage found


def test_changed_context_sentence_is_reported(demo_copy):
    def edit(records):
        records[0]["context"][0][1][0] = records[0]["context"][0][1][0].replace(".", "!")

    problems = _problems_after(demo_copy, "train.jsonl", edit)
    assert any("differ from the corpus text" in p for p in problems)


def test_resplit_context_is_reported(demo_copy):
    def edit(records):
        title, sentences = records[0]["context"][0]
        records[0]["context"][0] = [title, [" ".join(sentences)]]

    problems = _problems_after(demo_copy, "train.jsonl", edit)
    assert any("not split by the corpus rule" in p for p in problems)


def test_supporting_fact_out_of_range_is_reported(demo_copy):
    def edit(records):
        records[0]["supporting_facts"][0][1] = 9

    problems = _problems_after(demo_copy, "dev.jsonl", edit)
    assert any("out of range" in p for p in problems)


def test_supporting_fact_outside_context_is_reported(demo_copy):
    problems = _problems_after(demo_copy, "dev.jsonl", lambda r: r[0]["supporting_facts"].append(["Nowhere", 0]))
    assert any("'Nowhere' is not in the context" in p for p in problems)


def test_unknown_context_title_is_reported(demo_copy):
    def edit(records):
        records[1]["context"].append(["Atlantis", ["Atlantis is a legend."]])

    problems = _problems_after(demo_copy, "train.jsonl", edit)
    assert any("'Atlantis' is not in the corpus" in p for p in problems)


def test_answer_missing_from_support_is_reported(demo_copy):
    def edit(records):
        bridge = next(r for r in records if r["type"] == "bridge")
        bridge["answer"] = "Ulaanbaatar"

    problems = _problems_after(demo_copy, "train.jsonl", edit)
    assert any("'Ulaanbaatar' does not appear" in p for p in problems)


def test_yes_no_answer_on_bridge_is_reported(demo_copy):
    def edit(records):
        next(r for r in records if r["type"] == "bridge")["answer"] = "yes"

    problems = _problems_after(demo_copy, "train.jsonl", edit)
    assert any("yes/no answer belongs to a comparison" in p for p in problems)


def test_duplicate_corpus_id_is_reported(demo_copy):
    def edit(records):
        records[1]["id"] = records[0]["id"]

    problems = _problems_after(demo_copy, "corpus.jsonl", edit)
    assert any("duplicate id 'demo-0001'" in p for p in problems)


def test_dev_question_repeated_in_train_is_reported(demo_copy):
    dev = _read(demo_copy / "dev.jsonl")

    def edit(records):
        copy = dict(dev[0], _id="demo-q900", question=dev[0]["question"].upper().rstrip("?") + " ?")
        records.append(copy)

    problems = _problems_after(demo_copy, "train.jsonl", edit)
    assert any("question in both splits" in p for p in problems)


def test_too_few_distractors_is_reported(demo_copy):
    def edit(records):
        rec = records[0]
        support = {t for t, _ in rec["supporting_facts"]}
        rec["context"] = [c for c in rec["context"] if c[0] in support]

    problems = _problems_after(demo_copy, "train.jsonl", edit)
    assert any("0 distractor paragraphs" in p for p in problems)


def test_small_corpus_is_reported(demo_copy):
    def edit(records):
        del records[150:]

    problems = _problems_after(demo_copy, "corpus.jsonl", edit)
    assert any("want at least 160" in p for p in problems)


def test_bad_json_and_missing_file_are_reported_not_raised(demo_copy, capsys):
    (demo_copy / "dev.jsonl").write_text('{"_id": "demo-q001"\n', encoding="utf-8")
    (demo_copy / "corpus.jsonl").unlink()
    report = check.check_demo_data(demo_copy)
    assert any("dev.jsonl:1: not valid JSON" in p for p in report.problems)
    assert any("corpus.jsonl: file not found" in p for p in report.problems)
    assert check.main(["--data-dir", str(demo_copy)]) == 1
    assert "problem: " in capsys.readouterr().err
