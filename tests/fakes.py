"""Stand-ins for servers the tests cannot use: hosted APIs, the MediaWiki API and the Hub, which cannot be reached
from here, and a vLLM server with a LoRA module loaded, too slow to start for a test that needs only what its
/v1/models says. Each is a real HTTP server on 127.0.0.1, so the client under test (httpx, openai,
huggingface_hub) runs as it does against the real one."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` on a free port of 127.0.0.1; yields the base URL, `http://127.0.0.1:<port>`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class ChatAPI:
    """An OpenAI-compatible server as vLLM runs one: /v1/models lists the base model `base` and the LoRA module
    `planner` at the folder `adapter`; every chat completion answers `reply` with 11 prompt and 2 completion
    tokens, after refusing the first `fail_first` (429, then 503s, each with Retry-After 0). `calls` counts the
    chat requests; `handler` is the request handler, for serving the same API on another port."""

    def __init__(self, reply: str = "Paris", adapter: str = "", fail_first: int = 0) -> None:
        self.reply, self.adapter, self.fail_first = reply, adapter, fail_first
        self.calls = 0
        self.url = ""
        self.lock = threading.Lock()
        self.handler = type("Handler", (_ChatHandler,), {"api": self})


@contextlib.contextmanager
def chat_api(**settings) -> Iterator[ChatAPI]:
    """A `ChatAPI` served while the block runs; its `url` is the base URL clients take, ending in /v1."""
    api = ChatAPI(**settings)
    with serving(api.handler) as base:
        api.url = f"{base}/v1"
        yield api


class _ChatHandler(BaseHTTPRequestHandler):
    api: ChatAPI

    def do_POST(self):  # noqa: N802 (http.server API)
        api = self.api
        self.rfile.read(int(self.headers["Content-Length"]))
        with api.lock:
            api.calls += 1
            n = api.calls
        if n <= api.fail_first:
            return self._send(429 if n == 1 else 503, {"error": {"message": "slow down"}}, {"Retry-After": "0"})
        self._send(200, {
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": api.reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13},
        })

    def do_GET(self):  # noqa: N802
        self._send(200, {"object": "list", "data": [
            {"id": "base", "object": "model", "root": "base", "parent": None},
            {"id": "planner", "object": "model", "root": self.api.adapter, "parent": "base"},
        ]})

    def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class ReWOOChat:
    """A hosted OpenAI-compatible API that answers the way a good teacher would, for the rehearsal of the documented
    commands (scripts/rehearse.py): a planner prompt gets a valid ReWOO plan that searches each known question's
    gold pages (else the question), a Solver, ReAct, Direct or LLM-tool prompt the known gold answer, a judge
    `CORRECT`. `known` maps question text to (answers, gold titles). /v1/models lists `models` (name -> the adapter
    folder a LoRA module is served from, or None for a base model), as the vLLM server it may stand in for does.
    Usage is counted as about 4 characters a token, so a priced model costs what its prices say."""

    def __init__(self, known: dict[str, tuple[list[str], list[str]]] | None = None,
                 models: dict[str, str | None] | None = None) -> None:
        self.known = dict(known or {})
        self.models = dict(models or {})
        self.calls = 0
        self.url = ""
        self.lock = threading.Lock()
        self.handler = type("Handler", (_ReWOOHandler,), {"api": self})

    def lookup(self, text: str) -> tuple[str, list[str], list[str]]:
        for question, (answers, titles) in self.known.items():
            if question in text:
                return question, answers, titles
        return "", ["yes"], []

    def reply(self, messages: list[dict]) -> str:
        from distill.rewoo.prompts import SOLVER_INSTRUCTIONS, prompt_kind_of

        text = "\n".join(str(m.get("content") or "") for m in messages)
        last = str(messages[-1].get("content") or "") if messages else ""
        question, answers, titles = self.lookup(last if prompt_kind_of(messages) else text)
        if prompt_kind_of(messages):
            asked = question or last.removeprefix("Question:").strip()
            steps = [f"Plan: Find {t}.\n#E{i} = Wikipedia[{t}]" for i, t in enumerate(titles[:2] or [asked], 1)]
            if "LLM" in str(messages[0].get("content") or ""):
                steps.append(f"Plan: Answer.\n#E{len(steps) + 1} = LLM[{asked} Given context: #E1]")
            return "\n".join(steps)
        if text.startswith("You are grading"):
            return "CORRECT"
        if "Finish[" in text and SOLVER_INSTRUCTIONS not in text:
            return f"Thought: I know the answer.\nAction: Finish[{answers[0]}]"
        return answers[0]


@contextlib.contextmanager
def rewoo_chat(port: int = 0, **settings) -> Iterator[ReWOOChat]:
    """A `ReWOOChat` served on `port` (0: a free one) while the block runs; `url` ends in /v1."""
    api = ReWOOChat(**settings)
    server = ThreadingHTTPServer(("127.0.0.1", port), api.handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        yield api
    finally:
        server.shutdown()
        server.server_close()


class _ReWOOHandler(_ChatHandler):
    api: ReWOOChat

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        with self.api.lock:
            self.api.calls += 1
        if self.path.rstrip("/").endswith("/load_lora_adapter"):  # vLLM's runtime LoRA loading: listed from now on
            if not body.get("lora_name") or not Path(str(body.get("lora_path"))).is_dir():
                return self._send(400, {"error": {"message": f"no adapter folder at {body.get('lora_path')}"}})
            self.api.models[body["lora_name"]] = str(body["lora_path"])
            return self._send(200, {"message": f"Success: LoRA adapter '{body['lora_name']}' added successfully."})
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._send(404, {"error": {"message": f"the fake API has no {self.path}"}})
        text = self.api.reply(body.get("messages") or [])
        prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages") or []) // 4 + 1
        completion = len(text) // 4 + 1
        self._send(200, {
            "id": f"chatcmpl-{self.api.calls}", "object": "chat.completion", "created": 0,
            "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        })

    def do_GET(self):  # noqa: N802
        if self.path.rstrip("/").endswith("/health"):
            return self._send(200, {})
        self._send(200, {"object": "list", "data": [
            {"id": name, "object": "model", "root": root or name, "parent": None if root is None else "base"}
            for name, root in self.api.models.items()]})


class FakeMediaWiki(ThreadingHTTPServer):
    """The remote MediaWiki API, answering the two calls `OnlineWikipedia` makes (list=search, then prop=extracts)
    in the API's formatversion=2 JSON layout over `pages`, with scripted faults (tests/test_wikipedia_online.py).

    `faults` are used up one per request, in order; when they run out, `always` (None: answer properly).
    A fault is "429", "429:<Retry-After value>", "503", "500", "slow" (no answer until the test ends, so the
    client's timeout fires however loaded the machine is), "drop" (close
    the connection without answering), "html" (200 with an HTML page), "api:<code>" (the API's JSON error),
    or "404". The server records every request, the connections used and the most requests in flight.
    """

    daemon_threads = True

    def __init__(self, pages: dict[str, str], port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _MediaWikiHandler)
        self.pages = pages  # title -> its intro extract
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


class _MediaWikiHandler(BaseHTTPRequestHandler):
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
        self._json(self._query(fake.pages, params))

    @staticmethod
    def _query(pages: dict[str, str], params: dict) -> dict:
        if params.get("list") == "search":
            words = params["srsearch"].lower().split()
            scored = [(sum(w in f"{t} {x}".lower() for w in words), t) for t, x in pages.items()]
            hits = [t for score, t in sorted(scored, key=lambda s: (-s[0], s[1])) if score][: int(params["srlimit"])]
            return {"batchcomplete": True, "query": {"search": [{"ns": 0, "title": t} for t in hits]}}
        if params.get("prop") == "extracts":
            asked = params["titles"].split("|")
            # The real API does not keep the order of `titles`; answering in reverse checks the client re-ranks.
            found = [{"ns": 0, "title": t, "extract": pages[t]} for t in reversed(asked) if t in pages]
            missing = [{"ns": 0, "title": t, "missing": True} for t in asked if t not in pages]
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


@contextlib.contextmanager
def mediawiki(pages: dict[str, str], port: int = 0) -> Iterator[FakeMediaWiki]:
    """A `FakeMediaWiki` over `pages`, answering properly, for as long as the block runs."""
    server = FakeMediaWiki(pages, port)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
