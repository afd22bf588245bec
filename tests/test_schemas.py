"""Bad input is refused at the door: a record, a dataset row or a folder write that a stage cannot use is one
line naming file:line and the field (exit 2), before any work; an output folder is replaced whole or not at all.

Each record test writes a file a real stage wrote (the helpers of the stage's own tests), damages one field,
and runs the real CLI on it. Disk-full tests fake the full disk by making a write raise OSError(ENOSPC), the
error a full disk gives; everything else is real.
"""

from __future__ import annotations

import errno
import json
import math
import os
import threading
from pathlib import Path

import pytest
import yaml

from distill import cli
from distill.core.data import DatasetSource, Example, load_examples, rows_to_examples
from distill.core.errors import DistillError
from distill.core.store import read_jsonl
from test_filter import rec as trajectory
from test_report import rec as eval_record
from test_report import write_run
from test_sft_data import kept_records, write_kept


def _one_error(capsys, argv: list[str]) -> str:
    """Run the CLI; it must exit 2 with one line on stderr (no traceback) and return that line. Progress bars
    (datasets' `Saving the dataset`, redrawn with carriage returns) are not lines of the message."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.split("\n") if line.strip() and "\r" not in line]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------------------------- records: filter


def _without(record: dict, key: str) -> dict:
    return {k: v for k, v in record.items() if k != key}


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda r: _without(r, "id"), "id"),
        (lambda r: r | {"evidence": None}, "evidence"),
        (lambda r: r | {"plan": "Plan: look it up. #E1 = Wikipedia[x]"}, "plan"),
        (lambda r: r | {"scores": {"em": "1", "f1": "1.0"}}, "scores`: em: a score is a number from 0 to 1"),
        (lambda r: r | {"scores": {"em": 1, "f1": 1.0, "judge": "yes"}}, "scores`: judge: the verdict"),
        (lambda r: r | {"sample": "0"}, "sample"),
        (lambda r: r | {"plan": r["plan"] | {"steps": [{"id": "#E1"}]}}, "plan.steps.0.tool"),
        (lambda r: r | {"evidence": [{"id": "#E1", "status": "fine"}]}, "evidence.0.status"),
    ],
)
def test_filter_refuses_a_damaged_record_naming_line_and_field(tmp_path, capsys, damage, field):
    inp = _jsonl(tmp_path / "t.jsonl", [trajectory("1"), damage(trajectory("2"))])
    out = tmp_path / "kept.jsonl"
    err = _one_error(capsys, ["filter", str(inp), "--out", str(out)])
    assert f"t.jsonl:2: field `{field}" in err
    assert not out.exists()  # refused before any work: nothing written


def test_filter_counts_a_repeated_record_once_and_says_so(tmp_path, capsys):
    inp = _jsonl(tmp_path / "t.jsonl", [trajectory("1"), trajectory("1", em=0, f1=0.0), trajectory("2")])
    assert cli.main(["filter", str(inp), "--out", str(tmp_path / "kept.jsonl")]) == 0
    assert "skipped lines: duplicate 1" in capsys.readouterr().out
    report = json.loads((tmp_path / "kept.report.json").read_text())
    assert report["skipped"] == {"duplicate": 1} and report["input_records"] == 2 and report["kept"] == 2


# ------------------------------------------------------------------------------------ records: sft-data


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda r: r | {"sample": "abc"}, "sample"),
        (lambda r: r | {"question": 7}, "question"),
        (lambda r: r | {"planner": r["planner"] | {"output": None}}, "planner.output"),
        (lambda r: r | {"plan": r["plan"] | {"valid": False}}, "a kept record has a valid plan"),
    ],
)
def test_sft_data_refuses_a_damaged_kept_record(tmp_path, capsys, damage, field):
    records = kept_records()
    records[1] = damage(records[1])
    kept = write_kept(tmp_path / "kept.jsonl", records)
    out = tmp_path / "sft"
    err = _one_error(capsys, ["sft-data", str(kept), "--out", str(out), "--tokenizer", "none"])
    assert "kept.jsonl:2: " in err and field in err
    assert not out.exists()


# -------------------------------------------------------------------------------------- records: report


def _eval_records() -> list[dict]:
    return [eval_record("teacher", f"q{i}", "Paris", "Paris", wall=1.0 + i) for i in range(3)]


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda r: _without(r, "tokens"), "field `tokens`"),
        (lambda r: r | {"tokens": {"total": 3}}, "field `tokens.planner`"),
        (lambda r: _without(r, "planner"), "a rewoo record needs its planner call"),
        (lambda r: r | {"planner": None}, "a rewoo record needs its planner call"),
        (lambda r: r | {"plan": None}, "field `plan`"),
        (lambda r: r | {"wall_s": "1.5"}, "field `wall_s`"),
        (lambda r: r | {"wall_s": math.nan}, "field `wall_s`"),
        (lambda r: r | {"answers": []}, "field `answers`"),
        (lambda r: r | {"answers": ["  "]}, "field `answers.0`"),
        (lambda r: r | {"kind": "magic"}, "field `kind`"),
    ],
)
def test_report_refuses_a_damaged_record_and_keeps_the_last_report(tmp_path, capsys, damage, field):
    records = _eval_records()
    run = write_run(tmp_path, {"teacher": records})
    assert cli.main(["report", str(run)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert {"results.json", "report.md"} <= set(before)
    records[1] = damage(records[1])
    write_run(tmp_path, {"teacher": records})  # json.dumps writes NaN as the bare NaN token json.loads reads
    err = _one_error(capsys, ["report", str(run)])
    assert "teacher.jsonl:2: " in err and field in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing half-written


def test_report_n_is_the_number_of_questions_it_scored(tmp_path, capsys):
    run = write_run(tmp_path, {"teacher": _eval_records()})
    assert cli.main(["report", str(run)]) == 0
    assert "n=3 " in capsys.readouterr().out
    results = json.loads((run / "results.json").read_text())
    assert results["per_method"]["teacher"]["n"] == results["per_method"]["teacher"]["n_scored"] == 3
    assert results["per_method"]["teacher"]["judge"] is None  # checking a record adds no verdict it lacked
    judged = _eval_records()
    judged[0]["scores"]["judge"], judged[1]["scores"]["judge"] = True, None
    run = write_run(tmp_path, {"teacher": judged})
    assert cli.main(["report", str(run)]) == 0
    judge = json.loads((run / "results.json").read_text())["per_method"]["teacher"]["judge"]
    assert judge == {"accuracy": 1.0, "n_judged": 1, "unparsed": 1}


def test_a_report_that_fails_to_write_keeps_the_old_one_and_names_the_file(tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    run = write_run(tmp_path, {"teacher": _eval_records()})
    assert cli.main(["report", str(run)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    def disk_full(self, path, *args, **kwargs):  # a full disk, as the write of a plot meets it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(Figure, "savefig", disk_full)
    err = _one_error(capsys, ["report", str(run)])
    assert f"cannot write {run}/" in err and ".png: No space left on device" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no staging folder left behind


# ---------------------------------------------------------------------------------------- dataset rows


def _rows(tmp_path: Path, rows: list[dict], name: str = "d.jsonl") -> Path:
    return _jsonl(tmp_path / name, rows)


GOOD_ROW = {"id": "q0", "question": "Who wrote Hamlet?", "answer": "Shakespeare"}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "q1", "question": "", "answer": "x"}, "field `question`: the question is empty"),
        ({"id": "q1", "question": " \t\n ", "answer": "x"}, "field `question`: the question is empty"),
        ({"id": "q1", "question": "Who\x00 is it?", "answer": "x"}, "control character U+0000"),
        ({"id": "q1", "question": "Who\x1b[2J is it?", "answer": "x"}, "control character U+001B"),
        ({"id": "q1", "question": "Who is it?", "answer": "   "}, "field `answers`"),
        ({"id": "q1", "question": "Who is it?", "answers": ["", " "]}, "field `answers`"),
        ({"id": "q1", "question": "Who is it?", "answer": ""}, "field `answers`: no usable gold answer"),
        ({"id": "q1", "question": "Who is it?", "answers": [["x"]]}, "an answer must be text or a number, not list"),
        ({"id": "q1", "question": "Who is it?", "answer": 7.5, "answers": [None]}, "not NoneType"),
        ({"id": "q1", "question": "x" * 4001, "answer": "x"}, "4001 characters, more than max_question_chars (4000)"),
        ({"id": "q1", "question": "Who is " + "very " * 200_000 + "old?", "answer": "x"}, "max_question_chars"),
        ({"id": "q0", "question": "Who wrote Macbeth?", "answer": "x"}, "id 'q0' is also the id of another question"),
    ],
)
def test_a_dataset_row_no_model_should_see_is_refused_at_load(tmp_path, row, message):
    path = _rows(tmp_path, [GOOD_ROW, row])
    with pytest.raises(DistillError, match="d.jsonl:2") as info:
        load_examples(path, "hotpotqa", "train")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_file_without_questions_is_refused(tmp_path):
    for name, text in (("e.jsonl", "\n\n"), ("e.json", "[]")):
        (tmp_path / name).write_text(text)
        with pytest.raises(DistillError, match=f"{name}: no questions in it"):
            load_examples(tmp_path / name, "hotpotqa", "train")


def test_the_question_bound_is_a_setting_of_the_source(tmp_path):
    path = _rows(tmp_path, [GOOD_ROW])
    assert DatasetSource(name="x", source=str(path), metric="em_f1").max_question_chars == 4000
    assert [e.id for e in load_examples(path, "hotpotqa", "train", max_question_chars=17)] == ["q0"]
    with pytest.raises(DistillError, match="17 characters, more than max_question_chars \\(16\\)"):
        load_examples(path, "hotpotqa", "train", max_question_chars=16)
    with pytest.raises(ValueError):
        DatasetSource(name="x", source=str(path), metric="em_f1", max_question_chars=0)


def test_a_repeated_question_is_dropped_but_a_repeated_id_is_not(tmp_path):
    same = GOOD_ROW | {"question": "who wrote  HAMLET"}
    assert [e.question for e in load_examples(_rows(tmp_path, [GOOD_ROW, same]), "hotpotqa", "train")] == [
        GOOD_ROW["question"]]


def _generate_config(tmp_path: Path, *sources: Path, **extra) -> Path:
    cfg = {"datasets": [{"name": "hotpotqa", "source": str(s), "split": "train"} for s in sources],
           "output_dir": str(tmp_path / "run")} | extra
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_generate_refuses_two_questions_under_one_id_before_any_model_loads(tmp_path, capsys):
    a = _rows(tmp_path, [GOOD_ROW], "a.jsonl")
    b = _rows(tmp_path, [GOOD_ROW | {"question": "Who wrote Macbeth?"}], "b.jsonl")
    err = _one_error(capsys, ["generate", "--config", str(_generate_config(tmp_path, a, b))])
    assert "example id 'q0' occurs twice" in err
    assert not (tmp_path / "run").exists()
    one = _rows(tmp_path, [GOOD_ROW, GOOD_ROW | {"question": "Who wrote Macbeth?"}], "one.jsonl")
    err = _one_error(capsys, ["generate", "--config", str(_generate_config(tmp_path, one))])
    assert "one.jsonl:2: id 'q0' is also the id of another question, at" in err


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b'[{"question": "caf\xe9?", "answer": "x"}]', "d.json:1: not UTF-8 text"),
        (b"\n\n[" * 1 + b"[" * 200_000 + b"]" * 200_001, "d.json: JSON nested too deeply"),
        (b'{"Data": [{"Question": "q?", "Answer": {"Value": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}]}",
         "d.json: JSON nested too deeply"),
        (b"[1, 2,", "d.json:1: invalid JSON"),
        (b'[{"_id": "a\\udc00", "question": "Who?", "answer": "x"}]', "d.json: a string holds a lone UTF-16 surrogate"),
        (b'[{"question": "Who?", "answer": ""}]', "d.json: row 1: field `answers`"),
    ],
)
def test_a_bad_json_file_is_one_line_through_the_cli(tmp_path, capsys, blob, message):
    path = tmp_path / "d.json"
    path.write_bytes(blob)
    err = _one_error(capsys, ["generate", "--config", str(_generate_config(tmp_path, path))])
    assert message in err


def test_an_example_checks_itself_wherever_it_is_made():
    Example("q", "hotpotqa", "train", "Who?", ["x"])
    for bad in (dict(question=" "), dict(answers=[]), dict(answers=[" "]), dict(id=""), dict(question="a\x07b")):
        args = dict(id="q", dataset="hotpotqa", split="train", question="Who?", answers=["x"]) | bad
        with pytest.raises(ValueError):
            Example(**args)


def test_rows_from_the_hub_path_are_checked_too():
    with pytest.raises(DistillError, match=r"hub:x: row 2: field `question`: the question is empty"):
        rows_to_examples([GOOD_ROW, {"question": "", "answer": "x"}], "hotpotqa", "train", origin="hub:x")


# --------------------------------------------------------------------------------------------- folders


def test_sft_data_on_a_full_disk_keeps_the_old_dataset_and_names_the_file(tmp_path, capsys, monkeypatch):
    from datasets import load_from_disk
    from datasets.arrow_writer import ArrowWriter

    kept = write_kept(tmp_path / "kept.jsonl", kept_records())
    out = tmp_path / "sft"
    assert cli.main(["sft-data", str(kept), "--out", str(out), "--tokenizer", "none"]) == 0
    capsys.readouterr()
    old = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    old_rows = load_from_disk(str(out))["train"].to_list()

    def disk_full(self, *args, **kwargs):  # what a full disk does to the arrow file's write
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)

    monkeypatch.setattr(ArrowWriter, "write_table", disk_full)
    monkeypatch.setattr(ArrowWriter, "write_examples_on_file", disk_full)
    err = _one_error(capsys, ["sft-data", str(kept), "--out", str(out), "--tokenizer", "none", "--seed", "5"])
    assert f"cannot write {out}/" in err and ".arrow: No space left on device" in err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == old
    assert load_from_disk(str(out))["train"].to_list() == old_rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl", "sft"]  # nothing left beside it


def test_sft_data_replaces_the_old_dataset_whole(tmp_path, capsys):
    from datasets import load_from_disk

    kept = write_kept(tmp_path / "kept.jsonl", kept_records())
    out = tmp_path / "sft"
    out.mkdir()  # an empty folder (the pipeline makes one) is taken
    assert cli.main(["sft-data", str(kept), "--out", str(out), "--tokenizer", "none"]) == 0
    (out / "stale.txt").write_text("from an older run")
    assert cli.main(["sft-data", str(kept), "--out", str(out), "--tokenizer", "none"]) == 0
    assert not (out / "stale.txt").exists() and (out / "summary.json").exists()
    assert len(load_from_disk(str(out))["train"]) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl", "sft"]


def test_sft_data_never_replaces_a_folder_it_did_not_write(tmp_path, capsys):
    kept = write_kept(tmp_path / "kept.jsonl", kept_records())
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me")
    err = _one_error(capsys, ["sft-data", str(kept), "--out", str(mine), "--tokenizer", "none"])
    assert f"{mine} exists and is not an output of this command (no dataset_dict.json)" in err
    err = _one_error(capsys, ["sft-data", str(kept), "--out", str(kept), "--tokenizer", "none"])
    assert "is not an output of this command" in err
    assert (mine / "todo.txt").read_text() == "keep me" and read_jsonl(kept) == kept_records()


def test_generate_on_a_full_disk_names_the_record_write_and_the_manifest_says_it_stopped(tmp_path, monkeypatch):
    """The run machinery generation uses (lifecycle, store, loop), with a full disk from the first record on:
    every fsync fails with ENOSPC, as it does when the disk fills during a run."""
    from distill.core.run import RunStopped, run_lifecycle, run_records
    from distill.core.store import JsonlStore

    out = tmp_path / "run"
    full = threading.Event()
    real_fsync = os.fsync

    def fsync(fd):
        if full.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    async def work(item):
        full.set()  # the disk fills while the first answer is being made
        return trajectory(item, 0)

    items = [((str(i), 0), str(i)) for i in range(3)]
    manifest = {"command": "generate", "config": {"padding": "x" * 200}}
    with pytest.raises(DistillError) as info:
        with run_lifecycle(out, manifest), JsonlStore(out / "errors.jsonl") as errors:
            run_records(out / "trajectories.jsonl", items, work, lambda r: (r["id"], r["sample"]), errors,
                        concurrency=1, desc="generate", keep=lambda r: manifest.update(counts=r.counts()))
    message = str(info.value)
    assert isinstance(info.value, RunStopped)
    assert f"writing a record failed: cannot write {out / 'trajectories.jsonl'}: No space left" in message
    assert "manifest.json" not in message
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["status"] == "failed" and "writing a record" in on_disk["reason"]
    assert on_disk["counts"]["planned"] == 3


# ------------------------------------------------------------------------------------------ SFT examples


def test_training_refuses_a_dataset_with_empty_completions_before_loading_a_model(tmp_path):
    from distill.sft_data import build_examples, to_dataset_dict
    from distill.tools.registry import tool_descriptions
    from distill.train import load_splits
    from test_sft_data import TOOLS

    examples, _ = build_examples(kept_records(), tool_descriptions(TOOLS))
    empty = [e | {"completion": [{"role": "assistant", "content": "  "}]} for e in examples]
    to_dataset_dict(empty, []).save_to_disk(str(tmp_path / "sft"), num_shards={"train": 1, "validation": 1})
    with pytest.raises(DistillError, match=r"sft/train: row 1: field `completion`: the completion must be one "
                                           r"non-empty assistant message"):
        load_splits(str(tmp_path / "sft"))
    to_dataset_dict(examples, []).save_to_disk(str(tmp_path / "ok"), num_shards={"train": 1, "validation": 1})
    train, val = load_splits(str(tmp_path / "ok"))
    assert len(train) == len(examples) and val is None


# ----------------------------------------------------------------------------------------------- score


def test_distill_score_refuses_a_blank_gold_answer(tmp_path, capsys):
    path = _jsonl(tmp_path / "p.jsonl", [{"prediction": "x", "answers": ["x"]}, {"prediction": "", "answers": ["  "]}])
    err = _one_error(capsys, ["score", "--dataset", "hotpotqa", str(path)])
    assert "p.jsonl:2: `answers` must be a non-blank string" in err


def test_a_lone_surrogate_in_a_model_reply_is_mended_so_the_record_can_be_written(tmp_path):
    """A server's JSON can spell a lone surrogate (`\\ud800`); the record holds U+FFFD in its place, and a
    surrogate pair split into two code points is joined back."""
    from distill.llm.base import Completion
    from distill.rewoo.record import TrajectoryRecord, make_record
    from distill.core.store import JsonlStore

    example = Example("q1", "hotpotqa", "train", "Who?", ["x"])
    reply = Completion("Paris \ud800 \ud83d\ude00", model="m")
    record = make_record(example, "rewoo", 0, 0.0, evidence=[], solver={"output": reply.text},
                         prediction=reply.text, solver_calls=[reply], tools={})
    assert record["prediction"] == "Paris \ufffd \U0001F600" and record["solver"]["output"] == record["prediction"]
    with JsonlStore(tmp_path / "t.jsonl", schema=TrajectoryRecord) as store:
        store.append(record)
    assert read_jsonl(tmp_path / "t.jsonl", TrajectoryRecord)[0]["prediction"] == "Paris \ufffd \U0001F600"
