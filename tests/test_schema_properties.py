"""Property tests of the schemas: any JSON value in any field of a valid record (or dataset row) gives one
clear error naming file:line, or a stage that runs to its end; never a traceback or a hang.

Each case writes the damaged record to a file and runs the real stage on it: the filter, sft-data's example
builder, the report, the dataset loader.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distill.core.data import load_examples
from distill.core.errors import DistillError
from distill.filter import FilterConfig, KeptRecord, run_filter
from distill.report import write_report
from distill.sft_data import SftExample, build_examples
from distill.core.store import read_jsonl
from distill.tools.registry import tool_descriptions
from test_filter import rec as trajectory
from test_report import rec as eval_record
from test_sft_data import TOOLS, kept_records

pytestmark = pytest.mark.timeout(300)  # a hang fails the test instead of stalling the suite

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the report's readers: each example writes a whole report (tables, plots, the viewer), ~0.2 s of CPU
REPORT_SETTINGS = settings(SETTINGS, max_examples=50)

# JSON as a hostile file holds it: NaN and infinities (json.loads reads them), huge and negative numbers,
# strings with control characters and lone surrogates (written as \ud800 escapes), deep-ish nesting.
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(max_size=20) | st.sampled_from(["", " ", "\x00", "\ud800", "#E1", "ok", "rewoo", "NaN"]))
JSON = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def paths(value: Any, prefix: tuple = (), depth: int = 4) -> list[tuple]:
    """Every place in a record a value can go: each key of each dict, the first item of each list."""
    out = [prefix] if prefix else []
    if depth == 0:
        return out
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, prefix + (key,), depth - 1)
    elif isinstance(value, list) and value:
        out += paths(value[0], prefix + (0,), depth - 1)
    return out


def put(record: dict, path: tuple, value: Any) -> dict:
    """A copy of `record` with `value` at `path` (None at a dict key deletes the key half of the time)."""
    record = json.loads(json.dumps(record))
    target = record
    for part in path[:-1]:
        target = target[part]
    if value == "<delete>" and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return record


def write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=True) + "\n" for r in records), encoding="utf-8")
    return path


def check_error(exc: DistillError, name: str) -> None:
    message = str(exc)
    assert "\n" not in message and len(message) <= 800, message
    assert name in message, message


def damaged(record: dict):
    return st.tuples(st.sampled_from(paths(record)), JSON | st.just("<delete>")).map(
        lambda pv: put(record, *pv))


@SETTINGS
@given(st.data())
def test_trajectory_record_any_value_anywhere_filter(data):
    base = trajectory("2", steps=2)
    record = data.draw(damaged(base))
    with tempfile.TemporaryDirectory() as tmp:
        inp = write_lines(Path(tmp) / "t.jsonl", [trajectory("1"), record])
        try:
            report = run_filter(inp, Path(tmp) / "kept.jsonl", FilterConfig(criterion="answer_and_evidence"))
        except DistillError as exc:
            check_error(exc, "t.jsonl:2")
            return
        assert report["accounted"]
        for kept in read_jsonl(Path(tmp) / "kept.jsonl", KeptRecord):  # what filter writes, sft-data reads
            assert kept["plan"]["valid"] is True


@SETTINGS
@given(st.data())
def test_kept_record_any_value_anywhere_sft_data(data):
    records = kept_records()[:2]
    records[1] = data.draw(damaged(records[1]))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_lines(Path(tmp) / "kept.jsonl", records)
        try:
            checked = read_jsonl(path, KeptRecord)
        except DistillError as exc:
            check_error(exc, "kept.jsonl:2")
            return
    examples, counts = build_examples(checked, tool_descriptions(TOOLS))
    assert sum(counts.values()) == len(checked)
    for example in examples:  # every example built is one training reads
        SftExample.model_validate(example)


@SETTINGS
@given(st.data())
def test_sft_example_any_value_anywhere(data):
    example, _ = build_examples(kept_records()[:1], tool_descriptions(TOOLS))[0][0], None
    row = data.draw(damaged(example))
    try:
        SftExample.model_validate(row)
    except ValueError as exc:  # pydantic's ValidationError
        assert "validation error" in str(exc)
        return
    assert row["completion"][0]["content"].strip() and row["prompt"][-1]["role"] == "user"


@REPORT_SETTINGS
@given(st.data(), st.sampled_from(["rewoo", "react", "direct"]))
def test_eval_record_any_value_anywhere_report(data, kind):
    steps = 0 if kind == "direct" else 2
    records = [eval_record("m", f"q{i}", "Paris", "Paris", kind=kind, steps=steps, gold=["Paris"],
                           titles=("Paris",)) for i in range(2)]
    records[1] = data.draw(damaged(records[1]))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "records").mkdir(parents=True)
        write_lines(run / "records" / "m.jsonl", records)
        try:
            results = write_report(run)
        except DistillError as exc:
            message = str(exc)
            assert "\n" not in message and len(message) <= 800, message
            return
        text = (run / "report.md").read_text()
        json.loads((run / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in results"))
    for pm in results["per_method"].values():
        assert pm["n"] == pm["n_scored"]
    assert "# Evaluation report" in text


ROW = {"_id": "a1", "question": "Which river is longer?", "answer": "Danube", "type": "comparison",
       "level": "easy", "supporting_facts": [["Danube", 0], ["Rhine", 1]],
       "context": [["Danube", ["The Danube is long."]], ["Rhine", ["The Rhine is shorter."]]]}


@SETTINGS
@given(st.data())
def test_dataset_row_any_value_anywhere(data):
    row = data.draw(damaged(ROW))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_lines(Path(tmp) / "d.jsonl", [ROW | {"_id": "a0", "question": "Who?"}, row])
        try:
            examples = load_examples(path, "hotpotqa", "train")
        except DistillError as exc:
            check_error(exc, "d.jsonl:2")
            return
    for ex in examples:
        assert ex.question.strip() and ex.answers and all(a.strip() for a in ex.answers)
        assert len(ex.question) <= 4000 and not any(ord(c) < 32 and c not in "\t\n\r" for c in ex.question)
        assert all(isinstance(t, str) and isinstance(i, int) for t, i in ex.supporting_facts or [])
        assert not any(isinstance(x, float) and math.isnan(x) for x in (ex.id, ex.question))


# --- what a stage reads back about earlier runs: the run manifest and the stage marker -------------------

MANIFEST = {"command": "eval", "status": "complete", "config": {"seed": 0}, "reference": "m",
            "methods": [{"name": "m", "kind": "rewoo"}], "fingerprints": {"m": {"fingerprint": "ab", "settings": {}}},
            "bootstrap_samples": 20, "seed": 0, "prompt_budget": None,
            "examples": [["hotpotqa", "q0"], ["hotpotqa", "q1"]]}


@REPORT_SETTINGS
@given(st.data())
def test_manifest_any_value_anywhere_report(data):
    """The report reads eval's manifest for its bookkeeping (order, reference, questions, bootstrap): a damaged
    one is one line naming manifest.json, or a report."""
    manifest = data.draw(damaged(MANIFEST))
    records = [eval_record("m", f"q{i}", "Paris", "Paris", kind="rewoo", steps=2, gold=["Paris"], titles=("Paris",))
               for i in range(2)]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "records").mkdir(parents=True)
        write_lines(run / "records" / "m.jsonl", records)
        (run / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        try:
            write_report(run)
        except DistillError as exc:
            message = str(exc)
            assert "\n" not in message and len(message) <= 800, message
            return
        assert "# Evaluation report" in (run / "report.md").read_text()


def _marker() -> dict:
    from distill.pipeline import Unit

    unit = Unit("filter", Path("run/filter"), {"min_f1": 0.5, "criterion": "evidence"}, {"kept.jsonl": "d1"})
    return unit.head() | {"kept": 3, "input_records": 12, "seconds": 0.4}


@SETTINGS
@given(st.data())
def test_stage_marker_any_value_anywhere_pipeline(data):
    """A rerun reads each DONE.json to decide skip or redo: a damaged one is one line naming it, or a decision
    (`why` is None: skip; a line: redo) the pipeline can print."""
    from distill.pipeline import Unit, read_marker

    marker = data.draw(damaged(_marker()))
    unit = Unit("filter", Path("run/filter"), {"min_f1": 0.5, "criterion": "evidence"}, {"kept.jsonl": "d1"},
                followers=("sft-data", "train"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "DONE.json"
        path.write_text(json.dumps(marker), encoding="utf-8")
        try:
            read = read_marker(path)
        except DistillError as exc:
            check_error(exc, str(path))
            return
    why = unit.why(read, [])
    assert why is None or (isinstance(why, str) and "\n" not in why)
    if marker == _marker():
        assert why is None
