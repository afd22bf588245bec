"""The flywheel end to end on the real parts: the session's vLLM server as the planner's server (runtime LoRA loading
on), a real `distill serve-agent` app planning with its module, demo questions asked and given feedback through the
agent's own routes, then `distill flywheel` (its command: its own vLLM servers, real sampling, real TRL training,
the real evaluation of both rounds on the held-out side) twice, and `distill promote` and `--rollback` while 16
requests are in flight.

Round 1 learns from right answers; whatever its gate says must follow from its own figures, and a round the gate
kept is then promoted by hand, as a person would. Round 2 learns from corrupted feedback (each question given another
question's answer) and must be refused: against wrong answers neither round can score, so the interval cannot lie
above 0. Nothing is stood in for. Timeouts are far above any answer time: no outcome depends on how fast the model
answers, and no test reads a clock."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from distill import flywheel as fw
from test_agent_server import agent_server, traces
from test_agent_swap import ask_in_threads, record

ROOT = Path(__file__).resolve().parents[1]
LONG_S = 1800  # far above any answer or round on a loaded CPU: only turns a hang into a failure
TOKEN = "real-flywheel-" + "s3cr3t" * 4  # the agents' bearer token: no output, log or file may hold it
TOKEN_ENV = "FLYWHEEL_REAL_TEST_TOKEN"
TOOLS = ["Wikipedia", "LLM"]
AGENT = "flywheel-agent"
PROMPT = "fewshot"  # the prompt the nudged test adapter can plan with
SEED = 0
HOLDOUT = 0.3


def demo_rows() -> list[dict]:
    return [json.loads(line) for line in (ROOT / "data/demo/train.jsonl").read_text().splitlines() if line.strip()]


def batches(n_train: int, n_heldout: int, count: int) -> list[list[dict]]:
    """`count` batches of demo train questions, each with `n_train` on the train side and `n_heldout` on the
    held-out side of the flywheel's split (the split is a hash: chosen here, not hoped for)."""
    sides: dict[str, list[dict]] = {"train": [], "heldout": []}
    for row in demo_rows():
        sides[fw.split_of(row["question"], SEED, HOLDOUT)].append(row)
    return [sides["train"][i * n_train:(i + 1) * n_train] + sides["heldout"][i * n_heldout:(i + 1) * n_heldout]
            for i in range(count)]


def agent_config(tmp_path: Path, url: str):
    from distill.serving.agent_server import AgentServerConfig
    from tests.conftest import BASE_NAME

    return AgentServerConfig.model_validate({
        "name": AGENT, "planner_prompt": PROMPT, "tools": TOOLS, "planner_round": 0,
        "wikipedia_corpus": str(ROOT / "data/demo/corpus.jsonl"),
        "planner": {"backend": "openai", "base_url": url, "model": "planner", "max_tokens": 96, "timeout_s": LONG_S,
                    "stop": ["\nQuestion:"]},
        "solver": {"backend": "openai", "base_url": url, "model": BASE_NAME, "max_tokens": 16, "timeout_s": LONG_S},
        "max_in_flight": 32, "request_timeout_s": LONG_S, "traces_dir": str(tmp_path / "traces")})


def flywheel_config(tmp_path: Path, adapter: Path, vllm_url: str, agent: str) -> Path:
    from tests.conftest import BASE_NAME

    served = {"backend": "openai", "base_url": "@server", "max_retries": 0, "timeout_s": LONG_S}
    cfg = {
        "adapter": str(adapter), "output_dir": str(tmp_path / "flywheel"), "planner_prompt": PROMPT, "seed": SEED,
        # cool enough that a round keeps plans: this nudged base writes 4-8 valid plans of 12 at 0.5
        "planner": served | {"model": "policy", "temperature": 0.5, "max_tokens": 96, "stop": ["\nQuestion:"]},
        "solver": served | {"model": BASE_NAME, "max_tokens": 16},
        "tools": TOOLS, "wikipedia_corpus": str(ROOT / "data/demo/corpus.jsonl"),
        "datasets": [{"name": "served", "source": str(tmp_path / "traces"), "metric": "em_f1"}],
        "eval_sets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/dev.jsonl"), "split": "dev"}],
        "holdout_fraction": HOLDOUT, "min_train_questions": 6, "min_holdout_questions": 3,
        "samples_per_question": 4,
        "min_reward": 0.3,  # a valid plan whose calls ran: corrupted answers must still train a round, to be judged
        "concurrency": 8,
        "gate": {"measure": "f1", "bootstrap_samples": 500},
        "diversity_samples": 2,
        "server": {"base_model": BASE_NAME, "served_model_name": BASE_NAME, "max_model_len": 4096,
                   "cpu_kvcache_space_gb": 1, "health_timeout_s": 900},
        "service": {"vllm_url": vllm_url, "agents": [agent], "token_env": TOKEN_ENV, "timeout_s": 600},
        "train": {"max_steps": 2, "per_device_train_batch_size": 2, "global_batch_size": 2, "dtype": "float32",
                  "learning_rate": 1e-3, "eval_strategy": "no", "save_strategy": "no", "report_to": "none",
                  "logging_steps": 1},
    }
    path = tmp_path / "flywheel.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def distill(*argv: str) -> subprocess.CompletedProcess:
    env = os.environ | {TOKEN_ENV: TOKEN}
    return subprocess.run([sys.executable, "-m", "distill.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=2 * LONG_S)


def serve_and_feed(base: str, rows: list[dict], answers: list[str]) -> dict[str, str]:
    """Ask each question through the agent, all at once, then give each its answer as feedback: {question: id}."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    replies: dict = {}
    for t in ask_in_threads(base, [r["question"] for r in rows], replies, auth, AGENT):
        t.join(LONG_S)
    failed = {q: r for q, r in replies.items() if r[0] != 200}
    assert len(replies) == len(rows) and failed == {}
    ids = {q: body["id"] for q, (_, body) in replies.items()}
    with httpx.Client(base_url=base, timeout=LONG_S, headers=auth) as h:
        for row, answer in zip(rows, answers):
            fed = h.post("/v1/feedback", json={"id": ids[row["question"]], "answer": answer})
            assert fed.status_code == 200 and fed.json()["stored"] is True, fed.text
    return ids


def consistent(report: fw.RoundReport) -> None:
    """The gate's decision follows from its own figures: promote exactly when the interval lies above 0 and no
    guard got worse past its margin."""
    v = report.verdict
    above = v is not None and v.lo is not None and v.lo > 0
    guards_ok = all(g.ok for g in report.guards.values())
    assert report.decision == ("promote" if above and guards_ok else "keep"), report.model_dump_json()


def swap_under_load(base: str, service, questions: list[str], argv: list[str]) -> tuple[subprocess.CompletedProcess,
                                                                                       dict]:
    """`distill promote ...` once all of `questions` (16) have started: the command's run and every reply. Each of
    them took its planner before the swap, so its trace must name the planner served before it."""
    from test_agent_server import wait_for

    replies: dict = {}
    started = service.metrics.in_flight + service.traces.written
    threads = ask_in_threads(base, questions, replies, {"Authorization": f"Bearer {TOKEN}"}, AGENT)
    wait_for(lambda: service.metrics.in_flight + service.traces.written >= started + len(questions),
             "the requests to start")
    run = distill("promote", *argv)
    print(f"{' '.join(argv[2:])}: {service.metrics.in_flight} of {len(questions)} requests still in flight when it "
          "returned")
    for t in threads:
        t.join(LONG_S)
    return run, replies


def traces_by_id(service) -> dict[str, dict]:
    return {t["id"]: t for t in traces(service.cfg)}


def planners_of(service, replies: dict) -> set[tuple]:
    by_id = traces_by_id(service)
    return {(by_id[body["id"]]["served"]["planner_model"], by_id[body["id"]]["served"]["round"])
            for _, body in replies.values()}


def test_traffic_round_gate_refusal_promote_and_rollback_on_the_real_parts(tmp_path, vllm_server, lora_adapter):
    round_0 = record(Path(shutil.copytree(lora_adapter, tmp_path / "round_0")), PROMPT, TOOLS)
    good, bad = batches(n_train=6, n_heldout=3, count=2)
    loaded: list[str] = []
    with agent_server(agent_config(tmp_path, vllm_server.base_url), token=TOKEN) as (base, service):
        cfg_path = flywheel_config(tmp_path, round_0, vllm_server.base_url, base)
        out = tmp_path / "flywheel"
        try:
            # 1. traffic with right answers, and a round from it
            serve_and_feed(base, good, [r["answer"] for r in good])
            run = distill("flywheel", "--config", str(cfg_path))
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            first = fw.read_round_report(out / "round_1" / "report.json")
            print("round 1:", first.model_dump_json())
            assert (first.from_round, first.questions.train, first.questions.heldout) == (0, 6, 3)
            assert first.train.kept > 0 and first.train.global_step == 2 and first.adapter
            assert first.diversity.incumbent is not None and first.diversity.candidate is not None
            assert first.verdict is not None and first.verdict.n == 3
            consistent(first)
            loaded.append("round_1")
            if first.decision == "keep":  # a person promotes it by hand, under load
                run, replies = swap_under_load(base, service, [f"What is {i} * 7?" for i in range(16)],
                                               ["--config", str(cfg_path), "--round", "1"])
                assert run.returncode == 0, run.stdout + run.stderr
                assert {q: r for q, r in replies.items() if r[0] != 200} == {} and len(replies) == 16
                assert planners_of(service, replies) == {("planner", 0)}  # in flight across it, on the old one
            else:
                assert first.promoted_to == [base]
            assert service.planner["model"] == "round_1" and service.planner["round"] == 1
            assert Path(service.planner["adapter"]) == Path(first.adapter).resolve()

            # 2. traffic with corrupted feedback (each question given the next one's answer): refused
            answers = [r["answer"] for r in bad]
            after = serve_and_feed(base, bad, answers[1:] + answers[:1])
            run = distill("flywheel", "--config", str(cfg_path))
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            second = fw.read_round_report(out / "round_2" / "report.json")
            print("round 2:", second.model_dump_json())
            assert second.from_round == 1 and second.adapter_in == first.adapter
            assert second.train.kept > 0 and second.decision == "keep" and second.promoted_to == []
            assert "round_1" in second.reason and "\n" not in second.reason
            consistent(second)
            assert service.planner["model"] == "round_1"  # still the promoted round
            by_id = traces_by_id(service)
            assert {(by_id[i]["served"]["planner_model"], by_id[i]["served"]["round"]) for i in after.values()} == {
                ("round_1", 1)}

            # 3. roll back to round 0 under load
            loaded.append("round_0")
            run, replies = swap_under_load(base, service, [f"What is {i} * 13?" for i in range(16)],
                                           ["--config", str(cfg_path), "--rollback"])
            assert run.returncode == 0, run.stdout + run.stderr
            assert {q: r for q, r in replies.items() if r[0] != 200} == {} and len(replies) == 16
            assert planners_of(service, replies) == {("round_1", 1)}
            assert (service.planner["model"], service.planner["round"]) == ("round_0", 0)
            last = httpx.post(f"{base}/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=LONG_S, json={"model": AGENT,
                                                    "messages": [{"role": "user", "content": good[0]["question"]}]})
            assert last.status_code == 200
            assert traces_by_id(service)[last.json()["id"]]["served"]["planner_model"] == "round_0"
        finally:
            with httpx.Client(base_url=vllm_server.url, timeout=LONG_S) as v:
                for name in loaded:
                    v.post("/v1/unload_lora_adapter", json={"lora_name": name})

    log = fw.read_promotions(out / fw.PROMOTIONS)
    print("promotions:", [p.model_dump() for p in log])
    assert [(p.action, p.round) for p in log][-2:] == [("keep", 2), ("rollback", 0)]
    assert ("promote", 1) in [(p.action, p.round) for p in log]
    assert fw.in_service(str(round_0), log) == (0, str(round_0))

    shown = distill("report", str(out))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"round 1 from round 0: {first.decision}" in shown.stdout
    assert "round 2 from round 1: keep" in shown.stdout and "in service: round 0" in shown.stdout
    assert (out / "report.html").is_file()
    written = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.suffix in
                      {".json", ".jsonl", ".md", ".html", ".log", ".yaml"})
    assert TOKEN not in written and TOKEN not in shown.stdout + shown.stderr
