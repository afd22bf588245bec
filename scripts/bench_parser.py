"""Run: .venv/bin/python scripts/bench_parser.py [--repeats 3]

CPU seconds of the plan parser, the Worker's dependency code and the evidence-recall title reader on the
hostile shapes the tests check for linear growth (tests/test_plan_hostile.py, tests/test_evidence_recall.py),
at the named size and at 8x, best of --repeats. The tests assert only the ratio (linear ~8, quadratic ~64), so
a loaded machine cannot fail them; the absolute figures live here.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from distill.core.metrics import retrieved_titles  # noqa: E402
from distill.rewoo.plan import parse_plan  # noqa: E402
from distill.rewoo.worker import dependency_indices  # noqa: E402
from scaling import FACTOR, cpu_seconds  # noqa: E402
from test_plan_hostile import SHAPES, TOOLS, chained_steps, same_id_steps  # noqa: E402


def best(fn, repeats: int) -> float:
    return min(cpu_seconds(fn) for _ in range(repeats))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    cases = {f"parse_plan: {name}": (lambda c, shape=shape: partial(parse_plan, shape(c), tools=TOOLS,
                                                                      max_plan_chars=None), count)
             for name, (shape, count) in SHAPES.items()}
    cases["dependency_indices: chained steps"] = (lambda n: partial(dependency_indices, chained_steps(n)), 10_000)
    cases["dependency_indices: steps sharing one id"] = (lambda n: partial(dependency_indices, same_id_steps(n)),
                                                         10_000)
    hostile = lambda c: [{"id": "#E1", "tool": "Wikipedia", "output": ":" * (4 * c) + "\n\n" * c, "status": "ok"}]
    cases["retrieved_titles: colons and blank lines"] = (lambda c: partial(retrieved_titles, hostile(c)), 50_000)
    print(f"| case | size | CPU s | {FACTOR}x size CPU s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, (make, n) in cases.items():
        small, large = best(make(n), args.repeats), best(make(n * FACTOR), args.repeats)
        print(f"| {name} | {n:,} | {small:.4f} | {large:.4f} | {large / max(small, 1e-6):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
