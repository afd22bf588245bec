#!/usr/bin/env python
"""python scripts/kill_resume_check.py --config configs/generate_smollm2_vllm.yaml [--kills 4] [--seed 0]

Crash-safety check for generation: runs `scripts/generate_trajectories.py` with the config, kills it at
random points (alternating SIGKILL and SIGINT), resumes each time, and at the end verifies that every
planned (example, sample) record is on disk exactly once and that no line is torn.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--kills", type=int, default=4)
    p.add_argument("--min-wait", type=float, default=10)
    p.add_argument("--max-wait", type=float, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    rng = random.Random(args.seed)
    cmd = [sys.executable, str(ROOT / "scripts" / "generate_trajectories.py"), "--config", args.config]
    for s in args.set:
        cmd += ["--set", s]
    from distill.config import load_config
    from distill.generate import GenerateConfig

    cfg = load_config(GenerateConfig, args.config, args.set)
    out = Path(cfg.output_dir) / "trajectories.jsonl"
    for k in range(args.kills):
        sig = signal.SIGKILL if k % 2 == 0 else signal.SIGINT
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait = rng.uniform(args.min_wait, args.max_wait)
        try:
            proc.wait(timeout=wait)
            print(f"run {k}: finished before the kill")
            break
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
            proc.wait()
        lines = out.read_bytes().count(b"\n") if out.exists() else 0
        print(f"run {k}: {sig.name} after {wait:.0f}s, exit {proc.returncode}, {lines} records on disk")
    t0 = time.time()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(done.stderr[-2000:])
        return 1
    print(f"final run: complete in {time.time() - t0:.0f}s")
    raw = out.read_bytes()
    records = [json.loads(l) for l in raw.splitlines() if l.strip()]
    counts = collections.Counter((r["id"], r["sample"]) for r in records)
    manifest = json.loads((out.parent / "manifest.json").read_text())
    planned = manifest["planned_records"]
    dupes = [k for k, v in counts.items() if v > 1]
    ok = raw.endswith(b"\n") and not dupes and len(counts) == planned
    print(f"planned {planned}, on disk {len(records)}, distinct {len(counts)}, duplicates {len(dupes)}: "
          f"{'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
