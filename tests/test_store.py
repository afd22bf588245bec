"""The JSONL store and the call cache: nothing computed is lost, nothing torn is kept, nothing is paid twice."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import stat
import threading

import pytest

from distill.core.errors import DistillError
from distill.llm.cached import CachedChat
from distill.core.store import CallCache, JsonlStore, iter_jsonl, read_jsonl, stable_hash, write_json, write_jsonl


def test_append_then_reopen_keeps_every_record(tmp_path):
    path = tmp_path / "t.jsonl"
    with JsonlStore(path) as store:
        for i in range(5):
            store.append({"id": str(i), "sample": 0})
    reopened = JsonlStore(path)
    assert [r["id"] for r in reopened.records()] == ["0", "1", "2", "3", "4"]
    assert reopened.keys(lambda r: (r["id"], r["sample"])) == {(str(i), 0) for i in range(5)}
    assert not reopened.repaired


@pytest.mark.parametrize("tail", [b'{"id": "x", "sam', b'{"id": "x", "sample": 0}'])
def test_torn_last_line_is_cut_not_kept(tmp_path, tail):
    # A line without its newline was being written when the process died, even if it happens to parse.
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"id": "a", "sample": 0}\n{"id": "b", "sample": 0}\n' + tail)
    store = JsonlStore(path)
    assert store.repaired
    assert [r["id"] for r in store.records()] == ["a", "b"]
    store.append({"id": "c", "sample": 0})
    store.close()
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b", "c"]


def test_corrupt_middle_line_is_an_error_not_silently_dropped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(DistillError, match=r"t\.jsonl:2: invalid JSON .*not the last line"):
        JsonlStore(path)


def test_stable_hash_ignores_key_order_but_not_values():
    assert stable_hash({"a": 1, "b": [1, 2]}) == stable_hash({"b": [1, 2], "a": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})


def test_call_cache_persists_across_connections(tmp_path):
    cache = CallCache(tmp_path / "c.sqlite")
    cache.put("k", {"text": "hi"})
    cache.close()
    again = CallCache(tmp_path / "c.sqlite")
    assert again.get("k") == {"text": "hi"}
    assert again.get("missing") is None
    assert (again.hits, again.misses) == (1, 1)


def test_cached_chat_calls_the_real_model_once(tmp_path, smollm2):
    cache = CallCache(tmp_path / "c.sqlite")
    model = CachedChat(smollm2, cache)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = asyncio.run(model.chat(messages, max_tokens=8))
    second = asyncio.run(model.chat(messages, max_tokens=8))
    other_seed = asyncio.run(model.chat(messages, max_tokens=8, temperature=0.7, seed=1))
    assert model.calls == 2  # the repeat was served from the cache; a different sampling setup was not
    assert not first.cached and second.cached and not other_seed.cached
    assert second.text == first.text and second.usage == first.usage
    assert first.usage.prompt_tokens > 5 and first.usage.completion_tokens > 0


# ------------------------------------------------------------------------------------ bad bytes


def _key(rec: dict) -> tuple[str, int]:
    return (rec["id"], rec["sample"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"id": "b", "text": "caf\xe9"}',
         r"t\.jsonl:2: not UTF-8 text \(invalid continuation byte at byte 25 of the line\)"),
        (b"[" * 100_000 + b"]" * 100_000, r"t\.jsonl:2: JSON nested too deeply"),
        (b"[" * 1_000_000, r"t\.jsonl:2: JSON nested too deeply"),
        (b'["a", "b"]', r"t\.jsonl:2: expected a JSON object, got an array"),
        (b"null", r"t\.jsonl:2: expected a JSON object, got null"),
        (b'{"id": "b",}',
         r"t\.jsonl:2: invalid JSON \(Expecting property name enclosed in double quotes at column 12\)"),
    ],
)
def test_read_jsonl_names_file_and_line_of_any_bad_line(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"id": "a"}\n' + line + b'\n{"id": "c"}\n')
    with pytest.raises(DistillError, match=message):
        read_jsonl(path)
    # The store refuses the same line where it cannot be a torn write, and cuts it where it can.
    with pytest.raises(DistillError, match=message + ".*not the last line"):
        JsonlStore(path)
    path.write_bytes(b'{"id": "a"}\n' + line)
    store = JsonlStore(path)
    assert store.repaired and [r["id"] for r in store.records()] == ["a"]
    store.close()
    assert path.read_bytes() == b'{"id": "a"}\n'


def test_read_jsonl_missing_file_and_folder_are_one_line(tmp_path):
    with pytest.raises(DistillError, match="file not found"):
        read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DistillError, match="cannot read"):
        read_jsonl(tmp_path)


def test_line_separators_inside_strings_and_a_bom_survive_a_round_trip(tmp_path):
    # ensure_ascii=False writes U+2028/U+0085 raw; a reader splitting on every Unicode newline would tear them.
    records = [{"id": "a", "text": "one\u2028two\u0085three\r"}, {"id": "b", "text": "ünï"}]
    path = tmp_path / "t.jsonl"
    write_jsonl(path, records)
    assert read_jsonl(path) == records
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # saved by an editor that adds a BOM
    assert [n for n, _ in iter_jsonl(path)] == [1, 2] and read_jsonl(path) == records


# ------------------------------------------------------------------------------------ durability


def test_whole_file_writes_fsync_file_and_folder_and_leave_no_temp_file(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:  # the real fsync still runs; the spy only notes what it was given
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_json(tmp_path / "out" / "m.json", {"status": "complete"})
    assert synced == ["file", "dir"]
    synced.clear()
    write_jsonl(tmp_path / "out" / "r.jsonl", [{"id": "a"}])
    assert synced == ["file", "dir"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["m.json", "r.jsonl"]
    assert json.loads((tmp_path / "out" / "m.json").read_text()) == {"status": "complete"}


def test_a_failed_write_keeps_the_old_file_and_says_so_in_one_line(tmp_path):
    target = tmp_path / "r.jsonl"
    write_jsonl(target, [{"id": "old"}])

    def records():
        yield {"id": "new"}
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError):
        write_jsonl(target, records())
    assert read_jsonl(target) == [{"id": "old"}] and [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DistillError, match="cannot write"):
        write_json(blocker / "sub" / "x.json", {})


# ------------------------------------------------------------------------------------ duplicates


def test_two_writers_on_one_file_leave_duplicates_that_loading_drops(tmp_path):
    # Two runs on one folder: each store opened before the other wrote, so each appends the same question.
    path = tmp_path / "t.jsonl"
    first, second = JsonlStore(path, key=_key), JsonlStore(path, key=_key)
    assert first.append({"id": "a", "sample": 0, "answer": "first"})
    assert second.append({"id": "a", "sample": 0, "answer": "second"})
    assert second.append({"id": "b", "sample": 0})
    first.close(), second.close()
    assert len(read_jsonl(path)) == 3
    store = JsonlStore(path, key=_key)
    assert store.duplicates == 1 and len(store) == 2
    assert [r.get("answer") for r in store.records()] == ["first", None]  # the first copy is the one kept
    assert store.keys() == {("a", 0), ("b", 0)} == store.keys(_key)
    # And one store never writes a key twice: the append is ignored, the file untouched.
    size = path.stat().st_size
    assert not store.append({"id": "a", "sample": 0, "answer": "third"})
    assert store.append({"id": "a", "sample": 1})
    store.close()
    assert path.stat().st_size > size and len(read_jsonl(path)) == 4
    with JsonlStore(path) as keyless, JsonlStore(path, key=_key) as keyed:
        assert keyless.duplicates == 0 and len(keyless) == 4 and len(keyed) == 3


def test_a_record_without_its_key_is_one_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "sample": 0}\n{"id": "b"}\n')
    with pytest.raises(DistillError, match=r"record 2 has no key field 'sample'"):
        JsonlStore(path, key=_key)


def test_the_report_counts_a_record_written_twice_once(tmp_path, capsys):
    from test_report import sample_run, write_run

    from distill.report import load_records, recompute

    runs = sample_run()
    once = recompute(write_run(tmp_path / "once", runs))
    twice_runs = {m: recs + [dict(r, prediction="changed later") for r in recs] for m, recs in runs.items()}
    out = write_run(tmp_path / "twice", twice_runs)
    capsys.readouterr()
    assert {m: len(r) for m, r in load_records(out).items()} == {m: len(r) for m, r in runs.items()}
    assert "48 duplicate record(s)" in capsys.readouterr().out
    assert recompute(out) == once


# ------------------------------------------------------------------------------------ busy SQLite


def _hold_write_lock(path):
    """A second, real connection that takes the write lock and keeps it until told to let go."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO calls (key, kind, value) VALUES ('held', 'model', '1')")
    return holder


def test_busy_cache_waits_for_the_writer_then_writes(tmp_path):
    path = tmp_path / "c.sqlite"
    CallCache(path).close()
    holder = _hold_write_lock(path)
    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    cache = CallCache(path, busy_timeout_s=10, retries=0)  # SQLite's own wait is enough here
    cache.put("k", "v")
    assert cache.get("k") == "v" and cache.get("held") == 1 and cache.lock_retries == 0
    cache.close(), holder.close()


def test_busy_cache_retries_past_a_short_busy_timeout(tmp_path):
    path = tmp_path / "c.sqlite"
    CallCache(path).close()
    holder = _hold_write_lock(path)
    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    cache = CallCache(path, busy_timeout_s=0.01, retries=8, backoff_s=0.05)
    cache.put("k", "v")
    assert cache.get("k") == "v" and cache.lock_retries >= 1
    cache.close(), holder.close()


def test_cache_locked_for_good_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "c.sqlite"
    CallCache(path).close()
    holder = _hold_write_lock(path)
    cache = CallCache(path, busy_timeout_s=0.01, retries=2, backoff_s=0.01)
    assert cache.get("missing") is None  # WAL: readers are not blocked by the writer
    with pytest.raises(DistillError, match=rf"call cache {re.escape(str(path))} stayed locked .*3 tries"):
        cache.put("k", "v")
    assert cache.lock_retries == 2
    holder.execute("ROLLBACK")
    cache.put("k", "v")  # and the cache is still usable once the other writer is gone
    assert cache.get("k") == "v"
    cache.close(), holder.close()


def test_a_file_that_is_not_a_cache_is_one_line(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"not a database at all, just some text that is long enough" * 40)
    with pytest.raises(DistillError, match=rf"call cache {re.escape(str(path))}: file is not a database"):
        CallCache(path)


def test_a_cached_wikipedia_answer_is_not_reused_under_other_settings(tmp_path):
    """A rerun with another top_k or corpus must search again: the pipeline reruns generate when wikipedia_top_k
    changes, and an answer cached under top_k 1 would make that rerun repeat the old evidence."""
    from distill.llm.cached import CachedTool
    from distill.tools.wikipedia import LocalWikipedia

    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, [{"title": f"River {i}", "text": f"River {i} is a long river number {i}."} for i in range(4)])
    cache = CallCache(tmp_path / "c.sqlite")

    def search(tool) -> str:
        return asyncio.run(CachedTool(tool, cache).run("long river"))

    one = search(LocalWikipedia(corpus, top_k=1))
    three = search(LocalWikipedia(corpus, top_k=3))
    assert one.count("River ") == 2 and three.count("\n\n") == 2  # one paragraph, then three
    assert search(LocalWikipedia(corpus, top_k=3)) == three  # same settings: served from the cache
    write_jsonl(corpus, [{"title": "Lake", "text": "A long river flows into the lake."}])
    assert search(LocalWikipedia(corpus, top_k=3)).startswith("Lake:")  # another corpus: searched again
