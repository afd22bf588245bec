"""Tools: calculator results and refusals, local and scoped BM25 Wikipedia, the online API client, LLM tool,
registry."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import httpx
import pytest

from distill.errors import DistillError
from distill.llm.base import Completion, Usage
from distill.tools import (
    TOOL_DESCRIPTIONS,
    Calculator,
    LLMTool,
    LocalWikipedia,
    OnlineWikipedia,
    ScopedWikipedia,
    Tool,
    build_tools,
)
from distill.tools.calculator import evaluate
from distill.tools.wikipedia import FINGERPRINT_FILE, Paragraph, format_paragraphs

FIXTURE = Path(__file__).parent / "fixtures" / "mini_corpus.jsonl"


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2+3*4", "14"),
        ("(1 + 2) / 3", "1"),
        ("7 / 2", "3.5"),
        ("1,234 + 5", "1239"),
        ("1,234,567 - 1", "1234566"),
        ("12*(3+4) =", "84"),
        ("2 ** 10", "1024"),
        ("-3 ** 2", "-9"),
        ("+5 - -5", "10"),
        ("17 // 5", "3"),
        ("17 % 5", "2"),
        ("0.1 + 0.2", "0.3"),
        ("2 ** -1", "0.5"),
        ("2 ** 0.5", "1.41421356237"),
        ("10 ** 100", "1" + "0" * 100),
        ("1.5e3 + 1", "1501"),
    ],
)
def test_calculator_results(expression: str, expected: str) -> None:
    assert run(Calculator().run(expression)) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "function call"),
        ("abs(-1)", "function call"),
        ("x + 1", "name 'x'"),
        ("(1).real", "attribute 'real'"),
        ("'a' * 3", "literal 'a'"),
        ("True + 1", "literal True"),
        ("1j * 2", "literal 1j"),
        ("[1, 2]", "List"),
        ("1, 2", "comma"),
        ("1 < 2", "Lt"),
        ("2 ^ 3", "BitXor"),
        ("lambda: 1", "Lambda"),
        ("1 +", "not an arithmetic expression"),
        ("", "empty expression"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("9**9**9", "exponent"),
        ("2 ** 1001", "exponent"),
        ("99 ** 999", "digits"),
        ("10**999 * 10**999", "digits"),
        ("1e308 * 10", "too large"),
        ("10.0 ** 400", "too large"),
        ("10**999 / 3", "too large"),
        ("1e400", "too large"),
        ("1+" * 400 + "1", "longer than"),
    ],
)
def test_calculator_refusals(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


def test_calculator_tool_raises_so_the_worker_records_an_error() -> None:
    with pytest.raises(ValueError):
        run(Calculator().run("open('/etc/passwd')"))


# --------------------------------------------------------------------------------------- local wikipedia


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus" / "mini_corpus.jsonl"
    path.parent.mkdir()
    shutil.copy(FIXTURE, path)
    return path


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("DISTILL_CACHE", str(root))
    return root


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("Marie Curie", "Marie Curie"),
        ("Titanic (1997 film)", "Titanic (1997 film)"),
        ("RMS Titanic", "RMS Titanic"),
        ("Gustave Eiffel", "Gustave Eiffel"),
        ("who discovered radium", "Marie Curie"),
        ("ocean liner sank after striking an iceberg", "RMS Titanic"),
        ("first computer program Analytical Engine", "Ada Lovelace"),
        ("Curie temperature magnetism", "Pierre Curie"),
        ("largest river by discharge", "Amazon River"),
    ],
)
def test_local_wikipedia_finds_the_right_paragraph(corpus: Path, cache: Path, query: str, title: str) -> None:
    out = run(LocalWikipedia(corpus).run(query))
    assert out.startswith(f"{title}: ")
    assert "\n\n" not in out  # top_k=1: one paragraph


def test_local_wikipedia_returns_top_k_paragraphs_best_first(corpus: Path, cache: Path) -> None:
    out = run(LocalWikipedia(corpus, top_k=2, max_chars=None).run("Titanic"))
    titles = sorted(part.split(":")[0] for part in out.split("\n\n"))
    assert titles == ["RMS Titanic", "Titanic (1997 film)"]


@pytest.mark.parametrize("query", ["", "the of and a", "zzxqv"])
def test_local_wikipedia_returns_nothing_when_nothing_matches(corpus: Path, cache: Path, query: str) -> None:
    assert run(LocalWikipedia(corpus).run(query)) == ""


def test_local_wikipedia_caps_output_length(corpus: Path, cache: Path) -> None:
    out = run(LocalWikipedia(corpus, max_chars=60).run("Marie Curie"))
    assert len(out) <= 60 and out.endswith("…") and out.startswith("Marie Curie: ")


def test_index_is_persisted_beside_the_corpus_and_reused(corpus: Path, cache: Path) -> None:
    first = LocalWikipedia(corpus)
    assert first.index_built and first.index_dir == corpus.with_name("mini_corpus.jsonl.bm25s")
    stamp = (first.index_dir / FINGERPRINT_FILE).stat().st_mtime_ns
    second = LocalWikipedia(corpus)
    assert not second.index_built and second.index_dir == first.index_dir
    assert (first.index_dir / FINGERPRINT_FILE).stat().st_mtime_ns == stamp
    stored = json.loads((first.index_dir / FINGERPRINT_FILE).read_text())
    assert stored["size"] == corpus.stat().st_size and len(stored["sha256"]) == 64
    assert not cache.exists()


def test_index_is_rebuilt_when_the_corpus_changes(corpus: Path, cache: Path) -> None:
    assert LocalWikipedia(corpus).index_built
    record = {"title": "Zanzibar", "text": "Zanzibar is an archipelago off the coast of East Africa."}
    with corpus.open("a") as f:
        f.write(json.dumps(record) + "\n")
    changed = LocalWikipedia(corpus)
    assert changed.index_built
    assert run(changed.run("archipelago East Africa")).startswith("Zanzibar: ")
    assert not LocalWikipedia(corpus).index_built


def test_a_damaged_index_is_rebuilt(corpus: Path, cache: Path) -> None:
    index_dir = LocalWikipedia(corpus).index_dir
    assert index_dir is not None
    for path in index_dir.glob("*.npy"):
        path.write_bytes(b"not an array")
    again = LocalWikipedia(corpus)
    assert again.index_built
    assert run(again.run("Ada Lovelace")).startswith("Ada Lovelace: ")
    assert not LocalWikipedia(corpus).index_built


def test_a_touched_but_unchanged_corpus_keeps_its_index(corpus: Path, cache: Path) -> None:
    LocalWikipedia(corpus)
    os.utime(corpus, (1, 1))
    assert not LocalWikipedia(corpus).index_built


def test_read_only_corpus_folder_puts_the_index_in_the_cache(corpus: Path, cache: Path) -> None:
    folder = corpus.parent
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        first = LocalWikipedia(corpus)
        second = LocalWikipedia(corpus)
        assert sorted(p.name for p in folder.iterdir()) == ["mini_corpus.jsonl"]
    finally:
        folder.chmod(stat.S_IRWXU)
    assert first.index_built and not second.index_built
    assert first.index_dir is not None and first.index_dir.parent == cache / "bm25"
    assert run(second.run("Tenzing Norgay")).startswith("Tenzing Norgay: ")


def test_a_corpus_with_a_bad_line_is_a_clear_error(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"title": "A", "text": "a"}\n{"title": "B"\n')
    with pytest.raises(DistillError, match=r"bad.jsonl:2: not JSON"):
        LocalWikipedia(path)
    path.write_text('{"title": "A", "body": "a"}\n')
    with pytest.raises(DistillError, match="'title' and 'text'"):
        LocalWikipedia(path)
    with pytest.raises(DistillError, match="cannot read"):
        LocalWikipedia(tmp_path / "missing.jsonl")


def test_local_wikipedia_is_a_tool(corpus: Path, cache: Path) -> None:
    tool = LocalWikipedia(corpus)
    assert isinstance(tool, Tool) and tool.name == "Wikipedia"
    assert tool.description == TOOL_DESCRIPTIONS["Wikipedia"]


# -------------------------------------------------------------------------------------- scoped wikipedia

CONTEXT = [
    ("Ed Wood (film)", "Ed Wood is a 1994 American biographical period comedy-drama film directed by Tim Burton."),
    ("Scott Derrickson", "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer."),
    ("Ed Wood", "Edward Davis Wood Jr. was an American filmmaker, actor, writer, producer, and director."),
    ("Doctor Strange (2016 film)", "Doctor Strange is a 2016 American superhero film directed by Scott Derrickson."),
]


def test_scoped_wikipedia_searches_only_its_paragraphs() -> None:
    tool = LocalWikipedia.scoped(CONTEXT)
    assert isinstance(tool, ScopedWikipedia) and isinstance(tool, Tool)
    assert run(tool.run("Scott Derrickson")).startswith("Scott Derrickson: Scott Derrickson (born July 16, 1966)")
    assert run(tool.run("Ed Wood")).startswith("Ed Wood: Edward Davis Wood Jr.")
    assert run(tool.run("superhero film 2016")).startswith("Doctor Strange (2016 film): ")
    assert run(tool.run("Marie Curie radium")) == ""


def test_building_an_index_prints_no_bm25s_debug_lines(caplog) -> None:
    """One index per question with a per-question scope: bm25s's own DEBUG logger would print a line each."""
    with caplog.at_level(logging.DEBUG):
        run(LocalWikipedia.scoped(CONTEXT).run("Ed Wood"))
    assert not [r for r in caplog.records if r.name.startswith("bm25s") and r.levelno < logging.WARNING]


def test_scoped_wikipedia_top_k_and_empty_context() -> None:
    out = run(ScopedWikipedia(CONTEXT, top_k=2, max_chars=None).run("Tim Burton film Ed Wood"))
    assert [part.split(":")[0] for part in out.split("\n\n")] == ["Ed Wood (film)", "Ed Wood"]
    with pytest.raises(DistillError):
        ScopedWikipedia([])


def test_format_paragraphs_cuts_at_a_word() -> None:
    text = format_paragraphs([Paragraph("T", "one two three four five six seven")], 20)
    assert text == "T: one two three…"


# -------------------------------------------------------------------------------------- online wikipedia


def fake_mediawiki(requests: list[httpx.Request], *, hits: list[str], pages: dict[str, str]):
    """An in-process stand-in for the MediaWiki API, because the remote API cannot be reached from here.

    It answers the two calls OnlineWikipedia makes (list=search, then prop=extracts) in the API's
    formatversion=2 JSON layout, and records each request so the test can check what was sent.
    """

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        params = request.url.params
        if params.get("list") == "search":
            return httpx.Response(200, json={"query": {"search": [{"ns": 0, "title": t} for t in hits]}})
        if params.get("prop") == "extracts":
            asked = params["titles"].split("|")
            # The real API does not keep the order of `titles`; answering in reverse checks the tool re-ranks.
            found = [{"ns": 0, "title": t, "extract": pages[t]} for t in reversed(asked) if t in pages]
            missing = [{"ns": 0, "title": t, "missing": True} for t in asked if t not in pages]
            return httpx.Response(200, json={"batchcomplete": True, "query": {"pages": found + missing}})
        return httpx.Response(400, json={"error": {"code": "badparams", "info": "unexpected call"}})

    return httpx.MockTransport(handler)


def test_online_wikipedia_searches_then_fetches_intro_extracts() -> None:
    """The MediaWiki API is faked in-process (MockTransport) because the remote API cannot be reached here."""
    requests: list[httpx.Request] = []
    pages = {
        "Marie Curie": "Marie Curie was a physicist\nand chemist.",
        "Pierre Curie": "Pierre Curie was a physicist.",
    }
    transport = fake_mediawiki(requests, hits=["Marie Curie", "Pierre Curie"], pages=pages)
    tool = OnlineWikipedia(user_agent="distill-test/1.0", top_k=2, sentences=3, transport=transport, max_chars=None)
    out = run(tool.run("Curie radium"))
    assert out == "Marie Curie: Marie Curie was a physicist and chemist.\n\nPierre Curie: Pierre Curie was a physicist."
    search, extracts = requests
    assert all(r.headers["User-Agent"] == "distill-test/1.0" for r in requests)
    assert search.url.host == "en.wikipedia.org" and search.url.path == "/w/api.php"
    expected = {"action": "query", "list": "search", "srsearch": "Curie radium", "srlimit": "2", "format": "json"}
    assert {k: search.url.params.get(k) for k in expected} == expected
    assert {k: extracts.url.params[k] for k in ("prop", "exintro", "explaintext", "redirects", "exsentences")} == {
        "prop": "extracts",
        "exintro": "1",
        "explaintext": "1",
        "redirects": "1",
        "exsentences": "3",
    }
    assert extracts.url.params["titles"] == "Marie Curie|Pierre Curie"


def test_online_wikipedia_returns_nothing_without_hits() -> None:
    """Faked MediaWiki API (MockTransport): the remote API cannot be reached here."""
    requests: list[httpx.Request] = []
    out = run(OnlineWikipedia(transport=fake_mediawiki(requests, hits=[], pages={})).run("qwxz"))
    assert out == "" and len(requests) == 1


def test_online_wikipedia_raises_on_api_and_http_errors() -> None:
    """Faked MediaWiki API (MockTransport): the remote API cannot be reached here."""
    api_error = httpx.MockTransport(lambda r: httpx.Response(200, json={"error": {"code": "maxlag", "info": "lagged"}}))
    with pytest.raises(RuntimeError, match="maxlag"):
        run(OnlineWikipedia(transport=api_error).run("x"))
    server_error = httpx.MockTransport(lambda r: httpx.Response(503, text="unavailable"))
    with pytest.raises(httpx.HTTPStatusError):
        run(OnlineWikipedia(transport=server_error).run("x"))


# --------------------------------------------------------------------------------------------- LLM tool


class EchoChat:
    """A tiny ChatModel implementing the project's chat protocol (not a mock of a remote service)."""

    name = "echo-chat"

    def __init__(self) -> None:
        self.seen: list[tuple[list[dict], float, int]] = []

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        self.seen.append((messages, temperature, max_tokens))
        text = f"  answer to {messages[-1]['content']}\n"
        return Completion(text=text, usage=Usage(7, 3), latency_s=0.01, cost_usd=0.002, model=self.name)


def test_llm_tool_sends_the_query_and_records_usage() -> None:
    chat = EchoChat()
    tool = LLMTool(chat, max_tokens=64)
    assert tool.name == "LLM" and tool.description == TOOL_DESCRIPTIONS["LLM"]
    assert run(tool.run("What is 2+2?")) == "answer to What is 2+2?"
    run(tool.run("Second?"))
    assert chat.seen[0] == ([{"role": "user", "content": "What is 2+2?"}], 0.0, 64)
    assert len(tool.calls) == 2
    assert sum((c.usage for c in tool.calls), Usage()).total_tokens == 20
    assert sum(c.cost_usd for c in tool.calls) == pytest.approx(0.004)


# --------------------------------------------------------------------------------------------- registry


def test_descriptions_are_the_paper_lines() -> None:
    assert TOOL_DESCRIPTIONS["Wikipedia"].startswith("Worker that searches for similar page contents from Wikipedia.")
    assert TOOL_DESCRIPTIONS["LLM"].endswith("Input can be any instruction.")
    assert TOOL_DESCRIPTIONS["Calculator"] == (
        "Evaluates an arithmetic expression exactly. Input must be the expression alone, e.g. 12*(3+4)."
    )
    assert all("\n" not in d for d in TOOL_DESCRIPTIONS.values())


def test_build_tools_builds_the_named_tools() -> None:
    wiki = ScopedWikipedia(CONTEXT)
    tools = build_tools(["Wikipedia", "llm", "Calculator"], wikipedia=wiki, llm_model=EchoChat())
    assert list(tools) == ["Wikipedia", "LLM", "Calculator"]
    assert tools["Wikipedia"] is wiki
    assert isinstance(tools["LLM"], LLMTool) and isinstance(tools["Calculator"], Calculator)
    assert all(t.name == name for name, t in tools.items())


@pytest.mark.parametrize(
    ("names", "kwargs", "message"),
    [
        (["Google"], {}, "unknown tool 'Google'"),
        (["Wikipedia"], {}, "no Wikipedia backend"),
        (["LLM"], {}, "no model"),
        (["Calculator", "calculator"], {}, "listed twice"),
    ],
)
def test_build_tools_rejects_bad_names(names: list[str], kwargs: dict, message: str) -> None:
    with pytest.raises(DistillError, match=message):
        build_tools(names, wikipedia=None, **kwargs)


def test_scoped_wikipedia_on_real_hotpotqa_contexts(shared_data_dir: Path) -> None:
    """Every supporting page of a real distractor-setting question is found by its title among the ten."""
    lines = (shared_data_dir / "hotpotqa" / "dev_distractor_sample.jsonl").read_text().splitlines()[:30]
    for item in map(json.loads, lines):
        tool = LocalWikipedia.scoped([(title, " ".join(sentences)) for title, sentences in item["context"]])
        for title in {title for title, _ in item["supporting_facts"]}:
            assert run(tool.run(title)).startswith(f"{title}: "), (item["_id"], title)
