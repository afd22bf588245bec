"""`distill sft-data`: kept trajectories -> prompt/completion dataset, split by question, canonical plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill.cli import main as cli_main
from distill.core.config import validate
from distill.core.data import normalize_question
from distill.core.errors import DistillError
from distill.rewoo.plan import parse_plan, render_plan
from distill.rewoo.prompts import planner_messages
from distill.sft_data import (
    SftDataConfig,
    build_examples,
    build_sft_data,
    split_by_question,
    validation_question_count,
)
from distill.tools.registry import tool_descriptions

TOOLS = ["Wikipedia", "LLM", "Calculator"]

# Six questions, two teacher samples each with different (valid) plans; the teacher wrote them loosely
# (bold, numbering, `#E1:`) so canonical re-rendering is visible.
QUESTIONS: list[tuple[str, str, list[str]]] = [
    ("hotpotqa", "Which city hosted the 1992 Summer Olympics?", ["1992 Summer Olympics", "Barcelona Olympics"]),
    ("hotpotqa", "Who wrote the novel that the film Blade Runner is based on?", ["Blade Runner", "Philip K. Dick"]),
    ("hotpotqa", "Which is taller, the Eiffel Tower or the Statue of Liberty?", ["Eiffel Tower", "Statue of Liberty"]),
    ("triviaqa", "What is the chemical symbol for gold?", ["Gold", "Gold (element)"]),
    ("triviaqa", "In which year did the Berlin Wall fall?", ["Berlin Wall", "Fall of the Berlin Wall"]),
    ("triviaqa", "How many moons does Mars have?", ["Mars", "Moons of Mars"]),
]


def teacher_plan(question: str, topic: str, sample: int) -> str:
    if sample == 0:
        return (
            f"Plan: Search for information about {topic}.\n"
            f"#E1 = Wikipedia[{topic}]\n"
            f"Plan: Answer the question from the evidence.\n"
            f"#E2 = LLM[{question} Given context: #E1]"
        )
    return (
        f"1. **Plan:** Look up {topic} to find the relevant facts.\n"
        f"**#E1**: Wikipedia[{topic}]\n"
        f"2. **Plan:** Extract the answer.\n"
        f"#E2 = LLM[{question} Given context: #E1]\n"
        f"Plan: Count the number of steps.\n"
        f"#E3 = Calculator[1 + 1]"
    )


def kept_records() -> list[dict]:
    """12 kept records over 6 questions, in the trajectory record shape."""
    records = []
    for n, (dataset, question, topics) in enumerate(QUESTIONS):
        for sample in (0, 1):
            output = teacher_plan(question, topics[sample], sample)
            plan = parse_plan(output, tools=TOOLS)
            assert plan.valid, plan.errors
            records.append(
                {
                    "format_version": 1,
                    "id": f"{dataset}-{n}",
                    "dataset": dataset,
                    "question": question,
                    "answers": ["x"],
                    "method": "rewoo",
                    "sample": sample,
                    "planner": {
                        "model": "teacher",
                        "messages": planner_messages(question, tool_descriptions(TOOLS), "fewshot"),
                        "output": output,
                    },
                    "plan": plan.to_dict(),
                    "evidence": [],
                    "solver": {},
                    "prediction": "x",
                    "scores": {"em": 1, "f1": 1.0},
                }
            )
    return records


def bad_records() -> list[dict]:
    base = kept_records()[0]
    empty = json.loads(json.dumps(base)) | {"id": "bad-empty"}
    empty["planner"]["output"] = "I think the answer is Barcelona."
    unknown = json.loads(json.dumps(base)) | {"id": "bad-tool"}
    unknown["planner"]["output"] = "Plan: search.\n#E1 = Google[1992 Olympics]"
    return [empty, unknown]


def write_kept(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_examples_use_the_student_prompt_and_the_canonical_plan():
    tools = tool_descriptions(TOOLS)
    examples, counts = build_examples(kept_records() + bad_records(), tools)
    assert counts == {"ok": 12, "no_steps": 1, "invalid_plan": 1}
    assert len(examples) == 12
    for record, example in zip(kept_records(), examples):
        assert example["prompt"] == planner_messages(record["question"], tools, "full")
        completion = example["completion"]
        assert [m["role"] for m in completion] == ["assistant"]
        assert completion[0]["content"] == render_plan(parse_plan(record["planner"]["output"], tools=TOOLS))
        assert "**" not in completion[0]["content"] and "#E1 = Wikipedia[" in completion[0]["content"]
        assert (example["id"], example["dataset"]) == (record["id"], record["dataset"])
    # zero-shot: the teacher's exemplars never reach the student prompt
    assert "For example" not in examples[0]["prompt"][0]["content"]


def test_identical_samples_are_kept_once():
    records = kept_records()
    twin = json.loads(json.dumps(records[0])) | {"sample": 7}
    examples, counts = build_examples(records + [twin], tool_descriptions(TOOLS))
    assert len(examples) == 12 and counts["duplicate"] == 1 and counts["ok"] == 12


def test_split_keeps_each_question_on_one_side_and_is_seeded():
    examples, _ = build_examples(kept_records(), tool_descriptions(TOOLS))
    train, val = split_by_question(examples, 0.34, seed=3)
    key = lambda e: normalize_question(e["prompt"][-1]["content"])  # noqa: E731
    assert {key(e) for e in train}.isdisjoint({key(e) for e in val})
    assert len({key(e) for e in val}) == 2 and len(val) == 4 and len(train) == 8
    assert split_by_question(examples, 0.34, seed=3) == (train, val)
    others = {tuple(key(e) for e in split_by_question(examples, 0.34, seed=s)[1]) for s in range(6)}
    assert len(others) > 1  # the seed matters
    assert split_by_question(list(reversed(examples)), 0.34, seed=3)[1] == [e for e in reversed(examples) if e in val]


def test_normalised_questions_share_a_side():
    examples, _ = build_examples(kept_records(), tool_descriptions(TOOLS))
    shouted = dict(examples[0], prompt=planner_messages("WHICH city hosted the 1992  Summer Olympics", {}, "full"))
    for seed in range(5):
        train, val = split_by_question(examples + [shouted], 0.5, seed)
        first_side = "val" if examples[0] in val else "train"
        assert (shouted in val) == (first_side == "val")


def test_the_split_folds_questions_as_the_leak_guard_does():
    """Full-width letters and underscores fold as in `distill.core.data` (NFKC): the leak guard and the split agree."""
    from distill.core.data import Example, check_no_leak

    examples, _ = build_examples(kept_records(), tool_descriptions(TOOLS))
    wide = "Ｗｈｉｃｈ city hosted the 1992 Summer_Olympics?"
    variant = dict(examples[0], prompt=planner_messages(wide, {}, "full"))
    for seed in range(5):
        train, val = split_by_question(examples + [variant], 0.5, seed)
        assert (variant in val) == (examples[0] in val)
    with pytest.raises(DistillError, match="also appear in the evaluation set"):
        check_no_leak([Example("t", "hotpotqa", "train", wide, ["x"])], {QUESTIONS[0][1]})


def test_config_fixes_tool_case_and_refuses_bad_settings():
    cfg = validate(SftDataConfig, {"tools": "wikipedia, llm", "kept": "k", "out": "o"})
    assert cfg.tools == ["Wikipedia", "LLM"] and cfg.student_prompt == "full"
    for bad, message in [
        ({"tools": ["LLM", "llm"]}, "listed twice"),
        ({"tools": ["Bing"]}, "unknown tool"),
        ({"tools": []}, "no tools given"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"student_prompt": "oneshot"}, "student_prompt"),
        ({"max_length": 9}, "max_length"),
    ]:
        with pytest.raises(DistillError, match=message) as info:
            validate(SftDataConfig, bad)
        assert "\n" not in str(info.value)


def test_a_fewshot_student_prompt_is_the_teachers_prompt(tmp_path):
    kept = write_kept(tmp_path / "kept.jsonl", kept_records())
    cfg = SftDataConfig(kept=str(kept), out=str(tmp_path / "sft"), student_prompt="fewshot", tokenizer=None)
    summary = build_sft_data(cfg)
    first = json.loads((tmp_path / "sft" / "preview.jsonl").read_text().splitlines()[0])
    assert first["prompt"] == kept_records()[0]["planner"]["messages"]
    assert summary["student_prompt"] == "fewshot"


def test_a_compact_student_prompt_keeps_the_examples_and_cuts_the_prompt_tokens(tmp_path):
    """The same kept records and split under `full` and `compact` (the demo compares the two students on the
    same examples); only the system message differs, and the real tokenizer's count says by how much."""
    kept = write_kept(tmp_path / "kept.jsonl", kept_records())
    summaries, previews = {}, {}
    for kind in ("full", "compact"):
        out = tmp_path / kind
        argv = ["sft-data", str(kept), "--out", str(out), "--student-prompt", kind, "--val-fraction", "0.34"]
        assert cli_main(argv) == 0
        summaries[kind] = json.loads((out / "summary.json").read_text())
        previews[kind] = [json.loads(line) for line in (out / "preview.jsonl").read_text().splitlines()]
    full, compact = summaries["full"], summaries["compact"]
    assert (full["student_prompt"], compact["student_prompt"]) == ("full", "compact")
    assert full["records"] == compact["records"]
    for split in ("train", "validation"):
        assert full["splits"][split]["examples"] == compact["splits"][split]["examples"] > 0
        assert full["splits"][split]["completion_tokens"] == compact["splits"][split]["completion_tokens"]
        assert compact["splits"][split]["prompt_tokens"]["max"] * 3 < full["splits"][split]["prompt_tokens"]["min"]
    for f, c in zip(previews["full"], previews["compact"]):
        assert f["completion"] == c["completion"] and f["prompt"][1:] == c["prompt"][1:]
        assert c["prompt"][0] == {"role": "system", "content": "Tools: Wikipedia, LLM, Calculator"}


def test_cli_reads_a_config_and_flags_override_it(tmp_path):
    kept = write_kept(tmp_path / "kept.jsonl", kept_records())
    config = tmp_path / "sft.yaml"
    config.write_text("tools: [wikipedia, llm, calculator]\nval_fraction: 0.5\nseed: 3\ntokenizer: none\n")
    out = tmp_path / "sft"
    assert cli_main(["sft-data", str(kept), "--out", str(out), "--config", str(config), "--seed", "4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tools"] == TOOLS and summary["seed"] == 4 and summary["val_fraction"] == 0.5
    assert summary["splits"]["validation"]["questions"] == 3


def test_validation_gets_a_question_when_there_are_two():
    assert validation_question_count(2, 0.1) == 1
    assert validation_question_count(1, 0.1) == 0
    assert validation_question_count(6, 0.1) == 1
    assert validation_question_count(100, 0.1) == 10
    assert validation_question_count(3, 0.9) == 2  # never all of them
    assert validation_question_count(10, 0.0) == 0
    with pytest.raises(DistillError):
        split_by_question([], 1.0, 0)


def test_cli_writes_dataset_preview_and_summary(tmp_path, capsys):
    from datasets import load_from_disk

    kept = write_kept(tmp_path / "kept.jsonl", kept_records() + bad_records())
    out = tmp_path / "sft"
    assert cli_main(["sft-data", str(kept), "--out", str(out), "--val-fraction", "0.2", "--seed", "1"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "train:" in printed and "validation:" in printed and "prompt_tokens" in printed
    assert "WARNING: only 10 training examples (fewer than 100)" in captured.err  # loud, on stderr
    data = load_from_disk(str(out))
    assert set(data) == {"train", "validation"}
    assert len(data["train"]) + len(data["validation"]) == 12 and len(data["validation"]) == 2
    assert {"prompt", "completion", "id", "dataset"} <= set(data["train"].column_names)
    preview = [json.loads(line) for line in (out / "preview.jsonl").read_text().splitlines()]
    assert len(preview) == 12 and preview[0]["completion"][0]["role"] == "assistant"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == {"invalid_plan": 1, "no_steps": 1, "ok": 12}
    train = summary["splits"]["train"]
    assert train["examples"] == 10 and train["questions"] == 5
    # what the adapter trained on this data copies into its own record: the teacher, its prompt, the datasets
    assert summary["teacher"] == {"models": ["teacher"], "prompt": "fewshot"}
    assert summary["tool_descriptions"] == tool_descriptions(summary["tools"])
    assert sum(c["train"] for c in summary["datasets"].values()) == 10
    assert sum(c["validation"] for c in summary["datasets"].values()) == 2
    assert sum(train["per_dataset"].values()) == 10
    p = train["prompt_tokens"]
    assert 100 < p["min"] <= p["mean"] <= p["max"] < 1000
    assert 0 < train["completion_tokens"]["min"] < train["completion_tokens"]["max"]


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(DistillError, match="unknown tool"):
        tool_descriptions(["Wikipedia", "Bing"])
    kept = write_kept(tmp_path / "kept.jsonl", bad_records())
    with pytest.raises(DistillError, match="no record has a usable plan"):
        build_sft_data(SftDataConfig(kept=str(kept), out=str(tmp_path / "out"), tokenizer=None))
    assert cli_main(["sft-data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "error:" in capsys.readouterr().err


def test_no_validation_split_still_saves_both_splits(tmp_path):
    from datasets import load_from_disk

    kept = write_kept(tmp_path / "kept.jsonl", kept_records())
    summary = build_sft_data(SftDataConfig(kept=str(kept), out=str(tmp_path / "sft"), val_fraction=0.0, tokenizer=None))
    data = load_from_disk(str(tmp_path / "sft"))
    assert len(data["train"]) == 12 and len(data["validation"]) == 0
    assert data["validation"].column_names == data["train"].column_names
    assert summary["splits"]["validation"]["examples"] == 0
