#!/usr/bin/env python
"""python scripts/kill_resume_check.py [generate|eval] --config CONFIG [--kills 5] [--seed 0] [--set k=v ...]

SIGKILLs `distill generate` or `distill eval` at random points, resumes it each time, lets it finish, and checks
that every planned record is on disk exactly once, none seen after a kill was lost, and no line is torn; CI runs
the same `kill_and_resume` (tests/test_crash_resume.py). The first kill lands in start-up, the others one or two
records later plus 0-0.5 s, so each run makes progress. A kill rarely lands inside a record's short write, so
after the third kill the check leaves what one would: half a record at the end of a file, for the resume to cut.
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

# what keys a record, and where the records live, per command
KEYS = {"generate": ("id", "sample"), "eval": ("method", "id")}
RECORDS = {"generate": "trajectories.jsonl", "eval": "records/*.jsonl"}


def record_files(command: str, out: Path) -> list[Path]:
    """The record files on disk now: none yet when a kill lands before the first record is written."""
    return sorted(out.glob(RECORDS[command]))


def read_complete(command: str, out: Path) -> tuple[list[tuple], int]:
    """Keys of the complete lines on disk now, and how many files end in a torn (unfinished) line."""
    keys, torn = [], 0
    for path in record_files(command, out):
        raw = path.read_bytes()
        torn += bool(raw) and not raw.endswith(b"\n")
        for line in raw.split(b"\n")[:-1]:
            if line.strip():
                rec = json.loads(line)
                keys.append(tuple(rec[k] for k in KEYS[command]))
    return keys, torn


def planned_records(command: str, out: Path) -> int:
    manifest = json.loads((out / "manifest.json").read_text())
    if command == "generate":
        return manifest["planned_records"]
    return len(manifest["methods"]) * len(manifest["examples"])


def kill_and_resume(command: str, config: str, out: Path, kills: int, seed: int, sets=(), log=print,
                    timeout_s: float = 600) -> dict:
    """Kill a run `kills` times at random points, resume, finish; return what was seen (see `verdict`)."""
    rng = random.Random(seed)
    cmd = [sys.executable, "-m", "distill.cli", command, "--config", config] + [a for s in sets for a in ("--set", s)]
    seen: set[tuple] = set()
    points, torn_seen = [], 0
    for k in range(kills):
        before = len(read_complete(command, out)[0])
        planned = planned_records(command, out) if (out / "manifest.json").exists() else None
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        by_progress = k > 0 and planned is not None and planned - before > 2
        target = before + rng.randint(1, 2)
        delay = rng.uniform(0.0, 0.5) if by_progress else rng.uniform(0.2, 2.0)
        while proc.poll() is None and time.monotonic() - t0 < timeout_s:
            if not by_progress or len(read_complete(command, out)[0]) >= target:
                time.sleep(delay)
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            log(f"run {k}: ended (exit {proc.returncode}) before its kill")
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if k == 2 and record_files(command, out):
            with record_files(command, out)[-1].open("ab") as f:
                f.write(b'{"id": "torn-by-a-kill", "method": "x", "sample": 0, "prediction": "hal')
        keys, torn = read_complete(command, out)
        torn_seen += torn
        seen |= set(keys)
        at = time.monotonic() - t0
        where = f"after record {len(keys)}+{delay:.2f}s" if by_progress else "during start-up"
        points.append({"run": k, "at_s": round(at, 2), "records_on_disk": len(keys), "torn_tail": bool(torn)})
        log(f"kill {k + 1}: SIGKILL at {at:.2f}s ({where}), {len(keys)} records on disk"
            f"{', torn last line' if torn else ''}")
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout_s)
    keys, torn = read_complete(command, out)
    counts = collections.Counter(keys)
    result = {
        "kills": points, "final_exit": done.returncode, "final_stderr": done.stderr[-2000:],
        "planned": planned_records(command, out), "records": len(keys), "distinct": len(counts),
        "duplicates": sum(v - 1 for v in counts.values()), "lost": len(seen - set(counts)),
        "torn_at_end": torn, "torn_tails_repaired": torn_seen,
        "status": json.loads((out / "manifest.json").read_text())["status"],
    }
    log(f"final run: exit {done.returncode}, status {result['status']}; planned {result['planned']}, "
        f"on disk {result['records']}, duplicates {result['duplicates']}, lost {result['lost']}, "
        f"torn tails repaired {torn_seen}")
    return result


def verdict(result: dict) -> bool:
    return (result["final_exit"] == 0 and result["status"] == "complete" and result["duplicates"] == 0
            and result["lost"] == 0 and result["torn_at_end"] == 0 and result["distinct"] == result["planned"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", nargs="?", default="generate", choices=sorted(KEYS))
    p.add_argument("--config", required=True)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    from distill.config import load_config
    from distill.evaluate import EvalConfig
    from distill.generate import GenerateConfig

    cfg = load_config(GenerateConfig if args.command == "generate" else EvalConfig, args.config, args.set)
    result = kill_and_resume(args.command, args.config, Path(cfg.output_dir), args.kills, args.seed, args.set)
    ok = verdict(result)
    print("OK" if ok else f"FAIL\n{result['final_stderr']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
