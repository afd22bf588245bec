"""The whole distillation end to end on a reduced demo config: real SmolLM2, real vLLM servers, real TRL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def reduced_demo(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "demo_smollm2_cpu.yaml").read_text())
    cfg["run_dir"] = str(tmp_path / "run")
    gen = cfg["generate"]
    gen["datasets"][0]["n"] = 5
    gen["samples_per_question"] = 3
    gen["planner"]["temperature"] = 0.5  # a tiny teacher writes more well-formed plans when less random
    gen["planner"]["max_tokens"] = 128
    gen["solver"]["max_tokens"] = 12
    cfg["filter"] = {"min_f1": 0.0}  # keep every valid, fully run plan: this test is about the machinery
    cfg["train"] |= {"max_steps": 2, "eval_steps": 1, "save_steps": 1, "max_length": 768}
    ev = cfg["eval"]
    ev["datasets"][0]["n"] = 2
    ev["react_max_steps"] = 2
    ev["react_max_tokens"] = 48
    ev["solver"]["max_tokens"] = 12
    for p in ev["planners"]:
        p["spec"]["max_tokens"] = 96
    path = tmp_path / "demo_reduced.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_pipeline_runs_every_stage_then_skips_them(tmp_path):
    config = reduced_demo(tmp_path)
    cmd = [sys.executable, "-m", "distill.cli", "pipeline", "--config", str(config)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run = tmp_path / "run"
    for stage in ("generate", "filter", "sft-data", "train", "eval", "report"):
        assert (run / stage / "DONE.json").exists(), stage
    assert (run / "train" / "adapter_config.json").exists()
    results = json.loads((run / "results.json").read_text())
    assert {"teacher", "student", "base", "react", "direct"} <= set(results["methods"])
    assert (run / "report.md").read_text().count("student") >= 1
    assert list(run.glob("*.png"))
    student = [json.loads(l) for l in (run / "eval" / "records" / "student.jsonl").read_text().splitlines()]
    assert len(student) == 2 and all(r["planner"]["model"] == "planner" for r in student)
    assert first.stdout.strip().splitlines()[-1].startswith("results:")

    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("done, skipped") == 6
