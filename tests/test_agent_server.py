"""The agent as a service (`distill serve-agent`): the OpenAI-shaped endpoint, its guard rails, its traces and the
traces as a dataset source.

Two kinds of upstream. The fast tests put an in-process fake OpenAI-compatible server (`FakeUpstream`, a real
HTTP server on loopback) in place of the model server: it stands in for vLLM where a test must control *when* a
model answers (hold a request to fill the server, to send SIGTERM mid-request, to outlast a deadline), which a real
model cannot be made to do. Everything else is real: the agent built by the factory `distill eval` uses, the
Worker and its tools, uvicorn, the `openai` client, the traces on disk. The slow tests (`vllm_server`) put the
session's real vLLM server behind the agent: the student LoRA module `planner` plans, the base model solves.
No test asserts a time: holds are released by the test, deadlines against the real server are far above any
answer time, and waits for a condition have generous limits that only turn a hang into a failure.
"""


import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from distill.serving.agent_server import AgentServerConfig, AgentService, build_app, token_of
from distill.core.errors import DistillError
from distill.rewoo.record import TrajectoryRecord
from distill.core.store import read_jsonl
from distill.core.traces import TraceLog, trace_files
from fakes import chat_api

ROOT = Path(__file__).resolve().parents[1]
PLAN = "Plan: add the numbers.\n#E1 = Calculator[2 + 3]"
SHOUT_PLAN = "Plan: shout it.\n#E1 = Shout[hello]"
WAIT_S = 60  # the longest a test waits for a condition before calling it a hang


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str, poll_s: float = 0.02) -> None:
    """Polls a bounded number of times (at least WAIT_S of sleeping), reading no clock."""
    for _ in range(int(WAIT_S / poll_s)):
        if condition():
            return
        time.sleep(poll_s)
    raise AssertionError(f"gave up waiting for {what}")


def wait_until_up(proc: subprocess.Popen, base: str) -> None:
    """`distill serve-agent` in a subprocess answers /health; if it dies first, its output is the failure."""
    def up() -> bool:
        try:
            return httpx.get(f"{base}/health", timeout=WAIT_S).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, proc.stdout.read()
            return False

    wait_for(up, "the agent server to start")


@contextmanager
def uvicorn_thread(app, port: int):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "the server to start")
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(WAIT_S)


class FakeUpstream:
    """Stands in for a model server (vLLM's OpenAI API): the planner (a request with a system message) gets
    PLAN, the Solver gets `5`. While `gate` is clear, every request waits for it: `arrived` counts them."""

    def __init__(self) -> None:
        from fastapi import FastAPI, Request

        self.gate = threading.Event()
        self.gate.set()
        self.arrived = 0
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.arrived += 1
            await asyncio.to_thread(self.gate.wait)
            planner = body["messages"][0]["role"] == "system"
            shout = "shout" in body["messages"][-1]["content"]
            text = (SHOUT_PLAN if shout else PLAN) if planner else ("HELLO" if shout else "5")
            return {"id": "x", "object": "chat.completion", "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture(scope="module")
def upstream():
    fake = FakeUpstream()
    with uvicorn_thread(fake.app, fake.port):
        yield fake


def agent_config(tmp_path: Path, url: str, **over) -> AgentServerConfig:
    spec = {"backend": "openai", "base_url": url, "model": "fake", "max_retries": 0, "timeout_s": 30}
    data = {"name": "test-agent", "planner": spec, "solver": spec | {"max_tokens": 16}, "tools": ["Calculator"],
            "planner_prompt": "full", "traces_dir": str(tmp_path / "traces"), "port": 0,
            "probe_timeout_s": 60} | over  # the most it may be: on a loaded CI the fake's answer may be slow
    return AgentServerConfig.model_validate(data)


@contextmanager
def agent_server(cfg: AgentServerConfig, token: str | None = None):
    service = AgentService(cfg, token=token)
    port = free_port()
    with uvicorn_thread(build_app(service), port):
        yield f"http://127.0.0.1:{port}", service


def client(base: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=WAIT_S)


def traces(cfg: AgentServerConfig) -> list[dict]:
    return [r for path in trace_files(cfg.traces_dir) for r in read_jsonl(path, TrajectoryRecord)]


# ------------------------------------------------------------------------------------------ fast: fake upstream

def test_plain_reply_carries_answer_plan_evidence_usage_and_is_traced(tmp_path, upstream):
    cfg = agent_config(tmp_path, upstream.url)
    with agent_server(cfg) as (base, _):
        reply = client(base).chat.completions.create(
            model="test-agent", messages=[{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "What is 2 + 3?"}])
        models = client(base).models.list()
    assert [m.id for m in models.data] == ["test-agent"]
    assert reply.choices[0].message.content == "5"
    rewoo = reply.model_extra["rewoo"]
    assert rewoo["plan"]["valid"] is True
    assert [(e["tool"], e["input"], e["output"], e["status"]) for e in rewoo["evidence"]] == \
        [("Calculator", "2 + 3", "5", "ok")]
    assert rewoo["usage"]["model_calls"] == 2 and rewoo["usage"]["tokens"]["total"] == 28
    assert reply.usage.prompt_tokens == 22 and reply.usage.completion_tokens == 6
    [trace] = traces(cfg)
    assert trace["id"] == reply.id and trace["question"] == "What is 2 + 3?" and trace["prediction"] == "5"
    assert trace["served"]["status"] == 200 and trace["method"] == "test-agent"


def test_stream_sends_plan_then_steps_then_answer_then_done(tmp_path, upstream):
    cfg = agent_config(tmp_path, upstream.url)
    with agent_server(cfg) as (base, _):
        chunks = list(client(base).chat.completions.create(
            model="test-agent", messages=[{"role": "user", "content": "What is 2 + 3?"}], stream=True))
    events = [(c.model_extra.get("rewoo") or {}).get("event") for c in chunks]
    assert events == [None, "plan", "step", None, "done"]
    assert chunks[1].model_extra["rewoo"]["plan"]["steps"][0]["tool"] == "Calculator"
    assert chunks[2].model_extra["rewoo"]["step"]["output"] == "5"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "5"
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage.total_tokens == 28
    assert {c.id for c in chunks} == {traces(cfg)[0]["id"]}


class Shout:
    """A tool of the user's own (`module:Class`), as a config names one."""

    name = "Shout"
    description = "Shout[text]: the text in capitals."

    async def run(self, query: str) -> str:
        return query.upper()


def test_own_tools_from_the_config_are_served(tmp_path, upstream):
    cfg = agent_config(tmp_path, upstream.url, tools=["Calculator", f"{__name__}:Shout"])
    with agent_server(cfg) as (base, _):
        reply = client(base).chat.completions.create(
            model="test-agent", messages=[{"role": "user", "content": "shout hello"}])
    [step] = reply.model_extra["rewoo"]["evidence"]
    assert (step["tool"], step["output"], step["status"]) == ("Shout", "HELLO", "ok")


def test_bad_requests_are_one_openai_error_each(tmp_path, upstream):
    cfg = agent_config(tmp_path, upstream.url, max_question_chars=50, max_messages=3, max_body_bytes=2048)
    with agent_server(cfg) as (base, _):
        c = client(base)
        with pytest.raises(openai.NotFoundError) as exc:
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert exc.value.body["code"] == "model_not_found"
        cases = {
            "question_too_long": [{"role": "user", "content": "x" * 51}],
            "invalid_request": [{"role": "user", "content": "hi"}] * 4,
        }
        for code, messages in cases.items():
            with pytest.raises(openai.BadRequestError) as exc:
                c.chat.completions.create(model="test-agent", messages=messages)
            assert exc.value.body["code"] == code
        with httpx.Client(base_url=base, timeout=WAIT_S) as h:
            replies = {
                "no user": h.post("/v1/chat/completions", json={"model": "test-agent",
                                                                "messages": [{"role": "system", "content": "x"}]}),
                "not json": h.post("/v1/chat/completions", content=b"{nope"),
                "bad role": h.post("/v1/chat/completions", json={"model": "test-agent",
                                                                 "messages": [{"role": "robot", "content": "x"}]}),
                "control": h.post("/v1/chat/completions", json={"model": "test-agent",
                                                                "messages": [{"role": "user", "content": "a\x00b"}]}),
                "too big": h.post("/v1/chat/completions", content=b"x" * 4096),
                "no route": h.get("/v2/nothing"),
                "wrong method": h.get("/v1/chat/completions"),
            }
    statuses = {name: r.status_code for name, r in replies.items()}
    assert statuses == {"no user": 400, "not json": 400, "bad role": 400, "control": 400, "too big": 413,
                        "no route": 404, "wrong method": 405}
    for r in replies.values():
        error = r.json()["error"]
        assert set(error) == {"message", "type", "code"} and "\n" not in error["message"]
        assert "Traceback" not in r.text
    assert traces(cfg) == []  # refused before any model call


def test_auth_token_required_and_never_shown(tmp_path, upstream, monkeypatch):
    token = "tok-" + "s3cr3t" * 4
    monkeypatch.setenv("AGENT_TEST_BEARER", token)
    cfg = agent_config(tmp_path, upstream.url, auth_token_env="AGENT_TEST_BEARER")
    with agent_server(cfg, token=token_of(cfg)) as (base, _):
        for key in ("wrong-key-123456789", None):
            with httpx.Client(base_url=base, timeout=WAIT_S) as h:
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                r = h.post("/v1/chat/completions", headers=headers,
                           json={"model": "test-agent", "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
                assert h.get("/metrics", headers=headers).status_code == 401
                assert h.get("/health").status_code == 200  # a load balancer's probe needs no token
        reply = client(base, token).chat.completions.create(
            model="test-agent", messages=[{"role": "user", "content": f"is {token} a key?"}])
    assert reply.choices[0].message.content == "5"
    written = "".join(p.read_text() for p in Path(cfg.traces_dir).iterdir())
    assert token not in written and "***" in written


def test_refuses_to_start_off_loopback_without_a_token(tmp_path, upstream, monkeypatch, capsys):
    from distill.cli import main

    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"host": "0.0.0.0", "traces_dir": str(tmp_path / "t"),
                                  "planner": {"backend": "openai", "base_url": upstream.url, "model": "fake"}}))
    assert main(["serve-agent", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "auth_token_env" in err and len(err.strip().splitlines()) == 1
    monkeypatch.delenv("NOT_SET_BEARER", raising=False)
    cfg = agent_config(tmp_path, upstream.url, auth_token_env="NOT_SET_BEARER")
    with pytest.raises(DistillError, match="NOT_SET_BEARER is not set"):
        token_of(cfg)
    assert main(["serve-agent", "--config", str(config), "--set", "max_in_flight=0"]) == 2
    assert "max_in_flight" in capsys.readouterr().err


def test_overload_is_429_with_retry_after(tmp_path, upstream):
    cfg = agent_config(tmp_path, upstream.url, max_in_flight=1, retry_after_s=7)
    upstream.gate.clear()
    before = upstream.arrived
    results = {}
    try:
        with agent_server(cfg) as (base, _):
            def first():
                results["first"] = client(base).chat.completions.create(
                    model="test-agent", messages=[{"role": "user", "content": "What is 2 + 3?"}])

            thread = threading.Thread(target=first)
            thread.start()
            wait_for(lambda: upstream.arrived > before, "the first request to reach the model")
            with httpx.Client(base_url=base, timeout=WAIT_S) as h:
                r = h.post("/v1/chat/completions",
                           json={"model": "test-agent", "messages": [{"role": "user", "content": "again"}]})
                assert r.status_code == 429 and r.headers["retry-after"] == "7"
                assert r.json()["error"]["code"] == "too_many_requests"
                upstream.gate.set()
                thread.join(WAIT_S)
                metrics = h.get("/metrics").text
    finally:
        upstream.gate.set()
    assert results["first"].choices[0].message.content == "5"
    assert 'distill_agent_requests_total{path="/v1/chat/completions",status="429"} 1' in metrics
    assert 'distill_agent_requests_total{path="/v1/chat/completions",status="200"} 1' in metrics
    assert "distill_agent_in_flight 0" in metrics and 'distill_agent_tokens_total{role="planner"} 14' in metrics


def test_dead_or_slow_model_endpoint_is_503_and_traced(tmp_path, upstream):
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    cfg = agent_config(tmp_path, dead)
    with agent_server(cfg) as (base, _):
        with pytest.raises(openai.InternalServerError) as exc:
            client(base).chat.completions.create(model="test-agent", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 503 and exc.value.body["code"] == "upstream_unavailable"
    assert "\n" not in exc.value.body["message"]
    # slow: the model holds every request (until the test releases it), the deadline is what answers
    slow = agent_config(tmp_path / "slow", upstream.url, request_timeout_s=0.5)
    upstream.gate.clear()
    try:
        with agent_server(slow) as (base, _):
            with pytest.raises(openai.InternalServerError) as exc:
                client(base).chat.completions.create(model="test-agent", messages=[{"role": "user", "content": "hi"}])
    finally:
        upstream.gate.set()
    assert exc.value.status_code == 503 and exc.value.body["code"] == "upstream_timeout"
    [failed] = traces(slow)
    assert failed["served"]["status"] == 503 and failed["prediction"] is None


def test_feedback_and_traces_as_training_questions(tmp_path, upstream):
    from distill.core.data import DatasetSource, load_source

    cfg = agent_config(tmp_path, upstream.url)
    with agent_server(cfg) as (base, _):
        c = client(base)
        ids = [c.chat.completions.create(model="test-agent", messages=[{"role": "user", "content": q}]).id
               for q in ("What is 2 + 3?", "What is two plus three?", "Who cares?")]
        with httpx.Client(base_url=base, timeout=WAIT_S) as h:
            ok = [h.post("/v1/feedback", json=body).status_code for body in
                  ({"id": ids[0], "correct": True}, {"id": ids[1], "answer": "five"}, {"id": ids[2], "correct": False})]
            unknown = h.post("/v1/feedback", json={"id": "chatcmpl-nope", "correct": True})
            both = h.post("/v1/feedback", json={"id": ids[0], "correct": True, "answer": "5"})
    assert ok == [200, 200, 200]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_id"
    assert both.status_code == 400 and "exactly one" in both.json()["error"]["message"]
    examples = load_source(DatasetSource(name="served", source=cfg.traces_dir, metric="em_f1"))
    assert {(e.question, tuple(e.answers)) for e in examples} == {("What is 2 + 3?", ("5",)),
                                                                  ("What is two plus three?", ("five",))}
    # `distill improve` draws its questions through generate's loader: the leak guard against eval sets holds
    from types import SimpleNamespace

    from distill.generate import load_questions

    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"question": "what is two plus THREE", "answer": "5"}) + "\n")
    improve = SimpleNamespace(datasets=[DatasetSource(name="served", source=cfg.traces_dir, metric="em_f1")],
                              eval_sets=[DatasetSource(name="mine", source=str(eval_file), metric="em_f1")],
                              leak_policy="refuse", seed=0)
    with pytest.raises(DistillError, match="also appear in the evaluation set"):
        load_questions(improve)
    improve.leak_policy = "exclude"  # drawn around the eval question instead
    improve.datasets = [DatasetSource(name="served", source=cfg.traces_dir, metric="em_f1", n=1)]
    assert [e.question for e in load_questions(improve)] == ["What is 2 + 3?"]


def test_a_folder_without_traces_or_feedback_is_one_line(tmp_path):
    from distill.core.data import DatasetSource, load_source
    from distill.rewoo.agent import Question
    from distill.rewoo.record import make_record

    source = DatasetSource(name="served", source=str(tmp_path), metric="em_f1")
    with pytest.raises(DistillError, match="without trace files"):
        load_source(source)
    log = TraceLog(tmp_path, max_bytes=4096)
    log.write(make_record(Question("q?", id="r1", dataset="served"), "a", 0, 0.0, evidence=[],
                          solver={}, prediction="p", solver_calls=(), tools={}))
    log.close()
    with pytest.raises(DistillError, match="no served question has feedback"):
        load_source(source)


def test_a_trace_that_cannot_be_written_fails_the_request(tmp_path, upstream):
    cfg = agent_config(tmp_path, upstream.url)
    with agent_server(cfg) as (base, service):
        def full_disk(record):
            raise OSError(28, "No space left on device")

        service.traces.write = full_disk
        with pytest.raises(openai.InternalServerError) as exc:
            client(base).chat.completions.create(model="test-agent", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 503 and exc.value.body["code"] == "trace_not_written"
    assert "No space left" in exc.value.body["message"]


def test_traces_rotate_by_size_and_ids_survive_a_restart(tmp_path):
    from distill.rewoo.agent import Question
    from distill.rewoo.record import make_record

    def record(i: int) -> dict:
        return make_record(Question(f"question {i} " + "x" * 500, id=f"r{i}", dataset="served"), "a", 0,
                           0.0, evidence=[], solver={}, prediction="p", solver_calls=(), tools={})

    log = TraceLog(tmp_path, max_bytes=4096)
    for i in range(12):
        log.write(record(i))
    log.close()
    files = trace_files(tmp_path)
    assert len(files) > 1 and all(f.stat().st_size < 4096 + 4096 for f in files)
    assert [r["id"] for f in files for r in read_jsonl(f, TrajectoryRecord)] == [f"r{i}" for i in range(12)]
    again = TraceLog(tmp_path, max_bytes=4096)
    assert {f"r{i}" for i in range(12)} <= again.ids and again.current == files[-1]
    with pytest.raises(DistillError, match="in use by pid"):  # a second server process on one folder
        TraceLog(tmp_path, max_bytes=4096)
    again.close()


def test_sigterm_drains_the_request_in_flight_and_keeps_its_trace(tmp_path, upstream):
    port = free_port()
    config = tmp_path / "agent.yaml"
    spec = {"backend": "openai", "base_url": upstream.url, "model": "fake", "max_retries": 0}
    config.write_text(json.dumps({"name": "test-agent", "planner": spec, "solver": spec, "tools": ["Calculator"],
                                  "planner_prompt": "full", "port": port, "traces_dir": str(tmp_path / "traces")}))
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "distill.cli", "serve-agent", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    upstream.gate.clear()
    result = {}
    try:
        wait_until_up(proc, base)
        before = upstream.arrived
        thread = threading.Thread(target=lambda: result.setdefault("reply", client(base).chat.completions.create(
            model="test-agent", messages=[{"role": "user", "content": "What is 2 + 3?"}])))
        thread.start()
        wait_for(lambda: upstream.arrived > before, "the request to reach the model")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # not a condition of the outcome: the held request is still in flight whatever the wait
        assert proc.poll() is None  # draining, not gone
        upstream.gate.set()
        thread.join(WAIT_S)
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        upstream.gate.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert result["reply"].choices[0].message.content == "5"
    [trace] = [r for p in trace_files(tmp_path / "traces") for r in read_jsonl(p, TrajectoryRecord)]
    assert trace["id"] == result["reply"].id and "1 request(s) traced" in out


def test_factory_is_the_one_eval_uses(tmp_path, upstream, monkeypatch):
    import distill.agent.factory as agent_module

    calls = []
    real = agent_module.build_agent
    monkeypatch.setattr(agent_module, "build_agent", lambda *a, **k: calls.append(k) or real(*a, **k))
    AgentService(agent_config(tmp_path, upstream.url)).traces.close()
    assert calls == [{"method": "test-agent"}]


# ------------------------------------------------------------------------------------------ slow: real vLLM server

@pytest.fixture
def real_agent(tmp_path, vllm_server):
    from tests.conftest import BASE_NAME

    url = vllm_server.base_url
    cfg = AgentServerConfig.model_validate({
        "name": "student-agent", "planner_prompt": "full", "tools": ["Wikipedia", "Calculator"],
        "wikipedia_corpus": str(ROOT / "tests" / "fixtures" / "mini_corpus.jsonl"),
        "planner": {"backend": "openai", "base_url": url, "model": "planner", "max_tokens": 96, "timeout_s": 600},
        "solver": {"backend": "openai", "base_url": url, "model": BASE_NAME, "max_tokens": 24, "timeout_s": 600},
        "request_timeout_s": 1800, "traces_dir": str(tmp_path / "traces")})
    with agent_server(cfg) as (base, _):
        yield base, cfg


def test_real_vllm_plain_and_streamed(real_agent):
    base, cfg = real_agent
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=1800)
    question = [{"role": "user", "content": "Which country is the Eiffel Tower in?"}]
    reply = c.chat.completions.create(model="student-agent", messages=question)
    assert isinstance(reply.choices[0].message.content, str)
    rewoo = reply.model_extra["rewoo"]
    assert rewoo["usage"]["model_calls"] >= 2 and rewoo["usage"]["tokens"]["planner"] > 0
    assert len(rewoo["evidence"]) == len(rewoo["plan"]["steps"])
    chunks = list(c.chat.completions.create(model="student-agent", messages=question, stream=True))
    events = [(ch.model_extra.get("rewoo") or {}).get("event") for ch in chunks]
    assert events[1] == "plan" and events[-1] == "done"
    assert events.count("step") == len(chunks[1].model_extra["rewoo"]["plan"]["steps"])
    assert chunks[-1].choices[0].finish_reason == "stop"
    ids = [t["id"] for t in traces(cfg)]
    assert ids == [reply.id, chunks[0].id]
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="planner", messages=question)


def test_real_vllm_auth_and_sigterm_mid_request_in_a_subprocess(tmp_path, vllm_server):
    """The command as a user runs it, on the real server: a wrong key is refused, the right one answered, and
    SIGTERM sent while a request is in flight (the server's own gauge says so) lets it finish and keeps its
    trace. Should the answer come before the signal lands, the outcome is the same: that is the point."""
    from tests.conftest import BASE_NAME

    token = "real-" + "t0k3n" * 5
    port = free_port()
    url = vllm_server.base_url
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({
        "name": "student-agent", "planner_prompt": "full", "tools": ["Calculator"], "port": port,
        "auth_token_env": "REAL_AGENT_TOKEN", "request_timeout_s": 1800, "traces_dir": str(tmp_path / "traces"),
        # far above any answer time: with the default 60 s, a loaded CPU's answer outlasted the drain and uvicorn
        # cancelled the request (a 500), a timeout raced against the real model
        "drain_timeout_s": 1800,
        "planner": {"backend": "openai", "base_url": url, "model": "planner", "max_tokens": 96, "timeout_s": 600},
        "solver": {"backend": "openai", "base_url": url, "model": BASE_NAME, "max_tokens": 24, "timeout_s": 600}}))
    env = os.environ | {"PYTHONPATH": str(ROOT), "REAL_AGENT_TOKEN": token}
    proc = subprocess.Popen([sys.executable, "-m", "distill.cli", "serve-agent", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    result = {}
    try:
        wait_until_up(proc, base)
        question = [{"role": "user", "content": "What is 12 * 12?"}]
        with pytest.raises(openai.AuthenticationError):
            client(base, "not-the-token-at-all").chat.completions.create(model="student-agent", messages=question)
        c = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=1800)
        thread = threading.Thread(target=lambda: result.setdefault(
            "reply", c.chat.completions.create(model="student-agent", messages=question)))
        thread.start()
        wait_for(lambda: "distill_agent_in_flight 1" in httpx.get(f"{base}/metrics", headers=auth, timeout=WAIT_S).text
                 or "reply" in result, "the request to be in flight")
        proc.send_signal(signal.SIGTERM)
        thread.join(1800)
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "reply" in result, out  # the server's own log says why the request failed
    reply = result["reply"]
    [trace] = [r for p in trace_files(tmp_path / "traces") for r in read_jsonl(p, TrajectoryRecord)]
    assert trace["id"] == reply.id and trace["served"]["status"] == 200
    assert trace["prediction"] == reply.choices[0].message.content
    written = out + "".join(p.read_text() for p in (tmp_path / "traces").iterdir() if p.is_file())
    assert token not in written


def test_serve_agent_refuses_a_prompt_its_planner_adapter_was_not_trained_on(tmp_path):
    """The planner server names the LoRA module's folder (vLLM's /v1/models root); the adapter's own record says
    it was trained on the compact prompt with Wikipedia and LLM: another prompt or tool list is one line."""
    from distill.serving.agent_server import check_planner_as_trained
    from distill.tools.registry import tool_descriptions
    from test_openai_backend import _save_adapter

    _save_adapter(tmp_path / "adapter", seed=0)
    (tmp_path / "adapter" / "distill_adapter.json").write_text(json.dumps({
        "student_prompt": "compact", "tools": tool_descriptions(["Wikipedia", "LLM"])}))
    with chat_api(adapter=str(tmp_path / "adapter")) as api:
        url = api.url
        spec = {"backend": "openai", "base_url": url, "model": "planner", "max_retries": 0}
        with pytest.raises(DistillError, match="serve-agent asks adapter .* with planner prompt full and tools "
                                               "Calculator, but it was trained on prompt compact with tools "
                                               "Wikipedia, LLM"):
            check_planner_as_trained(agent_config(tmp_path, url, planner=spec))
        check_planner_as_trained(agent_config(tmp_path, url, planner=spec, planner_prompt="compact",
                                              tools=["Wikipedia", "LLM"]))  # as trained: no complaint
    down = {"backend": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "planner",
            "max_retries": 0, "timeout_s": 2}
    check_planner_as_trained(agent_config(tmp_path, down["base_url"], planner=down))  # not up yet: asked nothing
