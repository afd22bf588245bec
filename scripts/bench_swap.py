#!/usr/bin/env python
"""python scripts/bench_swap.py [--duration-s 300] [--in-flight 16] [--adapter A --adapter B] [--json OUT]

What a planner swap costs the requests around it. Starts its own vLLM server (the embedded SmolLM2
`smollm2-135m-instruct`, the first adapter as LoRA module `round_0`, runtime LoRA loading on, as `distill serve`
runs the flywheel's planner server) and `distill serve-agent` in a subprocess in front of it; loads the second
adapter at runtime as `round_1` (as a promotion does), keeps `--in-flight` chat requests in flight for
`--duration-s`, swaps the agent's planner to `round_1` (POST /v1/admin/planner) at a third of it and rolls back to
`round_0` at two thirds. Prints, per phase (before the swap, during it, after the rollback, by when each request
was sent): requests, failed, p50 and p99 latency, and which planner the traces say answered them; and how long
each POST took. Asserts nothing. Without --adapter, two test-style LoRA adapters (r 8 on q/v, lora_B nudged off
zero, seeds 0 and 1) are made in the work folder; a planner this small writes poor plans, which costs the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = "smollm2-135m-instruct"
AGENT = "swap-bench"
QUESTIONS = ["What is 17 * 23?", "What is 12 + 30?", "What is 2 to the power 10?", "What is 144 / 12?",
             "What is 999 - 123?", "What is 7 * 8 * 9?"]
LONG_S = 1800.0  # a request's own limit: far above any answer, so a stuck server shows as failures, not a hang


def make_adapter(out: Path, seed: int, scale: float = 1e-2) -> Path:
    """A real PEFT LoRA on the embedded SmolLM2 (as tests/conftest.py makes one; scripts do not import tests)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.llm.embedded import resolve_model_path

    base = resolve_model_path(BASE)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    peft_model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def start_agent(work: Path, vllm_base_url: str, in_flight: int) -> tuple[subprocess.Popen, str]:
    """`distill serve-agent` in a subprocess (its own interpreter: the load generator here does not share its
    event loop), on a free port; returns once /health answers."""
    from distill.serving.serve import free_port

    port = free_port("127.0.0.1")
    config = work / "agent.yaml"
    spec = {"backend": "openai", "base_url": vllm_base_url, "timeout_s": LONG_S, "max_retries": 0}
    config.write_text(json.dumps({
        "name": AGENT, "planner_prompt": "full", "tools": ["Calculator"], "port": port, "planner_round": 0,
        "planner": spec | {"model": "round_0", "max_tokens": 64}, "solver": spec | {"model": BASE, "max_tokens": 16},
        "max_in_flight": in_flight + 4, "request_timeout_s": LONG_S, "traces_dir": str(work / "traces")}))
    return spawn_agent(["--config", str(config)], port, work)


def spawn_agent(args: list[str], port: int, work: Path) -> tuple[subprocess.Popen, str]:
    """`distill serve-agent ARGS` in a subprocess logging to WORK/agent.log; returns once /health on PORT answers
    (scripts/bench_flywheel.py starts its agent with this too)."""
    import httpx

    with (work / "agent.log").open("w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "distill.cli", "serve-agent", *args], stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    base = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # at most about 10 minutes of polling
        if proc.poll() is not None:
            raise SystemExit(f"serve-agent exited with {proc.returncode}; see {work / 'agent.log'}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"serve-agent did not answer /health; see {work / 'agent.log'}")


async def load(base: str, duration_s: float, in_flight: int) -> dict:
    """`in_flight` workers, each sending its next request as soon as the last is answered; the swap at a third
    of the run, the rollback at two thirds. Returns every request (sent at, latency, status, id) and the swaps."""
    import httpx

    t0 = time.perf_counter()
    requests: list[dict] = []
    swaps: list[dict] = []
    end = t0 + duration_s

    async def worker(w: int, client: httpx.AsyncClient) -> None:
        i = w
        while time.perf_counter() < end:
            sent = time.perf_counter()
            row = {"sent_s": sent - t0, "status": None, "id": None}
            try:
                r = await client.post("/v1/chat/completions", timeout=LONG_S, json={
                    "model": AGENT, "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]})
                row["status"] = r.status_code
                if r.status_code == 200:
                    row["id"] = r.json()["id"]
                else:
                    row["error"] = (r.json().get("error") or {}).get("code")
            except httpx.HTTPError as exc:
                row["error"] = type(exc).__name__
            row["latency_s"] = time.perf_counter() - sent
            requests.append(row)
            i += in_flight

    async def swapper(client: httpx.AsyncClient) -> None:
        for at, model, round_ in ((duration_s / 3, "round_1", 1), (2 * duration_s / 3, "round_0", 0)):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            gauge = [line for line in (await client.get("/metrics", timeout=60)).text.splitlines()
                     if line.startswith("distill_agent_in_flight ")]
            sent = time.perf_counter()
            r = await client.post("/v1/admin/planner", json={"model": model, "round": round_}, timeout=60)
            swaps.append({"model": model, "sent_s": sent - t0, "answered_s": time.perf_counter() - t0,
                          "post_s": time.perf_counter() - sent, "status": r.status_code,
                          "in_flight": int(gauge[0].split()[-1]) if gauge else None, "reply": r.json()})

    limits = httpx.Limits(max_connections=in_flight + 8, max_keepalive_connections=in_flight + 8)
    async with httpx.AsyncClient(base_url=base, limits=limits) as client:
        await asyncio.gather(swapper(client), *(worker(w, client) for w in range(in_flight)))
    return {"requests": requests, "swaps": swaps}


def phase_table(run: dict, traces: dict[str, dict]) -> list[dict]:
    """Requests by phase, by when each was sent against when each POST was answered (the agent switches before
    it answers): before the swap, during it (on round_1), after the rollback."""
    swaps = run["swaps"]
    cut = [s["answered_s"] for s in swaps] + [float("inf")] * (2 - len(swaps))
    rows = []
    for name, lo, hi in (("before", 0.0, cut[0]), ("during", cut[0], cut[1]), ("after", cut[1], float("inf"))):
        reqs = [r for r in run["requests"] if lo <= r["sent_s"] < hi]
        ok = [r["latency_s"] for r in reqs if r["status"] == 200]
        planners = Counter((traces.get(r["id"]) or {}).get("served", {}).get("planner_model") for r in reqs
                           if r["id"])
        rows.append({"phase": name, "requests": len(reqs), "failed": len(reqs) - len(ok),
                     "p50_s": percentile(ok, 0.5), "p99_s": percentile(ok, 0.99),
                     "planners": dict(sorted(planners.items()))})
    return rows


def read_traces(folder: Path) -> dict[str, dict]:
    """{request id: its trace}, read as `distill improve` reads a traces folder."""
    from distill.rewoo.record import TrajectoryRecord
    from distill.core.store import read_jsonl
    from distill.core.traces import trace_files

    return {r["id"]: r for path in trace_files(folder) for r in read_jsonl(path, TrajectoryRecord)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=300.0, help="how long the load runs (10..86400)")
    p.add_argument("--in-flight", type=int, default=16, help="requests kept in flight (1..256)")
    p.add_argument("--adapter", action="append", default=[],
                   help="a LoRA adapter folder on the embedded SmolLM2; give two (round_0, round_1), or none to make them")
    p.add_argument("--work-dir", help="keep the adapters, logs and traces here (default: a temporary folder)")
    p.add_argument("--json", help="also write the phases, swaps and every request to this file")
    args = p.parse_args()
    problems = []
    if not 10 <= args.duration_s <= 86_400:
        problems.append("--duration-s must be in 10..86400")
    if not 1 <= args.in_flight <= 256:
        problems.append("--in-flight must be in 1..256")
    if len(args.adapter) not in (0, 2):
        problems.append(f"--adapter: give two (round_0, then round_1) or none, not {len(args.adapter)}")
    problems += [f"--adapter {a}: no adapter_config.json there" for a in args.adapter
                 if not (Path(a) / "adapter_config.json").is_file()]
    if problems:
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import httpx

    from distill.serving.serve import ServeConfig, VLLMServer

    with tempfile.TemporaryDirectory(prefix="bench-swap-") as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        adapters = [Path(a).resolve() for a in args.adapter] or \
            [make_adapter(work / f"adapter_{seed}", seed) for seed in (0, 1)]
        cfg = ServeConfig(base_model=BASE, served_model_name=BASE, adapters={"round_0": str(adapters[0])}, port=0,
                          max_model_len=4096, health_timeout_s=900, cpu_kvcache_space_gb=1,
                          env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
        t_start = time.perf_counter()
        with VLLMServer(cfg, log_path=work / "vllm.log") as server:
            print(f"vLLM up in {time.perf_counter() - t_start:.0f} s at {server.base_url}", flush=True)
            loaded = httpx.post(f"{server.url}/v1/load_lora_adapter", timeout=600,
                                json={"lora_name": "round_1", "lora_path": str(adapters[1])})
            if loaded.status_code != 200:
                print(f"error: loading round_1 into vLLM: HTTP {loaded.status_code} {loaded.text[:200]}",
                      file=sys.stderr)
                return 1
            agent, base = start_agent(work, server.base_url, args.in_flight)
            try:
                run = asyncio.run(load(base, args.duration_s, args.in_flight))
            finally:
                agent.terminate()
                agent.wait(timeout=LONG_S)
        rows = phase_table(run, read_traces(work / "traces"))
    print(f"\n{os.cpu_count()} cores; {args.in_flight} in flight for {args.duration_s:g} s; planner round_0 -> "
          f"round_1 at {args.duration_s / 3:.0f} s -> round_0 at {2 * args.duration_s / 3:.0f} s\n")
    print("| phase | requests | failed | p50 s | p99 s | planner (traces) |")
    print("|---|---:|---:|---:|---:|---|")

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for r in rows:
        planners = ", ".join(f"{k}: {n}" for k, n in r["planners"].items())
        print(f"| {r['phase']} | {r['requests']} | {r['failed']} | {fmt(r['p50_s'])} | {fmt(r['p99_s'])} | "
              f"{planners} |")
    for s in run["swaps"]:
        print(f"POST /v1/admin/planner -> {s['model']}: HTTP {s['status']} in {s['post_s']:.3f} s "
              f"(at {s['sent_s']:.0f} s, {s['in_flight']} requests in flight)")
    errors = Counter(r.get("error") for r in run["requests"] if r["status"] != 200)
    if errors:
        print("failures: " + ", ".join(f"{k}: {n}" for k, n in errors.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"duration_s": args.duration_s, "in_flight": args.in_flight,
                                               "phases": rows, "swaps": run["swaps"],
                                               "requests": run["requests"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
