"""Throughput check of the LoRA SFT stack on one GPU: a Qwen2.5-7B-shaped model, random weights, no download.

    scripts/gpu_check_train.sh --rehearsal          # the GPU half of the rehearsal, one command, under 10 minutes
    scripts/gpu_check_train.sh --rehearsal --tiny   # the same three parts on CPU with a 2-layer model (~2 min)
    scripts/gpu_check_train.sh                      # H200-class GPU: 7B shape, bf16, 200 steps
    scripts/gpu_check_train.sh --config configs/qwen2.5-7b_lora_80gb.yaml   # that config's batch and switches
    scripts/gpu_check_train.sh --batch-size 32 --no-gradient-checkpointing --liger --packing
    scripts/gpu_check_train.sh --sweep              # batch x checkpointing x kernels x packing, one table, ~10 min
    scripts/gpu_check_train.sh --tiny --steps 6     # CPU: a 2-layer model, to test the script itself

Training goes through `distill.train`'s own config parser and packing gate, then TRL's SFTTrainer, on synthetic
plan-like pairs built with the real student prompt; the SmolLM2 tokenizer provides the ids (a subset of Qwen's
vocabulary). `--sweep` runs each grid point in its own process, so an out-of-memory point is a row, not the end.
After `--warmup` steps it reports tokens/s, peak GPU memory and MFU = (4 N_base + 6 N_lora) x tokens /
(seconds x peak): a frozen base does no weight gradients, LoRA does; docs/TRAINING.md explains what is counted.

`--rehearsal` runs three parts, each in its own process with its own time limit (a failed part is a row with its
reason, not the end), and writes them as one JSON: `sft` (the 7B-shape step rate and MFU above, 60 steps), `grpo`
(one GRPO step of the 7B shape: improve's GRPO settings and its planner reward, the real Worker over the demo
corpus, generation by transformers since vLLM may be absent), and `two_processes` (`accelerate launch` of
`distill.train` with 2 processes on a 2-layer model: over NCCL on 2 GPUs; with one GPU NCCL takes one rank per
device, so the 2 ranks run on CPU over gloo (configs/accelerate/multi_cpu.yaml), and the row says so).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H200_BF16_DENSE_TFLOPS = 989.0

ENTITIES = [
    "Marie Curie", "the Danube", "Kyoto", "the Apollo 11 mission", "Ada Lovelace", "the Treaty of Westphalia",
    "Mount Kilimanjaro", "the Beatles", "Alan Turing", "the Great Barrier Reef", "Johann Sebastian Bach",
    "the Suez Canal", "Frida Kahlo", "the Hubble Space Telescope", "Nelson Mandela", "the Sahara",
]
RELATIONS = ["was born in", "was founded by", "is located in", "was directed by", "was named after", "won"]


def synthetic_dataset(n: int, seed: int):
    """Plan-like pairs: two lookups, an LLM extraction over #E refs, sometimes a calculation."""
    from datasets import Dataset

    from distill.rewoo.plan import Plan, Step, render_plan
    from distill.rewoo.prompts import planner_messages
    from distill.tools.registry import TOOL_DESCRIPTIONS

    rng, rows = random.Random(seed), []
    for _ in range(n):
        a, b = rng.sample(ENTITIES, 2)
        steps = [Step("#E1", f"Find out about {a}.", "Wikipedia", a, ()),
                 Step("#E2", f"Find out about {b}.", "Wikipedia", b, ()),
                 Step("#E3", "Extract the relevant dates.", "LLM", "When did each happen? Given context: #E1 and #E2",
                      ("#E1", "#E2"))]
        if rng.random() < 0.5:
            steps.append(Step("#E4", "Compute the difference in years.", "Calculator", "#E3", ("#E3",)))
        question = f"Which came first: the place where {a} {rng.choice(RELATIONS)}, or {b}?"
        rows.append({"prompt": planner_messages(question, dict(TOOL_DESCRIPTIONS), "full"),
                     "completion": [{"role": "assistant", "content": render_plan(Plan(tuple(steps), ()))}]})
    return Dataset.from_list(rows)


def model_config(tiny: bool):
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(
            vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False,
        )
    return Qwen2Config(  # Qwen2.5-7B-Instruct's shape
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )


def matmul_params(model, trainable: bool) -> int:
    """Weights that take part in matmuls (nn.Linear), frozen base or trainable LoRA."""
    import torch

    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return sum(w.numel() for w in weights if w.requires_grad == trainable)


def make_timer(cuda: bool):
    import torch
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        """(seconds, tokens trained on) at the start and after each step; `trainer` is set once it exists."""

        trainer = None

        def _mark(self, tokens: int) -> None:
            if cuda:
                torch.cuda.synchronize()
            self.marks.append((time.perf_counter(), tokens))

        def on_train_begin(self, args, state, control, **kwargs):
            self.marks: list[tuple[float, int]] = []
            self._mark(0)

        def on_step_end(self, args, state, control, **kwargs):
            self._mark(self.trainer._total_train_tokens)

    return Timer()


def run(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer, get_peft_config

    from distill.llm.embedded import resolve_model_path
    from distill.train import choose_batching, parse_train_config, world_size

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA GPU: run with --tiny to check the script on CPU")
    # the run's settings through distill.train's own parser and packing gate: what is measured is what trains
    data = {
        "model_name_or_path": "random-qwen2.5-7b-shape", "dataset_dir": "(synthetic)", "output_dir": args.output_dir,
        "per_device_train_batch_size": args.batch_size, "global_batch_size": args.batch_size * world_size(),
        "max_steps": args.steps, "learning_rate": 1e-4, "warmup_ratio": 0.03, "bf16": cuda,
        "dtype": "bfloat16" if cuda else "float32", "gradient_checkpointing": args.gradient_checkpointing,
        "max_length": args.max_length, "attn_implementation": args.attn_implementation,
        "logging_steps": max(1, args.steps // 10), "eval_strategy": "no", "save_strategy": "no", "report_to": "none",
        "use_liger_kernel": args.liger, "padding_free": args.packing, "packing": args.packing,
    }
    cfg = parse_train_config(data)
    choose_batching(cfg)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    torch.manual_seed(0)
    t_build = time.perf_counter()
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(
            model_config(args.tiny), attn_implementation=cfg.model.attn_implementation,
            dtype=torch.bfloat16 if cuda else torch.float32,
        )
    model.config.use_cache = False
    build_s = time.perf_counter() - t_build
    timer = make_timer(cuda)
    trainer = SFTTrainer(
        model=model, args=cfg.sft, train_dataset=synthetic_dataset(args.examples, seed=0),
        processing_class=tokenizer, peft_config=get_peft_config(cfg.model), callbacks=[timer],
    )
    timer.trainer = trainer
    n_base, n_lora = matmul_params(trainer.model, False), matmul_params(trainer.model, True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    measured = len(timer.marks) - 1 - args.warmup
    if measured < 1:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    (t0, tokens0), (t1, tokens1) = timer.marks[args.warmup], timer.marks[-1]
    seconds, tokens = t1 - t0, tokens1 - tokens0
    flops = (4 * n_base + 6 * n_lora) * tokens
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": "tiny Qwen2 (2 layers)" if args.tiny else "Qwen2.5-7B shape, random bf16 weights",
        "n_base_matmul_params": n_base, "n_lora_params": n_lora, "per_device_batch": args.batch_size,
        "gradient_checkpointing": cfg.sft.gradient_checkpointing, "liger": cfg.sft.use_liger_kernel,
        "packing": bool(cfg.sft.packing or cfg.sft.padding_free),
        "attn_implementation": trainer.model.config._attn_implementation,
        "measured_steps": measured, "tokens": int(tokens), "tokens_per_step": round(tokens / measured, 1),
        "seconds": round(seconds, 3), "s_per_step": round(seconds / measured, 4),
        "tokens_per_s": round(tokens / seconds, 1), "model_tflops_per_s": float(f"{flops / seconds / 1e12:.4g}"),
        "peak_tflops": args.peak_tflops, "mfu": float(f"{flops / seconds / (args.peak_tflops * 1e12):.4g}"),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None,
        "model_build_s": round(build_s, 1),
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "formula": "MFU = (4*N_base + 6*N_lora) * tokens / (seconds * peak); no recompute, no attention scores",
    }


# ---------------------------------------------------------------------------------------------- the sweep

def switches(text: str) -> list[bool]:
    values = {"on": True, "off": False}
    if any(v.strip() not in values for v in text.split(",")):
        raise argparse.ArgumentTypeError(f"a comma list of on/off, got {text!r}")
    return [values[v.strip()] for v in text.split(",")]


def integers(text: str) -> list[int]:
    return [int(b) for b in text.split(",")]


SWEEP_AXES = {"batch_size": ("--sweep-batch", integers, "8,32"),
              "gradient_checkpointing": ("--sweep-checkpointing", switches, "on,off"),
              "liger": ("--sweep-kernels", switches, "off,on"), "packing": ("--sweep-packing", switches, "off,on")}


def sweep_grid(args: argparse.Namespace) -> list[dict]:
    """Every combination of the four axes, cheapest first, so a short budget still gets the baseline rows."""
    axes = [getattr(args, flag[2:].replace("-", "_")) for flag, _, _ in SWEEP_AXES.values()]
    return [dict(zip(SWEEP_AXES, point)) for point in itertools.product(*axes)]


def point_argv(point: dict, args: argparse.Namespace, json_path: str) -> list[str]:
    flag = {True: "--", False: "--no-"}
    argv = ["--batch-size", str(point["batch_size"]), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--examples", str(args.examples), "--max-length", str(args.max_length),
            "--peak-tflops", str(args.peak_tflops), "--json", json_path,
            f"{flag[point['gradient_checkpointing']]}gradient-checkpointing", f"{flag[point['liger']]}liger",
            f"{flag[point['packing']]}packing"]
    if args.attn_implementation:
        argv += ["--attn-implementation", args.attn_implementation]
    return argv + (["--tiny"] if args.tiny else [])


def on_off(value: bool) -> str:
    return "yes" if value else "no"


def format_table(rows: list[dict]) -> str:
    """One markdown table; a point that failed keeps its row with the reason."""
    lines = ["| per-device batch | gradient checkpointing | Liger kernels | packing (ran) | tokens/s | MFU | "
             "peak allocated GiB | note |", "|---:|---|---|---|---:|---:|---:|---|"]
    for row in rows:
        r = row.get("result") or {}
        packing = on_off(row["packing"]) + (f" ({on_off(r['packing'])})" if "packing" in r else "")
        figures = (f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.3f}", "-" if r.get("peak_memory_gib") is None
                   else f"{r['peak_memory_gib']:.1f}") if r else ("-", "-", "-")
        lines.append(f"| {row['batch_size']} | {on_off(row['gradient_checkpointing'])} | {on_off(row['liger'])} | "
                     f"{packing} | {' | '.join(figures)} | {row.get('error', '')} |")
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, point in enumerate(sweep_grid(args)):
            json_path = str(Path(scratch) / f"point{i}.json")
            argv = [sys.executable, str(Path(__file__).resolve())] + point_argv(point, args, json_path)
            row = dict(point)
            started = time.perf_counter()
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=args.point_timeout)
                if done.returncode == 0:
                    row["result"] = json.loads(Path(json_path).read_text())
                else:
                    tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
                    row["error"] = "out of memory" if "OutOfMemoryError" in done.stderr else tail[0][:120]
            except subprocess.TimeoutExpired:
                row["error"] = f"over --point-timeout {args.point_timeout}s"
            row["wall_s"] = round(time.perf_counter() - started, 1)
            rows.append(row)
            print(f"[sweep] {i + 1}: {point} {row.get('error') or 'ok'} ({row['wall_s']} s)", file=sys.stderr,
                  flush=True)
    table = format_table(rows)
    print(table)
    return {"points": rows, "table": table}


# ---------------------------------------------------------------------------------------------- the rehearsal

REHEARSAL_PARTS = {"sft": 300, "grpo": 200, "two_processes": 200}  # seconds each: 700 s at most in all


def tiny_model_folder(out: Path) -> Path:
    """A 2-layer Llama with the SmolLM2 tokenizer and chat template, saved as a model folder (what
    `accelerate launch -m distill.train` loads by path)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from distill.llm.embedded import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=2048)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def run_grpo_step(args: argparse.Namespace) -> dict:
    """One GRPO step as `distill improve` (method grpo) takes it: improve's config, its GRPO arguments and its
    planner reward; the policy is a fresh LoRA on the random model in memory (no SFT adapter to load here)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from distill.core.config import validate
    from distill.generate import load_questions
    from distill.improve import ImproveConfig, PlannerReward, grpo_args
    from distill.llm.embedded import resolve_model_path
    from distill.rewoo.prompts import planner_messages
    from distill.tools.registry import tool_descriptions

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA GPU: run with --tiny to check the script on CPU")
    samples = 4 if args.tiny else 8
    cfg = validate(ImproveConfig, {
        "method": "grpo", "adapter": "(a fresh LoRA on the random model)", "output_dir": args.output_dir,
        "planner_prompt": "compact", "planner": {"temperature": 1.0, "max_tokens": 16 if args.tiny else 128},
        "tools": ["Wikipedia"], "wikipedia_corpus": str(ROOT / "data" / "demo" / "corpus.jsonl"),
        "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data" / "demo" / "train.jsonl"), "split": "train",
                      "n": 4}],
        "samples_per_question": samples,
        "grpo": {"max_steps": 1, "per_device_train_batch_size": samples, "gradient_accumulation_steps": 1,
                 "learning_rate": 1e-6, "save_strategy": "no", "gradient_checkpointing": cuda},
    }, "grpo check")
    examples = load_questions(cfg)
    grpo = grpo_args(cfg, Path(args.output_dir) / "grpo")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    descriptions = tool_descriptions(cfg.tools)
    dataset = Dataset.from_list([{"prompt": planner_messages(ex.question, descriptions, cfg.planner_prompt),
                                  "id": ex.id} for ex in examples])
    torch.manual_seed(0)
    t_build = time.perf_counter()
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(model_config(args.tiny),
                                                 dtype=torch.bfloat16 if cuda else torch.float32)
    policy = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    build_s = time.perf_counter() - t_build
    reward = PlannerReward(cfg, examples)
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=grpo, train_dataset=dataset,
                          processing_class=tokenizer)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    logged = next((e for e in trainer.state.log_history if "reward" in e), {})
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": "tiny Qwen2 (2 layers)" if args.tiny else "Qwen2.5-7B shape, random bf16 weights",
        "steps": trainer.state.global_step, "completions": sum(reward.calls), "num_generations": grpo.num_generations,
        "max_completion_length": grpo.max_completion_length, "step_s": round(seconds, 2),
        "model_build_s": round(build_s, 1), "reward": logged.get("reward"), "kl": logged.get("kl"),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }


def run_two_processes(args: argparse.Namespace) -> dict:
    """`accelerate launch -m distill.train` with 2 processes on a 2-layer model and synthetic plans."""
    import torch
    from datasets import DatasetDict

    gpus = 0 if args.tiny else torch.cuda.device_count()
    scratch = Path(args.output_dir) / "two_processes"
    model = tiny_model_folder(scratch / "model")
    DatasetDict({"train": synthetic_dataset(16, seed=0)}).save_to_disk(str(scratch / "sft"))
    env = dict(os.environ)
    if gpus >= 2:
        config, how = "multi_gpu.yaml", "2 GPUs, NCCL"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        config = "multi_cpu.yaml"
        how = ("one GPU: NCCL takes one rank per GPU, so the 2 ranks ran on CPU over gloo" if gpus == 1
               else "no GPU: 2 CPU ranks over gloo")
    out = scratch / "adapter"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / config),
           "--num_processes", "2", "--mixed_precision", "no", "-m", "distill.train",
           "--config", str(ROOT / "configs" / "smollm2-135m_lora_cpu.yaml")]
    for key, value in {"dataset_dir": scratch / "sft", "output_dir": out, "model_name_or_path": model,
                       "max_steps": 4, "save_steps": 2, "eval_strategy": "no"}.items():
        cmd += ["--set", f"{key}={value}"]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"accelerate launch failed: {(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}")
    info = json.loads((out / "distill_adapter.json").read_text())
    return {"how": how, "gpus_visible": gpus, "accelerate_config": f"configs/accelerate/{config}",
            "wall_s": round(time.perf_counter() - started, 1),
            **{k: info.get(k) for k in ("world_size", "gradient_accumulation_steps", "effective_batch_size",
                                        "global_step", "final_train_loss")},
            "adapter_files": sorted(p.name for p in out.iterdir() if p.is_file())}


def run_rehearsal(args: argparse.Namespace) -> dict:
    """The three parts, each in its own process (an out-of-memory or a hang is that part's row)."""
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for part, limit in REHEARSAL_PARTS.items():
            json_path = str(Path(scratch) / f"{part}.json")
            argv = [sys.executable, str(Path(__file__).resolve()), "--json", json_path,
                    "--output-dir", str(Path(scratch) / part)] + (["--tiny"] if args.tiny else [])
            if part == "sft":
                argv += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size)]
            else:
                argv += ["--part", part]
            limit *= 3 if args.tiny else 1  # a CPU shared with other work: a hang guard, not a time bound
            started = time.perf_counter()
            row: dict = {}
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
                if done.returncode == 0:
                    row["result"] = json.loads(Path(json_path).read_text())
                else:
                    tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
                    row["error"] = "out of memory" if "OutOfMemoryError" in done.stderr else tail[0][:300]
            except subprocess.TimeoutExpired:
                row["error"] = f"over its {limit} s limit"
            row["wall_s"] = round(time.perf_counter() - started, 1)
            results[part] = row
            print(f"[rehearsal] {part}: {row.get('error') or 'ok'} ({row['wall_s']} s)", file=sys.stderr, flush=True)
    results["ok"] = all("result" in results[part] for part in REHEARSAL_PARTS)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="2-layer model on CPU: checks the script, not the GPU")
    parser.add_argument("--config", default=None,
                        help="a training config: its batch, checkpointing, kernels, packing, attention, max_length")
    parser.add_argument("--steps", type=int, default=None, help="200 (sweep: 15, tiny: 6)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the timing: 10 (sweep: 3, tiny: 2)")
    parser.add_argument("--batch-size", type=int, default=None, help="per device, no accumulation: 8 (tiny: 2)")
    parser.add_argument("--examples", type=int, default=None, help="distinct synthetic examples: 512 (tiny: 32)")
    parser.add_argument("--max-length", type=int, default=None, help="1024")
    parser.add_argument("--attn-implementation", default=None, help="sdpa (default) or flash_attention_2")
    for flag, why in (("--gradient-checkpointing", "default on"),
                      ("--liger", "TRL's use_liger_kernel (fused RMSNorm, RoPE, SwiGLU); default off"),
                      ("--packing", "padding-free packed batches (needs flash-attn); default off")):
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=why)
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS, help="dense bf16 peak of the GPU")
    parser.add_argument("--output-dir", default=None, help="trainer scratch folder (nothing is saved)")
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("--sweep", action="store_true", help="run the grid below and print one table")
    for flag, kind, default in SWEEP_AXES.values():
        parser.add_argument(flag, type=kind, default=default, help=f"sweep axis (default {default})")
    parser.add_argument("--point-timeout", type=int, default=120, help="seconds per sweep point")
    parser.add_argument("--rehearsal", action="store_true",
                        help="SFT step rate and MFU, one GRPO step, a 2-process launch: one JSON, under 10 minutes")
    parser.add_argument("--part", choices=["grpo", "two_processes"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    settings = {"batch_size": 8, "gradient_checkpointing": True, "liger": False, "packing": False,
                "max_length": 1024, "attn_implementation": None}
    if args.config:
        from distill.train import load_train_config

        cfg = load_train_config(args.config)
        settings = {"batch_size": cfg.sft.per_device_train_batch_size,
                    "gradient_checkpointing": cfg.sft.gradient_checkpointing, "liger": cfg.sft.use_liger_kernel,
                    "packing": bool(cfg.sft.packing or cfg.sft.padding_free), "max_length": cfg.sft.max_length,
                    "attn_implementation": cfg.model.attn_implementation}
    if args.tiny:
        settings |= {"batch_size": 2, "steps": 6, "warmup": 2, "examples": 32}
    elif args.rehearsal:
        settings |= {"steps": 60, "warmup": 5, "examples": 512}
    else:
        settings |= {"steps": 15, "warmup": 3, "examples": 256} if args.sweep else {
            "steps": 200, "warmup": 10, "examples": 512}
    for name, value in settings.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        args.output_dir = args.output_dir or scratch
        parts = {"grpo": run_grpo_step, "two_processes": run_two_processes}
        result = (run_rehearsal(args) if args.rehearsal else parts[args.part](args) if args.part
                  else run_sweep(args) if args.sweep else run(args))
    text = json.dumps(result, indent=2)
    if not args.sweep:
        print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
