"""The OpenAI-compatible backend: retries on 429/5xx, load spread, usage, and a real vLLM server."""

from __future__ import annotations

import asyncio

import pytest

from distill.core.errors import DistillError
from distill.llm.base import Price
from distill.llm.openai_backend import OpenAIChat
from fakes import chat_api, serving


@pytest.fixture
def flaky():
    """A stand-in for a hosted API (which cannot be reached from here): fails twice, then answers."""
    with chat_api(fail_first=2) as api:
        yield api


def test_retries_429_and_5xx_then_records_usage_and_cost(flaky):
    model = OpenAIChat("m", [flaky.url], price=Price(1.0, 2.0), max_retries=3)
    out = asyncio.run(model.chat([{"role": "user", "content": "Capital of France?"}]))
    assert out.text == "Paris" and flaky.calls == 3
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (11, 2)
    assert out.cost_usd == pytest.approx((11 * 1.0 + 2 * 2.0) / 1e6)


def test_gives_up_after_max_retries(flaky):
    flaky.fail_first = 10
    model = OpenAIChat("m", [flaky.url], max_retries=1)
    with pytest.raises(Exception):
        asyncio.run(model.chat([{"role": "user", "content": "x"}]))
    assert flaky.calls == 2


def test_same_backend_works_across_event_loops_and_spreads_load(flaky):
    flaky.fail_first = 0
    model = OpenAIChat("m", [flaky.url, flaky.url.replace("127.0.0.1", "localhost")])
    for _ in range(2):  # each asyncio.run is a new loop: clients must be rebound, not reused
        asyncio.run(model.chat([{"role": "user", "content": "x"}]))

    async def burst():
        await asyncio.gather(*[model.chat([{"role": "user", "content": "x"}]) for _ in range(6)])

    asyncio.run(burst())
    assert sum(model.sent) == 8 and min(model.sent) >= 3


def test_clients_of_a_finished_event_loop_are_dropped_without_errors_in_the_next(flaky):
    """eval runs each method in its own asyncio.run: the previous loop's HTTP clients, collected during the
    next method, must not try to close their sockets on the new loop ('Event loop is closed' tracebacks)."""
    import gc

    flaky.fail_first, flaky.handler.protocol_version = 0, "HTTP/1.1"  # keep-alive, like vLLM: sockets stay open
    model = OpenAIChat("m", [flaky.url])
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


def test_missing_key_env_and_unreachable_server_are_clear_errors(monkeypatch):
    monkeypatch.delenv("DISTILL_TEST_KEY", raising=False)
    with pytest.raises(DistillError, match="DISTILL_TEST_KEY"):
        OpenAIChat("m", api_key_env="DISTILL_TEST_KEY")
    model = OpenAIChat("m", ["http://127.0.0.1:9/v1"], max_retries=0, timeout_s=2)
    with pytest.raises(DistillError, match="cannot reach"):
        asyncio.run(model.chat([{"role": "user", "content": "x"}]))


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
    from distill.core.store import CallCache

    cache = CallCache(tmp_path / "calls.sqlite")
    msgs = [{"role": "user", "content": "Capital of France?"}]

    with chat_api(adapter=str(tmp_path / "adapter")) as api:
        def ask(base_url=api.url):
            model = CachedChat(OpenAIChat("planner", [base_url]), cache)  # a new run: identity asked afresh
            out = asyncio.run(model.chat(msgs))
            return out.cached, asyncio.run(model.identity())

        _save_adapter(tmp_path / "adapter", seed=0)
        cached, first = ask()
        assert not cached and first["servers"][0]["root"] == str(tmp_path / "adapter")
        assert ask() == (True, first)  # same server, same weights: answered from the cache
        _save_adapter(tmp_path / "adapter", seed=1)  # retrained, served again as `planner`
        cached, second = ask()
        assert not cached and second["servers"][0]["weights"] != first["servers"][0]["weights"]
        assert api.calls == 2
        # the same server on another port (the pipeline starts its servers on a free one): the same model
        with serving(api.handler) as again:
            cached, third = ask(f"{again}/v1")
        assert cached and third == second and api.calls == 2


def test_an_idle_connection_is_not_reused_near_the_servers_keep_alive_deadline():
    """uvicorn (vLLM's server, the agent server) closes a connection idle for 5 s. A client that reuses one that
    long gets its request reset as the server closes it (ReadError), which with `max_retries: 0` stops a run. The
    pool reuses a connection while it is fresh and drops it once idle for KEEPALIVE_EXPIRY_S, well before that.
    Served by a real uvicorn server with its default keep-alive, as vLLM's is."""
    import json
    import threading
    import time

    import uvicorn

    from distill.core.retry import KEEPALIVE_EXPIRY_S
    from distill.serving.serve import free_port

    ports: list[int] = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        ports.append(scope["client"][1])  # the client's end of the connection this request came on
        body = json.dumps({"choices": [{"message": {"content": "Paris"}}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    assert server.config.timeout_keep_alive == 5 and KEEPALIVE_EXPIRY_S < server.config.timeout_keep_alive
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        model = OpenAIChat("m", [f"http://127.0.0.1:{port}/v1"], max_retries=0)

        async def three_calls():
            ask = [{"role": "user", "content": "Capital of France?"}]
            await model.chat(ask)
            await model.chat(ask)  # at once: the same connection
            await asyncio.sleep(KEEPALIVE_EXPIRY_S + 0.5)  # idle past the pool's expiry, short of the server's 5 s
            return await model.chat(ask)

        assert asyncio.run(three_calls()).text == "Paris"
        assert ports[0] == ports[1] and ports[2] != ports[1], ports
    finally:
        server.should_exit = True
        thread.join(timeout=10)
