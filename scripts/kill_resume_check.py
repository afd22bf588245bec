#!/usr/bin/env python
"""python scripts/kill_resume_check.py [generate|eval] --config CONFIG [--kills 5] [--seed 0] [--set k=v ...]

SIGKILLs `distill generate` or `distill eval` at points it observes, resumes it each time, lets it finish, and
checks that every planned record is on disk exactly once, none seen after a kill was lost, and no line is torn;
CI runs the same `kill_and_resume` (tests/test_crash_resume.py).

The kills: kill 0 lands in start-up, once the run's own manifest says `running` and before it has a record (the
lock is held and no record is written: the rerun must take the folder over). Each of the `kills` after it
waits, polling the record files, until the record count reaches its target (the count the run started from
plus 1 or 2, drawn from the seeded rng) and kills at once, so every run makes progress and no kill depends on
how fast the machine is. Targets stay `RESERVE` records below the planned count, so the run cannot finish
before its last kill; a workload without that room, a run that ends early or a record that does not land
within `timeout_s` fails with a message saying which. A kill seldom lands inside a record's short write, so
after one kill (drawn from the rng) the check leaves what one would: the last record line of a record file cut
partway, no newline; the resume must cut it and redo that record. The seed fixes the plan (1 or 2 records a
kill, which kill tears); how many records land between the count reaching a target and the kill is timing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import distill
from distill.evaluate import RECORDS_DIR
from distill.evaluate import record_key as eval_key
from distill.generate import TRAJECTORIES
from distill.generate import record_key as generate_key

# per command: where its records live (a glob under the output folder) and what keys one
LAYOUT = {"generate": (TRAJECTORIES, generate_key), "eval": (f"{RECORDS_DIR}/*.jsonl", eval_key)}
RESERVE = 3  # records a kill target stays below the planned count: more than a resumed run replays at once
POLL_S = 0.05


class KillCheckError(RuntimeError):
    """The check could not make a planned kill: the message says which and why."""


def record_files(command: str, out: Path) -> list[Path]:
    """The record files on disk now: none yet when a kill lands before the first record is written."""
    return sorted(out.glob(LAYOUT[command][0]))


def count_complete(command: str, out: Path) -> int:
    """Complete lines on disk now (a record is one line, written with its newline); cheap enough to poll."""
    return sum(path.read_bytes().count(b"\n") for path in record_files(command, out))


def read_complete(command: str, out: Path) -> tuple[list[tuple], int, int]:
    """Keys of the complete lines on disk now, how many files end in a torn (unfinished) line, and how many
    complete lines are not a record (a torn line a resume wrote after instead of cutting)."""
    keys, torn, bad = [], 0, 0
    for path in record_files(command, out):
        raw = path.read_bytes()
        torn += bool(raw) and not raw.endswith(b"\n")
        for line in raw.split(b"\n")[:-1]:
            if line.strip():
                try:
                    keys.append(LAYOUT[command][1](json.loads(line)))
                except (ValueError, KeyError, TypeError):
                    bad += 1
    return keys, torn, bad


def read_manifest(out: Path) -> dict | None:
    try:
        return json.loads((out / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):  # not written yet (it is replaced whole, so never half)
        return None


def planned_records(command: str, manifest: dict) -> int:
    if command == "generate":
        return manifest["planned_records"]
    return len(manifest["methods"]) * len(manifest["examples"])


def tear_last_line(command: str, out: Path) -> dict:
    """Cut the last record line of the most recently written record file partway, no newline: what a kill
    inside that record's write leaves (anything after it, such as a tail this kill tore itself, goes too).
    Returns where, the half line left, and the key of the record it tore."""
    path = max((p for p in record_files(command, out) if b"\n" in p.read_bytes()), key=lambda p: p.stat().st_mtime_ns)
    raw = path.read_bytes()
    end = raw.rfind(b"\n")  # the last complete line's newline
    start = raw.rfind(b"\n", 0, end) + 1
    cut = start + max(1, (end - start) // 2)
    os.truncate(path, cut)
    return {"file": str(path.relative_to(out)), "start": start, "cut": cut, "size": len(raw),
            "half": raw[start:cut], "key": LAYOUT[command][1](json.loads(raw[start:end]))}


def tear_repaired(out: Path, tear: dict) -> bool:
    """Whether a run after the tear cut the half line: from the torn line's start the file holds nothing, a
    whole record, or a newer unfinished line (a later kill's). Left alone, the half line is still there,
    alone or joined to a record written after it (a line that is no record)."""
    rest = (out / tear["file"]).read_bytes()[tear["start"]:]
    first, newline, _ = rest.partition(b"\n")
    if not newline:
        return rest != tear["half"]
    try:
        return isinstance(json.loads(first), dict)
    except ValueError:
        return False


def kill_and_resume(command: str, config: str, out: Path, kills: int, seed: int, sets=(), log=print,
                    timeout_s: float = 600) -> dict:
    """Kill a run in start-up and then `kills` times after records it writes, resume, finish; return what was
    seen (see `verdict`). Raises KillCheckError when a planned kill cannot be made (see the module docstring)."""
    rng = random.Random(seed)
    tear_after = rng.randint(1, kills) if kills else None
    cmd = [sys.executable, "-m", "distill.cli", command, "--config", config] + [a for s in sets for a in ("--set", s)]
    # the runs import the package this script imported, wherever they start
    here = str(Path(distill.__file__).resolve().parents[1])
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    seen: set[tuple] = set()
    points: list[dict] = []
    tear, planned = None, None
    for k in range(kills + 1):
        before = count_complete(command, out)
        if k == 0:
            target, earlier = None, (read_manifest(out) or {}).get("started_at")
        else:
            if planned - RESERVE < before + 1:
                raise KillCheckError(
                    f"kill {k}: no room for it: {before} of {planned} records on disk, and a kill must come "
                    f"{RESERVE} records before the end; give the run more work, or fewer kills")
            target = min(before + rng.randint(1, 2), planned - RESERVE)
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
            t0 = time.monotonic()
            while proc.poll() is None:
                if k == 0:
                    m = read_manifest(out)
                    if m is not None and m.get("status") == "running" and m.get("started_at") != earlier:
                        break
                elif count_complete(command, out) >= target:
                    break
                if time.monotonic() - t0 > timeout_s:
                    proc.kill()
                    proc.wait()
                    raise KillCheckError(
                        f"kill {k}: {'the manifest did not say running' if k == 0 else f'record {target} did not land'}"
                        f" within {timeout_s:g} s ({count_complete(command, out)} on disk); the run's stderr ends:\n"
                        f"{tail(stderr)}")
                time.sleep(POLL_S)
            if proc.poll() is not None:
                raise KillCheckError(
                    f"kill {k}: the run ended (exit {proc.returncode}) before its kill "
                    f"{'in start-up' if k == 0 else f'after record {target}'} "
                    f"({count_complete(command, out)} of {planned or '?'} on disk); its stderr ends:\n{tail(stderr)}")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        at = time.monotonic() - t0
        if tear is not None and "repaired" not in tear:  # the run after the tear has had its go
            tear["repaired"] = tear_repaired(out, tear)
        keys, torn, bad = read_complete(command, out)
        seen |= set(keys)
        if k == 0:
            planned = planned_records(command, read_manifest(out))
        points.append({"kill": k, "after_record": target, "on_disk": len(keys), "at_s": round(at, 2),
                       "torn_tail": bool(torn), "bad_lines": bad})
        where = "in start-up, once the manifest said running" if k == 0 else f"after record {target}"
        log(f"kill {k}: SIGKILL {where} ({len(keys)} on disk) at {at:.2f}s{', torn last line' if torn else ''}")
        if k == tear_after:
            tear = tear_last_line(command, out)
            log(f"  tore the last line of {tear['file']} (record {list(tear['key'])}): cut at byte "
                f"{tear['cut']} of {tear['size']}, no newline")
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout_s,
                          env=env)
    if tear is not None and "repaired" not in tear:
        tear["repaired"] = tear_repaired(out, tear)
    keys, torn, bad = read_complete(command, out)
    counts = collections.Counter(keys)
    if tear is not None:
        tear["final_copies"] = counts[tear["key"]]
    manifest = read_manifest(out) or {}
    result = {
        "kills": points, "final_exit": done.returncode, "final_stderr": done.stderr[-2000:],
        "planned": planned_records(command, manifest) if manifest else None, "records": len(keys),
        "distinct": len(counts), "duplicates": sum(v - 1 for v in counts.values()), "lost": len(seen - set(counts)),
        "torn_at_end": torn, "bad_lines": bad, "tear": tear,
        "torn_tails_repaired": int(bool(tear and tear["repaired"])), "status": manifest.get("status"),
    }
    log(f"final run: exit {done.returncode}, status {result['status']}; planned {result['planned']}, "
        f"on disk {result['records']}, duplicates {result['duplicates']}, lost {result['lost']}, "
        f"torn tails repaired {result['torn_tails_repaired']}"
        + (f" (record {list(tear['key'])} on disk {tear['final_copies']}x)" if tear else ""))
    return result


def tail(handle, n: int = 2000) -> str:
    handle.seek(0)
    return handle.read().decode("utf-8", "replace")[-n:]


def verdict(result: dict) -> bool:
    tear = result["tear"]
    return (result["final_exit"] == 0 and result["status"] == "complete" and result["duplicates"] == 0
            and result["lost"] == 0 and result["torn_at_end"] == 0 and result["bad_lines"] == 0
            and all(p["bad_lines"] == 0 for p in result["kills"])
            and result["distinct"] == result["records"] == result["planned"]
            and (tear is None or (tear["repaired"] and tear["final_copies"] == 1)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", nargs="?", default="generate", choices=sorted(LAYOUT))
    p.add_argument("--config", required=True)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    from distill.core.config import load_config
    from distill.evaluate import EvalConfig
    from distill.generate import GenerateConfig

    from distill.core.errors import DistillError

    try:
        cfg = load_config(GenerateConfig if args.command == "generate" else EvalConfig, args.config, args.set)
    except DistillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"seed {args.seed} (replay the same kill plan with --seed {args.seed})")
    try:
        result = kill_and_resume(args.command, args.config, Path(cfg.output_dir), args.kills, args.seed, args.set)
    except KillCheckError as exc:
        print(f"FAIL: {exc}")
        return 1
    ok = verdict(result)
    print("OK" if ok else f"FAIL\n{result['final_stderr']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
