#!/usr/bin/env python
"""python scripts/bench_generate.py --base-url http://127.0.0.1:8010/v1 --model teacher [--records 16]

Trajectories per minute of `distill generate` against a running OpenAI-compatible server (a local vLLM),
at concurrency 1, 4 and 16, printed as ratios to concurrency 1. The call cache is off and each level gets
a fresh output folder, so every record is a real planner call, tool calls and a solver call.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8010/v1")
    p.add_argument("--model", default="teacher")
    p.add_argument("--records", type=int, default=16, help="records per concurrency level")
    p.add_argument("--levels", default="1,4,16")
    p.add_argument("--questions", default=str(ROOT / "data" / "demo" / "train.jsonl"))
    p.add_argument("--corpus", default=str(ROOT / "data" / "demo" / "corpus.jsonl"))
    args = p.parse_args()
    from distill.core.config import validate
    from distill.generate import GenerateConfig, generate

    spec = {"backend": "openai", "model": args.model, "base_url": args.base_url, "max_concurrency": 64}
    rows = []
    for level in [int(x) for x in args.levels.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = validate(GenerateConfig, {
                # the teacher settings of configs/generate_smollm2_vllm.yaml
                "planner": spec | {"temperature": 0.7, "max_tokens": 160, "stop": ["\nQuestion:"]},
                "solver": spec | {"max_tokens": 32},
                "llm_tool": spec | {"max_tokens": 64},
                "tool_timeout_s": 300, "evidence_max_chars": 500,
                "wikipedia_corpus": args.corpus,
                "datasets": [{"name": "hotpotqa", "source": args.questions, "n": args.records}],
                "output_dir": tmp, "concurrency": level, "cache": None, "samples_per_question": 1,
            })
            t0 = time.perf_counter()
            summary = generate(cfg)
            wall = time.perf_counter() - t0
        rows.append((level, summary["records"], wall, summary["records"] / wall * 60))
    base = rows[0][3]
    print("\n| concurrency | records | wall s | trajectories/min | ratio to c=1 |")
    print("|---:|---:|---:|---:|---:|")
    for level, n, wall, rate in rows:
        print(f"| {level} | {n} | {wall:.1f} | {rate:.1f} | {rate / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
