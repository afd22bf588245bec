"""A dataset of one's own: CSV, Parquet and JSONL files (the first two read by the real `datasets` library), a
`columns` mapping onto the fields distill reads, and a `metric` that decides the scoring rules, carried by every
record so that generation, the filter and the report score alike."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from distill import cli
from distill.core.config import validate
from distill.core.errors import DistillError
from distill.evaluate import EvalConfig, load_eval_examples
from distill.generate import GenerateConfig, load_questions
from distill.report import rescore
from distill.rewoo.record import TrajectoryRecord, make_record


def _one_error(capsys, argv: list[str]) -> str:
    """Run the CLI: exit 2 and one line on stderr, no traceback; that line."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.split("\n") if line.strip() and "\r" not in line]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _config(tmp_path: Path, **dataset) -> Path:
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump({"datasets": [dataset], "output_dir": str(tmp_path / "run")}))
    return path


def _record(example, prediction: str) -> dict:
    """The trajectory record every method writes, for `prediction` (no plan, no tool, no model call)."""
    return make_record(example, "direct", 0, 0.0, evidence=[], solver={}, prediction=prediction,
                       solver_calls=[], tools={})


def _questions(tmp_path: Path, **dataset) -> dict:
    cfg = validate(GenerateConfig, {"datasets": [dataset], "output_dir": str(tmp_path / "run")})
    return {ex.id: ex for ex in load_questions(cfg)}


CSV = ('qid,prompt,target,notes\n'
       '007,"Who wrote ""Hamlet"", the play?",William Shakespeare,NA\n'
       '008,Is the Danube longer than the Rhine?,yes,\n'
       '009,Which band sang a song called None?,None,x\n')


def test_a_csv_file_with_a_column_mapping_loads_and_scores(tmp_path):
    source = tmp_path / "mine.csv"
    source.write_text(CSV)
    dataset = {"name": "mine", "source": str(source), "metric": "em_f1",
               "columns": {"question": "prompt", "answer": "target", "id": "qid"}}
    examples = _questions(tmp_path, **dataset)
    # every cell is the text it holds: "007" is not the number 7, "None" and "NA" are not missing values
    assert sorted(examples) == ["007", "008", "009"]
    assert examples["007"].question == 'Who wrote "Hamlet", the play?'
    assert examples["007"].answers == ["William Shakespeare"] and examples["009"].answers == ["None"]
    assert {ex.dataset for ex in examples.values()} == {"mine"}

    record = _record(examples["007"], "Shakespeare")
    assert record["metric"] == "em_f1" and record["scores"] == {"em": 0, "f1": pytest.approx(2 / 3)}
    assert rescore(record) == record["scores"]  # the report scores the record as it was scored
    # eval loads the same entry the same way
    evaluated = load_eval_examples(validate(EvalConfig, {"baselines": ["direct"], "datasets": [dataset | {"n": 2}]}))
    assert [ex.id for ex in evaluated] == ["007", "008"] and evaluated[0].metric == "em_f1"


def test_a_parquet_file_loads_with_lists_of_answers(tmp_path):
    source = tmp_path / "quiz.parquet"
    table = pa.table({"id": ["p1", "p2"], "question": ["Which planet is closest to the Sun?", "Who wrote Emma?"],
                      "answers": [["Mercury (planet)", "Mercury"], ["Jane Austen", "Austen"]]})
    pq.write_table(table, source)
    examples = _questions(tmp_path, name="triviaqa", source=str(source))
    assert examples["p1"].answers == ["Mercury (planet)", "Mercury"]
    assert examples["p2"].question == "Who wrote Emma?" and examples["p2"].metric == "triviaqa"
    assert _record(examples["p1"], "Mercury_(planet)")["scores"]["em"] == 1  # the name's rules: TriviaQA's


def test_a_jsonl_file_with_columns(tmp_path):
    source = tmp_path / "mine.jsonl"
    rows = [{"qid": 41, "prompt": "What is 6 times 7?", "target": 42, "question": "not this one"},
            {"qid": 42, "prompt": "What colour is the sky?", "target": "blue"}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = _questions(tmp_path, name="hotpotqa", source=str(source),
                          columns={"question": "prompt", "answer": "target", "id": "qid"})
    assert examples["41"].question == "What is 6 times 7?"  # the mapped column wins over one of the field's name
    assert examples["41"].answers == ["42"] and examples["42"].answers == ["blue"]


def test_a_missing_mapped_column_is_one_line_naming_the_file_and_the_column(tmp_path, capsys):
    table = tmp_path / "mine.csv"
    table.write_text(CSV)
    columns = {"question": "prompt", "answer": "answer_text"}
    config = _config(tmp_path, name="mine", source=str(table), metric="em_f1", columns=columns)
    err = _one_error(capsys, ["generate", "--config", str(config)])
    assert f"{table}: no column 'answer_text', which columns.answer names" in err
    assert not (tmp_path / "run").exists()

    lines = tmp_path / "mine.jsonl"
    lines.write_text(json.dumps({"prompt": "Who?", "answer_text": "x"}) + "\n" + json.dumps({"prompt": "What?"}) + "\n")
    config = _config(tmp_path, name="mine", source=str(lines), metric="em_f1", columns=columns)
    err = _one_error(capsys, ["generate", "--config", str(config)])
    assert f"{lines}:2: no column 'answer_text', which columns.answer names" in err


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dataset_name_without_rules_of_its_own_needs_a_metric(tmp_path, capsys):
    source = tmp_path / "mine.jsonl"
    source.write_text(json.dumps({"question": "Is it?", "answer": "yes"}) + "\n")
    for cls in (GenerateConfig, EvalConfig):
        with pytest.raises(DistillError) as info:
            validate(cls, {"datasets": [{"name": "mine", "source": str(source)}]}, "c.yaml")
        assert str(info.value) == ("c.yaml: datasets.0.metric: Value error, dataset 'mine' has no scoring rules "
                                   "of its own: set its `metric` (hotpotqa | triviaqa | em_f1)")
    # through the command line: refused when the config is read, before any check or model
    model = {"backend": "openai", "base_url": f"http://127.0.0.1:{_unused_port()}/v1", "model": "m",
             "prompt_per_mtok": 0.0, "completion_per_mtok": 0.0}
    config = tmp_path / "gen.yaml"
    config.write_text(yaml.safe_dump({"planner": model, "solver": model, "tools": ["Calculator"],
                                      "datasets": [{"name": "mine", "source": str(source)}],
                                      "output_dir": str(tmp_path / "run")}))
    err = _one_error(capsys, ["generate", "--check", "--offline", "--config", str(config)])
    assert err.startswith(f"error: {config}: datasets.0.metric: ") and "set its `metric`" in err


def test_the_metric_decides_the_rules_and_the_record_carries_it(tmp_path):
    source = tmp_path / "mine.jsonl"
    rows = [{"id": "y", "question": "Is the Danube longer than the Rhine?", "answer": "yes"},
            {"id": "m", "question": "Which planet is closest to the Sun?", "answers": ["Mercury (planet)", "Hermes"]}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))

    plain = _questions(tmp_path, name="mine", source=str(source), metric="em_f1")
    record = _record(plain["y"], "yes it is")
    # plain rules: "yes it is" shares one token with "yes" (HotpotQA's yes/no rule would give F1 0)
    assert record["metric"] == "em_f1" and record["scores"] == {"em": 0, "f1": pytest.approx(0.5)}
    assert _record(plain["m"], "Mercury_(planet)")["scores"]["em"] == 0  # plain rules keep the underscore

    trivia = _questions(tmp_path, name="mine", source=str(source), metric="triviaqa")
    record = _record(trivia["m"], "Mercury_(planet)")  # TriviaQA's rules, over every alias
    assert record["metric"] == "triviaqa" and record["scores"]["em"] == 1
    assert _record(trivia["m"], "hermes")["scores"]["em"] == 1
    assert rescore(record) == record["scores"]

    # a record written before records carried a metric is read, and scored, as it was then
    old = {k: v for k, v in _record(plain["y"], "yes it is").items() if k != "metric"}
    TrajectoryRecord.model_validate(old)
    assert rescore(old) == {"em": 0, "f1": 0.0}


def test_the_leak_guard_line_suggests_the_eval_entry_itself_and_pasting_it_passes(tmp_path, monkeypatch, capsys):
    """An own eval file that generate.eval_sets does not list: the line's suggested entry keeps `columns` and
    `metric` (without them the guard could not read the file), and pasted into eval_sets the check passes. A local
    file is matched by its path alone: listed in both without `split` (defaults `train` and `validation`), it
    matches."""
    from test_pipeline import ROOT, wiring_config

    monkeypatch.chdir(ROOT)
    (tmp_path / "mine.csv").write_text(CSV)
    cfg = wiring_config(tmp_path)
    cfg["eval"]["datasets"] = [{"name": "support_faq", "source": str(tmp_path / "mine.csv"), "n": 2,
                                "metric": "em_f1", "columns": {"question": "prompt", "answer": "target", "id": "qid"}}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == 2
    leak = [line for line in capsys.readouterr().err.splitlines() if "generate.eval_sets does not list" in line]
    assert len(leak) == 1, leak
    entry = yaml.safe_load(leak[0].split(": add ", 1)[1].split(" there, ")[0])
    assert entry == {"name": "support_faq", "source": str(tmp_path / "mine.csv"), "split": "validation",
                     "metric": "em_f1", "columns": {"question": "prompt", "answer": "target", "id": "qid"}}

    cfg["generate"]["eval_sets"].append(entry)
    path.write_text(yaml.safe_dump(cfg))
    cli.main(["pipeline", "--check", "--offline", "--config", str(path)])
    assert "generate.eval_sets does not list" not in capsys.readouterr().err

    del entry["split"]  # the same file, each list's default split
    cfg["generate"]["eval_sets"][-1] = entry
    path.write_text(yaml.safe_dump(cfg))
    cli.main(["pipeline", "--check", "--offline", "--config", str(path)])
    assert "generate.eval_sets does not list" not in capsys.readouterr().err
