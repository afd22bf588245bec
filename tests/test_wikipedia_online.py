"""The online Wikipedia client against a fake MediaWiki API that misbehaves the way the real one does.

The remote API cannot be reached from the test machines, so `FakeMediaWiki` stands in for it: a real HTTP/1.1
server on 127.0.0.1 (the client's real httpx stack, pool and timeouts are exercised) that answers the two calls
the client makes (list=search, then prop=extracts) in the API's formatversion=2 JSON layout, and injects
429 (with and without Retry-After), 5xx, slow answers, dropped connections, HTML bodies and API errors.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pytest

from distill import __version__
from distill.errors import DistillError
from distill.filter import FilterConfig, first_failure
from distill.rewoo.plan import parse_plan
from distill.rewoo.worker import NO_EVIDENCE, WorkerConfig, run_plan
from distill.tools.wikipedia import OnlineWikipedia
from distill import retry
from distill.retry import retry_after_s

PAGES = {
    "Marie Curie": "Marie Curie was a physicist\nand chemist who discovered radium.",
    "Pierre Curie": "Pierre Curie was a physicist who studied magnetism.",
    "Amazon River": "The Amazon River is the largest river by discharge.",
}
ANSWER = (
    "Marie Curie: Marie Curie was a physicist and chemist who discovered radium.\n\n"
    "Pierre Curie: Pierre Curie was a physicist who studied magnetism."
)


class FakeMediaWiki(ThreadingHTTPServer):
    """A fake of the remote MediaWiki API (see the module docstring), with scripted faults.

    `faults` are used up one per request, in order; when they run out, `always` (None: answer properly).
    A fault is "429", "429:<Retry-After value>", "503", "500", "slow" (no answer until the test ends, so the
    client's timeout fires however loaded the machine is), "drop" (close
    the connection without answering), "html" (200 with an HTML page), "api:<code>" (the API's JSON error),
    or "404". The server records every request, the connections used and the most requests in flight.
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.faults: list[str] = []
        self.always: str | None = None
        self.delay_s = 0.0
        self.release = threading.Event()  # set at teardown: held "slow" answers may go then
        self.together = 0  # hold the first requests until this many are in flight at once (0: no hold)
        self.all_in = threading.Event()
        self.requests: list[dict] = []
        self.connections: set[tuple[str, int]] = set()
        self.inflight = 0
        self.max_inflight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/w/api.php"

    def next_fault(self) -> str | None:
        with self.lock:
            return self.faults.pop(0) if self.faults else self.always

    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up on a slow answer leaves a broken pipe: expected here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the test can see whether the client pools connections
    server: FakeMediaWiki

    def log_message(self, format, *args) -> None:
        pass

    def do_GET(self) -> None:
        fake = self.server
        params = dict(parse_qsl(urlsplit(self.path).query))
        with fake.lock:
            path = urlsplit(self.path).path
            fake.requests.append({"t": time.monotonic(), "path": path, "params": params, "headers": dict(self.headers)})
            fake.connections.add(self.client_address)
            fake.inflight += 1
            fake.max_inflight = max(fake.max_inflight, fake.inflight)
            if fake.inflight >= fake.together:
                fake.all_in.set()
        fake.all_in.wait(30)  # a client that never sends `together` at once fails the test below, late but surely
        try:
            self._answer(fake, params, fake.next_fault())
        finally:
            with fake.lock:
                fake.inflight -= 1

    def _answer(self, fake: FakeMediaWiki, params: dict, fault: str | None) -> None:
        time.sleep(fake.delay_s)
        if fault == "drop":
            self.close_connection = True
            return
        if fault == "slow":
            fake.release.wait(60)
        if fault and fault.split(":")[0] in ("429", "500", "503", "404"):
            code, _, retry_after = fault.partition(":")
            headers = {"Retry-After": retry_after} if retry_after else {}
            return self._send(int(code), b"<html>busy</html>", "text/html", headers)
        if fault == "html":
            return self._send(200, b"<!DOCTYPE html><html>Wikimedia Error</html>", "text/html")
        if fault and fault.startswith("api:"):
            code = fault[4:]
            return self._json({"error": {"code": code, "info": f"fake {code}"}}, {"Retry-After": "0"})
        self._json(self._query(params))

    @staticmethod
    def _query(params: dict) -> dict:
        if params.get("list") == "search":
            words = params["srsearch"].lower().split()
            scored = [(sum(w in f"{t} {x}".lower() for w in words), t) for t, x in PAGES.items()]
            hits = [t for score, t in sorted(scored, key=lambda s: (-s[0], s[1])) if score][: int(params["srlimit"])]
            return {"batchcomplete": True, "query": {"search": [{"ns": 0, "title": t} for t in hits]}}
        if params.get("prop") == "extracts":
            asked = params["titles"].split("|")
            # The real API does not keep the order of `titles`; answering in reverse checks the client re-ranks.
            found = [{"ns": 0, "title": t, "extract": PAGES[t]} for t in reversed(asked) if t in PAGES]
            missing = [{"ns": 0, "title": t, "missing": True} for t in asked if t not in PAGES]
            return {"batchcomplete": True, "query": {"pages": found + missing}}
        return {"error": {"code": "badparams", "info": "unexpected call"}}

    def _json(self, obj: dict, headers: dict | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), "application/json", headers)

    def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True  # the client already gave up (a slow answer)


@pytest.fixture()
def fake():
    server = FakeMediaWiki()
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
    from distill.agents import build_wikipedia
    from distill.config import AgentConfig
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
