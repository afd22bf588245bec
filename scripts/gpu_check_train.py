"""Throughput check of the LoRA SFT stack on one GPU: a Qwen2.5-7B-shaped model, random weights, no download.

    scripts/gpu_check_train.sh                      # H200-class GPU: 7B shape, bf16, 200 steps
    scripts/gpu_check_train.sh --tiny --steps 6     # CPU: a 2-layer model, to test the script itself

The model is built in code from a Qwen2.5-7B-Instruct-like config (28 layers, hidden 3584, GQA 28/4 heads,
MLP 18944, vocab 152064 so the LM-head cost is the real one); the embedded SmolLM2 tokenizer provides the
token ids (its 49,152 ids are a subset of the model's vocabulary). The data are synthetic plan-like
prompt/completion pairs built with the real student prompt (`planner_messages`) and canonical plans, and
training goes through the same code as `distill.train`: TRL SFTTrainer, completion-only loss, PEFT LoRA
r 8 / alpha 16 / all-linear, bf16, gradient checkpointing.

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
        "prompt": planner_messages(question, tools, fewshot=False),
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


def run(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from distill.llm.embedded import resolve_model_path
    from distill.train import TrainConfig, build_lora_config, build_sft_config, world_size

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA GPU: run with --tiny to check the script on CPU")
    cfg = TrainConfig(
        model_name_or_path="random-qwen2.5-7b-shape", dataset_dir="(synthetic)", output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size, global_batch_size=args.batch_size * world_size(),
        max_steps=args.steps, learning_rate=1e-4, warmup_ratio=0.03, bf16=cuda,
        torch_dtype="bfloat16" if cuda else "float32",
        gradient_checkpointing=not args.no_gradient_checkpointing, max_length=args.max_length,
        attn_implementation=args.attn_implementation, logging_steps=max(1, args.steps // 10),
        eval_strategy="no", save_strategy="no", report_to="none", eval_on_start=False,
    )
    sft_args = build_sft_config(cfg, world_size(), has_eval=False)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    extra = {"attn_implementation": cfg.attn_implementation} if cfg.attn_implementation else {}
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
        model=model, args=sft_args, train_dataset=synthetic_dataset(args.examples, seed=0),
        processing_class=tokenizer, peft_config=build_lora_config(cfg), callbacks=[timer],
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
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": "tiny Qwen2 (2 layers)" if args.tiny else "Qwen2.5-7B shape, random bf16 weights",
        "n_base_matmul_params": n_base,
        "n_lora_params": n_lora,
        "per_device_batch": args.batch_size,
        "gradient_checkpointing": cfg.gradient_checkpointing,
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
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="2-layer model on CPU: checks the script, not the GPU")
    parser.add_argument("--steps", type=int, default=None, help="200 (tiny: 6)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the timing: 10 (tiny: 2)")
    parser.add_argument("--batch-size", type=int, default=None, help="per device, no accumulation: 8 (tiny: 2)")
    parser.add_argument("--examples", type=int, default=None, help="distinct synthetic examples: 512 (tiny: 32)")
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--attn-implementation", default=None, help="sdpa (default) or flash_attention_2")
    parser.add_argument("--no-gradient-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS, help="dense bf16 peak of the GPU")
    parser.add_argument("--output-dir", default=None, help="trainer scratch folder (nothing is saved)")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    defaults = {"steps": 6, "warmup": 2, "batch_size": 2, "examples": 32} if args.tiny else {
        "steps": 200, "warmup": 10, "batch_size": 8, "examples": 512}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        args.output_dir = args.output_dir or scratch
        result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
