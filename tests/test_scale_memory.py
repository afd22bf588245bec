"""Memory that must not grow with a run's size (scripts/bench_scale.py measures it at 1k-16k questions): the record
store behind generate, eval and improve keeps keys, not records, whether it loads a file or appends to it."""

from __future__ import annotations

import json
import tracemalloc

from distill.store import JsonlStore


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
