"""From traffic to the next adapter, end to end on the real parts: the agent served with a student planner (the LoRA
module `planner` on the session's vLLM server), demo questions asked through the `openai` client, feedback given,
one expert-iteration round of `distill improve` (its own command, real TRL training) reading the traces folder,
the new adapter loaded into the same vLLM server as a LoRA module at runtime (no second server start) and one more
question answered by the agent planning with it.

Timeouts are far above any answer time: no outcome depends on how fast the model answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai

from distill.core.data import normalize_question
from distill.rewoo.record import TrajectoryRecord
from distill.core.store import read_jsonl
from distill.core.traces import trace_files
from test_agent_server import agent_server
from test_improve import improve_config

ROOT = Path(__file__).resolve().parents[1]
LONG_S = 1800  # far above any answer or round on a loaded CPU: only turns a hang into a failure
IMPROVED = "planner-improved"  # the LoRA module the round's adapter is loaded as


def _rows(path: Path) -> dict[str, dict]:
    return {r["_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def _agent(tmp_path: Path, server, model: str):
    from distill.serving.agent_server import AgentServerConfig
    from tests.conftest import BASE_NAME

    url = server.base_url
    return AgentServerConfig.model_validate({
        "name": "student-agent", "planner_prompt": "fewshot",  # the prompt the nudged test adapter plans with
        "tools": ["Wikipedia", "LLM"], "wikipedia_corpus": str(ROOT / "data/demo/corpus.jsonl"),
        "planner": {"backend": "openai", "base_url": url, "model": model, "max_tokens": 64, "timeout_s": LONG_S,
                    "stop": ["\nQuestion:"]},
        "solver": {"backend": "openai", "base_url": url, "model": BASE_NAME, "max_tokens": 12, "timeout_s": LONG_S},
        "request_timeout_s": LONG_S, "traces_dir": str(tmp_path / "traces")})


def _ask(base: str, question: str):
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=LONG_S)
    return c.chat.completions.create(model="student-agent", messages=[{"role": "user", "content": question}])


def _traces(folder: Path) -> dict[str, dict]:
    return {r["id"]: r for p in trace_files(folder) for r in read_jsonl(p, TrajectoryRecord)}


def test_traffic_feedback_improve_serve(tmp_path, vllm_server, lora_adapter):
    from safetensors.torch import load_file

    train, dev = _rows(ROOT / "data/demo/train.jsonl"), _rows(ROOT / "data/demo/dev.jsonl")
    # two train questions given the gold answer, one marked wrong without one, one eval question given its answer
    asked = {"gold_1": train["demo-q001"], "gold_2": train["demo-q002"], "wrong": train["demo-q003"],
             "eval": dev["demo-q004"]}
    traces_dir = tmp_path / "traces"

    # 1. traffic: the agent with the student planner, through the openai client
    with agent_server(_agent(tmp_path, vllm_server, "planner")) as (base, _):
        ids = {k: _ask(base, row["question"]).id for k, row in asked.items()}
        with httpx.Client(base_url=base, timeout=LONG_S) as h:
            feedback = [{"id": ids["gold_1"], "answer": asked["gold_1"]["answer"]},
                        {"id": ids["gold_2"], "answer": asked["gold_2"]["answer"]},
                        {"id": ids["wrong"], "correct": False},
                        {"id": ids["eval"], "answer": asked["eval"]["answer"]}]
            assert [h.post("/v1/feedback", json=f).status_code for f in feedback] == [200] * 4
    served = _traces(traces_dir)
    assert set(served) == set(ids.values()) and all(t["served"]["status"] == 200 for t in served.values())

    # 2. one expert-iteration round over the traces folder, the command a user runs
    config = improve_config(
        tmp_path, vllm_server, lora_adapter,
        # the nudged test adapter wrote 2 valid plans of 8 in a run: at that rate 16 samples all invalid is ~1%
        samples_per_question=8,
        datasets=[{"name": "served", "source": str(traces_dir), "metric": "em_f1"}],
        eval_sets=[{"name": "hotpotqa", "source": str(ROOT / "data/demo/dev.jsonl"), "split": "dev"}],
        leak_policy="exclude")  # traffic holds eval questions: drawn around them, as the shipped config does
    run = subprocess.run([sys.executable, "-m", "distill.cli", "improve", "--config", str(config)], cwd=ROOT,
                         capture_output=True, text=True, timeout=2 * LONG_S)
    assert run.returncode == 0, run.stdout + run.stderr
    round_dir = tmp_path / "improve" / "round_1"
    summary = json.loads((round_dir / "summary.json").read_text())
    print("improve round summary:", json.dumps(summary))

    samples = read_jsonl(round_dir / "samples.jsonl")
    # exactly the questions with a usable answer: not the one marked wrong, not the eval one (leak guard)
    assert {r["id"] for r in samples} == {ids["gold_1"], ids["gold_2"]}
    assert len(samples) == 2 * 8 and summary["questions"] == 2 and summary["samples"] == 16
    for rec in samples:  # each learned against the answer its feedback gave
        key = "gold_1" if rec["id"] == ids["gold_1"] else "gold_2"
        assert rec["question"] == asked[key]["question"] and rec["answers"] == [asked[key]["answer"]]
    dev_questions = {normalize_question(r["question"]) for r in dev.values()}
    assert not {normalize_question(r["question"]) for r in samples} & dev_questions
    assert summary["kept"] > 0 and summary["train"]["global_step"] == 1

    new_adapter = round_dir / "adapter"
    start = load_file(str(lora_adapter / "adapter_model.safetensors"))
    trained = load_file(str(new_adapter / "adapter_model.safetensors"))
    assert set(trained) == set(start) and any(not trained[k].equal(start[k]) for k in trained)

    # 3. the new adapter into the running vLLM server as a LoRA module, and the agent planning with it
    with httpx.Client(base_url=vllm_server.url, timeout=LONG_S) as v:
        loaded = v.post("/v1/load_lora_adapter", json={"lora_name": IMPROVED, "lora_path": str(new_adapter)})
        assert loaded.status_code == 200, loaded.text
        try:
            modules = {m["id"]: m for m in v.get("/v1/models").json()["data"]}
            assert Path(modules[IMPROVED]["root"]) == new_adapter  # the module is the round's adapter
            with agent_server(_agent(tmp_path, vllm_server, IMPROVED)) as (base, _):
                reply = _ask(base, train["demo-q005"]["question"])
        finally:
            assert v.post("/v1/unload_lora_adapter", json={"lora_name": IMPROVED}).status_code == 200
    trace = _traces(traces_dir)[reply.id]
    assert trace["planner"]["model"] == IMPROVED and trace["served"]["status"] == 200
    assert trace["prediction"] == reply.choices[0].message.content
