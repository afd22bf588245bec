"""The running agent switches its planner (`POST /v1/admin/planner`) without dropping a request.

The fast tests put a gated fake model server behind the agent (`TwoModels`, a real HTTP server on loopback that
lists the modules `old` and `new`): holding its answers is the only way to know for certain that requests are in
flight while the swap happens. The slow test does the same on the session's real vLLM server: 16 questions in
flight, a second LoRA module loaded at runtime, the swap to it and the rollback, every request answered.
No test asserts a time: holds are released by the test, and waits for a condition only turn a hang into a failure.
"""

import asyncio
import json
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from distill.serving.agent_server import AgentServerConfig, check_planner_as_trained, token_of
from distill.tools.registry import tool_descriptions
from test_agent_server import PLAN, WAIT_S, agent_server, free_port, traces, uvicorn_thread, wait_for

ROOT = Path(__file__).resolve().parents[1]
LONG_S = 1800  # far above any answer on a loaded CPU: only turns a hang into a failure


class TwoModels:
    """A model server as vLLM runs one, listing each of `roots` ({module: root folder}) on /v1/models. The planner
    (a request with a system message) gets PLAN, the Solver `5`; while `gate` is clear every chat request waits
    for it, and while `models_gate` is clear so does /v1/models. `planned` is the model of each planner call."""

    def __init__(self) -> None:
        from fastapi import FastAPI, Request

        self.gate, self.models_gate = threading.Event(), threading.Event()
        self.gate.set()
        self.models_gate.set()
        self.arrived = 0
        self.planned: list[str] = []
        self.roots = {"old": "old", "new": "new"}
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            planner = body["messages"][0]["role"] == "system"
            if planner:
                self.planned.append(body["model"])
            self.arrived += 1
            await asyncio.to_thread(self.gate.wait)
            return {"id": "x", "object": "chat.completion", "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": PLAN if planner else "5"},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}

        @app.get("/v1/models")
        async def models():
            await asyncio.to_thread(self.models_gate.wait)
            return {"object": "list", "data": [{"id": name, "object": "model", "root": root}
                                               for name, root in self.roots.items()]}

        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def models():
    fake = TwoModels()
    with uvicorn_thread(fake.app, fake.port):
        try:
            yield fake
        finally:
            fake.gate.set()
            fake.models_gate.set()


def swap_config(tmp_path: Path, url: str, **over) -> AgentServerConfig:
    spec = {"backend": "openai", "base_url": url, "model": "old", "max_retries": 0, "timeout_s": WAIT_S}
    data = {"name": "swap-agent", "planner": spec, "solver": spec | {"model": "solver", "max_tokens": 16},
            "tools": ["Calculator"], "planner_prompt": "full", "traces_dir": str(tmp_path / "traces"),
            "planner_round": 0, "max_in_flight": 32, "request_timeout_s": LONG_S,
            "probe_timeout_s": 60} | over  # the most it may be: a loaded CI must not turn the probe into a 503
    return AgentServerConfig.model_validate(data)


def record(folder: Path, prompt: str, tools: list[str]) -> Path:
    """An adapter folder as `distill train` leaves it, as far as the as-trained check reads it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "distill_adapter.json").write_text(json.dumps({"student_prompt": prompt,
                                                             "tools": tool_descriptions(tools)}))
    return folder


def ask_in_threads(base: str, questions: list[str], out: dict, headers: dict | None = None,
                   model: str = "swap-agent") -> list[threading.Thread]:
    """Each question posted from a thread of its own; `out[question]` = (status, body)."""
    def ask(q: str) -> None:
        r = httpx.post(f"{base}/v1/chat/completions", headers=headers or {}, timeout=LONG_S,
                       json={"model": model, "messages": [{"role": "user", "content": q}]})
        out[q] = (r.status_code, r.json())

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    return threads


def metric(text: str, name: str) -> str:
    return next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " "))


# ------------------------------------------------------------------------------------------ fast: fake upstream

def test_swap_while_requests_are_held_keeps_each_on_the_planner_it_started_with(tmp_path, models):
    cfg = swap_config(tmp_path, models.url)
    replies: dict = {}
    models.gate.clear()
    with agent_server(cfg) as (base, _), httpx.Client(base_url=base, timeout=WAIT_S) as h:
        first = [f"What is {i} + 1?" for i in range(4)]
        threads = ask_in_threads(base, first, replies)
        wait_for(lambda: models.arrived == 4, "the first requests to reach the planner")
        swapped = h.post("/v1/admin/planner", json={"model": "new", "adapter": "/runs/round_1/adapter", "round": 1})
        assert swapped.status_code == 200, swapped.text  # while the first four are still held
        second = [f"What is {i} + 2?" for i in range(4)]
        threads += ask_in_threads(base, second, replies)
        wait_for(lambda: models.arrived == 8, "the second requests to reach the planner")
        models.gate.set()
        for t in threads:
            t.join(WAIT_S)
        now = h.get("/v1/admin/planner").json()
        back = h.post("/v1/admin/planner", json={"model": "old", "round": 0})
        metrics = h.get("/metrics").text
    body = swapped.json()
    assert (body["object"], body["model"], body["adapter"], body["round"]) == \
        ("planner", "new", "/runs/round_1/adapter", 1)
    assert {k: body["previous"][k] for k in ("model", "adapter", "round")} == {"model": "old", "adapter": None,
                                                                              "round": 0}
    assert now == {k: body[k] for k in ("object", "model", "adapter", "round", "since")}
    assert back.status_code == 200 and back.json()["model"] == "old" and back.json()["previous"]["model"] == "new"
    assert [replies[q][0] for q in first + second] == [200] * 8
    assert models.planned == ["old"] * 4 + ["new"] * 4
    by_id = {t["id"]: t for t in traces(cfg)}
    for questions, model, adapter, round_ in ((first, "old", None, 0), (second, "new", "/runs/round_1/adapter", 1)):
        for q in questions:
            trace = by_id[replies[q][1]["id"]]
            assert trace["planner"]["model"] == model
            served = trace["served"]
            assert (served["planner_model"], served["adapter"], served["round"]) == (model, adapter, round_)
    assert metric(metrics, "distill_agent_planner_round") == "0"  # rolled back to round 0
    assert metric(metrics, "distill_agent_planner_swaps_total") == "2"


def test_a_model_the_server_does_not_list_is_404_and_the_old_planner_stays(tmp_path, models):
    cfg = swap_config(tmp_path, models.url)
    with agent_server(cfg) as (base, _), httpx.Client(base_url=base, timeout=WAIT_S) as h:
        refused = h.post("/v1/admin/planner", json={"model": "round_9", "round": 9})
        after = h.get("/v1/admin/planner").json()
        reply = h.post("/v1/chat/completions", json={"model": "swap-agent",
                                                     "messages": [{"role": "user", "content": "What is 2 + 3?"}]})
        metrics = h.get("/metrics").text
    assert refused.status_code == 404
    error = refused.json()["error"]
    assert error["code"] == "model_not_found" and "round_9" in error["message"] and "\n" not in error["message"]
    assert (after["model"], after["round"]) == ("old", 0)
    assert reply.status_code == 200, reply.text
    [trace] = traces(cfg)
    assert trace["planner"]["model"] == "old" and trace["served"]["planner_model"] == "old"
    assert metric(metrics, "distill_agent_planner_swaps_total") == "0"


def test_an_adapter_trained_on_another_prompt_is_422_and_one_as_trained_names_its_folder(tmp_path, models):
    other = record(tmp_path / "round_2", "compact", ["Wikipedia", "LLM"])
    same = record(tmp_path / "round_3", "full", ["Calculator"])
    models.roots |= {"round_2": str(other), "round_3": str(same)}
    cfg = swap_config(tmp_path, models.url)
    with agent_server(cfg) as (base, _), httpx.Client(base_url=base, timeout=WAIT_S) as h:
        refused = h.post("/v1/admin/planner", json={"model": "round_2", "round": 2})
        kept = h.get("/v1/admin/planner").json()
        taken = h.post("/v1/admin/planner", json={"model": "round_3", "round": 3})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "not_as_trained" and "trained on prompt compact" in error["message"]
    assert "\n" not in error["message"] and kept["model"] == "old"
    assert taken.status_code == 200 and taken.json()["adapter"] == str(same)  # the server's word, not the body's


def test_a_planner_server_down_or_silent_is_503_and_nothing_changes(tmp_path, models):
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    cfg = swap_config(tmp_path, dead)
    with agent_server(cfg) as (base, _), httpx.Client(base_url=base, timeout=WAIT_S) as h:
        down = h.post("/v1/admin/planner", json={"model": "new"})
        assert h.get("/v1/admin/planner").json()["model"] == "old"
    assert down.status_code == 503 and down.json()["error"]["code"] == "upstream_unavailable"
    silent = swap_config(tmp_path / "silent", models.url, probe_timeout_s=0.5)
    models.models_gate.clear()  # /v1/models holds every request until the test ends
    with agent_server(silent) as (base, _), httpx.Client(base_url=base, timeout=WAIT_S) as h:
        slow = h.post("/v1/admin/planner", json={"model": "new"})
        assert h.get("/v1/admin/planner").json()["model"] == "old"
    models.models_gate.set()
    assert slow.status_code == 503 and slow.json()["error"]["code"] == "upstream_unavailable"
    assert "probe_timeout_s" in slow.json()["error"]["message"]


BAD_BODIES = {
    "bad name": {"model": "round 1"},
    "no model": {"round": 1},
    "extra key": {"model": "new", "force": True},
    "negative round": {"model": "new", "round": -1},
    "round too big": {"model": "new", "round": 1_000_001},
    "round as text": {"model": "new", "round": "1"},
    "round as bool": {"model": "new", "round": True},
    "adapter too long": {"model": "new", "adapter": "x" * 4097},
    "adapter empty": {"model": "new", "adapter": ""},
    "a list": [{"model": "new"}],
    "a string": "new",
}


def test_a_bad_body_is_400_in_one_line_and_nothing_changes(tmp_path, models):
    cfg = swap_config(tmp_path, models.url)
    with agent_server(cfg) as (base, _), httpx.Client(base_url=base, timeout=WAIT_S) as h:
        replies = {name: h.post("/v1/admin/planner", json=body) for name, body in BAD_BODIES.items()}
        replies["not json"] = h.post("/v1/admin/planner", content=b"{model: new")
        after = h.get("/v1/admin/planner").json()
    assert {name: r.status_code for name, r in replies.items()} == {name: 400 for name in replies}
    for r in replies.values():
        error = r.json()["error"]
        assert error["code"] in ("invalid_request", "invalid_json") and "\n" not in error["message"]
    assert (after["model"], after["round"]) == ("old", 0)


def test_the_admin_routes_need_the_bearer_token(tmp_path, models, monkeypatch):
    token = "swap-" + "s3cr3t" * 4
    monkeypatch.setenv("SWAP_TEST_BEARER", token)
    cfg = swap_config(tmp_path, models.url, auth_token_env="SWAP_TEST_BEARER")
    with agent_server(cfg, token=token_of(cfg)) as (base, _), httpx.Client(base_url=base, timeout=WAIT_S) as h:
        statuses = {}
        for name, headers in (("none", {}), ("wrong", {"Authorization": "Bearer not-the-token-at-all"})):
            statuses[f"post {name}"] = h.post("/v1/admin/planner", headers=headers, json={"model": "new"}).status_code
            statuses[f"get {name}"] = h.get("/v1/admin/planner", headers=headers).status_code
        unchanged = h.get("/v1/admin/planner", headers={"Authorization": f"Bearer {token}"}).json()
        swapped = h.post("/v1/admin/planner", headers={"Authorization": f"Bearer {token}"}, json={"model": "new"})
    assert statuses == {"post none": 401, "get none": 401, "post wrong": 401, "get wrong": 401}
    assert unchanged["model"] == "old"
    assert swapped.status_code == 200 and swapped.json()["model"] == "new"


def test_planner_round_is_bounded_and_the_start_names_the_served_adapter(tmp_path):
    from distill.serving.agent_server import AgentService
    from fakes import chat_api

    for bad in (-1, 1_000_001, True, "2"):
        with pytest.raises(ValidationError, match="planner_round"):
            swap_config(tmp_path, "http://127.0.0.1:1/v1", planner_round=bad)
    folder = record(tmp_path / "round_0", "full", ["Calculator"])
    with chat_api(adapter=str(folder)) as api:
        spec = {"backend": "openai", "base_url": api.url, "model": "planner", "max_retries": 0}
        cfg = swap_config(tmp_path, api.url, planner=spec, planner_round=5)
        found = check_planner_as_trained(cfg)  # what `distill serve-agent` passes to its service at start
    assert found == str(folder)
    service = AgentService(cfg, adapter=found)
    service.traces.close()
    assert {k: service.planner[k] for k in ("model", "adapter", "round")} == \
        {"model": "planner", "adapter": str(folder), "round": 5}
    assert metric(service.metrics.text(), "distill_agent_planner_round") == "5"


# ------------------------------------------------------------------------------------------ slow: real vLLM server

def test_real_vllm_swap_and_rollback_under_16_requests_in_flight(tmp_path, vllm_server, lora_adapter):
    """16 questions in flight on the student module `planner`, the swap to a second module loaded at runtime
    (`round_1`, a copy of the test adapter recorded as trained on this agent's prompt and tools), more questions,
    the rollback while those run, more questions: none fails, and each trace names the planner it was asked of."""
    from tests.conftest import BASE_NAME

    token = "real-swap-" + "t0k3n" * 4
    url = vllm_server.base_url
    round_1 = record(Path(shutil.copytree(lora_adapter, tmp_path / "round_1")), "full", ["Calculator"])
    cfg = AgentServerConfig.model_validate({
        "name": "swap-agent", "planner_prompt": "full", "tools": ["Calculator"], "planner_round": 0,
        "planner": {"backend": "openai", "base_url": url, "model": "planner", "max_tokens": 48, "timeout_s": LONG_S},
        "solver": {"backend": "openai", "base_url": url, "model": BASE_NAME, "max_tokens": 8, "timeout_s": LONG_S},
        "max_in_flight": 32, "request_timeout_s": LONG_S, "traces_dir": str(tmp_path / "traces")})
    auth = {"Authorization": f"Bearer {token}"}
    replies: dict = {}
    batches = {"before": [f"What is {i} * 7?" for i in range(16)], "swapped": [f"What is {i} * 11?" for i in range(6)],
               "rolled back": [f"What is {i} * 13?" for i in range(4)]}
    with httpx.Client(base_url=vllm_server.url, timeout=LONG_S) as v:
        loaded = v.post("/v1/load_lora_adapter", json={"lora_name": "round_1", "lora_path": str(round_1)})
        assert loaded.status_code == 200, loaded.text
        try:
            with agent_server(cfg, token=token) as (base, service), \
                    httpx.Client(base_url=base, timeout=LONG_S) as h:
                def started(n: int):
                    return lambda: service.metrics.in_flight + service.traces.written >= n

                assert h.post("/v1/admin/planner", json={"model": "round_1"}).status_code == 401
                threads = ask_in_threads(base, batches["before"], replies, auth)
                wait_for(started(16), "the first 16 requests to start")
                swap = h.post("/v1/admin/planner", headers=auth, json={"model": "round_1", "round": 1})
                in_flight_at_swap = service.metrics.in_flight
                threads += ask_in_threads(base, batches["swapped"], replies, auth)
                wait_for(started(22), "the requests after the swap to start")
                unknown = h.post("/v1/admin/planner", headers=auth, json={"model": "round_99", "round": 99})
                bad = h.post("/v1/admin/planner", headers=auth, json={"model": "planner", "round": -1})
                rollback = h.post("/v1/admin/planner", headers=auth, json={"model": "planner", "round": 0})
                threads += ask_in_threads(base, batches["rolled back"], replies, auth)
                for t in threads:
                    t.join(LONG_S)
                final = h.get("/v1/admin/planner", headers=auth).json()
        finally:
            assert v.post("/v1/unload_lora_adapter", json={"lora_name": "round_1"}).status_code == 200
    print(f"requests in flight when the swap answered: {in_flight_at_swap}")
    assert swap.status_code == 200, swap.text
    assert (swap.json()["model"], swap.json()["adapter"], swap.json()["round"]) == ("round_1", str(round_1), 1)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert bad.status_code == 400
    assert rollback.status_code == 200 and rollback.json()["previous"]["model"] == "round_1"
    assert (final["model"], final["adapter"], final["round"]) == ("planner", None, 0)
    asked = [q for qs in batches.values() for q in qs]
    failed = {q: replies.get(q) for q in asked if replies.get(q, (None,))[0] != 200}
    assert failed == {}
    by_id = {t["id"]: t for t in traces(cfg)}
    expect = {"before": ("planner", None, 0), "swapped": ("round_1", str(round_1), 1),
              "rolled back": ("planner", None, 0)}
    for batch, questions in batches.items():
        for q in questions:
            trace = by_id[replies[q][1]["id"]]
            served = trace["served"]
            assert (served["planner_model"], served["adapter"], served["round"]) == expect[batch], (batch, q)
            assert trace["planner"]["model"] == expect[batch][0] and served["status"] == 200
