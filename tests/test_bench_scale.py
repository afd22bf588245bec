"""scripts/bench_scale.py at a tiny size: the real `distill` stages against the script's instant teacher (a
real HTTP server on 127.0.0.1, standing in for a hosted teacher), with the script's own questions and the demo
corpus, so it needs no shared data. Checks that every stage ran and reported sane numbers, never how fast."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_scale_reports_every_stage(tmp_path):
    out = tmp_path / "bench.json"
    # no shared data (the variable points at nothing): the script writes its own questions
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_scale.py"), "--sizes", "20,40", "--tokenizer", "none",
         "--concurrency", "8", "--corpus", str(ROOT / "data" / "demo" / "corpus.jsonl"), "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "DISTILL_SHARED_DATA": str(tmp_path / "no-data")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "questions: generated" in proc.stdout

    table = [line for line in proc.stdout.splitlines() if re.match(r"\| (generate|filter|sft-data) \| \d+ \|", line)]
    assert {(line.split("|")[1].strip(), int(line.split("|")[2])) for line in table} == {
        (stage, n) for stage in ("generate", "filter", "sft-data") for n in (20, 40)}
    ratios = [line for line in proc.stdout.splitlines() if re.match(r"\| (generate|filter|sft-data) \| 40/20 \|", line)]
    assert len(ratios) == 3
    assert "overhead ms / question" in proc.stdout

    rows = json.loads(out.read_text())["rows"]
    by = {(r["stage"], r["questions"]): r for r in rows}
    for (stage, n), r in by.items():
        assert r["wall_s"] > 0 and r["cpu_s"] > 0, r
        assert 20 < r["peak_rss_mib"] < 8192, r  # a Python process with distill imported, in MiB not KiB or bytes
        assert r["output_mib"] > 0, r
    for n in (20, 40):
        assert by[("generate", n)]["records"] == n  # one trajectory per question, none lost
        # the teacher answers a quarter wrong: the filter drops some and keeps most
        assert 0 < by[("filter", n)]["records"] < n
        assert by[("sft-data", n)]["records"] == by[("filter", n)]["records"]
    assert by[("generate", 40)]["output_mib"] > by[("generate", 20)]["output_mib"]
