#!/usr/bin/env python
"""python scripts/bench_binding.py [--questions 32] [--eval 12] [--hogs 0] [--bindings default,all,...] [--adapter DIR]

How the CPU model server should share the machine with the pipeline around it. For each binding, one vLLM CPU
server (the demo's base model, served as the teacher) is started, and the pipeline's own stages run against it as
subprocesses: `distill generate` (the few-shot teacher on the demo train questions, two samples each: the shape of
generate and of an improve round's sampling) and `distill eval` (teacher ReWOO and the ReAct baseline on the demo
dev questions). Their Worker, BM25 search and HTTP clients compete with the server's engine for the same cores,
which a client-only benchmark does not see. With `--adapter` (a trained student, e.g. runs/demo/train/student) a
third stage has an improve round's shape: the adapter served as a LoRA module plans on the compact prompt at
temperature 1.0, 4 samples per question and 64 in flight, its LLM tool on the base model, no Solver; a fourth the
final eval's student rows (the LoRA module plans, the base model is the LLM tool and the Solver). Per stage: wall
seconds and the model's generated tokens per second (vLLM's own counter). `--hogs N` adds N busy processes for the
whole run (a machine that is doing something else).
Prints a table, asserts nothing. As an AVX2 laptop would: `source scripts/avx2/env.sh` first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (cores vLLM reserves, more server environment, client nice level, more serve settings). vLLM's own rule
# reserves one core per engine process for its scheduler and binds the model's OpenMP threads to the rest (1 here);
# 0 binds them to all. The *_compiled rows let vLLM torch.compile the model (distill serves CPU models eager).
BINDINGS: dict[str, tuple[int | None, dict[str, str], int, dict]] = {
    "vllm_rule": (1, {}, 0, {}),
    "all": (0, {}, 0, {}),
    "all_nice": (0, {}, 10, {}),
    "all_passive": (0, {"OMP_WAIT_POLICY": "PASSIVE"}, 0, {}),
    "nobind": (None, {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, 0, {}),
    "all_passive_compiled": (0, {"OMP_WAIT_POLICY": "PASSIVE"}, 0, {"enforce_eager": False}),
    "vllm_rule_compiled": (1, {}, 0, {"enforce_eager": False}),
}


def generated_tokens(url: str) -> float:
    """vLLM's running count of generated tokens, from its Prometheus endpoint."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", text, re.M))


def stage(argv: list[str], nice: int, url: str, log: Path) -> tuple[float, float]:
    """(wall seconds, generated tokens/s) of one command against the server."""
    before, t0 = generated_tokens(url), time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(["nice", "-n", str(nice), *argv], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    wall = time.perf_counter() - t0
    if code != 0:
        sys.exit(f"{' '.join(argv[:3])} exited {code}; see {log}")
    return wall, (generated_tokens(url) - before) / wall


def commands(base_url: str, work: Path, name: str, questions: int, dev: int, policy: bool) -> dict[str, list[str]]:
    distill = [str(Path(sys.executable).parent / "distill")]
    urls = [f"--set={part}.base_url={base_url}" for part in ("planner", "solver", "llm_tool")]
    gen = distill + ["generate", "--config", "configs/generate_smollm2_vllm.yaml", *urls,
                     f"--set=datasets.0.n={questions}", f"--set=output_dir={work / name / 'generate'}", "--set=cache=null"]
    spec = f"{{backend: openai, base_url: '{base_url}', model: teacher, max_tokens: 256}}"
    evaluate = distill + ["eval", "--config", "configs/eval_smollm2_cpu.yaml"]
    shared = [f"--set=solver={{backend: openai, base_url: '{base_url}', model: teacher, max_tokens: 48}}",
              f"--set=datasets.0.n={dev}", "--set=robustness=null", "--set=cache=null", "--set=bootstrap_samples=100"]
    ev = evaluate + [f"--set=planners=[{{name: teacher, prompt: fewshot, spec: {spec}}}]", "--set=baselines=[react]",
                     *shared, f"--set=output_dir={work / name / 'eval'}"]
    stages = {"generate": gen, "eval": ev}
    if policy:  # an improve round's sampling (configs/improve_smollm2_cpu.yaml's planner, tools and concurrency)
        stages["improve"] = distill + [
            "generate", "--config", "configs/generate_smollm2_vllm.yaml", *urls, "--set=planner.model=policy",
            "--set=planner_prompt=compact", "--set=planner.temperature=1.0", "--set=planner.max_tokens=128",
            "--set=planner.max_concurrency=64", "--set=llm_tool.max_tokens=48", "--set=llm_tool.max_concurrency=64",
            "--set=solve=false", "--set=tools=[Wikipedia, LLM]", "--set=wikipedia_top_k=3",
            "--set=samples_per_question=4", "--set=concurrency=64", f"--set=datasets.0.n={questions}",
            f"--set=output_dir={work / name / 'improve'}", "--set=cache=null"]
        student = f"{{backend: openai, base_url: '{base_url}', model: policy, max_tokens: 128, max_concurrency: 64}}"
        stages["eval_student"] = evaluate + [  # the final eval's student rows: the LoRA plans, the base model solves
            f"--set=planners=[{{name: student, prompt: compact, spec: {student}}}]", "--set=baselines=[]",
            "--set=tools=[Wikipedia, LLM]", "--set=wikipedia_top_k=3", "--set=concurrency=48", *shared,
            f"--set=output_dir={work / name / 'eval_student'}"]
    return stages


def run_binding(name: str, work: Path, questions: int, dev: int, adapter: str | None, only: list[str]) -> dict:
    from distill.serving.serve import ServeConfig, VLLMServer

    reserved, env, nice, serve = BINDINGS[name]
    cfg = ServeConfig(served_model_name="teacher", port=0, env=env, max_model_len=2048, cpu_reserved_cores=reserved,
                      adapters={"policy": adapter} if adapter else {}, **serve)
    log = work / f"{name}.vllm.log"
    t0 = time.perf_counter()
    with VLLMServer(cfg, log_path=log) as server:
        row = {"binding": name, "start_s": round(time.perf_counter() - t0, 1)}
        for stage_name, argv in commands(server.base_url, work, name, questions, dev, bool(adapter)).items():
            if stage_name not in only:
                continue
            wall, rate = stage(argv, nice, server.url, work / f"{name}.{stage_name}.log")
            row[stage_name] = {"wall_s": round(wall, 1), "tokens_per_s": round(rate, 1)}
    binds = [line.strip() for line in log.read_text(errors="replace").splitlines()
             if "reserve_cpu_num" in line or "core ids" in line.lower() or "reserved_cpus" in line]
    row["vllm_says"] = binds[:3]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bindings", default=",".join(BINDINGS), help=f"comma-separated, of {', '.join(BINDINGS)}")
    p.add_argument("--questions", type=int, default=32, help="generate: demo train questions (2 samples each)")
    p.add_argument("--eval", type=int, default=12, help="eval: demo dev questions (teacher ReWOO and ReAct)")
    p.add_argument("--hogs", type=int, default=0, help="busy processes beside the run (a machine doing other work)")
    p.add_argument("--adapter", help="a trained student's adapter: adds an improve round's sampling as a stage")
    p.add_argument("--stages", default="generate,eval,improve,eval_student", help="comma-separated stages to run")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    names = [n.strip() for n in args.bindings.split(",") if n.strip()]
    if unknown := [n for n in names if n not in BINDINGS]:
        sys.exit(f"--bindings: unknown {', '.join(unknown)} (known: {', '.join(BINDINGS)})")
    train, dev = (sum(1 for _ in (ROOT / "data" / "demo" / f).open()) for f in ("train.jsonl", "dev.jsonl"))
    if not 1 <= args.questions <= train or not 1 <= args.eval <= dev:
        sys.exit(f"--questions must be in 1..{train} and --eval in 1..{dev} (the demo's train and dev questions)")
    known, of_adapter = ("generate", "eval", "improve", "eval_student"), ("improve", "eval_student")
    stages = [s.strip() for s in args.stages.split(",") if s.strip() and (s.strip() not in of_adapter or args.adapter)]
    if bad := [s for s in stages if s not in known]:
        sys.exit(f"--stages: unknown {', '.join(bad)} (known: {', '.join(known)})")
    if args.adapter and not (Path(args.adapter) / "adapter_config.json").is_file():
        sys.exit(f"--adapter {args.adapter}: no adapter_config.json there")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-binding-") as tmp:
            for name in names:
                rows.append(run_binding(name, Path(tmp), args.questions, args.eval, args.adapter, stages))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    cpu = "AVX2 float32" if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" else "native"
    shapes = {"generate": f"generate {args.questions} questions x 2 samples",
              "eval": f"eval {args.eval} dev questions x (teacher ReWOO, ReAct)",
              "improve": f"improve {args.questions} questions x 4 plans of the LoRA student",
              "eval_student": f"eval {args.eval} dev questions x the LoRA student (ReWOO)"}
    print(f"\n{os.cpu_count()} cores, {cpu}, {args.hogs} hog(s); " + ", ".join(shapes[s] for s in stages) + "\n")
    print("| binding | server start s | " + " | ".join(f"{s} s | {s} tok/s" for s in stages) + " |")
    print("|---|---:|" + "---:|---:|" * len(stages))
    for r in rows:
        cells = [f"{r[s]['wall_s']} | {r[s]['tokens_per_s']}" for s in stages]
        print(f"| {r['binding']} | {r['start_s']} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
