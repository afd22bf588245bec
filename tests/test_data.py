"""Loaders map every layout to one Example; sampling is seeded and leak-free."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill.core.data import (
    Example,
    check_no_leak,
    detect_layout,
    load_examples,
    normalize_question,
    question_set,
    rows_to_examples,
    sample_mix,
)
from distill.core.errors import DistillError

FIXTURES = Path(__file__).parent / "fixtures" / "data"


def _ex(question: str, dataset: str = "hotpotqa", i: int = 0) -> Example:
    return Example(id=f"{dataset}-{i}", dataset=dataset, split="train", question=question, answers=["x"])


def _load_via_datasets(path: Path, dataset: str, tmp_path: Path, monkeypatch) -> list[Example]:
    """The hub code path, fed from a local file by the datasets library's own json builder."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    return load_examples("hub:json", dataset, "train", data_files=str(path))


# ---------------------------------------------------------------------------------------------------------
# HotpotQA


def test_hotpot_official_json_list():
    examples = load_examples(str(FIXTURES / "hotpot_official.json"), "hotpotqa", "dev")
    assert [e.id for e in examples] == ["hp-fixture-001", "hp-fixture-002"]
    first = examples[0]
    assert first.dataset == "hotpotqa" and first.split == "dev"
    assert first.answers == ["Spree"]
    assert first.type == "bridge" and first.level == "easy"
    assert [title for title, _ in first.context] == ["Brandenburg Gate", "Berlin", "Danube"]
    assert first.context[1][1][1] == " The city lies on the banks of the Spree."
    assert first.supporting_facts == [("Brandenburg Gate", 0), ("Berlin", 1)]


def test_hotpot_jsonl_with_pool_rows_and_dedup():
    examples = load_examples(str(FIXTURES / "hotpot.jsonl"), "hotpotqa", "train")
    # the third line repeats the second question with other case/punctuation and is dropped
    assert [e.id for e in examples][:2] == ["hp-fixture-101", "hp-fixture-102"]
    assert len(examples) == 3
    pool_row = examples[2]
    assert pool_row.context is None and pool_row.supporting_facts is None
    assert pool_row.answers == ["Tokyo"] and pool_row.type == "bridge" and pool_row.level == "medium"
    assert pool_row.id.startswith("hotpotqa-")  # no id in the source: a stable hash
    again = load_examples(str(FIXTURES / "hotpot.jsonl"), "hotpotqa", "train")
    assert again[2].id == pool_row.id
    assert examples[0].supporting_facts == [("Moonlight Sonata", 0), ("Ludwig van Beethoven", 2)]


def test_hotpot_hub_dict_layout_through_datasets_library(tmp_path, monkeypatch):
    examples = _load_via_datasets(FIXTURES / "hotpot_hub.jsonl", "hotpotqa", tmp_path, monkeypatch)
    assert [e.id for e in examples] == ["hp-fixture-201", "hp-fixture-202"]
    first = examples[0]
    assert first.answers == ["France"]
    assert [t for t, _ in first.context] == ["Treaty of Versailles", "Versailles, Yvelines", "Potsdam"]
    assert first.context[1] == ("Versailles, Yvelines", ["Versailles is a city west of Paris.", " It is in France."])
    assert first.supporting_facts == [("Treaty of Versailles", 0), ("Versailles, Yvelines", 1)]
    assert examples[1].type == "comparison" and examples[1].answers == ["yes"]


def test_hub_and_plain_rows_agree():
    rows = [json.loads(line) for line in (FIXTURES / "hotpot_hub.jsonl").read_text().splitlines()]
    direct = rows_to_examples(rows, "hotpotqa", "train")
    assert direct[0].supporting_facts == [("Treaty of Versailles", 0), ("Versailles, Yvelines", 1)]
    assert detect_layout(rows[0]) == "hotpotqa-hub"


# ---------------------------------------------------------------------------------------------------------
# TriviaQA


def test_trivia_official_json_value_first_then_aliases():
    examples = load_examples(str(FIXTURES / "trivia_official.json"), "triviaqa", "dev")
    assert [e.id for e in examples] == ["tqa-fixture-1", "tqa-fixture-2"]
    assert examples[0].question == "Which planet is closest to the Sun?"
    assert examples[0].answers == ["Mercury (planet)", "Mercury", "Planet Mercury"]
    assert examples[1].answers == ["Cello", "Violoncello"]
    assert examples[0].context is None and examples[0].type is None


def test_trivia_jsonl_layout():
    examples = load_examples(str(FIXTURES / "trivia.jsonl"), "triviaqa", "train")
    assert [e.id for e in examples] == ["tqa-fixture-11", "tqa-fixture-12"]  # 13 repeats 12's question
    assert examples[0].answers == ["Au", "AU", "Aurum"]
    assert examples[1].answers == ["Herman Melville", "Melville", "H. Melville"]


def test_trivia_hub_layout_through_datasets_library(tmp_path, monkeypatch):
    examples = _load_via_datasets(FIXTURES / "trivia_hub.jsonl", "triviaqa", tmp_path, monkeypatch)
    assert [e.id for e in examples] == ["tqa-fixture-21", "tqa-fixture-22"]
    assert examples[0].answers == ["Indian Ocean", "Indian ocean", "Indian"]
    assert examples[1].answers == ["Six", "6"]


def test_generic_jsonl_and_inferred_dataset():
    examples = load_examples(str(FIXTURES / "generic.jsonl"), "nq", "test")
    assert [e.answers for e in examples] == [["green", "Green"], ["144"]]
    assert examples[0].dataset == "nq" and examples[1].id == "gen-2"
    inferred = load_examples(str(FIXTURES / "trivia.jsonl"), None, "dev")
    assert {e.dataset for e in inferred} == {"triviaqa"}


def test_limit_counts_distinct_questions():
    assert [e.id for e in load_examples(str(FIXTURES / "trivia.jsonl"), "triviaqa", "dev", limit=1)] == [
        "tqa-fixture-11"
    ]


# ---------------------------------------------------------------------------------------------------------
# errors


def test_missing_file_names_path_and_expectation(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DistillError, match=r"data file not found: .*nope\.jsonl.*\.json/\.jsonl/\.csv/\.parquet"):
        load_examples(str(missing), "hotpotqa", "dev")


def test_unknown_layout_names_path_row_and_expected_fields():
    with pytest.raises(DistillError) as info:
        load_examples(str(FIXTURES / "unknown_layout.jsonl"), "hotpotqa", "dev")
    message = str(info.value)
    assert "unknown_layout.jsonl:1 " in message and "'query'" in message
    assert "question" in message and "answer" in message


def test_layout_contradicting_dataset_label_is_rejected():
    with pytest.raises(DistillError, match="triviaqa-jsonl layout but the dataset is 'hotpotqa'"):
        load_examples(str(FIXTURES / "trivia.jsonl"), "hotpotqa", "dev")


def test_malformed_rows_and_files(tmp_path):
    with pytest.raises(DistillError, match="row 1 looks like the hotpotqa-hub layout but is malformed"):
        rows_to_examples([{"question": "q?", "answer": "a", "context": {"titles": []}}], "hotpotqa", "dev")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{oops\n')
    with pytest.raises(DistillError, match=r"bad\.jsonl:2: invalid JSON"):
        load_examples(str(bad), "hotpotqa", "dev")
    odd = tmp_path / "data.tsv"
    odd.write_text("question\tanswer\n")
    with pytest.raises(DistillError, match=r"unknown file type '\.tsv'; expected \.json/\.jsonl/\.csv/\.parquet"):
        load_examples(str(odd), "hotpotqa", "dev")
    header_only = tmp_path / "data.csv"
    header_only.write_text("question,answer\n")
    with pytest.raises(DistillError, match=r"data\.csv: no questions in it"):
        load_examples(str(header_only), "hotpotqa", "dev")
    blank = tmp_path / "blank.csv"
    blank.write_text("question,answer\nWho?,x\nWhat?,\n")  # an empty cell is an empty answer, not a missing one
    with pytest.raises(DistillError, match=r"blank\.csv: row 2: field `answers`: .*no usable gold answer"):
        load_examples(str(blank), "hotpotqa", "dev")
    for name, blob, message in [("latin.csv", b"question,answer\ncaf\xe9?,x\n", "UnicodeDecodeError"),
                                ("quote.csv", b'question,answer\n"Who?,x\n', "ParserError"),
                                ("fake.parquet", b"PAR1 not really", "ArrowInvalid")]:
        (tmp_path / name).write_bytes(blob)
        kind = "CSV" if name.endswith(".csv") else "PARQUET"
        with pytest.raises(DistillError, match=rf"{name}: not a readable {kind} file \({message}: "):
            load_examples(str(tmp_path / name), "hotpotqa", "dev")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}),
                   tmp_path / "empty.parquet")
    with pytest.raises(DistillError, match=r"empty\.parquet: no questions in it"):
        load_examples(str(tmp_path / "empty.parquet"), "hotpotqa", "dev")
    scalar = tmp_path / "scalar.json"
    scalar.write_text('{"version": 1}')
    with pytest.raises(DistillError, match="`Data` list"):
        load_examples(str(scalar), "triviaqa", "dev")


def test_unreachable_hub_is_a_distill_error(monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DistillError, match="cannot load hub:hotpotqa/hotpot_qa:distractor split 'validation'"):
        load_examples("hub:hotpotqa/hotpot_qa:distractor", "hotpotqa", "validation")


# ---------------------------------------------------------------------------------------------------------
# sampling and leaks


def test_normalize_question_is_idempotent_and_ignores_case_and_punctuation():
    key = normalize_question("Who wrote  'Moby-Dick'?")
    assert key == "who wrote moby dick"
    assert normalize_question(key) == key
    assert normalize_question("ＷＨＯ wrote Moby Dick") == key  # full-width letters fold


def _pool(prefix: str, dataset: str, n: int) -> list[Example]:
    return [_ex(f"{prefix} question number {i}?", dataset, i) for i in range(n)]


def test_sample_mix_is_deterministic_and_seed_dependent():
    pools = [(_pool("hotpot", "hotpotqa", 50), 10), (_pool("trivia", "triviaqa", 50), 10)]
    first = sample_mix(pools, seed=7)
    assert [e.question for e in first] == [e.question for e in sample_mix(pools, seed=7)]
    assert [e.question for e in first] != [e.question for e in sample_mix(pools, seed=8)]
    assert sum(e.dataset == "hotpotqa" for e in first) == 10
    assert sum(e.dataset == "triviaqa" for e in first) == 10
    # resizing the second pool leaves the draw from the first one unchanged
    smaller = sample_mix([pools[0], (pools[1][0], 3)], seed=7)
    assert {e.question for e in smaller if e.dataset == "hotpotqa"} == {
        e.question for e in first if e.dataset == "hotpotqa"
    }


def test_sample_mix_dedups_across_pools_and_honours_exclusions():
    shared = [_ex(f"Shared question {i}?", "hotpotqa", i) for i in range(5)]
    echo = [_ex(f"shared QUESTION {i}", "triviaqa", i) for i in range(5)]  # same questions, other pool
    extra = [_ex(f"Trivia only {i}?", "triviaqa", 10 + i) for i in range(5)]
    mix = sample_mix([(shared + shared, 5), (echo + extra, 4)], seed=0, exclude_questions={"Trivia only 0?"})
    keys = [normalize_question(e.question) for e in mix]
    assert len(keys) == len(set(keys)) == 9
    assert {e.question for e in mix if e.dataset == "hotpotqa"} == {e.question for e in shared}
    assert {e.question for e in mix if e.dataset == "triviaqa"} == {f"Trivia only {i}?" for i in range(1, 5)}


def test_sample_mix_refuses_to_shrink_silently():
    with pytest.raises(DistillError, match=r"pool 1 \(triviaqa\) has only 3 unused distinct questions, 4 requested"):
        sample_mix([(_pool("a", "hotpotqa", 5), 2), (_pool("b", "triviaqa", 3), 4)], seed=0)


def test_sample_mix_n_none_takes_every_question_the_exclusions_leave():
    """`n: null` is all of a source: with the leak guard's `exclude` that is all but the eval questions, not a
    refusal for drawing fewer than the source holds (a traces folder whose traffic asked an eval question)."""
    pool = _pool("served", "served", 4)
    mix = sample_mix([(pool, None)], seed=0, exclude_questions={"served question number 2?"})
    assert sorted(e.question for e in mix) == [f"served question number {i}?" for i in (0, 1, 3)]
    with pytest.raises(DistillError, match=r"pool 0 \(served\): every question is excluded or already drawn"):
        sample_mix([(pool[:1], None)], seed=0, exclude_questions={"served question number 0?"})


def test_check_no_leak_reports_count_and_examples():
    train = [_ex("What is the capital of France?"), _ex("Who painted the Mona Lisa?"), _ex("Unseen?")]
    evaluation = [_ex("what is the capital of france"), _ex("WHO painted the Mona Lisa")]
    with pytest.raises(DistillError, match=r"2 training question\(s\).*'What is the capital of France\?'"):
        check_no_leak(train, evaluation)
    check_no_leak(train[2:], evaluation)
    with pytest.raises(DistillError, match=r"^1 training question"):
        check_no_leak(train, {"what is the capital of france?"})


def test_real_shared_files_map_to_examples(shared_data_dir: Path):
    shared = shared_data_dir  # a clone has no shared data: the fixture skips with its reason
    dev = load_examples(str(shared / "hotpotqa" / "dev_distractor_sample.jsonl"), "hotpotqa", "dev")
    assert len(dev) == 200
    # the official dev set has the odd question with fewer than 10 paragraphs; here it is one
    assert sum(len(e.context) == 10 for e in dev) == 199 and all(len(e.context) >= 2 for e in dev)
    assert all(e.supporting_facts and e.answers and e.type in ("bridge", "comparison") for e in dev)
    titles = {t for t, _ in dev[0].context}
    assert {t for t, _ in dev[0].supporting_facts} <= titles

    pool = load_examples(str(shared / "hotpotqa" / "train_pool.jsonl"), "hotpotqa", "train")
    assert len(pool) == 6167 and all(e.answers for e in pool)
    assert sum(e.context is None for e in pool) == len(pool)

    tdev = load_examples(str(shared / "triviaqa" / "dev_sample.jsonl"), "triviaqa", "dev")
    assert len(tdev) == 500
    raw = json.loads((shared / "triviaqa" / "dev_sample.jsonl").read_text().splitlines()[0])
    assert tdev[0].id == raw["id"] and tdev[0].answers[0] == raw["answer"]
    assert set(tdev[0].answers) == set(raw["aliases"]) | {raw["answer"]}

    official = load_examples(str(shared / "triviaqa" / "official_format_sample.json"), "triviaqa", "dev")
    assert len(official) == 1 and official[0].answers[0] == "Sunset Boulevard"

    ttrain = load_examples(str(shared / "triviaqa" / "train_pool.jsonl"), "triviaqa", "train")
    assert len(ttrain) == 8833  # 8,837 rows, 4 repeat a question after normalisation
    check_no_leak(pool + ttrain, dev + tdev)
    mix = sample_mix([(pool, 2000), (ttrain, 2000)], seed=0, exclude_questions=question_set(dev + tdev))
    assert len(mix) == 4000
