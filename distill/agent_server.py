"""The distilled agent as a service: an OpenAI-shaped chat endpoint in front of the whole ReWOO agent.

    distill serve-agent --config configs/agent_server.yaml

Clients already speak OpenAI's chat API, so the agent is one more `model` to them: `POST /v1/chat/completions`
with `model` = the agent's name answers the last user message, with the plan, each step's evidence and the usage
in an extra `rewoo` field (and, with `stream: true`, as server-sent chunks while they happen). The agent is
built by `distill.agents.build_agent`, the factory `distill eval` uses, so what is served is what was
measured. Every request, answered or failed, is written to the traces folder (`distill.traces`) before its
reply goes out, and `POST /v1/feedback` marks a served answer right or gives the right one: the traffic becomes
the next round's training questions.

Guard rails, because the server faces clients it does not control: a bearer token (from the environment variable
`auth_token_env` names; required off loopback), bounded body, question and message count, at most
`max_in_flight` requests in flight (then 429 with Retry-After), a deadline per request, a model endpoint that is
down or slow answered with 503 and one line, every error one JSON body in OpenAI's shape, and SIGTERM draining
the requests in flight (their traces included) before the process exits.
"""


import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from distill.config import AgentConfig, add_config_args, load_config
from distill.errors import DistillError, ServerUnreachable, one_line
from distill.secrets import remember

log = logging.getLogger(__name__)

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$"


class AgentServerConfig(AgentConfig):
    """`distill serve-agent`: the agent's own settings (planner, Solver, tools, ... as `distill ask` and eval
    read them) plus how it is served. Each bound has a ceiling, so a typo cannot make the server unbounded."""

    name: Annotated[str, Field(pattern=_NAME)] = "distill-agent"
    """the `model` clients ask for"""
    host: str = "127.0.0.1"
    """address to listen on; off loopback a bearer token is required"""
    port: int = Field(default=8080, ge=0, le=65535)
    """0: a free port, printed at start"""
    auth_token_env: str | None = None
    """the *name* of the environment variable holding the bearer token clients must send; required unless the
    server listens on loopback only"""
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """largest request body accepted (413 beyond)"""
    max_question_chars: int = Field(default=4000, ge=1, le=100_000)
    """longest question (the last user message) accepted"""
    max_messages: int = Field(default=64, ge=1, le=1000)
    """most messages in one request"""
    max_in_flight: int = Field(default=8, ge=1, le=4096)
    """requests served at once; beyond it: 429 with Retry-After"""
    retry_after_s: int = Field(default=2, ge=1, le=3600)
    """the Retry-After of a 429"""
    request_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """deadline of one request's whole plan-work-solve (503 beyond)"""
    drain_timeout_s: float = Field(default=60.0, ge=0, le=3600)
    """on SIGTERM: how long requests in flight may finish"""
    traces_dir: str = "runs/agent/traces"
    """append-only traces folder, one per server process"""
    traces_max_bytes: int = Field(default=64 * 1024 * 1024, ge=4096, le=1 << 40)
    """size at which a new trace file is started"""

    @model_validator(mode="after")
    def _check(self) -> "AgentServerConfig":
        if self.cache is not None:
            raise ValueError("cache: a served agent answers live; a call cache would replay old answers (set null)")
        return self


# ------------------------------------------------------------------------------------------ request shapes

class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


class ChatRequest(BaseModel):
    """What is read of a chat-completions body; sampling options a client sends (temperature, ...) are
    accepted and ignored: the agent's models run with the settings it was evaluated with."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message]
    stream: bool = False


class ApiError(Exception):
    """A reply in OpenAI's error shape: status, one-line message, type and code."""

    def __init__(self, status: int, message: str, type_: str, code: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.headers = status, message, type_, code, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


def _bad_request(message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, "invalid_request_error", code)


def question_of(req: ChatRequest, cfg: AgentServerConfig) -> str:
    """The last user message, checked as a dataset question is (it goes to every model the agent calls)."""
    from distill.data import _bad_characters

    if not req.messages:
        raise _bad_request("messages: empty; send at least one user message")
    if len(req.messages) > cfg.max_messages:
        raise _bad_request(f"messages: {len(req.messages)} messages, more than {cfg.max_messages}")
    user = [m for m in req.messages if m.role == "user"]
    if not user:
        raise _bad_request("messages: no user message; the last user message is the question")
    question = user[-1].text().strip()
    if not question:
        raise _bad_request("messages: the last user message is empty")
    if len(question) > cfg.max_question_chars:
        raise _bad_request(f"messages: the question has {len(question)} characters, more than "
                           f"{cfg.max_question_chars}", "question_too_long")
    if bad := _bad_characters(question):
        raise _bad_request(f"messages: the question holds the control character U+{ord(bad[0]):04X}")
    return question


# ------------------------------------------------------------------------------------------ metrics

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    """Prometheus text exposition, by hand: five figures do not need a client library."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()  # (path, status)
        self.errors: Counter[str] = Counter()  # error code
        self.tokens: Counter[str] = Counter()  # role
        self.model_calls = 0
        self.cost_usd = 0.0
        self.latency_counts = [0] * len(LATENCY_BUCKETS)
        self.latency_sum = 0.0
        self.latency_n = 0
        self.in_flight = 0

    def observe(self, path: str, status: int, seconds: float | None = None, code: str | None = None) -> None:
        self.requests[(path, str(status))] += 1
        if code:
            self.errors[code] += 1
        if seconds is not None:
            self.latency_sum += seconds
            self.latency_n += 1
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    self.latency_counts[i] += 1

    def charge(self, record: dict) -> None:
        for role in ("planner", "solver", "tools"):
            self.tokens[role] += record.get("tokens", {}).get(role, 0)
        self.model_calls += record.get("llm_calls", 0)
        self.cost_usd += record.get("cost_usd", 0.0)

    def text(self) -> str:
        p = "distill_agent"
        out = [f"# HELP {p}_requests_total HTTP requests by path and status.", f"# TYPE {p}_requests_total counter"]
        out += [f'{p}_requests_total{{path="{path}",status="{s}"}} {n}' for (path, s), n in sorted(self.requests.items())]
        out += [f"# HELP {p}_errors_total Failed requests by error code.", f"# TYPE {p}_errors_total counter"]
        out += [f'{p}_errors_total{{code="{c}"}} {n}' for c, n in sorted(self.errors.items())]
        out += [f"# HELP {p}_in_flight Chat requests being answered now.", f"# TYPE {p}_in_flight gauge",
                f"{p}_in_flight {self.in_flight}"]
        out += [f"# HELP {p}_tokens_total Model tokens spent, by role.", f"# TYPE {p}_tokens_total counter"]
        out += [f'{p}_tokens_total{{role="{r}"}} {self.tokens[r]}' for r in ("planner", "solver", "tools")]
        out += [f"# HELP {p}_model_calls_total Model calls made.", f"# TYPE {p}_model_calls_total counter",
                f"{p}_model_calls_total {self.model_calls}"]
        out += [f"# HELP {p}_cost_usd_total Dollars spent on model calls.", f"# TYPE {p}_cost_usd_total counter",
                f"{p}_cost_usd_total {self.cost_usd:.6f}"]
        out += [f"# HELP {p}_request_seconds Chat request latency.", f"# TYPE {p}_request_seconds histogram"]
        out += [f'{p}_request_seconds_bucket{{le="{b:g}"}} {n}' for b, n in zip(LATENCY_BUCKETS, self.latency_counts)]
        out += [f'{p}_request_seconds_bucket{{le="+Inf"}} {self.latency_n}',
                f"{p}_request_seconds_sum {self.latency_sum:.6f}", f"{p}_request_seconds_count {self.latency_n}"]
        return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ the service

def usage_of(record: dict) -> dict:
    """OpenAI's usage block (every model call of the request: planner, re-plans, Solver, LLM tool)."""
    calls = [record.get("planner") or {}, record.get("solver") or {}]
    calls += [r.get("planner") or {} for r in record.get("replans", [])]
    usages = [c.get("usage") or {} for c in calls] + [record.get("tool_usage") or {}]
    prompt = sum(u.get("prompt_tokens", 0) for u in usages)
    completion = sum(u.get("completion_tokens", 0) for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def rewoo_of(record: dict) -> dict:
    """The reply's extra field: what the agent did, enough to check an answer against its evidence."""
    evidence = [{k: e.get(k) for k in ("id", "tool", "input", "output", "status", "error")}
                for e in record.get("evidence", [])]
    return {
        "plan": record.get("plan"), "evidence": evidence,
        "usage": {"tokens": record.get("tokens"), "model_calls": record.get("llm_calls", 0),
                  "tool_calls": record.get("tool_calls", 0), "cost_usd": record.get("cost_usd", 0.0),
                  "wall_s": record.get("wall_s", 0.0)},
    }


class AgentService:
    """One agent, its traces and its counters; the FastAPI app (`build_app`) is a thin layer over it."""

    def __init__(self, cfg: AgentServerConfig, agent=None, token: str | None = None):
        from distill.agents import build_agent
        from distill.traces import TraceLog

        self.cfg = cfg
        self.token = token
        # the factory `distill eval` builds its methods with: the served agent is the measured one
        self.agent = agent if agent is not None else build_agent(cfg, method=cfg.name)
        self.traces = TraceLog(cfg.traces_dir, cfg.traces_max_bytes)
        self.metrics = Metrics()
        self.tasks: set[asyncio.Task] = set()
        self.draining = False

    # -- a request's work, in a task of its own: it finishes and writes its trace even if the client leaves

    def start(self, question: str, rid: str, stream: bool, emit) -> asyncio.Task:
        """The request holds its `in_flight` slot (taken by the handler) until this task ends, trace written."""
        task = asyncio.get_running_loop().create_task(self._answer(question, rid, stream, emit))
        self.tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self.tasks.discard(t)
            self.metrics.in_flight -= 1

        task.add_done_callback(done)
        return task

    async def _answer(self, question: str, rid: str, stream: bool, emit) -> tuple[dict, ApiError | None]:
        from distill.rewoo.agent import Question
        from distill.rewoo.record import make_record
        from distill.traces import now

        t0 = time.perf_counter()
        example = Question(question, id=rid, dataset="served")
        served = {"at": now(), "model": self.cfg.name, "stream": stream}
        error = None
        try:
            record = await asyncio.wait_for(self.agent.run(example, on_event=emit), self.cfg.request_timeout_s)
            record["served"] = served | {"status": 200}
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure ends as a trace and one line to the client
            error = self._error_of(exc)
            record = make_record(example, self.cfg.name, 0, t0, evidence=[], solver={}, prediction=None,
                                 solver_calls=(), tools={}, recall=False,
                                 served=served | {"status": error.status, "error": error.body()["error"]})
        try:
            await asyncio.to_thread(self.traces.write, record)
        except Exception as exc:  # a full disk: the request fails rather than goes untraced
            log.error("trace not written: %s", one_line(exc))
            error = ApiError(503, f"the request's trace could not be written ({one_line(exc, 200)})", "server_error",
                             "trace_not_written")
        self.metrics.charge(record)
        return record, error

    def _error_of(self, exc: Exception) -> ApiError:
        from distill.llm.openai_backend import ServerError

        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            return ApiError(503, f"the agent did not finish within request_timeout_s ({self.cfg.request_timeout_s:g} s)"
                            "; a model endpoint is slow or down", "server_error", "upstream_timeout",
                            {"Retry-After": str(self.cfg.retry_after_s)})
        if isinstance(exc, (ServerError, ServerUnreachable)):
            return ApiError(503, f"model endpoint failed: {one_line(exc, 300)}", "server_error", "upstream_unavailable",
                            {"Retry-After": str(self.cfg.retry_after_s)})
        if isinstance(exc, DistillError):
            return ApiError(503, one_line(exc, 300), "server_error", "agent_failed")
        log.error("request failed: %s", one_line(exc), exc_info=True)
        return ApiError(500, f"internal error ({type(exc).__name__}); the trace holds the request", "server_error",
                        "internal_error")

    async def drain(self) -> None:
        """Wait for every request's work (and its trace) up to drain_timeout_s: uvicorn waits for the
        connections, this for work whose client already left."""
        self.draining = True
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=self.cfg.drain_timeout_s)
        self.traces.close()


def build_app(service: AgentService):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from contextlib import asynccontextmanager

    cfg, metrics = service.cfg, service.metrics

    @asynccontextmanager
    async def lifespan(app):
        yield
        await service.drain()

    app = FastAPI(title=f"distill agent {cfg.name}", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    def error_response(err: ApiError, path: str) -> JSONResponse:
        metrics.observe(path, err.status, code=err.code)
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        err = ApiError(exc.status_code, message.get(exc.status_code, str(exc.detail)), "invalid_request_error", code)
        metrics.observe("other", err.status, code=err.code)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.error("unhandled: %s", one_line(exc), exc_info=True)
        err = ApiError(500, f"internal error ({type(exc).__name__})", "server_error", "internal_error")
        return error_response(err, request.url.path)

    def authorize(request: Request) -> None:
        if service.token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), service.token.encode()):
            raise ApiError(401, "missing or wrong bearer token (Authorization: Bearer ...)", "authentication_error",
                           "invalid_api_key", {"WWW-Authenticate": "Bearer"})

    async def read_json(request: Request) -> Any:
        """The body, refused past max_body_bytes whether or not the client declared its length."""
        limit = cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body of {int(declared)} bytes is over max_body_bytes ({limit})",
                           "invalid_request_error", "body_too_large")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"request body is over max_body_bytes ({limit})", "invalid_request_error",
                               "body_too_large")
        try:
            return json.loads(bytes(body))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _bad_request(f"the body is not JSON ({one_line(exc, 120)})", "invalid_json") from None
        except RecursionError:
            raise _bad_request("the body is nested too deeply", "invalid_json") from None

    def parse(model: type[BaseModel], data: Any) -> Any:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise _bad_request(f"{where}: {first['msg']}") from None

    @app.get("/health")
    async def health():
        status = "draining" if service.draining else "ok"
        return JSONResponse({"status": status, "model": cfg.name, "in_flight": metrics.in_flight},
                            status_code=503 if service.draining else 200)

    @app.get("/metrics")
    async def prometheus(request: Request):
        authorize(request)
        return PlainTextResponse(metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        metrics.observe("/v1/models", 200)
        return {"object": "list", "data": [{"id": cfg.name, "object": "model", "created": 0, "owned_by": "distill"}]}

    @app.post("/v1/feedback")
    async def feedback(request: Request):
        from distill.traces import Feedback

        authorize(request)
        item = parse(Feedback, await read_json(request))
        if item.at is not None:
            raise _bad_request("at: set by the server")
        stored = await asyncio.to_thread(service.traces.feedback, item)
        if not stored:
            raise ApiError(404, f"id {item.id!r} was not served by this agent", "invalid_request_error", "unknown_id")
        metrics.observe("/v1/feedback", 200)
        return {"id": item.id, "object": "feedback", "stored": True}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        authorize(request)
        if service.draining:
            raise ApiError(503, "the server is shutting down", "server_error", "draining",
                           {"Retry-After": str(cfg.retry_after_s)})
        if metrics.in_flight >= cfg.max_in_flight:
            raise ApiError(429, f"{metrics.in_flight} requests in flight, the most this server takes "
                           f"(max_in_flight); retry after {cfg.retry_after_s} s", "rate_limit_error",
                           "too_many_requests", {"Retry-After": str(cfg.retry_after_s)})
        metrics.in_flight += 1  # no await between the check and this: the event loop runs one handler at a time
        try:
            req = parse(ChatRequest, await read_json(request))
            if req.model != cfg.name:
                raise ApiError(404, f"model {req.model[:80]!r} is not served here; this agent is {cfg.name!r}",
                               "invalid_request_error", "model_not_found")
            question = question_of(req, cfg)
        except BaseException:
            metrics.in_flight -= 1  # no task took the slot
            raise
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        t0 = time.perf_counter()
        if not req.stream:
            record, err = await asyncio.shield(service.start(question, rid, False, None))
            if err is not None:
                metrics.observe("/v1/chat/completions", err.status, time.perf_counter() - t0, err.code)
                return JSONResponse(err.body() | {"id": rid}, status_code=err.status, headers=err.headers)
            metrics.observe("/v1/chat/completions", 200, time.perf_counter() - t0)
            return {
                "id": rid, "object": "chat.completion", "created": created, "model": cfg.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": record.get("prediction") or ""},
                             "finish_reason": "stop"}],
                "usage": usage_of(record), "rewoo": rewoo_of(record),
            }

        queue: asyncio.Queue = asyncio.Queue()
        task = service.start(question, rid, True, lambda kind, payload: queue.put_nowait((kind, payload)))
        task.add_done_callback(lambda t: queue.put_nowait(("end", None)))

        def chunk(delta: dict, finish: str | None = None, **extra) -> str:
            body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": cfg.name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]} | extra
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        async def events():
            yield chunk({"role": "assistant", "content": ""})
            while True:
                kind, payload = await queue.get()
                if kind == "plan":
                    yield chunk({}, rewoo={"event": "plan", "plan": payload})
                elif kind == "step":
                    step = {k: payload.get(k) for k in ("id", "tool", "input", "output", "status", "error")}
                    yield chunk({}, rewoo={"event": "step", "step": step})
                elif kind == "end":
                    break
            record, err = task.result() if not task.cancelled() else ({}, ApiError(
                503, "the request was cancelled", "server_error", "cancelled"))
            if err is not None:
                metrics.observe("/v1/chat/completions", err.status, time.perf_counter() - t0, err.code)
                yield f"data: {json.dumps(err.body())}\n\n"
            else:
                metrics.observe("/v1/chat/completions", 200, time.perf_counter() - t0)
                yield chunk({"content": record.get("prediction") or ""})
                yield chunk({}, "stop", usage=usage_of(record),
                            rewoo={"event": "done", **rewoo_of(record)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": rid})

    return app


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)


def token_of(cfg: AgentServerConfig) -> str | None:
    """The bearer token, read from the environment only; off loopback a server without one is refused."""
    from distill.serve import is_loopback

    if cfg.auth_token_env is None:
        if not is_loopback(cfg.host):
            raise DistillError(f"host {cfg.host} is reachable from other machines: set auth_token_env to the name of "
                               "an environment variable holding the bearer token clients must send")
        return None
    token = os.environ.get(cfg.auth_token_env, "")
    if not token.strip():
        raise DistillError(f"auth_token_env: the environment variable {cfg.auth_token_env} is not set or empty "
                           "(it should hold the bearer token)")
    if len(token) < 16:
        raise DistillError(f"auth_token_env: the token in {cfg.auth_token_env} is shorter than 16 characters")
    remember(token)  # masked wherever it could show: logs, traces, error bodies
    return token


def check_planner_as_trained(cfg: AgentServerConfig) -> None:
    """A planner server serving a distill adapter (vLLM's /v1/models names its folder) must be sent the prompt
    kind and tools it was trained on, as its record says: refused in one line before any request is taken. A
    server not up yet is asked nothing here (the agent starts, and its first request says so)."""
    from distill.llm.openai_backend import ServerError
    from distill.merge import check_as_trained
    from distill.provenance import adapter_of
    from distill.run import model_identities
    from distill.tools.registry import tool_descriptions

    if cfg.planner.backend != "openai":
        return
    try:
        identity = model_identities({"planner": cfg.planner})["planner"]
    except ServerError as exc:
        log.warning("planner: could not ask %s what it serves (%s)", cfg.planner.base_url, exc)
        return
    if folder := adapter_of(identity):
        check_as_trained(folder, cfg.planner_prompt, tool_descriptions(cfg.tools), "serve-agent")


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from distill.serve import client_host, free_port

    cfg = load_config(AgentServerConfig, args.config, args.set)
    token = token_of(cfg)
    if cfg.planner.backend != "openai":
        log.warning("planner: backend %s runs in this process; a served student is usually a LoRA module on a "
                    "vLLM server (backend: openai)", cfg.planner.backend)
    check_planner_as_trained(cfg)
    service = AgentService(cfg, token=token)
    port = cfg.port or free_port(cfg.host)
    app = build_app(service)
    server = uvicorn.Server(uvicorn.Config(
        app, host=cfg.host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=cfg.drain_timeout_s,
        timeout_keep_alive=5, lifespan="on",
    ))
    print(f"agent {cfg.name} on http://{client_host(cfg.host)}:{port}/v1 (auth: "
          f"{'bearer token from $' + cfg.auth_token_env if token else 'none, loopback only'}; "
          f"traces: {service.traces.current})", flush=True)
    stopped_by: list[int] = []
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler that was there before it: a
    # handler of ours, so a drained stop ends here with exit 0 and its summary line, not killed by the signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
    server.run()
    print(f"agent {cfg.name} stopped: {service.traces.written} request(s) traced in {cfg.traces_dir}", flush=True)
    return 0


if __name__ == "__main__":  # `python -m distill.agent_server` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
