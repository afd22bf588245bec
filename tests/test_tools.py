"""Tools: calculator results and refusals, local and scoped BM25 Wikipedia, LLM tool, registry.

The online Wikipedia client has its own file, test_wikipedia_online.py, with its fake MediaWiki server."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path

import pytest

from distill.core.errors import DistillError
from distill.llm.base import Completion, Usage
from distill.tools.base import Tool
from distill.tools.calculator import Calculator, evaluate
from distill.tools.llm_tool import LLMTool
from distill.tools.registry import TOOL_DESCRIPTIONS, build_tools
from distill.tools.wikipedia import LocalWikipedia, ScopedWikipedia, format_paragraphs

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
def test_local_wikipedia_finds_the_right_paragraph(corpus: Path, query: str, title: str) -> None:
    out = run(LocalWikipedia(corpus).run(query))
    assert out.startswith(f"{title}: ")
    assert "\n\n" not in out  # top_k=1: one paragraph


def test_local_wikipedia_returns_top_k_paragraphs_best_first(corpus: Path) -> None:
    out = run(LocalWikipedia(corpus, top_k=2, max_chars=None).run("Titanic"))
    titles = sorted(part.split(":")[0] for part in out.split("\n\n"))
    assert titles == ["RMS Titanic", "Titanic (1997 film)"]


@pytest.mark.parametrize("query", ["", "the of and a", "zzxqv"])
def test_local_wikipedia_returns_nothing_when_nothing_matches(corpus: Path, query: str) -> None:
    assert run(LocalWikipedia(corpus).run(query)) == ""


def test_local_wikipedia_caps_output_length(corpus: Path) -> None:
    out = run(LocalWikipedia(corpus, max_chars=60).run("Marie Curie"))
    assert len(out) <= 60 and out.endswith("…") and out.startswith("Marie Curie: ")


def test_the_index_lives_in_memory_and_nothing_is_written(corpus: Path, cache: Path) -> None:
    """No index folder beside the user's corpus, none in the cache: the corpus folder is left as it was."""
    tool = LocalWikipedia(corpus)
    assert run(tool.run("Tenzing Norgay")).startswith("Tenzing Norgay: ")
    assert sorted(p.name for p in corpus.parent.iterdir()) == ["mini_corpus.jsonl"]
    assert not cache.exists()


def test_a_new_instance_sees_a_changed_corpus(corpus: Path) -> None:
    assert run(LocalWikipedia(corpus).run("archipelago East Africa")) == ""
    record = {"title": "Zanzibar", "text": "Zanzibar is an archipelago off the coast of East Africa."}
    with corpus.open("a") as f:
        f.write(json.dumps(record) + "\n")
    assert run(LocalWikipedia(corpus).run("archipelago East Africa")).startswith("Zanzibar: ")


def test_a_corpus_with_a_bad_line_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"title": "A", "text": "a"}\n{"title": "B"\n')
    with pytest.raises(DistillError, match=r"bad.jsonl:2: .*JSON"):
        LocalWikipedia(path)
    path.write_text('{"title": "A", "text": "a"}\n\n{"title": "B", "body": "b"}\n')
    with pytest.raises(DistillError, match="record 2: .*'title' and 'text'"):
        LocalWikipedia(path)
    path.write_text("\n")
    with pytest.raises(DistillError, match="no records"):
        LocalWikipedia(path)
    with pytest.raises(DistillError, match="missing.jsonl"):
        LocalWikipedia(tmp_path / "missing.jsonl")


def test_local_wikipedia_is_a_tool(corpus: Path) -> None:
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
    text = format_paragraphs([("T", "one two three four five six seven")], 20)
    assert text == "T: one two three…"


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


# ------------------------------------------------------------------------------------- a tool of your own

PLUGIN = '''
class Reverse:
    name = "Reverse"
    description = "Reverse[text]: the text backwards. Input: any text."

    async def run(self, query: str) -> str:
        return query[::-1]


class SyncRun:
    name = "SyncRun"
    description = "d"

    def run(self, query):
        return query


class BadName:
    name = "two words"
    description = "d"

    async def run(self, query):
        return query


class Shadow:
    name = "wikipedia"
    description = "d"

    async def run(self, query):
        return query


class Broken:
    name = "Broken"
    description = "d"

    def __init__(self):
        raise RuntimeError("no credentials")

    async def run(self, query):
        return query
'''


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    from distill.tools.registry import plugin_tool

    name = f"distill_test_plugin_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    plugin_tool.cache_clear()


def test_a_tool_of_your_own_is_in_the_prompt_and_runs_in_a_plan(plugin_module):
    from distill.rewoo.plan import parse_plan
    from distill.rewoo.prompts import planner_messages
    from distill.rewoo.worker import run_plan_sync
    from distill.tools.registry import tool_descriptions

    names = ["Calculator", f"{plugin_module}:Reverse"]
    descriptions = tool_descriptions(names)
    assert list(descriptions) == ["Calculator", "Reverse"]
    prompt = planner_messages("q?", descriptions, "full")[0]["content"]
    assert "Reverse[text]: the text backwards." in prompt
    tools = build_tools(names, wikipedia=None)
    plan = parse_plan("Plan: reverse it\n#E1 = Reverse[abc]\nPlan: add\n#E2 = Calculator[1 + 2]", tools=tools.values())
    assert plan.valid, plan.errors
    evidence = run_plan_sync(plan, tools)
    assert [(e.status, e.output) for e in evidence] == [("ok", "cba"), ("ok", "3")]


@pytest.mark.parametrize("attr,says", [
    ("SyncRun", "async def run"), ("BadName", "must be a word"), ("Shadow", "built-in tool's"),
    ("Missing", "has no class 'Missing'"),
])
def test_a_tool_of_your_own_that_cannot_work_is_one_line(plugin_module, attr, says):
    from distill.tools.registry import tool_descriptions

    with pytest.raises(DistillError, match=says) as info:
        tool_descriptions([f"{plugin_module}:{attr}"])
    assert "\n" not in str(info.value) and f"{plugin_module}:{attr}" in str(info.value)


def test_a_tool_of_your_own_that_fails_to_import_or_build_is_one_line(plugin_module):
    from distill.tools.registry import tool_descriptions

    with pytest.raises(DistillError, match="cannot import no_such_module_xyz .ModuleNotFoundError"):
        tool_descriptions(["no_such_module_xyz:Tool"])
    with pytest.raises(DistillError, match="building it failed .RuntimeError: no credentials"):
        build_tools([f"{plugin_module}:Broken"], wikipedia=None)
    with pytest.raises(DistillError, match="listed twice"):
        build_tools([f"{plugin_module}:Reverse", f"{plugin_module}:Reverse"], wikipedia=None)


def test_the_agent_builds_a_tool_of_your_own_and_caches_its_results(plugin_module, tmp_path):
    from distill.agent.factory import make_tools_for
    from distill.core.config import AgentConfig
    from distill.core.data import Example
    from distill.llm.cached import CachedTool
    from distill.core.store import CallCache

    cfg = AgentConfig(tools=["Calculator", f"{plugin_module}:Reverse"], wikipedia_corpus=None)
    tools = make_tools_for(cfg, None, cache=CallCache(tmp_path / "calls.sqlite"))(
        Example("q1", "hotpotqa", "dev", "q?", ["a"]))
    assert list(tools) == ["Calculator", "Reverse"] and isinstance(tools["Reverse"], CachedTool)
    assert asyncio.run(tools["Reverse"].run("abc")) == "cba"
