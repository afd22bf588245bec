"""The distilled agent as a service: an OpenAI-shaped chat endpoint in front of the whole ReWOO agent.

    distill serve-agent --config configs/agent_server.yaml

Clients already speak OpenAI's chat API, so the agent is one more `model` to them: `POST /v1/chat/completions`
with `model` = the agent's name answers the last user message, with the plan, each step's evidence and the usage
in an extra `rewoo` field (and, with `stream: true`, as server-sent chunks while they happen). The agent is
built by `distill.agent.factory.build_agent`, the factory `distill eval` uses, so what is served is what was
measured. Every request, answered or failed, is written to the traces folder (`distill.core.traces`) before its
reply goes out, and `POST /v1/feedback` marks a served answer right or gives the right one: the traffic becomes
the next round's training questions. `POST /v1/admin/planner` switches the planner to another model (a LoRA
module: the next round's adapter, or back) while the server runs: requests in flight finish on the planner they
started with, and every trace names the planner model, adapter and round that answered it.

Guard rails, because the server faces clients it does not control: a bearer token (from the environment variable
`auth_token_env` names; required off loopback), bounded body, question and message count, deadlines for a
request's headers and body (a client that stalls is cut off, and holds no slot while it sends), at most
`max_in_flight` requests in flight (then 429 with Retry-After), a deadline per request, a model endpoint that is
down or slow answered with 503 and one line, every error one JSON body in OpenAI's shape, a client that leaves
counted as such (499) rather than as a server error, and SIGTERM draining the requests in flight (their traces
included) while /health says so, before the process exits.
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
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from distill.agent import factory
from distill.agent.factory import with_planner
from distill.core.config import AgentConfig, add_config_args, load_config
from distill.core.data import _bad_characters
from distill.core.errors import DistillError, ServerUnreachable, clip, one_line
from distill.core.secrets import remember
from distill.core.traces import Feedback, NotWritten, TraceLog, now
from distill.llm import spec_identity
from distill.llm.base import openai_urls
from distill.llm.openai_backend import OpenAIChat, ServerError
from distill.reporting.provenance import adapter_of
from distill.rewoo.agent import Question
from distill.rewoo.record import make_record
from distill.serving.serve import client_host, free_port, is_loopback
from distill.tools.registry import tool_descriptions
from distill.training.merge import check_as_trained

log = logging.getLogger(__name__)

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$"


class AgentServerConfig(AgentConfig):
    """`distill serve-agent`: the agent's own settings (planner, Solver, tools, ... as `distill ask` and eval
    read them) plus how it is served. Each bound has a ceiling, so a typo cannot make the server unbounded."""

    name: Annotated[str, Field(pattern=_NAME)] = "distill-agent"
    """the `model` clients ask for"""
    host: str = "127.0.0.1"
    """address to listen on; off loopback a bearer token is required"""
    # StrictInt here and below: a boolean is no number (`port: true` would be port 1)
    port: StrictInt = Field(default=8080, ge=0, le=65535)
    """0: a free port, printed at start"""
    auth_token_env: str | None = None
    """the *name* of the environment variable holding the bearer token clients must send; required unless the
    server listens on loopback only"""
    max_body_bytes: StrictInt = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """largest request body accepted (413 beyond)"""
    max_question_chars: StrictInt = Field(default=4000, ge=1, le=100_000)
    """longest question (the last user message) accepted"""
    max_messages: StrictInt = Field(default=64, ge=1, le=1000)
    """most messages in one request"""
    max_in_flight: StrictInt = Field(default=8, ge=1, le=4096)
    """requests served at once (a request takes a slot once its whole body has arrived); beyond it: 429 with
    Retry-After"""
    retry_after_s: StrictInt = Field(default=2, ge=1, le=3600)
    """the Retry-After of a 429"""
    header_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """a connection's request headers must arrive within this (from its opening, or from its previous reply);
    beyond it the connection is closed (with a 408 if part of a request came)"""
    body_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """a request's whole body must arrive within this once its headers have: 408 beyond, and the connection is
    closed"""
    request_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """deadline of one request's whole plan-work-solve (503 beyond)"""
    probe_timeout_s: float = Field(default=5.0, gt=0, le=60)
    """at start: how long to wait for the planner server to say what it serves (asked once, no retries); a
    server that does not answer in time is not checked and the server starts"""
    drain_timeout_s: float = Field(default=60.0, ge=0, le=3600)
    """on SIGTERM: how long requests in flight may finish"""
    traces_dir: str = "runs/agent/traces"
    """append-only traces folder, one per server process"""
    traces_max_bytes: StrictInt = Field(default=64 * 1024 * 1024, ge=4096, le=1 << 40)
    """size at which a new trace file is started"""
    planner_round: StrictInt | None = Field(default=None, ge=0, le=1_000_000)
    """the flywheel round of the planner served at start (every trace says which round answered it); null:
    not known. `POST /v1/admin/planner` changes it with the planner"""

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


class PlannerSwap(BaseModel):
    """`POST /v1/admin/planner`'s body: the LoRA module (or model) on the planner server to plan with from now
    on, and what it is (its adapter folder, its flywheel round) for the traces and /metrics."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(pattern=_NAME)]
    adapter: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    round: Annotated[StrictInt, Field(ge=0, le=1_000_000)] | None = None


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
        self.reading = 0  # requests whose body is arriving: they hold no slot
        self.planner_round: int | None = None  # the flywheel round planning now (None: not known)
        self.planner_swaps = 0

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
        out += [f'{p}_requests_total{{path="{path}",status="{s}"}} {n}'
                for (path, s), n in sorted(self.requests.items())]
        out += [f"# HELP {p}_errors_total Failed requests by error code.", f"# TYPE {p}_errors_total counter"]
        out += [f'{p}_errors_total{{code="{c}"}} {n}' for c, n in sorted(self.errors.items())]
        out += [f"# HELP {p}_in_flight Chat requests being answered now.", f"# TYPE {p}_in_flight gauge",
                f"{p}_in_flight {self.in_flight}"]
        out += [f"# HELP {p}_reading_body Requests whose body is still arriving (they hold no slot).",
                f"# TYPE {p}_reading_body gauge", f"{p}_reading_body {self.reading}"]
        out += [f"# HELP {p}_planner_round The flywheel round of the planner in service (-1: not known).",
                f"# TYPE {p}_planner_round gauge",
                f"{p}_planner_round {-1 if self.planner_round is None else self.planner_round}"]
        out += [f"# HELP {p}_planner_swaps_total Planner switches made (POST /v1/admin/planner).",
                f"# TYPE {p}_planner_swaps_total counter", f"{p}_planner_swaps_total {self.planner_swaps}"]
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

    def __init__(self, cfg: AgentServerConfig, agent=None, token: str | None = None, adapter: str | None = None):
        """`adapter`: the adapter folder the planner server says it serves as cfg.planner.model, where known
        (`check_planner_as_trained` finds it at start)."""
        self.cfg = cfg
        self.token = token
        # the factory `distill eval` builds its methods with: the served agent is the measured one
        self.agent = agent if agent is not None else factory.build_agent(cfg, method=cfg.name)
        # what plans now; `agent` and `planner` are replaced together, between two awaits, by `swap_planner`
        self.planner = {"model": cfg.planner.model, "adapter": adapter, "round": cfg.planner_round, "since": now()}
        self.swap_lock = asyncio.Lock()  # one swap at a time: each probes the server, then replaces both
        self.traces = TraceLog(cfg.traces_dir, cfg.traces_max_bytes)
        self.metrics = Metrics()
        self.metrics.planner_round = cfg.planner_round
        self.tasks: set[asyncio.Task] = set()
        self.draining = False
        self.drain_deadline: float | None = None  # time.monotonic() by which a drain gives up waiting

    # -- a request's work, in a task of its own: it finishes and writes its trace even if the client leaves

    def start(self, question: str, rid: str, stream: bool, emit) -> asyncio.Task:
        """The request holds its `in_flight` slot (taken by the handler) until this task ends, trace written.
        The agent and its planner's description are taken here, when the request starts: a planner swap while
        it runs leaves it on the planner it started with, and its trace names that one."""
        agent, planner = self.agent, self.planner
        task = asyncio.get_running_loop().create_task(self._answer(question, rid, stream, emit, agent, planner))
        self.tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self.tasks.discard(t)
            self.metrics.in_flight -= 1

        task.add_done_callback(done)
        return task

    async def _answer(self, question: str, rid: str, stream: bool, emit, agent,
                      planner: dict) -> tuple[dict, ApiError | None]:

        t0 = time.perf_counter()
        example = Question(question, id=rid, dataset="served")
        served = {"at": now(), "model": self.cfg.name, "stream": stream, "planner_model": planner["model"],
                  "adapter": planner["adapter"], "round": planner["round"]}
        error = None
        try:
            record = await asyncio.wait_for(agent.run(example, on_event=emit), self.cfg.request_timeout_s)
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
        except Exception as exc:  # a full disk: the request fails rather than goes untraced (nothing of it is kept)
            log.error("trace not written, the request answered 503: %s", one_line(exc))
            reason = exc.reason if isinstance(exc, NotWritten) else (
                exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__)
            error = ApiError(503, f"the request's trace could not be written ({clip(reason, 200)})",
                             "server_error", "trace_not_written", {"Retry-After": str(self.cfg.retry_after_s)})
        self.metrics.charge(record)
        return record, error

    def _error_of(self, exc: Exception) -> ApiError:
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

    async def swap_planner(self, req: PlannerSwap) -> dict:
        """Plan with another model of the planner server from the next request on, without a restart or a
        dropped request: the server is asked first whether it serves the model (404 if not, 503 if it does not
        answer) and, where its folder holds distill's record, whether it was trained on this agent's planner
        prompt and tools (422 if not); then a copy of the agent with the new planner (Solver, tools and the
        Wikipedia index shared) replaces the old one. Requests already running keep the agent they started
        with. One swap at a time, so two promotions cannot interleave their check and their switch."""
        cfg = self.cfg
        if cfg.planner.backend != "openai":
            raise _bad_request(f"planner.backend is {cfg.planner.backend}: only a planner on a model server "
                               "(backend: openai) can be switched while serving")
        async with self.swap_lock:
            folder = await self._served_adapter(req.model)
            if folder is not None:
                try:
                    check_as_trained(folder, cfg.planner_prompt, tool_descriptions(cfg.tools), "the planner swap")
                except DistillError as exc:
                    raise ApiError(422, one_line(exc, 500), "invalid_request_error", "not_as_trained") from None
                if req.adapter is not None and Path(req.adapter).resolve() != Path(folder).resolve():
                    log.warning("planner: %s is served from %s, not %s as the swap says; the traces name %s",
                                req.model, folder, req.adapter, folder)
            try:
                agent = with_planner(self.agent, cfg.planner.model_copy(update={"model": req.model}), cfg.prices)
            except DistillError as exc:  # an agent kind without a planner, a key gone from the environment
                raise _bad_request(one_line(exc, 300)) from None
            previous = self.planner
            # no await from here to the return: no request can start between the two assignments
            self.agent = agent
            self.planner = {"model": req.model, "adapter": folder or req.adapter, "round": req.round, "since": now()}
            self.metrics.planner_round = req.round
            self.metrics.planner_swaps += 1
            log.info("planner: %s -> %s (adapter %s, round %s; was adapter %s, round %s)", previous["model"],
                     req.model, self.planner["adapter"], req.round, previous["adapter"], previous["round"])
            return {"object": "planner", **self.planner, "previous": previous}

    async def _served_adapter(self, model: str) -> str | None:
        """Whether every planner server lists `model` on /v1/models (404 `model_not_found` if one does not),
        and the adapter folder holding distill's record it is served from, where readable here (else None).
        Asked once per server within probe_timeout_s and without retries, as at start; by /v1/models alone,
        not `spec_identity`, which also hashes the weights it finds there: a base model's gigabytes would
        outlast the probe."""
        spec, wait = self.cfg.planner, self.cfg.probe_timeout_s
        retry = {"Retry-After": str(self.cfg.retry_after_s)}
        roots = []
        try:
            chat = OpenAIChat(model, spec.base_urls, spec.api_key_env, timeout_s=wait, max_retries=0)
            async with asyncio.timeout(wait):
                for i, url in enumerate(openai_urls(spec.base_urls)):
                    listing = await chat.models(i)
                    data = listing.get("data") if isinstance(listing, dict) else None
                    found = [m for m in (data if isinstance(data, list) else [])
                             if isinstance(m, dict) and m.get("id") == model]
                    if not found:
                        raise ApiError(404, f"the planner server {url} does not serve model {model!r} (its /v1/models "
                                       "does not list it); load it there first", "invalid_request_error",
                                       "model_not_found")
                    roots.append(found[0].get("root"))
        except (ServerError, ServerUnreachable) as exc:
            raise ApiError(503, f"the planner server did not say what it serves ({one_line(exc, 300)}); the "
                           "planner is unchanged", "server_error", "upstream_unavailable", retry) from None
        except TimeoutError:
            raise ApiError(503, f"the planner server did not say what it serves within probe_timeout_s ({wait:g} s); "
                           "the planner is unchanged", "server_error", "upstream_unavailable", retry) from None
        return adapter_of({"servers": [{"root": root} for root in roots]})

    def busy(self) -> bool:
        """Whether a request is being read or answered: a drain waits for these."""
        return bool(self.tasks) or self.metrics.reading > 0

    async def drain(self) -> None:
        """Wait for every request's work (and its trace) until the drain's deadline (drain_timeout_s from the
        signal): `DrainingServer` waits for the clients, this for work whose client already left."""
        self.draining = True
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.cfg.drain_timeout_s
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=max(0.0, self.drain_deadline - time.monotonic()))
        self.traces.close()


class ClientLeft(Exception):
    """The client closed its connection before its request was read or answered."""


# ------------------------------------------------------------------------------------------ the HTTP layer

async def service_of(request: Request) -> AgentService:
    """The service `build_app` put on its app: the routes are module-level, one router for every app."""
    return request.app.state.service


Service = Annotated[AgentService, Depends(service_of)]

router = APIRouter()


class CountedStream(StreamingResponse):
    """A stream that reports how it ended, once, however it ended: every event sent, the client gone (the
    response is cut short without an error), or a failure while sending."""

    def __init__(self, content, on_end, **kwargs):
        super().__init__(content, **kwargs)
        self.on_end = on_end

    async def __call__(self, scope, receive, send) -> None:
        failed = False
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass  # the client went away mid-stream: counted as such, nothing to log
        except Exception:
            failed = True
            raise
        finally:
            self.on_end(failed)


def error_response(metrics: Metrics, err: ApiError, path: str) -> JSONResponse:
    metrics.observe(path, err.status, code=err.code)
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def client_left(metrics: Metrics, path: str, seconds: float | None = None) -> Response:
    """Counted as nginx counts it (499, `client_closed`), not as a server error; the reply goes nowhere."""
    metrics.observe(path, 499, seconds, "client_closed")
    return Response(status_code=499)


async def _api_error(request: Request, exc: ApiError):
    return error_response(request.app.state.service.metrics, exc, request.url.path)


async def _client_left(request: Request, exc: Exception):
    return client_left(request.app.state.service.metrics, request.url.path)


async def _http_error(request: Request, exc: StarletteHTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    err = ApiError(exc.status_code, message.get(exc.status_code, str(exc.detail)), "invalid_request_error", code)
    request.app.state.service.metrics.observe("other", err.status, code=err.code)
    return JSONResponse(err.body(), status_code=err.status)


async def _bug(request: Request, exc: Exception):
    log.error("unhandled: %s", one_line(exc), exc_info=True)
    err = ApiError(500, f"internal error ({type(exc).__name__})", "server_error", "internal_error")
    return error_response(request.app.state.service.metrics, err, request.url.path)


def authorize(service: AgentService, request: Request) -> None:
    if service.token is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), service.token.encode()):
        raise ApiError(401, "missing or wrong bearer token (Authorization: Bearer ...)", "authentication_error",
                       "invalid_api_key", {"WWW-Authenticate": "Bearer"})


async def read_json(service: AgentService, request: Request) -> Any:
    """The body, refused past max_body_bytes whether or not the client declared its length, and past
    body_timeout_s however slowly it trickles in. Nothing is held for the request while it arrives."""
    cfg, metrics = service.cfg, service.metrics
    limit = cfg.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {int(declared)} bytes is over max_body_bytes ({limit})",
                       "invalid_request_error", "body_too_large", {"Connection": "close"})
    body = bytearray()
    metrics.reading += 1
    try:
        async with asyncio.timeout(cfg.body_timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise ApiError(413, f"request body is over max_body_bytes ({limit})", "invalid_request_error",
                                   "body_too_large", {"Connection": "close"})
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within body_timeout_s ({cfg.body_timeout_s:g} s)",
                       "invalid_request_error", "body_timeout", {"Connection": "close"}) from None
    except ClientDisconnect:
        raise ClientLeft() from None
    finally:
        metrics.reading -= 1
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


@router.get("/health")
async def health(service: Service):
    status = "draining" if service.draining else "ok"
    return JSONResponse({"status": status, "model": service.cfg.name, "in_flight": service.metrics.in_flight},
                        status_code=503 if service.draining else 200)


@router.get("/metrics")
async def prometheus(request: Request, service: Service):
    authorize(service, request)
    return PlainTextResponse(service.metrics.text(), media_type="text/plain; version=0.0.4")


@router.get("/v1/models")
async def models(request: Request, service: Service):
    authorize(service, request)
    service.metrics.observe("/v1/models", 200)
    return {"object": "list",
            "data": [{"id": service.cfg.name, "object": "model", "created": 0, "owned_by": "distill"}]}


@router.get("/v1/admin/planner")
async def planner(request: Request, service: Service):
    authorize(service, request)
    service.metrics.observe("/v1/admin/planner", 200)
    return {"object": "planner", **service.planner}


@router.post("/v1/admin/planner")
async def swap_planner(request: Request, service: Service):
    authorize(service, request)
    data = await read_json(service, request)
    swapped = await service.swap_planner(parse(PlannerSwap, data))
    service.metrics.observe("/v1/admin/planner", 200)
    return swapped


@router.post("/v1/feedback")
async def feedback(request: Request, service: Service):
    authorize(service, request)
    item = parse(Feedback, await read_json(service, request))
    if item.at is not None:
        raise _bad_request("at: set by the server")
    try:
        stored = await asyncio.to_thread(service.traces.feedback, item)
    except NotWritten as exc:  # a full disk: one line here, a 503 the client can retry
        log.error("feedback not written, the request answered 503: %s", one_line(exc))
        raise ApiError(503, f"the feedback could not be stored ({clip(exc.reason, 200)})", "server_error",
                       "feedback_not_written", {"Retry-After": str(service.cfg.retry_after_s)}) from None
    if not stored:
        raise ApiError(404, f"id {item.id!r} was not served by this agent", "invalid_request_error", "unknown_id")
    service.metrics.observe("/v1/feedback", 200)
    return {"id": item.id, "object": "feedback", "stored": True}


@router.post("/v1/chat/completions")
async def chat(request: Request, service: Service):
    path = "/v1/chat/completions"
    cfg, metrics = service.cfg, service.metrics
    authorize(service, request)
    data = await read_json(service, request)  # a client that stalls here holds no slot
    if service.draining:
        raise ApiError(503, "the server is shutting down", "server_error", "draining",
                       {"Retry-After": str(cfg.retry_after_s)})
    req = parse(ChatRequest, data)
    if req.model != cfg.name:
        raise ApiError(404, f"model {req.model[:80]!r} is not served here; this agent is {cfg.name!r}",
                       "invalid_request_error", "model_not_found")
    question = question_of(req, cfg)
    if metrics.in_flight >= cfg.max_in_flight:
        raise ApiError(429, f"{metrics.in_flight} requests in flight, the most this server takes "
                       f"(max_in_flight); retry after {cfg.retry_after_s} s", "rate_limit_error",
                       "too_many_requests", {"Retry-After": str(cfg.retry_after_s)})
    metrics.in_flight += 1  # no await since the check: the event loop runs one handler at a time
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    t0 = time.perf_counter()
    if not req.stream:
        record, err = await asyncio.shield(service.start(question, rid, False, None))
        if await request.is_disconnected():
            return client_left(metrics, path, time.perf_counter() - t0)
        if err is not None:
            metrics.observe(path, err.status, time.perf_counter() - t0, err.code)
            return JSONResponse(err.body() | {"id": rid}, status_code=err.status, headers=err.headers)
        metrics.observe(path, 200, time.perf_counter() - t0)
        return {
            "id": rid, "object": "chat.completion", "created": created, "model": cfg.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": record.get("prediction") or ""},
                         "finish_reason": "stop"}],
            "usage": usage_of(record), "rewoo": rewoo_of(record),
        }
    return _stream(service, question, rid, created, t0, path)


def _stream(service: AgentService, question: str, rid: str, created: int, t0: float, path: str) -> CountedStream:
    """The answer as server-sent chunks while the agent works: the plan, each step, then the answer and usage.
    The request's slot is already taken; its task ends it, whether or not the client stays."""
    cfg, metrics = service.cfg, service.metrics
    queue: asyncio.Queue = asyncio.Queue()
    task = service.start(question, rid, True, lambda kind, payload: queue.put_nowait((kind, payload)))
    task.add_done_callback(lambda t: queue.put_nowait(("end", None)))
    # how the stream ended, for /metrics: (status, error code) once the last event is out
    ended: dict[str, Any] = {}

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
            yield f"data: {json.dumps(err.body())}\n\n"
        else:
            yield chunk({"content": record.get("prediction") or ""})
            yield chunk({}, "stop", usage=usage_of(record),
                        rewoo={"event": "done", **rewoo_of(record)})
        yield "data: [DONE]\n\n"
        ended["outcome"] = (err.status, err.code) if err is not None else (200, None)

    def on_end(failed: bool) -> None:
        status, code = ended.get("outcome", (500, "internal_error") if failed else (499, "client_closed"))
        metrics.observe(path, status, time.perf_counter() - t0, code)

    return CountedStream(events(), on_end, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Request-Id": rid})


@asynccontextmanager
async def _lifespan(app: FastAPI):
    yield
    await app.state.service.drain()


def build_app(service: AgentService) -> FastAPI:
    """One app per service; the routes (`router`) find the service on the app's state."""
    app = FastAPI(title=f"distill agent {service.cfg.name}", lifespan=_lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.service = service
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(ClientLeft, _client_left)
    app.add_exception_handler(ClientDisconnect, _client_left)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _bug)
    app.include_router(router)
    return app


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)


def token_of(cfg: AgentServerConfig) -> str | None:
    """The bearer token, read from the environment only; off loopback a server without one is refused."""
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


def check_planner_as_trained(cfg: AgentServerConfig) -> str | None:
    """A planner server serving a distill adapter (vLLM's /v1/models names its folder) must be sent the prompt
    kind and tools it was trained on, as its record says: refused in one line before any request is taken. A
    server not up yet, or one that does not answer within probe_timeout_s, is not checked (the agent starts,
    and its first request says so): asked once, without the request timeouts and retries, so a hung planner
    delays the start by one probe at most. Returns that adapter folder (None when none is found), which every
    trace then names."""
    if cfg.planner.backend != "openai":
        return None
    probe = cfg.planner.model_copy(update={"timeout_s": cfg.probe_timeout_s, "max_retries": 0})

    async def ask() -> dict:
        return await asyncio.wait_for(spec_identity(probe), cfg.probe_timeout_s)

    try:
        identity = asyncio.run(ask())
    except (ServerError, ServerUnreachable) as exc:
        log.warning("planner: could not ask %s what it serves (%s)", cfg.planner.base_url, exc)
        return None
    except (TimeoutError, asyncio.TimeoutError):
        log.warning("planner: %s did not say what it serves within probe_timeout_s (%g s); starting without "
                    "checking its adapter against planner_prompt and tools", cfg.planner.base_url, cfg.probe_timeout_s)
        return None
    if folder := adapter_of(identity):
        check_as_trained(folder, cfg.planner_prompt, tool_descriptions(cfg.tools), "serve-agent")
    return folder


_HEADER_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"


def http_protocol(cfg: AgentServerConfig, metrics: Metrics) -> type:
    """uvicorn's h11 protocol with a deadline on a request's headers, which uvicorn does not have: without one, a
    client that connects and sends half a request line keeps its connection (and a file descriptor) for ever.
    The clock starts when the connection opens and again after each reply; it stops once a request's headers
    are in (the body has its own deadline, in the app)."""
    body = json.dumps(ApiError(408, f"the request headers did not arrive within header_timeout_s "
                                    f"({cfg.header_timeout_s:g} s)", "invalid_request_error",
                               "header_timeout").body()).encode()
    reply = _HEADER_TIMEOUT_REPLY + f"content-length: {len(body)}\r\n\r\n".encode() + body

    class DeadlineH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_headers()

        def _await_headers(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(cfg.header_timeout_s, self._headers_late, self.cycle)

        def _headers_late(self, cycle) -> None:
            self._header_timer = None
            if self.cycle is not cycle or self.transport.is_closing():
                return  # a request's headers came in time
            if self.conn.trailing_data[0]:  # part of a request: say why it is cut off; an idle one just closes
                metrics.observe("other", 408, code="header_timeout")
                self.transport.write(reply)
            self.transport.close()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():  # no pipelined request started
                self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

    return DeadlineH11Protocol


def draining_server(config, service: AgentService):
    """uvicorn's server, but the first SIGTERM/SIGINT drains before anything closes: the listener stays open so
    that /health answers 503 (a load balancer takes the process out of rotation) and new chat requests get 503
    `draining`, while the requests in flight (and bodies being read) finish, up to drain_timeout_s; then
    uvicorn's own shutdown runs with what is left of it. A second signal stops waiting."""
    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            if not service.draining and not self.should_exit:
                self._captured_signals.append(sig)  # re-raised after the run, as uvicorn does
                service.draining = True
                service.drain_deadline = time.monotonic() + service.cfg.drain_timeout_s
                return
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if service.draining and not self.should_exit:
                left = service.drain_deadline - time.monotonic()
                if not service.busy() or left <= 0:
                    self.config.timeout_graceful_shutdown = max(left, 1.0)
                    self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer(config)


def main(args: argparse.Namespace) -> int:
    cfg = load_config(AgentServerConfig, args.config, args.set)
    token = token_of(cfg)
    if cfg.planner.backend != "openai":
        log.warning("planner: backend %s runs in this process; a served student is usually a LoRA module on a "
                    "vLLM server (backend: openai)", cfg.planner.backend)
    adapter = check_planner_as_trained(cfg)
    service = AgentService(cfg, token=token, adapter=adapter)
    port = cfg.port or free_port(cfg.host)
    app = build_app(service)
    server = draining_server(uvicorn.Config(
        app, host=cfg.host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=cfg.drain_timeout_s,
        timeout_keep_alive=5, lifespan="on", http=http_protocol(cfg, service.metrics),
    ), service)
    print(f"agent {cfg.name} on http://{client_host(cfg.host)}:{port}/v1 (auth: "
          f"{'bearer token from $' + cfg.auth_token_env if token else 'none, loopback only'}; "
          f"traces: {service.traces.current})", flush=True)
    stopped_by: list[int] = []
    # the server drains on SIGTERM/SIGINT, then re-raises the signal to the handler that was there before it: a
    # handler of ours, so a drained stop ends here with exit 0 and its summary line, not killed by the signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
    server.run()
    print(f"agent {cfg.name} stopped: {service.traces.written} request(s) traced in {cfg.traces_dir}", flush=True)
    return 0


if __name__ == "__main__":  # `python -m distill.serving.agent_server` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
