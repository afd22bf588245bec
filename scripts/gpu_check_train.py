"""Throughput check of the LoRA SFT stack on one GPU: a Qwen2.5-7B-shaped model, random weights, no download.

    scripts/gpu_check_train.sh                      # H200-class GPU: 7B shape, bf16, 200 steps
    scripts/gpu_check_train.sh --config configs/qwen2.5-7b_lora_80gb.yaml   # that config's batch and switches
    scripts/gpu_check_train.sh --batch-size 32 --no-gradient-checkpointing --liger --packing
    scripts/gpu_check_train.sh --sweep              # batch x checkpointing x kernels x packing, one table
    scripts/gpu_check_train.sh --tiny --steps 6     # CPU: a 2-layer model, to test the script itself

The model is built in code from a Qwen2.5-7B-Instruct-like config (28 layers, hidden 3584, GQA 28/4 heads,
MLP 18944, vocab 152064 so the LM-head cost is the real one); the embedded SmolLM2 tokenizer provides the
token ids (its 49,152 ids are a subset of the model's vocabulary). The data are synthetic plan-like
prompt/completion pairs built with the real student prompt (`planner_messages`) and canonical plans, and
training goes through the same code as `distill.train` (its config parser, its packing gate, TRL SFTTrainer,
completion-only loss, PEFT LoRA r 8 / alpha 16 / all-linear, bf16). `--liger` is TRL's `use_liger_kernel`;
`--packing` is TRL's padding-free packing, used only where flash-attention's varlen kernels are installed
(otherwise the run says so and trains on padded batches: the table's `packing` column shows what ran).

`--sweep` runs each grid point in its own process (an out-of-memory point is a row, not the end) with
`--steps 15 --warmup 3` unless given, and prints one markdown table; the default 16-point grid is sized for
about 10 minutes on one H200, model builds included (an estimate: not yet run on a GPU).

Reported, after `--warmup` steps: tokens/s (non-padding tokens, prompt included: the prompt is computed on even
though it carries no loss), seconds per step, peak GPU memory, and model FLOPs utilisation

    MFU = (4 * N_base + 6 * N_lora) * tokens / (seconds * peak)

where N_base counts the frozen base's matmul weights (every nn.Linear, LM head included; the input embedding
is a lookup), 2N per token for the forward and 2N for the backward's activation gradients (a frozen base has
no weight gradients), and 6N for the trainable LoRA weights. Neither the recomputation of gradient
checkpointing (hardware FLOPs, not model FLOPs) nor attention scores (~1% of 4N at these lengths) are
counted. peak = 989 TFLOP/s, the H200's dense bf16 figure (use --peak-tflops for other GPUs).
"""

from __future__ import annotations

import argparse
import json
import random
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


def synthetic_example(rng: random.Random, tools: dict[str, str]) -> dict:
    """A plan-like pair: two or three lookups, an LLM extraction over #E refs, sometimes a calculation."""
    from distill.rewoo.plan import Plan, Step, render_plan
    from distill.rewoo.prompts import planner_messages

    a, b = rng.sample(ENTITIES, 2)
    question = f"Which came first: the place where {a} {rng.choice(RELATIONS)}, or {b}?"
    steps = [Step("#E1", f"Find out about {a}.", "Wikipedia", a, ())]
    steps.append(Step("#E2", f"Find out about {b}.", "Wikipedia", b, ()))
    ask = "When did each happen? Given context: #E1 and #E2"
    steps.append(Step("#E3", "Extract the relevant dates.", "LLM", ask, ("#E1", "#E2")))
    if rng.random() < 0.5:
        steps.append(Step("#E4", "Compute the difference in years.", "Calculator", "#E3", ("#E3",)))
    return {
        "prompt": planner_messages(question, tools, "full"),
        "completion": [{"role": "assistant", "content": render_plan(Plan(tuple(steps), ()))}],
        "id": f"synthetic-{rng.random():.8f}",
        "dataset": "synthetic",
        "sample": 0,
    }


def synthetic_dataset(n: int, seed: int):
    from distill.sft_data import to_dataset_dict
    from distill.tools.registry import TOOL_DESCRIPTIONS

    rng = random.Random(seed)
    return to_dataset_dict([synthetic_example(rng, dict(TOOL_DESCRIPTIONS)) for _ in range(n)], [])["train"]


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

    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            for p in module.parameters(recurse=False):
                if p.dim() == 2 and p.requires_grad == trainable:
                    total += p.numel()
    return total


def make_timer(warmup: int, cuda: bool):
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        """Wall time and token count between the end of warm-up and the last step."""

        def __init__(self):
            self.trainer = None
            self.t0 = self.tokens0 = self.t1 = self.tokens1 = None
            self.step_times: list[float] = []
            self._start = 0.0

        def _now(self) -> float:
            if cuda:
                import torch

                torch.cuda.synchronize()
            return time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = self._now()
            if state.global_step == warmup:
                self.t0, self.tokens0 = self._start, self.trainer._total_train_tokens

        def on_step_end(self, args, state, control, **kwargs):
            now = self._now()
            if state.global_step > warmup:
                self.step_times.append(now - self._start)
                self.t1, self.tokens1 = now, self.trainer._total_train_tokens

    return Timer()


def build_config(args: argparse.Namespace, cuda: bool):
    """The run's settings through distill.train's own parser, so what is measured is what training would run."""
    from distill.train import choose_batching, parse_train_config, world_size

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
    return cfg


def run(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer, get_peft_config

    from distill.llm.embedded import resolve_model_path

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA GPU: run with --tiny to check the script on CPU")
    cfg = build_config(args, cuda)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    attn = cfg.model.attn_implementation
    extra = {"attn_implementation": attn} if attn else {}
    torch.manual_seed(0)
    t_build = time.perf_counter()
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(
            model_config(args.tiny), dtype=torch.bfloat16 if cuda else torch.float32, **extra
        )
    model.config.use_cache = False
    build_s = time.perf_counter() - t_build
    timer = make_timer(args.warmup, cuda)
    trainer = SFTTrainer(
        model=model, args=cfg.sft, train_dataset=synthetic_dataset(args.examples, seed=0),
        processing_class=tokenizer, peft_config=get_peft_config(cfg.model), callbacks=[timer],
    )
    timer.trainer = trainer
    n_base, n_lora = matmul_params(trainer.model, False), matmul_params(trainer.model, True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    if timer.t0 is None or timer.t1 is None:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    seconds, tokens = timer.t1 - timer.t0, timer.tokens1 - timer.tokens0
    flops = (4 * n_base + 6 * n_lora) * tokens
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": "tiny Qwen2 (2 layers)" if args.tiny else "Qwen2.5-7B shape, random bf16 weights",
        "n_base_matmul_params": n_base,
        "n_lora_params": n_lora,
        "per_device_batch": args.batch_size,
        "gradient_checkpointing": cfg.sft.gradient_checkpointing,
        "liger": cfg.sft.use_liger_kernel,
        "packing": bool(cfg.sft.packing or cfg.sft.padding_free),
        "attn_implementation": trainer.model.config._attn_implementation,
        "measured_steps": len(timer.step_times),
        "tokens": int(tokens),
        "tokens_per_step": round(tokens / max(1, len(timer.step_times)), 1),
        "seconds": round(seconds, 3),
        "s_per_step": round(seconds / max(1, len(timer.step_times)), 4),
        "tokens_per_s": round(tokens / seconds, 1),
        "model_tflops_per_s": float(f"{flops / seconds / 1e12:.4g}"),
        "peak_tflops": args.peak_tflops,
        "mfu": float(f"{flops / seconds / (args.peak_tflops * 1e12):.4g}"),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None,
        "model_build_s": round(build_s, 1),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "formula": "MFU = (4*N_base + 6*N_lora) * tokens / (seconds * peak); no recompute, no attention scores",
    }


# ---------------------------------------------------------------------------------------------- the sweep

SWEEP_DEFAULTS = {"sweep_batch": "8,32", "sweep_checkpointing": "on,off", "sweep_kernels": "off,on",
                  "sweep_packing": "off,on"}


def _switches(text: str, name: str) -> list[bool]:
    values = {"on": True, "off": False}
    out = [values.get(v.strip()) for v in text.split(",")]
    if None in out or not out:
        raise SystemExit(f"--{name.replace('_', '-')}: a comma list of on/off, got {text!r}")
    return out


def sweep_grid(args: argparse.Namespace) -> list[dict]:
    """Every combination of the four axes, cheapest first, so a short budget still gets the baseline rows."""
    try:
        batches = [int(b) for b in args.sweep_batch.split(",")]
    except ValueError:
        raise SystemExit(f"--sweep-batch: a comma list of integers, got {args.sweep_batch!r}") from None
    return [
        {"batch_size": b, "gradient_checkpointing": ckpt, "liger": liger, "packing": packing}
        for b in batches
        for ckpt in _switches(args.sweep_checkpointing, "sweep_checkpointing")
        for liger in _switches(args.sweep_kernels, "sweep_kernels")
        for packing in _switches(args.sweep_packing, "sweep_packing")
    ]


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
    import subprocess

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
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="default on")
    parser.add_argument("--liger", action=argparse.BooleanOptionalAction, default=None,
                        help="TRL's use_liger_kernel (fused RMSNorm, RoPE, SwiGLU); default off")
    parser.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None,
                        help="padding-free packed batches (needs flash-attn); default off")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS, help="dense bf16 peak of the GPU")
    parser.add_argument("--output-dir", default=None, help="trainer scratch folder (nothing is saved)")
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("--sweep", action="store_true", help="run the grid below and print one table")
    for name, default in SWEEP_DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", default=default, help=f"sweep axis (default {default})")
    parser.add_argument("--point-timeout", type=int, default=120, help="seconds per sweep point")
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
        result = run_sweep(args) if args.sweep else run(args)
    text = json.dumps(result, indent=2)
    if not args.sweep:
        print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
