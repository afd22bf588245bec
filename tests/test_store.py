"""The JSONL store and the call cache: nothing computed is lost, nothing torn is kept, nothing is paid twice."""

from __future__ import annotations

import asyncio
import json

import pytest

from distill.errors import DistillError
from distill.llm.cached import CachedChat
from distill.store import CallCache, JsonlStore, read_jsonl, stable_hash


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
    with pytest.raises(DistillError, match="line 2"):
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
