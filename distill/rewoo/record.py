"""The trajectory record every agent writes (ReWOO and the baselines), and the per-question seed they sample
with: one shape that generation, filtering, training data, evaluation and the report all read, kept apart from
any one agent so that each can import it.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from distill.llm.base import Completion, Usage
from distill.metrics import evidence_recall, gold_titles, score

FORMAT_VERSION = 1


def sample_seed(example_id: str, sample: int, base: int = 0) -> int:
    """A stable per-(example, sample) seed: reruns resample identically and hit the call cache."""
    return (zlib.crc32(f"{example_id}#{sample}".encode()) + base) % (2**31)


def call_record(messages: list[dict], out: Completion) -> dict:
    return {
        "model": out.model, "messages": messages, "output": out.text, "usage": asdict(out.usage),
        "latency_s": round(out.latency_s, 4), "cost_usd": out.cost_usd, "cached": out.cached,
    }


def make_record(
    example, method: str, sample: int, t0: float, *, evidence: list[dict], solver: dict, prediction: str,
    solver_calls: Sequence[Completion], tools: Mapping[str, Any], planner: dict | None = None,
    plan: dict | None = None, planner_calls: Sequence[Completion] = (), recall: bool = True, **extra: Any,
) -> dict:
    """The trajectory record of every method (ReWOO and the baselines), so the report compares like with like.
    A method without a plan has no steps and validity not applicable (None, not False); `recall` is off for
    one that never retrieves, so its records do not enter the evidence-recall mean."""
    tool_calls = [c for t in tools.values() for c in getattr(t, "calls", [])]
    by_role = {"planner": planner_calls, "solver": solver_calls, "tools": tool_calls}
    usage = {role: sum((c.usage for c in cs), Usage()) for role, cs in by_role.items()}
    tokens = {role: u.total_tokens for role, u in usage.items()}
    calls = [*planner_calls, *solver_calls, *tool_calls]
    record = {
        "format_version": FORMAT_VERSION,
        "id": example.id,
        "dataset": example.dataset,
        "question": example.question,
        "answers": list(example.answers),
        "method": method,
        "sample": sample,
        "planner": planner,
        "plan": plan or {"valid": None, "steps": [], "errors": []},
        "evidence": evidence,
        "solver": solver,
        "prediction": prediction,
        "scores": dict(score(example.dataset, prediction, example.answers)) if example.answers else {},
        "tool_usage": asdict(usage["tools"]),
        "tokens": tokens | {"total": sum(tokens.values())},
        "llm_calls": len(calls),
        "tool_calls": len(evidence),
        "cost_usd": sum(c.cost_usd for c in calls),
        "wall_s": round(time.perf_counter() - t0, 4),
    }
    if recall:
        record["evidence_recall"] = evidence_recall(gold_titles(getattr(example, "supporting_facts", None)), evidence)
    return record | extra
