"""Model-server faults: each one ends as one line naming the server and the fault, and a run survives them.

Fast tests: a fake OpenAI-compatible server of this file (a stand-in for a misbehaving hosted API, which
cannot be reached from here) answers every request with one fault; `distill ask` in a subprocess must say so
in one line and exit 2. Slow test: a fault-injecting proxy in front of the REAL vLLM CPU server, with a
`distill generate` run through it that must finish with every record.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from distill.llm.openai_backend import OpenAIChat
from fakes import serving

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "id": "x", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13},
}
HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"

# fault -> (status, headers, body or None to drop the connection, held: no answer until the test ends)
FAULTS: dict[str, tuple[int, dict, bytes | None, bool]] = {
    "no choices": (200, {}, json.dumps(GOOD | {"choices": []}).encode(), False),
    "null content": (200, {}, json.dumps(
        GOOD | {"choices": [{"index": 0, "message": {"role": "assistant", "content": None}}]}).encode(), False),
    "malformed json": (200, {}, b'{"choices": [{"message": {"content": "Par', False),
    "html": (200, {"Content-Type": "text/html"}, HTML, False),
    "429 retry-after": (429, {"Retry-After": "3600"}, b'{"error": {"message": "slow down"}}', False),
    "429": (429, {}, b'{"error": {"message": "rate limited"}}', False),
    "500": (500, {}, b'{"error": {"message": "internal error"}}', False),
    "503": (503, {}, b'{"error": {"message": "overloaded"}}', False),
    "dropped": (200, {}, None, False),
    "slow": (200, {}, json.dumps(GOOD).encode(), True),
    "400": (400, {}, b'{"error": {"message": "max_tokens is too large"}}', False),
    "401": (401, {}, b'{"error": {"message": "invalid api key"}}', False),
    "404": (404, {}, b'{"error": {"message": "The model `m` does not exist."}}', False),
}
# what the one-line error must say for each fault
SAYS = {
    "no choices": "no choices", "null content": "no text content", "malformed json": "malformed body",
    "html": "not JSON: '<html>", "429 retry-after": "HTTP 429: slow down", "429": "HTTP 429", "500": "HTTP 500",
    "503": "HTTP 503: overloaded", "dropped": "connection dropped", "slow": "no answer within 2s",
    "400": "HTTP 400: max_tokens is too large", "401": "HTTP 401: invalid api key", "404": "HTTP 404",
}
NOT_RETRIED = {"400", "401", "404"}


class FakeAPI(BaseHTTPRequestHandler):
    """Answers with `script[n]` for the n-th chat request (the last entry repeats); None is a good reply."""

    protocol_version = "HTTP/1.1"
    script: list[str | None] = [None]
    calls = 0
    release = threading.Event()  # held ("slow") answers wait for it: the client's timeout fires first, always

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        fault = cls.script[min(cls.calls, len(cls.script) - 1)]
        cls.calls += 1
        status, headers, body, held = FAULTS[fault] if fault else (200, {}, json.dumps(GOOD).encode(), False)
        if held:
            cls.release.wait(60)
        if body is None:
            self.close_connection = True
            self.connection.shutdown(2)  # the connection drops before any reply
            return
        try:
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client timed out and left (the "slow" fault)
            self.close_connection = True

    def do_GET(self):  # noqa: N802
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "root": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake():
    FakeAPI.script, FakeAPI.calls, FakeAPI.release = [None], 0, threading.Event()
    with serving(FakeAPI) as base:
        yield f"{base}/v1"
        FakeAPI.release.set()


def ask(url: str, *sets: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """timeout_s: only a held ("slow") answer should ever reach it; a prompt one never must, however loaded the
    machine, or the fault under test would turn into a timeout."""
    spec = ["backend=openai", f"base_url={url}", "model=m", "max_retries=1", f"timeout_s={timeout_s:g}",
            "max_retry_after_s=0.05"]
    argv = [sys.executable, "-m", "distill.cli", "ask", "What is 2 + 2?", "--set", "tools=[Calculator]"]
    for role in ("planner", "solver"):
        for s in spec:
            argv += ["--set", f"{role}.{s}"]
    for s in sets:
        argv += ["--set", s]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_server_fault_is_one_line_naming_server_and_fault(fake: str, fault: str) -> None:
    FakeAPI.script = [fault]
    done = ask(fake, timeout_s=2 if fault == "slow" else 60)
    err = done.stderr.strip()
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: model server {fake} (model m): ") and SAYS[fault] in err, err
    if fault in NOT_RETRIED:
        assert FakeAPI.calls == 1 and "attempt" not in err  # the caller's fault: asking again cannot help
    else:
        assert FakeAPI.calls == 2 and err.endswith("after 2 attempts")  # max_retries=1


@pytest.mark.parametrize("fault", [f for f in FAULTS if f not in NOT_RETRIED])
def test_a_passing_fault_is_retried_and_counted(fake: str, fault: str) -> None:
    FakeAPI.script = [fault, fault, None]
    # A held reply always outlasts the timeout; a prompt one must never: on a loaded machine a short timeout could
    # turn it into a timeout whose request the server answers later, shifting the script.
    timeout = 2.0 if fault == "slow" else 60.0
    model = OpenAIChat("m", [fake], max_retries=2, timeout_s=timeout, max_retry_after_s=0.05, backoff_s=0.01)
    out = asyncio.run(model.chat([{"role": "user", "content": "Capital of France?"}]))
    assert out.text == "Paris" and out.usage.prompt_tokens == 11
    assert model.retries == 2 and FakeAPI.calls == 3
    assert sum(model.faults.values()) == 2


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    from distill.core.retry import Fault, backoff_s, retry_after_s

    model = OpenAIChat("m", ["http://127.0.0.1:9/v1"], max_retry_after_s=60)
    assert backoff_s(0, Fault("429", "", True, wait_s=7.5), model.backoff_s, model.max_wait_s) == 7.5
    assert backoff_s(0, Fault("429", "", True, wait_s=3600), model.backoff_s, model.max_wait_s) == 60  # the cap
    assert 0 <= backoff_s(3, Fault("503", "", True), model.backoff_s, model.max_wait_s) <= 0.5 * 2**3  # jittered
    assert retry_after_s("12") == 12 and retry_after_s("soon") is None and retry_after_s(None) is None
    assert 50 < retry_after_s(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))) <= 61


# ---------------------------------------------------------------- slow: a fault-injecting proxy before real vLLM

# Every fault a real server's answer can be replaced by, except "slow": a client timeout would race the real
# model's answer time, which depends on the machine (float32 on a 2-core AVX2 laptop answers slower than any short
# timeout). The timeout fault is tested against the fake server above, whose held answer never comes.
PROXY_FAULTS = ("429 retry-after", "429", "500", "503", "dropped", "no choices", "null content", "html")


class FaultProxy:
    """HTTP proxy on 127.0.0.1 in front of a real server. Every `every`-th chat request gets the next fault of
    a seeded shuffle of PROXY_FAULTS instead of an answer; the rest are forwarded. It counts what it did.
    No request body is faulted twice: a retry that lands on a fault's turn is forwarded and the fault waits
    for the next new request, so whether one call exhausts its retries never hangs on how concurrent
    requests happened to interleave (at one in two, seven faults in a row for one call would otherwise be
    a matter of chance on a loaded machine).
    The client's timeout is far above any answer time, so no fault here depends on how fast the model answers."""

    def __init__(self, upstream: str, every: int = 3, seed: int = 0):
        self.upstream, self.every = upstream.rstrip("/"), every
        rng = random.Random(seed)
        self._order = list(PROXY_FAULTS)
        rng.shuffle(self._order)
        self.injected: Counter[str] = Counter()
        self.chat_requests = 0
        self.forwarded = 0
        self.pending = 0  # faults due but not yet given: their turn fell on a retry
        self._faulted: set[bytes] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        import httpx

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._client = httpx.AsyncClient(timeout=300)
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        await self._client.aclose()

    def _next_fault(self, body: bytes) -> str | None:
        self.chat_requests += 1
        self.pending += self.chat_requests % self.every == 0
        if not self.pending or body in self._faulted:
            return None
        self.pending -= 1
        self._faulted.add(body)
        fault = self._order[sum(self.injected.values()) % len(self._order)]
        self.injected[fault] += 1
        return fault

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            length = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
            body = await reader.readexactly(length) if length else b""
            fault = self._next_fault(body) if path.endswith("/chat/completions") else None
            if fault == "dropped":
                return  # closed without a word
            if fault:
                status, extra, payload, _ = FAULTS[fault]
                if fault == "429 retry-after":
                    extra = {"Retry-After": "1"}
            else:
                resp = await self._client.request(method, self.upstream + path, content=body,
                                                  headers={"Content-Type": "application/json"})
                self.forwarded += path.endswith("/chat/completions")
                status, extra, payload = resp.status_code, {}, resp.content
            out = [f"HTTP/1.1 {status} X", "Content-Type: application/json", f"Content-Length: {len(payload)}",
                   "Connection: close", *(f"{k}: {v}" for k, v in extra.items())]
            writer.write(("\r\n".join(out) + "\r\n\r\n").encode() + payload)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client left (its timeout), or the proxy is stopping
        finally:
            writer.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_generation_through_a_faulty_proxy_keeps_every_record(tmp_path: Path, vllm_server) -> None:
    import yaml

    with FaultProxy(vllm_server.url, every=2) as proxy:
        # timeout_s far above any answer of the real server, however slow the machine: no retry here is a timeout
        spec = {"backend": "openai", "model": "smollm2-135m-instruct", "base_url": f"http://127.0.0.1:{proxy.port}/v1",
                "timeout_s": 600, "max_retries": 6, "max_retry_after_s": 2, "max_concurrency": 8}
        cfg = {
            "planner": spec | {"max_tokens": 96, "temperature": 0.7, "stop": ["\nQuestion:"]},
            "solver": spec | {"max_tokens": 16},
            "llm_tool": spec | {"max_tokens": 24},
            "tools": ["Wikipedia", "LLM"],
            "wikipedia_corpus": str(ROOT / "data" / "demo" / "corpus.jsonl"),
            "tool_timeout_s": 120,
            "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data" / "demo" / "train.jsonl"), "split": "train", "n": 6}],
            "output_dir": str(tmp_path / "run"),
            "concurrency": 6,
        }
        (tmp_path / "gen.yaml").write_text(yaml.safe_dump(cfg))
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "distill.cli", "generate", "--config", str(tmp_path / "gen.yaml")],
                              cwd=ROOT, capture_output=True, text=True, timeout=800)
        wall = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert sorted(r["id"] for r in records) == sorted({r["id"] for r in records}) and len(records) == 6
    injected = sum(proxy.injected.values())
    print(f"\nproxy: {proxy.chat_requests} chat requests, {proxy.forwarded} answered, {injected} faults injected "
          f"{dict(sorted(proxy.injected.items()))}, retries {summary['retries']} {summary['faults']}, records {len(records)}/6, "
          f"generate wall {wall:.0f}s")
    assert set(proxy.injected) == set(PROXY_FAULTS)  # every kind, at the set rate of one request in two
    assert injected + proxy.pending == proxy.chat_requests // proxy.every  # one in `every`, none given twice
    assert proxy.chat_requests - proxy.forwarded == injected
    # Every answer the client received reached the cache, and every retry was an injected fault, which the client
    # named by its kind
    assert proxy.forwarded == summary["cache"]["model_misses"]
    assert summary["retries"] == injected
    client_kind = {"429 retry-after": "429", "html": "malformed body"}
    expected = Counter(client_kind.get(k, k) for k in proxy.injected.elements())
    assert summary["faults"] == dict(expected), (summary["faults"], dict(proxy.injected))
