"""The trajectory record every agent writes (ReWOO and the baselines), and the per-question seed they sample
with: one shape that generation, filtering, training data, evaluation and the report all read, kept apart from
any one agent so that each can import it.

`TrajectoryRecord` is that shape as a schema: `make_record` checks what it builds against it and every stage
that reads records back checks each line against it (or a stricter model built on it: the filter's kept
record, eval's record) before any work, so a hand-edited or damaged file is one line naming file:line and the
field, never a traceback halfway through. Values are strict (a string is not a number, NaN is not a time);
fields a reader does not need may be absent, fields a reader does need may not.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import asdict
from typing import Annotated, Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from distill.llm.base import Completion, Usage
from distill.core.metrics import Metric, evidence_recall, gold_titles, metric_for, score

FORMAT_VERSION = 1

Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]
Dollars = Annotated[float, Field(ge=0)]


class Shape(BaseModel):
    """Strict JSON types, no NaN or infinity; fields a model does not name pass through unchecked."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


class PlanStepShape(Shape):
    id: str
    description: str = ""
    tool: str
    input: str
    deps: list[str]


class PlanErrorShape(Shape):
    code: str
    step: str | None = None
    message: str = ""


class PlanShape(Shape):
    valid: bool | None  # None: a method without a plan
    steps: list[PlanStepShape]
    errors: list[PlanErrorShape] = []


class EvidenceShape(Shape):
    id: str
    tool: str = ""
    input: str = ""
    output: str = ""
    status: Literal["ok", "empty", "error", "timeout"]
    error: str | None = None
    start_s: float = 0.0
    end_s: float = 0.0
    injected: bool = False


class UsageShape(Shape):
    prompt_tokens: Count = 0
    completion_tokens: Count = 0


class CallShape(Shape):
    """A model call: its messages, reply, usage and cost (`call_record`)."""

    model: str | None = None
    messages: list[dict[str, Any]] = []
    output: str = ""
    usage: UsageShape = UsageShape()
    latency_s: Seconds = 0.0
    cost_usd: Dollars = 0.0
    cached: bool = False


class ScoresShape(Shape):
    """EM, F1 and the judge's verdict, each only where it was measured: readers test `"em" in scores` (a question
    without gold answers has none), so the check adds no default, it only refuses a wrong type."""

    @model_validator(mode="after")
    def _typed(self) -> "ScoresShape":
        extra = self.model_extra or {}
        for name in ("em", "f1"):
            value = extra.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{name}: a score is a number from 0 to 1, not {value!r:.40}")
        if extra.get("judge") not in (True, False, None):  # None: a judge reply that did not parse
            raise ValueError(f"judge: the verdict is true, false or null, not {extra['judge']!r:.40}")
        return self


class TokensShape(Shape):
    planner: Count = 0
    solver: Count = 0
    tools: Count = 0
    total: Count = 0


class RecallShape(Shape):
    recall: float = Field(ge=0, le=1)
    all: bool
    gold: list[str] = []
    found: list[str] = []


class TrajectoryRecord(Shape):
    """One answer of one method to one question (`make_record`), as generation writes it and the filter reads it."""

    format_version: int = FORMAT_VERSION
    id: str = Field(min_length=1)
    dataset: str
    question: str
    answers: list[str]
    # the scoring rules of `scores` (`distill.core.metrics`); absent in older records, read by `metric_of`
    metric: Metric | None = None
    method: str | None = None
    sample: int = Field(default=0, ge=0)
    planner: CallShape | None = None
    plan: PlanShape
    evidence: list[EvidenceShape] = []
    solver: CallShape = CallShape()
    prediction: str | None = None
    scores: ScoresShape = ScoresShape()
    tool_usage: UsageShape = UsageShape()
    tokens: TokensShape = TokensShape()
    llm_calls: Count = 0
    tool_calls: Count = 0
    cost_usd: Dollars = 0.0
    wall_s: Seconds = 0.0
    evidence_recall: RecallShape | None = None
    # ids of plan steps deliberately not run (generate's `run_unread_steps: false`: LLM steps nothing reads)
    not_run: list[str] = []


def sample_seed(example_id: str, sample: int, base: int = 0) -> int:
    """A stable per-(example, sample) seed: reruns resample identically and hit the call cache."""
    return (zlib.crc32(f"{example_id}#{sample}".encode()) + base) % (2**31)


def call_record(messages: list[dict], out: Completion) -> dict:
    return {
        "model": out.model, "messages": messages, "output": out.text, "usage": asdict(out.usage),
        "latency_s": round(out.latency_s, 4), "cost_usd": out.cost_usd, "cached": out.cached,
    }


def _mend(value: Any) -> Any:
    """`value` with every lone UTF-16 surrogate in its strings replaced by U+FFFD. A model or a tool can
    return one (a JSON `\\ud800` escape), no file can hold it, and a record that cannot be written would stop
    the run; a pair split in two code points is joined back."""
    if isinstance(value, str):
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return value
    if isinstance(value, dict):
        return {_mend(k): _mend(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mend(v) for v in value]
    return value


def make_record(
    example, method: str, sample: int, t0: float, *, evidence: list[dict], solver: dict, prediction: str,
    solver_calls: Sequence[Completion], tools: Mapping[str, Any], planner: dict | None = None,
    plan: dict | None = None, planner_calls: Sequence[Completion] = (), recall: bool = True, scored: bool = True,
    **extra: Any,
) -> dict:
    """The trajectory record of every method (ReWOO and the baselines), so the report compares like with like.
    A method without a plan has no steps and validity not applicable (None, not False); `recall` is off for
    one that never retrieves, so its records do not enter the evidence-recall mean; `scored` is off for a
    trajectory that was never solved (no answer to score, so no EM of 0 either)."""
    tool_calls = [c for t in tools.values() for c in getattr(t, "calls", [])]
    by_role = {"planner": planner_calls, "solver": solver_calls, "tools": tool_calls}
    usage = {role: sum((c.usage for c in cs), Usage()) for role, cs in by_role.items()}
    tokens = {role: u.total_tokens for role, u in usage.items()}
    calls = [*planner_calls, *solver_calls, *tool_calls]
    metric = getattr(example, "metric", None)
    if example.answers:
        metric = metric_for(example.dataset, metric)
    record = {
        "format_version": FORMAT_VERSION,
        "id": example.id,
        "dataset": example.dataset,
        "question": example.question,
        "answers": list(example.answers),
        "metric": metric,
        "method": method,
        "sample": sample,
        "planner": planner,
        "plan": plan or {"valid": None, "steps": [], "errors": []},
        "evidence": evidence,
        "solver": solver,
        "prediction": prediction,
        "scores": dict(score(metric, prediction, example.answers)) if example.answers and scored else {},
        "tool_usage": asdict(usage["tools"]),
        "tokens": tokens | {"total": sum(tokens.values())},
        "llm_calls": len(calls),
        "tool_calls": len(evidence),
        "cost_usd": sum(c.cost_usd for c in calls),
        "wall_s": round(time.perf_counter() - t0, 4),
    }
    if recall:
        record["evidence_recall"] = evidence_recall(gold_titles(getattr(example, "supporting_facts", None)), evidence)
    record = _mend(record | extra)
    TrajectoryRecord.model_validate(record)  # a writer's slip fails here, not in the stage that reads it
    return record
