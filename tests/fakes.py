"""Stand-ins for servers the tests cannot use: hosted APIs and the Hub, which cannot be reached from here, and a
vLLM server with a LoRA module loaded, too slow to start for a test that needs only what its /v1/models says.
Each is a real HTTP server on 127.0.0.1, so the client under test (httpx, openai, huggingface_hub) runs as it does
against the real one."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
