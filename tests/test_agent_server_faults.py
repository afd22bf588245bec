"""`distill serve-agent` as a hostile network and a failing machine meet it: clients that stall their body or
their headers, clients that leave mid-body or mid-answer, a crash that tore the last line of a trace file, a full
disk, a SIGTERM while requests are in flight, and a planner server that accepts connections and never answers.

Every test runs the real command in a subprocess (uvicorn, its HTTP protocol, signals, the traces on disk), with
its log captured. The model server behind it is `FakeUpstream` (a real HTTP server on loopback, see
test_agent_server.py): the tests must decide *when* a model answers, which a real model cannot be made to do.
Clients are raw sockets where the point is what a well-behaved client library would never send. No test asserts
a time: the deadlines are set short so the tests are quick, and the figures the slow-client test measures are
printed (run with `-s` to see them), not asserted.
"""


import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from distill.rewoo.record import TrajectoryRecord
from distill.core.store import read_jsonl
from distill.core.traces import trace_files
from test_agent_server import WAIT_S, FakeUpstream, client, free_port, uvicorn_thread, wait_for

ROOT = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
QUESTION = {"model": "test-agent", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


@pytest.fixture(scope="module")
def upstream():
    fake = FakeUpstream()
    with uvicorn_thread(fake.app, fake.port):
        yield fake


class Agent:
    """A `distill serve-agent` process: its base URL, its config, and its log (stdout and stderr, to a file so
    that a chatty server never blocks on a full pipe)."""

    def __init__(self, proc: subprocess.Popen, base: str, log: Path, traces: Path):
        self.proc, self.base, self.log_path, self.traces = proc, base, log, traces

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """/metrics as {'name{labels}': value}."""
        text = httpx.get(f"{self.base}/metrics", timeout=WAIT_S).text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def count(self, path: str, status: int) -> float:
        return self.metrics().get(f'distill_agent_requests_total{{path="{path}",status="{status}"}}', 0.0)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@contextmanager
def agent(tmp_path: Path, url: str, traces: Path | None = None, wait: bool = True, **over):
    port = free_port()
    traces = traces or tmp_path / "traces"
    spec = {"backend": "openai", "base_url": url, "model": "fake", "max_retries": 0, "timeout_s": 30}
    settings = {"name": "test-agent", "planner": spec, "solver": spec | {"max_tokens": 16}, "tools": ["Calculator"],
                "planner_prompt": "full", "port": port, "traces_dir": str(traces)} | over
    config = tmp_path / f"agent-{port}.yaml"
    config.write_text(json.dumps(settings))
    log = tmp_path / f"agent-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "distill.cli", "serve-agent", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    a = Agent(proc, f"http://127.0.0.1:{port}", log, traces)
    try:
        if wait:
            def up() -> bool:
                assert proc.poll() is None, a.log
                try:
                    return httpx.get(f"{a.base}/health", timeout=WAIT_S).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(up, "the agent server to start")
        yield a
    finally:
        if proc.poll() is None:
            a.stop()


def raw_request(port: int, headers: dict[str, str], body: bytes = b"", path: str = CHAT) -> socket.socket:
    """A socket that has sent a request's headers and `body` (maybe less than its Content-Length) and stays open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sock.sendall(head.encode() + body)
    return sock


def read_reply(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def port_of(a: Agent) -> int:
    return int(a.base.rsplit(":", 1)[1])


def traced(folder: Path) -> list[dict]:
    return [r for p in trace_files(folder) for r in read_jsonl(p, TrajectoryRecord)]


# ------------------------------------------------------------------------------------------ slow clients

def test_stalled_bodies_hold_no_slot_and_are_cut_off_with_408(tmp_path, upstream):
    """Three clients send headers with a Content-Length and stall the body, as many as max_in_flight: the
    server's slots stay free for everyone else, and each stalled client gets 408 once body_timeout_s passes.
    A client that stalls inside its headers is cut off too (header_timeout_s). Figures printed for the record."""
    stalled_n = 3
    upstream.gate.set()
    with agent(tmp_path, upstream.url, max_in_flight=stalled_n, body_timeout_s=5, header_timeout_s=2) as a:
        port = port_of(a)
        started = time.monotonic()
        body = json.dumps(QUESTION).encode()
        stalled = [raw_request(port, {"Content-Length": str(len(body))}, body[:10]) for _ in range(stalled_n)]
        wait_for(lambda: a.metrics()["distill_agent_reading_body"] == stalled_n, "the stalled bodies to be read")
        held = a.metrics()["distill_agent_in_flight"]
        # while they stall, as many other clients as there are slots, at once
        with ThreadPoolExecutor(stalled_n) as pool:
            others = list(pool.map(lambda _: httpx.post(f"{a.base}{CHAT}", json=QUESTION, timeout=WAIT_S),
                                   range(stalled_n)))
        still_stalled = a.metrics()["distill_agent_reading_body"]
        replies = []
        for sock in stalled:
            replies.append(read_reply(sock))  # the server closes each after its 408
            sock.close()
        freed_after = time.monotonic() - started
        # a client that stalls within its request line
        half = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        half.sendall(b"POST /v1/chat/com")
        header_reply = read_reply(half)
        half.close()
        after = a.metrics()
        assert a.stop() == 0
    statuses = [r.status_code for r in others]
    print(f"\nslow clients: {stalled_n} stalled bodies (max_in_flight {stalled_n}, body_timeout_s 5): slots held "
          f"while they stalled {held:g} of {stalled_n}; other clients meanwhile got {statuses}; stalled bodies "
          f"still being read when the others were answered: {still_stalled:g}; all stalled clients answered 408 "
          f"and closed {freed_after:.1f} s after they connected; a stalled request line got "
          f"{header_reply.split(b' ', 2)[1].decode() if header_reply else 'nothing'} and was closed")
    assert held == 0 and statuses == [200] * stalled_n
    for reply in replies:
        head, _, rest = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and json.loads(rest)["error"]["code"] == "body_timeout"
    assert header_reply.startswith(b"HTTP/1.1 408") and b"header_timeout" in header_reply
    assert after["distill_agent_reading_body"] == 0 and after["distill_agent_in_flight"] == 0
    assert after[f'distill_agent_requests_total{{path="{CHAT}",status="408"}}'] == stalled_n
    assert after['distill_agent_errors_total{code="header_timeout"}'] == 1
    assert after[f'distill_agent_requests_total{{path="{CHAT}",status="200"}}'] == stalled_n
    assert "Traceback" not in a.log
    assert len(traced(a.traces)) == stalled_n  # the answered ones; a request never read is not one


# ------------------------------------------------------------------------------------------ clients that leave

def test_clients_that_leave_are_counted_499_without_a_traceback(tmp_path, upstream):
    """Mid-body, while a plain answer is worked on, and mid-stream: each is one `client_closed` (499) in
    /metrics, no 500 and no traceback in the log; the work of the two that were answered still ends in a trace,
    and a stream that runs to its end is counted 200 when it ends."""
    upstream.gate.set()
    with agent(tmp_path, upstream.url) as a:
        port = port_of(a)
        body = json.dumps(QUESTION).encode()
        # 1. mid-body: half the body, then gone
        sock = raw_request(port, {"Content-Length": str(len(body))}, body[: len(body) // 2])
        wait_for(lambda: a.metrics()["distill_agent_reading_body"] == 1, "the body to be read")
        sock.close()
        wait_for(lambda: a.count(CHAT, 499) == 1, "the mid-body leaver to be counted")
        upstream.gate.clear()
        try:
            # 2. a plain request whose client leaves while the model works
            before = upstream.arrived
            sock = raw_request(port, {"Content-Length": str(len(body))}, body)
            wait_for(lambda: upstream.arrived > before, "the request to reach the model")
            sock.close()
            # 3. a stream whose client leaves after the first event
            before = upstream.arrived
            sock = raw_request(port, {"Content-Length": str(len(json.dumps(QUESTION | {"stream": True})))},
                               json.dumps(QUESTION | {"stream": True}).encode())
            seen = b""
            while b"data: " not in seen:  # the headers, then the role chunk: sent before any model call
                seen += sock.recv(65536) or pytest.fail(f"closed after {seen!r}")
            wait_for(lambda: upstream.arrived > before, "the stream to reach the model")
            sock.close()
            wait_for(lambda: a.count(CHAT, 499) == 2, "the stream's leaver to be counted")
        finally:
            upstream.gate.set()
        wait_for(lambda: a.count(CHAT, 499) == 3, "the plain leaver to be counted once its answer was ready")
        wait_for(lambda: a.metrics()["distill_agent_in_flight"] == 0, "the work of the leavers to end")
        # 4. a stream that runs to its end
        chunks = list(client(a.base).chat.completions.create(**QUESTION, stream=True))
        wait_for(lambda: a.count(CHAT, 200) == 1, "the completed stream to be counted")
        m = a.metrics()
        assert a.stop() == 0
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert m['distill_agent_errors_total{code="client_closed"}'] == 3
    assert not any('status="500"' in k for k in m) and not any("internal_error" in k for k in m)
    assert "Traceback" not in a.log and "ERROR" not in a.log, a.log
    # the two leavers whose question was read were answered into the traces, as was the completed stream
    assert [t["served"]["status"] for t in traced(a.traces)] == [200, 200, 200]


# ------------------------------------------------------------------------------------------ a crash's torn line

def test_a_torn_last_line_is_set_aside_and_the_server_starts(tmp_path, upstream):
    """A crash mid-write left the last line of the trace file and of the feedback file torn: the next start
    moves each torn tail to `<file>.torn` (kept byte for byte), names it in one log line, and serves on; the
    records before it still take feedback."""
    from distill.rewoo.agent import Question
    from distill.rewoo.record import make_record

    traces = tmp_path / "traces"
    traces.mkdir()
    good = make_record(Question("What is 1 + 1?", id="chatcmpl-before", dataset="served"), "test-agent", 0, 0.0,
                       evidence=[], solver={}, prediction="2", solver_calls=(), tools={})
    good_line = json.dumps(good) + "\n"
    torn = json.dumps(good | {"id": "chatcmpl-torn"})[:57].encode()  # what a crash leaves: no newline
    (traces / "traces-000001.jsonl").write_bytes(good_line.encode() + torn)
    feedback_line = json.dumps({"id": "chatcmpl-before", "correct": True, "at": "2026-01-01T00:00:00+00:00"}) + "\n"
    (traces / "feedback.jsonl").write_bytes(feedback_line.encode() + b'{"id": "chatcmpl-bef')
    with agent(tmp_path, upstream.url, traces=traces) as a:
        reply = client(a.base).chat.completions.create(**QUESTION)
        fed = httpx.post(f"{a.base}/v1/feedback", json={"id": "chatcmpl-before", "answer": "two"}, timeout=WAIT_S)
        assert a.stop() == 0
    print("\n" + "\n".join(line for line in a.log.splitlines() if ".torn" in line))
    assert fed.status_code == 200
    assert (traces / "traces-000001.jsonl.torn").read_bytes() == torn
    assert (traces / "feedback.jsonl.torn").read_bytes() == b'{"id": "chatcmpl-bef'
    assert [t["id"] for t in traced(traces)] == ["chatcmpl-before", reply.id]
    assert [json.loads(line)["id"] for line in (traces / "feedback.jsonl").read_text().splitlines()] == \
        ["chatcmpl-before"] * 2
    for name in ("traces-000001.jsonl", "feedback.jsonl"):
        [line] = [line for line in a.log.splitlines() if f"{name}.torn" in line]
        assert "torn line" in line and str(traces / name) in line
    assert "Traceback" not in a.log


def test_a_torn_line_in_the_middle_is_still_one_line_and_exit_2(tmp_path, upstream):
    """Only a last line can be a torn write: a bad line with records after it is damage to fix by hand."""
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "traces-000001.jsonl").write_text('{"id": "chatcmpl-x", "ques\n{"id": "chatcmpl-y"}\n')
    with agent(tmp_path, upstream.url, traces=traces, wait=False) as a:
        assert a.proc.wait(WAIT_S) == 2
    assert "traces-000001.jsonl:1" in a.log and "Traceback" not in a.log
    assert not list(traces.glob("*.torn"))


# ------------------------------------------------------------------------------------------ a full disk

@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs: a real filesystem that fills up (needs root, as CI's container runs; skipped otherwise)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> Path:
    """Fill the filesystem of `folder` to the last byte with a file of its own."""
    filler = folder / "filler"
    with filler.open("ab", buffering=0) as handle:
        for size in (4096, 1):
            try:
                while True:
                    handle.write(b"x" * size)
            except OSError:
                pass
    return filler


def test_a_full_disk_is_a_503_with_one_line_and_never_a_false_trace(tmp_path, upstream, tiny_disk):
    """On a full disk a chat request is a 503 `trace_not_written` that leaves no trace at all (it was not
    served), feedback is a 503 `feedback_not_written`, each with one log line and no traceback; once there is
    room again both work, and the failed request never shows up in the traces."""
    traces = tiny_disk / "traces"
    with agent(tmp_path, upstream.url, traces=traces) as a:
        filler = fill(tiny_disk)
        failed = httpx.post(f"{a.base}{CHAT}", json=QUESTION, timeout=WAIT_S)
        filler.unlink()
        served = client(a.base).chat.completions.create(**QUESTION)
        filler = fill(tiny_disk)
        fb_failed = httpx.post(f"{a.base}/v1/feedback", json={"id": served.id, "correct": True}, timeout=WAIT_S)
        filler.unlink()
        fb_ok = httpx.post(f"{a.base}/v1/feedback", json={"id": served.id, "correct": True}, timeout=WAIT_S)
        m = a.metrics()
        assert a.stop() == 0
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "trace_not_written"
    assert "No space left" in failed.json()["error"]["message"] and "retry-after" in failed.headers
    assert fb_failed.status_code == 503 and fb_failed.json()["error"]["code"] == "feedback_not_written"
    assert fb_ok.status_code == 200
    assert [(t["id"], t["served"]["status"]) for t in traced(traces)] == [(served.id, 200)]
    assert failed.json()["id"] not in (traces / "traces-000001.jsonl").read_text()
    assert len((traces / "feedback.jsonl").read_text().splitlines()) == 1
    assert m['distill_agent_errors_total{code="trace_not_written"}'] == 1
    assert m['distill_agent_errors_total{code="feedback_not_written"}'] == 1
    log = a.log
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "trace not written" in line]) == 1
    assert len([line for line in log.splitlines() if "feedback not written" in line]) == 1


# ------------------------------------------------------------------------------------------ draining, start-up

def test_health_is_503_while_draining_and_the_request_in_flight_finishes(tmp_path, upstream):
    """SIGTERM while a request is in flight: the listener stays open, /health answers 503 `draining` (what a
    load balancer probes), a new request is refused with 503 `draining`, the one in flight is answered and
    traced, then the process exits 0."""
    upstream.gate.clear()
    result = {}
    try:
        with agent(tmp_path, upstream.url, drain_timeout_s=WAIT_S) as a:
            before = upstream.arrived
            thread = threading.Thread(target=lambda: result.setdefault(
                "reply", client(a.base).chat.completions.create(**QUESTION)))
            thread.start()
            wait_for(lambda: upstream.arrived > before, "the request to reach the model")
            a.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: httpx.get(f"{a.base}/health", timeout=WAIT_S).status_code == 503,
                     "/health to say draining")
            health = httpx.get(f"{a.base}/health", timeout=WAIT_S)
            refused = httpx.post(f"{a.base}{CHAT}", json=QUESTION, timeout=WAIT_S)
            upstream.gate.set()
            thread.join(WAIT_S)
            code = a.proc.wait(WAIT_S)
    finally:
        upstream.gate.set()
    assert health.json()["status"] == "draining" and health.json()["in_flight"] == 1
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert code == 0 and result["reply"].choices[0].message.content == "5"
    assert [t["id"] for t in traced(a.traces)] == [result["reply"].id]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{a.base}/health", timeout=WAIT_S)  # gone once drained


def test_a_hung_planner_delays_the_start_by_one_probe_at_most(tmp_path, upstream):
    """A planner server that accepts connections and never answers (request timeouts of 60 s with 2 retries):
    start-up asks it once, gives up after probe_timeout_s with one warning, and serves; the hung server is
    still holding the probe's connection unanswered when the agent is up."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)  # never accepted: the kernel completes the handshake, nothing ever answers
    url = f"http://127.0.0.1:{hung.getsockname()[1]}/v1"
    try:
        planner = {"backend": "openai", "base_url": url, "model": "planner", "timeout_s": 60, "max_retries": 2}
        with agent(tmp_path, upstream.url, planner=planner, probe_timeout_s=1) as a:
            up = httpx.get(f"{a.base}/health", timeout=WAIT_S)
            assert a.stop() == 0
    finally:
        hung.close()
    log = a.log.splitlines()
    [warning] = [i for i, line in enumerate(log) if "probe_timeout_s" in line]
    [serving] = [i for i, line in enumerate(log) if line.startswith("agent test-agent on http://")]
    assert up.status_code == 200 and warning < serving
    assert "did not say what it serves within probe_timeout_s (1 s)" in log[warning]


def test_a_boolean_is_no_port(tmp_path, upstream, capsys):
    """`port: true` would listen on port 1 if read as a number: refused in one line, as every bound is."""
    from distill.cli import main

    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"traces_dir": str(tmp_path / "t"),
                                  "planner": {"backend": "openai", "base_url": upstream.url, "model": "fake"}}))
    for setting in ("port=true", "max_in_flight=true", "body_timeout_s=0", "header_timeout_s=1000"):
        assert main(["serve-agent", "--config", str(config), "--set", setting]) == 2
        err = capsys.readouterr().err
        assert setting.split("=")[0] in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "t").exists()
