"""Run: .venv/bin/python scripts/bench_worker.py [--latency 0.1] [--widths 1 2 4 8] [--repeats 3]

How much the Worker's dependency-graph scheduling buys over running tool calls one after another.

Plan shape for width w (2w + 1 steps), the shape of a typical multi-hop ReWOO plan:

    #E1..#Ew        = Wikipedia[entity i]            w independent look-ups
    #E(w+1)..#E(2w) = Wikipedia[follow-up on #Ei]    each depends on one look-up
    #E(2w+1)        = LLM[combine #E(w+1) .. #E(2w)] depends on all follow-ups

Every tool call sleeps a fixed latency (asyncio.sleep), so the critical path is 3 calls and the ideal
speedup is (2w + 1) / 3. "sequential" is the same Worker with max_concurrency=1; "concurrent" uses
max_concurrency = 2w + 1. Times are the best of --repeats runs; "of ideal" = speedup / ideal speedup.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distill.rewoo.plan import Plan, parse_plan  # noqa: E402
from distill.rewoo.worker import WorkerConfig, run_plan  # noqa: E402


@dataclass
class SleepTool:
    """A tool with fixed latency: stands in for a network call so only scheduling is measured."""

    name: str
    latency_s: float
    description: str = "sleeps, then echoes"

    async def run(self, query: str) -> str:
        await asyncio.sleep(self.latency_s)
        return f"result for: {query[:40]}"


def fan_plan(width: int) -> Plan:
    lines = []
    for i in range(1, width + 1):
        lines += [f"Plan: look up entity {i}.", f"#E{i} = Wikipedia[entity {i}]"]
    for i in range(1, width + 1):
        lines += [f"Plan: follow up on entity {i}.", f"#E{width + i} = Wikipedia[follow-up on #E{i}]"]
    refs = " ".join(f"#E{width + i}" for i in range(1, width + 1))
    lines += ["Plan: combine the findings.", f"#E{2 * width + 1} = LLM[combine {refs}]"]
    plan = parse_plan("\n".join(lines), tools=["Wikipedia", "LLM"])
    assert plan.valid, plan.errors
    return plan


async def best_time(plan: Plan, tools: dict, concurrency: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        evidence = await run_plan(plan, tools, WorkerConfig(max_concurrency=concurrency))
        best = min(best, time.perf_counter() - start)
        assert all(e.status == "ok" for e in evidence), [e.error for e in evidence if e.status != "ok"]
    return best


async def bench(widths: list[int], latency: float, repeats: int) -> list[dict]:
    tools = {name: SleepTool(name, latency) for name in ("Wikipedia", "LLM")}
    rows = []
    for width in widths:
        plan = fan_plan(width)
        steps = len(plan.steps)
        sequential = await best_time(plan, tools, 1, repeats)
        concurrent = await best_time(plan, tools, steps, repeats)
        rows.append(dict(width=width, steps=steps, seq=sequential, conc=concurrent, speedup=sequential / concurrent,
                         ideal=steps / 3))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per tool call")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = asyncio.run(bench(args.widths, args.latency, args.repeats))
    print(f"tool latency {args.latency:g}s, best of {args.repeats}")
    print("| width | steps | sequential s | concurrent s | speedup | ideal | of ideal |")
    print("|------:|------:|-------------:|-------------:|--------:|------:|---------:|")
    for r in rows:
        print(f"| {r['width']} | {r['steps']} | {r['seq']:.3f} | {r['conc']:.3f} | {r['speedup']:.2f} | "
              f"{r['ideal']:.2f} | {r['speedup'] / r['ideal']:.2f} |")
    worst = min(r["speedup"] / r["ideal"] for r in rows if r["width"] == max(args.widths))
    return 0 if worst >= 0.8 else 1


if __name__ == "__main__":
    raise SystemExit(main())
