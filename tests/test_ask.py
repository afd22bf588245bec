"""`distill ask` end to end offline: the real SmolLM2 in process, BM25 over a local corpus."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {
    "format_version", "id", "dataset", "question", "answers", "method", "sample", "planner", "plan", "evidence",
    "solver", "prediction", "scores", "tokens", "cost_usd", "wall_s", "llm_calls", "tool_calls",
}


def ask(*extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "distill.cli", "ask", *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_ask_json_record_has_every_field():
    out = ask("In which country was the composer of the opera Carmen born?", "--config", "configs/ask_smollm2_local.yaml",
              "--set", "planner.max_tokens=96", "--set", "solver.max_tokens=16", "--answer", "France", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rec = json.loads(out.stdout)
    assert FIELDS <= set(rec)
    assert {"model", "messages", "output", "usage", "latency_s", "cost_usd"} <= set(rec["planner"])
    assert rec["planner"]["usage"]["prompt_tokens"] > 100 and rec["solver"]["usage"]["completion_tokens"] > 0
    assert {"valid", "steps", "errors"} <= set(rec["plan"])
    for ev in rec["evidence"]:
        assert {"id", "tool", "input", "output", "status", "error", "start_s", "end_s"} <= set(ev)
        assert ev["end_s"] >= ev["start_s"]
    assert set(rec["scores"]) >= {"em", "f1"}
    assert rec["tokens"]["total"] == rec["tokens"]["planner"] + rec["tokens"]["solver"] + rec["tokens"]["tools"]


def test_bad_inputs_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("planner:\n  backend: nope\nunknown_key: 1\n")
    for args in (["Q?", "--config", str(bad)], ["Q?", "--config", str(tmp_path / "missing.yaml")], ["  "],
                 ["Q?", "--set", "wikipedia_corpus=/nonexistent.jsonl"]):
        out = ask(*args)
        assert out.returncode == 2, (args, out.stderr)
        lines = [l for l in out.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in out.stderr, (args, out.stderr)
