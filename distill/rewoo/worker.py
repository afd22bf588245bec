"""The ReWOO Worker: run a plan's tool calls as a dependency graph.

Each step is an asyncio task that waits for exactly the steps it references, then for a semaphore slot, so
a step starts the moment its inputs exist (not when a whole "level" is done). Waiting happens before taking
a slot, so a step blocked on its dependencies never holds one and the graph cannot deadlock.

A tool failure is data, not an exception: it yields `No evidence found` with its status and error
recorded, and the steps after it still run, so every trajectory is complete and the filter can judge it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

from distill.core.errors import DistillError
from distill.core.metrics import RETRIEVAL_TOOLS
from distill.core.secrets import mask
from distill.rewoo.plan import Plan, Step, substitute
from distill.tools.base import Tool

log = logging.getLogger(__name__)

NO_EVIDENCE = "No evidence found"
TRUNCATION_MARK = "…"
DEFAULT_TOOL_TIMEOUT_S = 30.0

# The ways a step can go wrong: each is a status of its evidence, and a trigger the agent may re-plan on.
Surprise = Literal["empty", "error", "timeout"]
Status = Literal["ok", Surprise]
SURPRISES: tuple[str, ...] = get_args(Surprise)


class InjectedToolFailure(RuntimeError):
    """A failure made on purpose in place of a tool call (eval's `tool_failure_rate`). Its evidence says
    `injected`, so the report tells a made failure from a real one by a field, not by the error's text."""


@dataclass
class WorkerConfig:
    max_concurrency: int = 8
    tool_timeout_s: float | dict[str, float] = DEFAULT_TOOL_TIMEOUT_S  # a dict: tool name -> s, others default
    evidence_max_chars: int = 1500


@dataclass
class Evidence:
    id: str
    tool: str
    input: str  # after substitution of the referenced evidence
    output: str  # truncated to evidence_max_chars; NO_EVIDENCE unless status is "ok"
    status: Status
    error: str | None
    start_s: float  # seconds since the run started (time.perf_counter), when the tool call began
    end_s: float
    injected: bool = False  # the failure was an InjectedToolFailure, not the tool's own

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def truncate(text: str, max_chars: int) -> str:
    """Cap `text` at max_chars characters in all, the last being a visible cut mark."""
    return text if len(text) <= max_chars else text[: max(max_chars - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK


def dependency_indices(steps: Sequence[Step]) -> list[list[int]]:
    """For each step, the indices of the earlier steps it waits for. A ref resolves to the latest *earlier*
    step with that id (a duplicate id acts as reassignment) and refs to later steps or to itself are left in
    the text as written, so the graph is always acyclic, and built in one pass whatever a runaway plan holds."""
    latest: dict[str, int] = {}
    deps: list[list[int]] = []
    for index, step in enumerate(steps):
        deps.append([latest[ref] for ref in step.deps if ref in latest])
        latest[step.id] = index
    return deps


def needed_by(steps: Sequence[Step], root: Callable[[Step], bool]) -> list[bool]:
    """For each step, whether it is a root or a step whose output a root takes in, directly or through others (a
    reference resolves as the Worker resolves it). Linear in the plan's steps and references."""
    deps = dependency_indices(steps)
    keep = [False] * len(steps)
    todo = [i for i, step in enumerate(steps) if root(step)]
    while todo:
        i = todo.pop()
        if not keep[i]:
            keep[i] = True
            todo.extend(deps[i])
    return keep


def kept_part(plan: Plan, keep: Sequence[bool]) -> Plan:
    """The plan's steps whose `keep` is true, in plan order."""
    return replace(plan, steps=tuple(step for step, kept in zip(plan.steps, keep) if kept))


def retrieval_part(plan: Plan) -> Plan:
    """The plan's retrieval steps and the steps they read, in plan order: all that evidence recall can see."""
    return kept_part(plan, needed_by(plan.steps, lambda step: step.tool in RETRIEVAL_TOOLS))


async def run_plan(
    plan: Plan, tools: Mapping[str, Tool], config: WorkerConfig | None = None,
    known: Mapping[str, str] | None = None, t0: float | None = None,
    on_step: Callable[[Evidence], None] | None = None,
) -> list[Evidence]:
    """Run every step of `plan` (valid or not) and return its evidence in step order.

    `known` maps ids of evidence gathered before this plan (a re-plan continues an earlier one) to their
    outputs, substituted without waiting; an earlier step of `plan` with the same id wins. `t0` (a
    time.perf_counter value, by default now) lets the steps of a continued plan share the first one's clock.
    `on_step` hears of each step the moment it finishes, in finishing order: a served agent streams it then
    rather than when the whole plan is done."""
    config, known = config or WorkerConfig(), known or {}
    if config.max_concurrency < 1:
        raise DistillError(f"worker max_concurrency must be at least 1, got {config.max_concurrency}")
    origin = time.perf_counter() if t0 is None else t0
    semaphore = asyncio.Semaphore(config.max_concurrency)
    deps = dependency_indices(plan.steps)
    tasks: list[asyncio.Task[Evidence]] = []

    def clock() -> float:
        return time.perf_counter() - origin

    async def run_step(step: Step, index: int) -> Evidence:
        # Tasks are created in step order and deps point backwards, so every awaited task exists.
        inputs = {ref: known[ref] for ref in step.deps if ref in known}
        inputs |= {plan.steps[i].id: (await tasks[i]).output for i in deps[index]}
        query = substitute(step.input, inputs)
        tool = tools.get(step.tool)
        if tool is None:
            now = clock()
            return _failed(step, query, "error", f"unknown tool {step.tool!r}", now, now)
        timeout = config.tool_timeout_s
        if isinstance(timeout, Mapping):
            timeout = timeout.get(step.tool, DEFAULT_TOOL_TIMEOUT_S)
        async with semaphore:
            start = clock()
            try:
                raw = await asyncio.wait_for(tool.run(query), timeout)
            except asyncio.TimeoutError:
                return _failed(step, query, "timeout", f"no answer within {timeout:g}s", start, clock())
            except Exception as exc:  # any tool failure becomes recorded evidence, by design
                log.debug("tool %s failed on %r", step.tool, query, exc_info=True)
                return _failed(step, query, "error", mask(f"{type(exc).__name__}: {exc}"), start, clock(),
                               injected=isinstance(exc, InjectedToolFailure))
            end = clock()
        text = raw.strip() if isinstance(raw, str) else ""
        if not text:
            why = "tool returned no text" if isinstance(raw, str) else f"tool returned {type(raw).__name__}, not text"
            return _failed(step, query, "empty", why, start, end)
        return Evidence(step.id, step.tool, query, truncate(text, config.evidence_max_chars), "ok", None, start, end)

    async def run_and_tell(step: Step, index: int) -> Evidence:
        evidence = await run_step(step, index)
        if on_step is not None:
            on_step(evidence)
        return evidence

    async with asyncio.TaskGroup() as group:
        for index, step in enumerate(plan.steps):
            tasks.append(group.create_task(run_and_tell(step, index)))
    return [task.result() for task in tasks]


def _failed(step: Step, query: str, status: Status, error: str, start: float, end: float,
            injected: bool = False) -> Evidence:
    return Evidence(step.id, step.tool, query, NO_EVIDENCE, status, error, start, end, injected)


def run_plan_sync(plan: Plan, tools: Mapping[str, Tool], config: WorkerConfig | None = None) -> list[Evidence]:
    """`run_plan` for scripts and the REPL, which have no event loop of their own."""
    return asyncio.run(run_plan(plan, tools, config))
