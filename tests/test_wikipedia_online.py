"""The online Wikipedia client against a fake MediaWiki API that misbehaves the way the real one does.

The remote API cannot be reached from the test machines, so `FakeMediaWiki` stands in for it: a real HTTP/1.1
server on 127.0.0.1 (the client's real httpx stack, pool and timeouts are exercised) that answers the two calls
the client makes (list=search, then prop=extracts) in the API's formatversion=2 JSON layout, and injects
429 (with and without Retry-After), 5xx, slow answers, dropped connections, HTML bodies and API errors.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import threading
import time
import pytest
from fakes import FakeMediaWiki

from distill import __version__
from distill.core.errors import DistillError
from distill.filter import FilterConfig, first_failure
from distill.rewoo.plan import parse_plan
from distill.rewoo.worker import NO_EVIDENCE, WorkerConfig, run_plan
from distill.tools.wikipedia import OnlineWikipedia
from distill.core import retry
from distill.core.retry import retry_after_s

PAGES = {
    "Marie Curie": "Marie Curie was a physicist\nand chemist who discovered radium.",
    "Pierre Curie": "Pierre Curie was a physicist who studied magnetism.",
    "Amazon River": "The Amazon River is the largest river by discharge.",
}
ANSWER = (
    "Marie Curie: Marie Curie was a physicist and chemist who discovered radium.\n\n"
    "Pierre Curie: Pierre Curie was a physicist who studied magnetism."
)


@pytest.fixture()
def fake():
    server = FakeMediaWiki(PAGES)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def client(fake: FakeMediaWiki, **kwargs) -> OnlineWikipedia:
    """Short backoff so fault tests run in about a second each; the timeout only ever fires on a held answer,
    and is long enough that a loaded machine never turns a real answer into one."""
    settings = dict(contact="https://example.org/distill-tests", api_url=fake.url, top_k=2, max_chars=None,
                    timeout_s=2.0, backoff_s=0.01, max_wait_s=2.0)
    return OnlineWikipedia(**(settings | kwargs))


def test_searches_then_fetches_intro_extracts_with_an_etiquette_user_agent(fake: FakeMediaWiki) -> None:
    tool = client(fake, sentences=3)
    assert asyncio.run(tool.run("Curie physicist")) == ANSWER
    search, extracts = fake.requests
    assert all(r["path"] == "/w/api.php" for r in fake.requests)
    user_agents = {r["headers"]["User-Agent"] for r in fake.requests}
    assert user_agents == {tool.user_agent}
    assert tool.user_agent.startswith(f"distill/{__version__} (")
    assert "https://example.org/distill-tests" in tool.user_agent and "httpx/" in tool.user_agent
    expected = {"action": "query", "list": "search", "srsearch": "Curie physicist", "srlimit": "2", "format": "json"}
    assert {k: search["params"].get(k) for k in expected} == expected
    assert {k: extracts["params"].get(k) for k in ("prop", "exintro", "explaintext", "redirects", "exsentences")} == {
        "prop": "extracts",
        "exintro": "1",
        "explaintext": "1",
        "redirects": "1",
        "exsentences": "3",
    }
    assert extracts["params"]["titles"] == "Marie Curie|Pierre Curie"
    assert tool.retries == 0


def test_the_default_endpoint_is_english_wikipedia_and_a_missing_contact_is_flagged(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        tool = OnlineWikipedia()
    assert tool.api_url == "https://en.wikipedia.org/w/api.php"
    assert any("wikipedia_contact" in r.getMessage() for r in caplog.records)


def test_no_hits_is_empty_evidence_after_one_request(fake: FakeMediaWiki) -> None:
    assert asyncio.run(client(fake).run("zzxqv")) == ""
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    "faults",
    [
        ["429"],
        ["429:0"],
        ["503"],
        ["500", "503"],
        ["drop"],
        ["slow"],
        ["html"],
        ["api:ratelimited"],
        ["api:maxlag"],
        ["503", "drop", "429:0", "slow"],
    ],
)
def test_faults_are_retried_and_the_answer_comes_back_right(fake: FakeMediaWiki, faults: list[str]) -> None:
    fake.faults = list(faults)
    tool = client(fake)
    assert asyncio.run(tool.run("Curie physicist")) == ANSWER
    assert tool.retries == len(faults)
    assert len(fake.requests) == len(faults) + 2
    assert not fake.faults


def test_retry_after_is_honoured(fake: FakeMediaWiki) -> None:
    fake.faults = ["429:1"]
    tool = client(fake, timeout_s=10)  # a loaded machine must not turn the refused request into a timeout
    assert asyncio.run(tool.run("Curie physicist")) == ANSWER
    refused, retried = fake.requests[0]["t"], fake.requests[1]["t"]
    assert retried - refused >= 0.95  # never back sooner than the server asked
    assert tool.retries == 1


@pytest.mark.timeout(60)
def test_retry_after_beyond_the_cap_waits_only_the_cap(fake: FakeMediaWiki, monkeypatch) -> None:
    waits = []
    chosen = retry.backoff_s
    monkeypatch.setattr(retry, "backoff_s", lambda *a: waits.append(chosen(*a)) or waits[-1])
    fake.faults = ["429:3600"]
    tool = client(fake, max_wait_s=0.2)
    assert asyncio.run(tool.run("Curie physicist")) == ANSWER
    assert waits == [0.2]  # the cap, not the hour the server asked for


def test_retry_after_as_seconds_or_an_http_date() -> None:
    assert retry_after_s("7") == 7.0
    assert retry_after_s(" 0 ") == 0.0
    later = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 50 <= retry_after_s(later) <= 61
    assert retry_after_s(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None and retry_after_s("") is None


def test_the_concurrency_cap_holds_and_connections_are_pooled(fake: FakeMediaWiki) -> None:
    fake.delay_s, fake.together = 0.2, 3  # three in flight at once whatever the load, then answers overlap
    tool = client(fake, max_concurrency=3, timeout_s=60.0)
    queries = [f"Curie physicist {i}" for i in range(12)]

    async def many() -> list[str]:
        return await asyncio.gather(*(tool.run(q) for q in queries))

    assert asyncio.run(many()) == [ANSWER] * 12
    assert len(fake.requests) == 24
    assert fake.max_inflight == 3
    assert len(fake.connections) <= 3  # one pooled client, kept-alive connections reused


def test_a_new_event_loop_gets_a_working_client(fake: FakeMediaWiki) -> None:
    """`run_plan_sync` and evaluation start a new loop per run; the client made in the first must not leak in."""
    tool = client(fake)
    assert asyncio.run(tool.run("Curie physicist")) == ANSWER
    assert asyncio.run(tool.run("Curie physicist")) == ANSWER
    assert tool.retries == 0


@pytest.mark.parametrize(("fault", "named"), [("503", "HTTP 503"), ("429:0", "HTTP 429"), ("drop", "connection failed"),
                                               ("slow", "no answer within 0.2s"), ("html", "not JSON")])
def test_faults_that_outlast_the_retries_are_one_clear_line(fake: FakeMediaWiki, fault: str, named: str) -> None:
    fake.always = fault
    tool = client(fake, max_retries=2, timeout_s=0.2)
    with pytest.raises(DistillError) as info:
        asyncio.run(tool.run("Curie physicist"))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"Wikipedia API {fake.url}: ")
    assert named in message and "after 3 attempts" in message
    assert tool.retries == 2 and len(fake.requests) == 3


@pytest.mark.parametrize("fault", ["404", "api:badparams"])
def test_a_refusal_is_not_retried(fake: FakeMediaWiki, fault: str) -> None:
    fake.always = fault
    tool = client(fake)
    with pytest.raises(DistillError, match="Wikipedia API .*(HTTP 404|error badparams)"):
        asyncio.run(tool.run("Curie physicist"))
    assert tool.retries == 0 and len(fake.requests) == 1


def test_the_budget_ends_a_call_with_its_fault_instead_of_waiting_past_it(fake: FakeMediaWiki) -> None:
    fake.faults = ["429:5"]
    tool = client(fake, budget_s=0.5, max_wait_s=10)
    with pytest.raises(DistillError, match=r"HTTP 429 Too Many Requests$"):
        asyncio.run(tool.run("Curie physicist"))
    assert tool.retries == 0 and len(fake.requests) == 1
    fake.faults = ["503", "slow"]
    tool = client(fake, budget_s=0.5, timeout_s=5.0)
    with pytest.raises(DistillError, match=r"HTTP 503 Service Unavailable, then no answer within the 0.5s budget"):
        asyncio.run(tool.run("Curie physicist"))
    assert tool.retries == 1


def test_the_agent_config_settings_reach_the_client() -> None:
    from distill.agent.factory import build_wikipedia
    from distill.core.config import AgentConfig
    from distill.tools.registry import tool_descriptions

    cfg = AgentConfig(
        wikipedia_backend="online", wikipedia_contact="ops@example.org", wikipedia_max_concurrency=3,
        wikipedia_max_retries=7, wikipedia_timeout_s=4.0, wikipedia_max_wait_s=9.0, wikipedia_top_k=2,
        tool_timeout_s=20.0,
    )
    tool = build_wikipedia(cfg, tool_descriptions(cfg.tools))
    assert isinstance(tool, OnlineWikipedia) and "ops@example.org" in tool.user_agent
    settings = (tool.max_concurrency, tool.max_retries, tool.timeout_s, tool.max_wait_s, tool.top_k)
    assert settings == (3, 7, 4.0, 9.0, 2)
    assert tool.budget_s < cfg.tool_timeout_s  # the client names its fault before the Worker's timeout fires


@pytest.mark.parametrize(
    ("fault", "settings"),
    [("429:0", {"max_retries": 1}), ("429:5", {"budget_s": 0.9, "max_wait_s": 10})],
    ids=["retries-run-out", "retry-after-past-the-worker-timeout"],
)
def test_a_rate_limit_is_a_tool_error_the_filter_drops(fake: FakeMediaWiki, fault: str, settings: dict) -> None:
    """Not a silent "No evidence found", nor a bare timeout: the Worker records the API's fault as the step's
    error, and the filter counts the trajectory as a step failure."""
    fake.always = fault
    tool = client(fake, **settings)
    plan = parse_plan("Plan: Look her up.\n#E1 = Wikipedia[Marie Curie]", tools=["Wikipedia"])
    assert plan.valid
    (evidence,) = asyncio.run(run_plan(plan, {"Wikipedia": tool}, WorkerConfig(tool_timeout_s=1.0)))
    assert evidence.status == "error" and evidence.output == NO_EVIDENCE
    assert "Wikipedia API" in evidence.error and "HTTP 429" in evidence.error
    record = {"plan": plan.to_dict(), "evidence": [evidence.to_dict()], "scores": {"em": 1.0, "f1": 1.0}}
    assert first_failure(record, FilterConfig()) == "step_failed"


def test_the_api_url_setting_reaches_the_client_and_bad_ones_are_refused(fake: FakeMediaWiki) -> None:
    """`wikipedia_api_url` picks the MediaWiki API a run searches (another language, a mirror, or the rehearsal's
    fake): the agent factory's client calls it, and a setting that is no http(s) address is one line at load."""
    from distill.agent.factory import build_wikipedia
    from distill.core.config import AgentConfig, validate

    cfg = validate(AgentConfig, {"wikipedia_backend": "online", "wikipedia_api_url": fake.url,
                                 "wikipedia_contact": "https://example.org/distill-tests", "wikipedia_top_k": 2,
                                 "wikipedia_max_chars": 1000}, "test")
    wiki = build_wikipedia(cfg, {"Wikipedia": ""})
    assert asyncio.run(wiki.run("Curie physicist")) == ANSWER
    assert {r["path"] for r in fake.requests} == {"/w/api.php"}
    assert AgentConfig().wikipedia_api_url == "https://en.wikipedia.org/w/api.php"
    for bad, words in (("en.wikipedia.org/w/api.php", "scheme must be http or https"),
                       ("https://me:secret@mirror.test/w/api.php", "must not carry credentials"),
                       ("@server", "not this address")):
        with pytest.raises(DistillError, match=words) as info:
            validate(AgentConfig, {"wikipedia_api_url": bad}, "test")
        assert "secret" not in str(info.value) and "\n" not in str(info.value)
