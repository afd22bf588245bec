#!/usr/bin/env python
"""python scripts/bench_flywheel.py [--questions 200] [--adapter runs/demo/improve/student/round_1/adapter] [--json OUT]
       [--traces DIR] [--set KEY=VALUE ...]

What one flywheel round costs on this machine, from served traffic to the gate's decision. Starts the planner's vLLM
server (the embedded SmolLM2 with the adapter as LoRA module `planner`, runtime LoRA loading on, as
docs/flywheel.md serves it) and `distill serve-agent` with the shipped configs/agent_server.yaml in front of it;
asks `--questions` demo train questions through the agent (16 in flight) and gives each its gold answer as
feedback; then times `distill flywheel --config configs/flywheel_smollm2_cpu.yaml` on those traces, promotion to the
running agent included (`--set` passes more settings to it). `--traces` times the round on the traces of an earlier
run (its work folder's `traces`, copied) instead of serving the questions again: one traffic run, a round timed on
each kind of CPU. Prints the traffic's time, the round's time by part (questions, train: sampling and TRL,
eval, diversity, total) from its report.json, its questions, kept plans, verdict and decision. Asserts nothing.
Run `make demo` first (its improved student is the default adapter). As an AVX2 laptop would: `source
scripts/avx2/env.sh` first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = "smollm2-135m-instruct"
LONG_S = 1800.0  # far above any answer: a stuck server shows as a failure, not a hang


def start_agent(work: Path, vllm_base_url: str, in_flight: int) -> tuple[subprocess.Popen, str]:
    """The shipped agent config in a subprocess, pointed at this server and folder; returns once /health answers."""
    from bench_swap import spawn_agent  # this script's folder is on sys.path

    from distill.serving.serve import free_port

    port = free_port("127.0.0.1")
    sets = [f"port={port}", f"planner.base_url={vllm_base_url}", f"solver.base_url={vllm_base_url}",
            f"traces_dir={work / 'traces'}", f"max_in_flight={in_flight + 4}", f"request_timeout_s={LONG_S:g}",
            f"planner.timeout_s={LONG_S:g}", f"solver.timeout_s={LONG_S:g}"]
    return spawn_agent(["--config", "configs/agent_server.yaml", *[f"--set={s}" for s in sets]], port, work)


async def traffic(base: str, rows: list[dict], in_flight: int) -> dict:
    """Each question through the agent's OpenAI route, `in_flight` at a time, then its gold answer as feedback."""
    import httpx

    sem = asyncio.Semaphore(in_flight)
    failed: list[str] = []

    async def one(client: httpx.AsyncClient, row: dict) -> None:
        async with sem:
            r = await client.post("/v1/chat/completions", timeout=LONG_S, json={
                "model": "distill-agent", "messages": [{"role": "user", "content": row["question"]}]})
            if r.status_code != 200:
                failed.append(f"HTTP {r.status_code}")
                return
            fed = await client.post("/v1/feedback", timeout=60, json={"id": r.json()["id"], "answer": row["answer"]})
            if fed.status_code != 200:
                failed.append(f"feedback HTTP {fed.status_code}")

    limits = httpx.Limits(max_connections=in_flight + 4, max_keepalive_connections=in_flight + 4)
    async with httpx.AsyncClient(base_url=base, limits=limits) as client:
        await asyncio.gather(*(one(client, row) for row in rows))
    return {"asked": len(rows), "failed": failed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=200, help="demo train questions served with feedback (8..273)")
    p.add_argument("--adapter", default="runs/demo/improve/student/round_1/adapter",
                   help="the adapter in service (round 0), trained on the compact prompt with Wikipedia and LLM")
    p.add_argument("--config", default="configs/flywheel_smollm2_cpu.yaml", help="the flywheel config to time")
    p.add_argument("--in-flight", type=int, default=16, help="traffic requests in flight (1..64)")
    p.add_argument("--work-dir", help="keep the traces, the round and the logs here (default: a temporary folder)")
    p.add_argument("--json", help="also write the figures and the round's report to this file")
    p.add_argument("--traces", help="time the round on these traces (an earlier run's WORK/traces) instead of traffic")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="one more flywheel setting (repeatable), e.g. --set samples_per_question=4")
    args = p.parse_args()
    adapter = Path(args.adapter).resolve()
    if not 8 <= args.questions <= 273 or not 1 <= args.in_flight <= 64:
        print("error: --questions must be in 8..273 and --in-flight in 1..64", file=sys.stderr)
        return 2
    if not Path(args.config).is_file():
        print(f"error: --config {args.config}: no such file", file=sys.stderr)
        return 2
    if args.traces and not any(Path(args.traces).glob("traces-*.jsonl")):
        print(f"error: --traces {args.traces}: no traces-*.jsonl there", file=sys.stderr)
        return 2
    if bad := [s for s in args.sets if "=" not in s]:
        print(f"error: --set {bad[0]}: expected KEY=VALUE", file=sys.stderr)
        return 2
    if not (adapter / "adapter_config.json").is_file():
        print(f"error: --adapter {args.adapter}: no adapter_config.json there (run make demo first)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from distill.serving.serve import ServeConfig, VLLMServer

    rows = [json.loads(line) for line in (ROOT / "data/demo/train.jsonl").read_text().splitlines() if line.strip()]
    rows = rows[:args.questions]
    with tempfile.TemporaryDirectory(prefix="bench-flywheel-") as tmp:
        work = Path(args.work_dir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        cfg = ServeConfig(base_model=BASE, served_model_name=BASE, adapters={"planner": str(adapter)}, port=0,
                          max_model_len=4096, health_timeout_s=900, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
        with VLLMServer(cfg, log_path=work / "vllm.log") as server:
            agent, base = start_agent(work, server.base_url, args.in_flight)
            try:
                t0 = time.perf_counter()
                if args.traces:
                    shutil.copytree(args.traces, work / "traces", dirs_exist_ok=True)
                    served = {"asked": None, "failed": [], "traces_from": str(Path(args.traces).resolve())}
                    print(f"traffic: none, the traces of {args.traces}", flush=True)
                else:
                    served = asyncio.run(traffic(base, rows, args.in_flight))
                    print(f"traffic: {served['asked']} questions with feedback in {time.perf_counter() - t0:.0f} s, "
                          f"{len(served['failed'])} failed", flush=True)
                traffic_s = time.perf_counter() - t0
                sets = [f"adapter={adapter}", f"output_dir={work / 'flywheel'}",
                        f"datasets.0.source={work / 'traces'}", f"service.vllm_url={server.base_url}",
                        f"service.agents=[{base}]", *args.sets]
                t0 = time.perf_counter()
                with (work / "flywheel.log").open("w") as log:
                    code = subprocess.call([sys.executable, "-m", "distill.cli", "flywheel", "--config", args.config,
                                            *[f"--set={s}" for s in sets]], stdout=log, stderr=subprocess.STDOUT,
                                           cwd=ROOT)
                round_s = time.perf_counter() - t0
            finally:
                agent.terminate()
                agent.wait(timeout=LONG_S)
        if code != 0:
            print(f"error: distill flywheel exited {code}; see {work / 'flywheel.log'}", file=sys.stderr)
            return 1
        report = json.loads((work / "flywheel" / "round_1" / "report.json").read_text())
    cpu = "AVX2 float32" if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" else "native"
    q, t, v, wall = report["questions"], report["train"], report["verdict"], report["cost"]["wall_s"]
    print(f"\n{os.cpu_count()} cores, {cpu}; {args.questions} traced questions -> {q['train']} train, "
          f"{q['heldout']} held-out; {args.config} {' '.join('--set ' + s for s in args.sets)}\n")
    print("| traffic s | questions s | train s (sampling + TRL) | eval s | diversity s | round total s | "
          "distill flywheel s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {traffic_s:.0f} | {wall['questions']:.0f} | {wall['train']:.0f} | {wall['eval']:.0f} | "
          f"{wall['diversity']:.0f} | {wall['total']:.0f} | {round_s:.0f} |")
    print(f"\nsamples {t['samples']}, kept {t['kept']}, global step {t['global_step']}; {v['measure']} "
          f"{v['candidate']} vs {v['incumbent']}, diff {v['diff']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}] (n {v['n']}); "
          f"diversity {report['diversity']['incumbent']} -> {report['diversity']['candidate']}; tokens "
          f"{report['cost']['tokens']}\n{report['decision']}: {report['reason']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"traffic_s": traffic_s, "round_s": round_s, "served": served,
                                               "report": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
