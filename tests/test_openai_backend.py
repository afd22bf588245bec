"""The OpenAI-compatible backend: retries on 429/5xx, load spread, usage, and a real vLLM server."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from distill.errors import DistillError
from distill.llm.base import Price
from distill.llm.openai_backend import OpenAIChat


class FlakyAPI(BaseHTTPRequestHandler):
    """A stand-in for a hosted API (which cannot be reached from here): fails `fail_first` times, then answers."""

    fail_first = 2
    calls = 0

    def do_POST(self):  # noqa: N802 (http.server API)
        type(self).calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls <= type(self).fail_first:
            self.send_response(429 if type(self).calls == 1 else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "slow down"}}')
            return
        body = {
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13},
        }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky_server():
    FlakyAPI.calls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_retries_429_and_5xx_then_records_usage_and_cost(flaky_server):
    model = OpenAIChat("m", [flaky_server], price=Price(1.0, 2.0), max_retries=3)
    out = asyncio.run(model.chat([{"role": "user", "content": "Capital of France?"}]))
    assert out.text == "Paris" and FlakyAPI.calls == 3
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (11, 2)
    assert out.cost_usd == pytest.approx((11 * 1.0 + 2 * 2.0) / 1e6)


def test_gives_up_after_max_retries(flaky_server):
    FlakyAPI.fail_first = 10
    try:
        model = OpenAIChat("m", [flaky_server], max_retries=1)
        with pytest.raises(Exception):
            asyncio.run(model.chat([{"role": "user", "content": "x"}]))
        assert FlakyAPI.calls == 2
    finally:
        FlakyAPI.fail_first = 2


def test_same_backend_works_across_event_loops_and_spreads_load(flaky_server):
    FlakyAPI.fail_first = 0
    try:
        model = OpenAIChat("m", [flaky_server, flaky_server.replace("127.0.0.1", "localhost")])
        for _ in range(2):  # each asyncio.run is a new loop: clients must be rebound, not reused
            asyncio.run(model.chat([{"role": "user", "content": "x"}]))

        async def burst():
            await asyncio.gather(*[model.chat([{"role": "user", "content": "x"}]) for _ in range(6)])

        asyncio.run(burst())
        assert sum(model.sent) == 8 and min(model.sent) >= 3
    finally:
        FlakyAPI.fail_first = 2


def test_clients_of_a_finished_event_loop_are_dropped_without_errors_in_the_next(flaky_server):
    """eval runs each method in its own asyncio.run: the previous loop's HTTP clients, collected during the
    next method, must not try to close their sockets on the new loop ('Event loop is closed' tracebacks)."""
    import gc

    FlakyAPI.fail_first, FlakyAPI.protocol_version = 0, "HTTP/1.1"  # keep-alive, like vLLM: sockets stay open
    try:
        model = OpenAIChat("m", [flaky_server])
        asyncio.run(model.chat([{"role": "user", "content": "x"}]))
        errors = []

        async def next_method():
            asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
            await model.chat([{"role": "user", "content": "x"}])  # rebinds: the old clients lose their last ref
            gc.collect()
            for _ in range(20):
                await asyncio.sleep(0.01)
            gc.collect()

        asyncio.run(next_method())
        assert not errors, [str(e.get("exception") or e.get("message")) for e in errors]
    finally:
        FlakyAPI.fail_first, FlakyAPI.protocol_version = 2, "HTTP/1.0"


def test_missing_key_env_and_unreachable_server_are_clear_errors(monkeypatch):
    monkeypatch.delenv("DISTILL_TEST_KEY", raising=False)
    with pytest.raises(DistillError, match="DISTILL_TEST_KEY"):
        OpenAIChat("m", api_key_env="DISTILL_TEST_KEY")
    model = OpenAIChat("m", ["http://127.0.0.1:9/v1"], max_retries=0, timeout_s=2)
    with pytest.raises(DistillError, match="cannot reach"):
        asyncio.run(model.chat([{"role": "user", "content": "x"}]))


class ServedModels(FlakyAPI):
    """A stand-in for vLLM's /v1/models: `planner` is a LoRA module whose `root` is the adapter folder."""

    root = ""

    def do_GET(self):  # noqa: N802
        body = json.dumps({"object": "list", "data": [
            {"id": "base", "object": "model", "root": "base", "parent": None},
            {"id": "planner", "object": "model", "root": type(self).root, "parent": "base"},
        ]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _save_adapter(folder, seed: int) -> None:
    """A real safetensors adapter file; another seed is another training run's weights."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    save_file({"lora_A.weight": torch.randn(8, 64, generator=gen), "lora_B.weight": torch.randn(64, 8, generator=gen)},
              str(folder / "adapter_model.safetensors"))


def test_a_retrained_adapter_served_under_the_same_name_misses_the_old_cache(tmp_path):
    from distill.llm.cached import CachedChat
    from distill.store import CallCache

    ServedModels.calls, ServedModels.fail_first, ServedModels.root = 0, 0, str(tmp_path / "adapter")
    server = ThreadingHTTPServer(("127.0.0.1", 0), ServedModels)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    cache = CallCache(tmp_path / "calls.sqlite")
    msgs = [{"role": "user", "content": "Capital of France?"}]

    def ask(base_url=url):
        model = CachedChat(OpenAIChat("planner", [base_url]), cache)  # a new run: identity asked afresh
        out = asyncio.run(model.chat(msgs))
        return out.cached, asyncio.run(model.identity())

    try:
        _save_adapter(tmp_path / "adapter", seed=0)
        cached, first = ask()
        assert not cached and first["servers"][0]["root"] == str(tmp_path / "adapter")
        assert ask() == (True, first)  # same server, same weights: answered from the cache
        _save_adapter(tmp_path / "adapter", seed=1)  # retrained, served again as `planner`
        cached, second = ask()
        assert not cached and second["servers"][0]["weights"] != first["servers"][0]["weights"]
        assert ServedModels.calls == 2
        # the same server on another port (the pipeline starts its servers on a free one): the same model
        again = ThreadingHTTPServer(("127.0.0.1", 0), ServedModels)
        threading.Thread(target=again.serve_forever, daemon=True).start()
        try:
            cached, third = ask(f"http://127.0.0.1:{again.server_address[1]}/v1")
        finally:
            again.shutdown()
        assert cached and third == second and ServedModels.calls == 2
    finally:
        server.shutdown()
        ServedModels.fail_first = 2
