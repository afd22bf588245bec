"""Memory that must not grow with a run's size (scripts/bench_scale.py measures it at 1k-16k questions): the record
store behind generate, eval and improve keeps keys, not records, whether it loads a file or appends to it; the
filter keeps a small row per record, not the records."""

from __future__ import annotations

import json
import tracemalloc

from distill.core.store import JsonlStore


def _key(rec: dict) -> tuple:
    return (rec["id"], rec["sample"])


def _record(i: int) -> dict:
    return {"id": f"q{i}", "sample": 0, "planner": {"output": "x" * 4000}, "evidence": [{"output": "y" * 2000}]}


def test_the_store_holds_keys_not_records(tmp_path):
    path = tmp_path / "records.jsonl"
    n = 1500  # ~9 MB of records: kept in memory they would be far above the bound below
    tracemalloc.start()
    try:
        with JsonlStore(path, key=_key) as store:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(n):
                assert store.append(_record(i))
            appended = tracemalloc.get_traced_memory()[0] - base
            assert not store.append(_record(0))  # a key already held: nothing written
        base = tracemalloc.get_traced_memory()[0]
        reopened = JsonlStore(path, key=_key)
        loaded = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    size = path.stat().st_size
    assert size > 8_000_000
    assert appended < size / 20 and loaded < size / 20, (appended, loaded, size)
    # what the store answers is unchanged: every key, each record once, read back from the file
    assert len(reopened) == n and reopened.keys() == {(f"q{i}", 0) for i in range(n)}
    assert [r["id"] for r in reopened.iter_records()] == [f"q{i}" for i in range(n)]
    reopened.close()


def test_records_read_back_skip_later_copies_of_a_key(tmp_path):
    path = tmp_path / "records.jsonl"
    lines = [{"id": "a", "sample": 0, "v": 1}, {"id": "b", "sample": 0, "v": 2}, {"id": "a", "sample": 0, "v": 3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with JsonlStore(path, key=_key) as store:
        assert store.duplicates == 1 and len(store) == 2
        assert [r["v"] for r in store.records()] == [1, 2]  # the first copy is the one the run counted
        assert store.keys(lambda r: r["v"]) == {1, 2}


def _trajectory_file(path, n: int) -> int:
    """`n` questions, two samples each, ~6 KB a record (a trajectory's evidence is kilobytes of page text)."""
    from test_filter import rec

    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            for sample in range(2):
                r = rec(f"q{i}", sample, f1=1.0 - sample / 2, dataset=("hotpotqa", "triviaqa")[i % 2])
                r["evidence"] = [e | {"output": f"page text {i} " * 250} for e in r["evidence"]]
                f.write(json.dumps(r) + "\n")
    return path.stat().st_size


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_filter_holds_a_small_row_per_record_not_the_records(tmp_path):
    """Peak memory of `run_filter` on 4x the records grows by far less than the records themselves: it reads the
    file twice (check and choose, then write what it chose) instead of holding it. Kept output stays whole."""
    from distill.filter import FilterConfig, run_filter

    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    n = 250
    grown_bytes = _trajectory_file(large, 4 * n) - _trajectory_file(small, n)
    peaks = {p.stem: _peak(lambda p=p: run_filter(p, tmp_path / f"{p.stem}.kept.jsonl", FilterConfig()))
             for p in (small, large)}
    growth = peaks["large"] - peaks["small"]
    # the records, as JSON, grew by ~9 MB; held as objects they would take more than that again
    assert grown_bytes > 8_000_000
    assert growth < grown_bytes / 10, (growth, grown_bytes, peaks)
    per_record = growth / (2 * 3 * n)
    assert per_record < 1500, per_record  # a Row, a key and a few ids per record
    print(f"filter: peak growth {growth} B over {2 * 3 * n} records, {per_record:.0f} B per record")
    kept = [json.loads(line) for line in (tmp_path / "large.kept.jsonl").read_text().splitlines()]
    assert [r["id"] for r in kept] == [f"q{i}" for i in range(4 * n)] and {r["sample"] for r in kept} == {0}


def _kept_file(path, n: int) -> int:
    """`n` questions, two kept samples each, in the kept record shape (the teacher's few-shot prompt in each)."""
    from test_sft_data import kept_records

    base = kept_records()
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            for r in base[2 * (i % 6): 2 * (i % 6) + 2]:
                f.write(json.dumps(r | {"id": f"q{i}", "question": f"{r['question'][:-1]} (case {i})?"}) + "\n")
    return path.stat().st_size


def test_sft_data_streams_the_kept_records_into_the_dataset(tmp_path):
    """Peak memory of `build_sft_data` on 4x the kept records grows by far less than the records: it reads the
    file once to check, count and split by question, then once per split into Arrow, keeping a question and a
    digest per example. The dataset written is whole."""
    from datasets import load_from_disk

    from distill.sft_data import SftDataConfig, build_sft_data

    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    n = 400
    grown_bytes = _kept_file(large, 4 * n) - _kept_file(small, n)
    peaks = {p.stem: _peak(lambda p=p: build_sft_data(SftDataConfig(kept=str(p), out=str(tmp_path / p.stem),
                                                                    tokenizer=None)))
             for p in (small, large)}
    growth = peaks["large"] - peaks["small"]
    # the records grew by ~9.7 MB; the code that held them and their examples grew by 42 MB, this one by ~1 MB
    assert grown_bytes > 8_000_000
    assert growth < grown_bytes / 5, (growth, grown_bytes, peaks)
    assert growth / (2 * 3 * n) < 1000  # a question and a digest per example, not the example
    print(f"sft-data: peak growth {growth} B over {2 * 3 * n} records, {growth / (2 * 3 * n):.0f} B per record")
    written = load_from_disk(str(tmp_path / "large"))
    assert len(written["train"]) + len(written["validation"]) == 2 * 4 * n
    assert len({row["id"] for row in written["validation"]}) == round(4 * n * 0.1)
