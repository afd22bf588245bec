"""LoRA SFT of the student Planner: TRL `SFTTrainer` + PEFT `LoraConfig`, launched by accelerate.

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m distill.train \
        --config configs/qwen2.5-7b_lora_gpu.yaml [--set key=value ...]
    distill train --config configs/smollm2-135m_lora_cpu.yaml          # one process, same code

The dataset is `distill sft-data`'s prompt/completion DatasetDict; TRL computes the loss on the completion only
(`completion_only_loss`), so the prompt masking is TRL's own, not ours. The config names the *effective*
batch (`global_batch_size`) and the accumulation is derived from the number of processes, so the
optimisation is the same on 1 GPU or 8. Rerunning the same command after an interruption resumes from the
last checkpoint in `output_dir`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from distill.config import Strict, add_config_args, load_config
from distill.errors import DistillError

log = logging.getLogger("distill.train")

ADAPTER_INFO = "distill_adapter.json"
Strategy = Literal["no", "steps", "epoch"]


class TrainConfig(Strict):
    """One flat training config; every key is documented in docs/TRAINING.md."""

    model_name_or_path: str = "smollm2-135m-instruct"  # HF id, local folder, or an embedded alias
    dataset_dir: str  # `distill sft-data` output (save_to_disk folder with train/validation)
    output_dir: str
    # LoRA (paper: r 8, alpha 16, dropout 0.05)
    lora_r: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    lora_target_modules: str | list[str] = "all-linear"
    # optimisation
    learning_rate: float = Field(1e-4, gt=0)
    num_train_epochs: float = Field(10, gt=0)
    max_steps: int = -1  # > 0 overrides num_train_epochs
    per_device_train_batch_size: int = Field(4, ge=1)
    per_device_eval_batch_size: int | None = None  # defaults to the train one
    global_batch_size: int = Field(128, ge=1)  # effective batch = per_device x accumulation x processes
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = Field(0.03, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = 1.0
    max_length: int = Field(2048, ge=16)
    # precision and memory
    bf16: bool = False
    gradient_checkpointing: bool = False
    load_in_4bit: bool = False  # QLoRA: nf4, double quantisation, bf16 compute (needs bitsandbytes and CUDA)
    attn_implementation: str | None = None  # sdpa, eager, flash_attention_2; None lets transformers choose
    torch_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # logging, evaluation, checkpoints
    logging_steps: int = Field(10, ge=1)
    eval_strategy: Strategy = "epoch"
    eval_steps: int | None = None
    eval_on_start: bool = False  # a step-0 validation loss, so the curve shows where training started
    save_strategy: Strategy = "epoch"
    save_steps: int | None = None
    save_total_limit: int | None = 2
    report_to: Literal["none", "tensorboard", "wandb"] = "none"
    seed: int = 0
    dataloader_num_workers: int = Field(0, ge=0)
    resume: bool = True  # continue from the last checkpoint in output_dir when there is one

    @field_validator("eval_strategy", "save_strategy", mode="before")
    @classmethod
    def _yaml_no(cls, value: Any) -> Any:
        """YAML reads a bare `no` (as in `--set eval_strategy=no`) as false."""
        return "no" if value is False else value

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.eval_strategy == "steps" and not self.eval_steps:
            raise ValueError("eval_strategy 'steps' needs eval_steps")
        if self.save_strategy == "steps" and not self.save_steps:
            raise ValueError("save_strategy 'steps' needs save_steps")
        if self.load_in_4bit and self.torch_dtype == "float32":
            raise ValueError("load_in_4bit computes in bfloat16: set torch_dtype to bfloat16 or auto")
        return self


# ---------------------------------------------------------------------------------------------- arithmetic


def world_size() -> int:
    """Processes taking part, from the launcher's environment (accelerate launch and torchrun set WORLD_SIZE).

    Read before accelerate's state exists on purpose: creating `PartialState()` here would fix its backend and
    timeout before TrainingArguments could; `build_trainer` checks the two agree once they do exist."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _has_accelerator() -> bool:
    import torch

    xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    return torch.cuda.is_available() or torch.backends.mps.is_available() or xpu


def gradient_accumulation_steps(global_batch_size: int, per_device: int, processes: int) -> int:
    """Accumulation that keeps the effective batch at `global_batch_size` whatever the number of processes."""
    per_step = per_device * processes
    if global_batch_size % per_step:
        raise DistillError(
            f"global_batch_size {global_batch_size} is not divisible by per_device_train_batch_size {per_device} "
            f"x {processes} process(es) = {per_step}; change one of them"
        )
    return global_batch_size // per_step


# ---------------------------------------------------------------------------------------------- building


def build_sft_config(cfg: TrainConfig, processes: int, has_eval: bool, resuming: bool = False):
    """TRL's SFTConfig from ours; TrainingArguments are made before the model so ZeRO-3 can shard at load.
    A resumed run skips the step-0 evaluation: its result is already in the restored log history."""
    from trl import SFTConfig

    accumulation = gradient_accumulation_steps(cfg.global_batch_size, cfg.per_device_train_batch_size, processes)
    eval_strategy = cfg.eval_strategy if has_eval else "no"
    return SFTConfig(
        output_dir=cfg.output_dir,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        per_device_eval_batch_size=cfg.per_device_eval_batch_size or cfg.per_device_train_batch_size,
        gradient_accumulation_steps=accumulation,
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_ratio,  # transformers 5: a float below 1 is a ratio of the total steps
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        max_length=cfg.max_length,
        completion_only_loss=True,  # loss on the plan only; TRL builds the labels from the prompt/completion split
        assistant_only_loss=False,
        packing=False,
        bf16=cfg.bf16,
        fp16=False,
        gradient_checkpointing=cfg.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if cfg.gradient_checkpointing else None,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        eval_strategy=eval_strategy,
        eval_steps=cfg.eval_steps,
        eval_on_start=cfg.eval_on_start and eval_strategy != "no" and not resuming,
        save_strategy=cfg.save_strategy,
        save_steps=cfg.save_steps or 500,
        save_total_limit=cfg.save_total_limit,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=cfg.dataloader_num_workers,
        remove_unused_columns=True,
        ddp_find_unused_parameters=False,
        disable_tqdm=not sys.stderr.isatty(),
        use_cpu=not _has_accelerator(),  # also what makes several CPU processes (gloo) train as one job
    )


def build_lora_config(cfg: TrainConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def _require(module: str, why: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise DistillError(f"{why} needs the package {module!r} (pip install {module})")


def load_model(cfg: TrainConfig, path: str):
    """The frozen base. Loaded by us (not by TRL from a string) so QLoRA and device placement are explicit."""
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": "auto" if cfg.torch_dtype == "auto" else getattr(torch, cfg.torch_dtype)}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    if cfg.load_in_4bit:
        _require("bitsandbytes", "load_in_4bit (QLoRA)")
        if not torch.cuda.is_available():
            raise DistillError("load_in_4bit (QLoRA) needs a CUDA GPU")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        kwargs["dtype"] = torch.bfloat16
        kwargs["device_map"] = {"": PartialState().local_process_index}  # each DDP rank holds its own copy
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise DistillError(f"cannot load model {cfg.model_name_or_path!r}: {str(exc).splitlines()[0]}") from None
    model.config.use_cache = False  # the KV cache is useless in training and fights gradient checkpointing
    return model


def load_tokenizer(path: str, name: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise DistillError(f"{name}: the tokenizer has no chat template; the planner prompt is a chat")
    return tokenizer


def load_splits(dataset_dir: str):
    """train and validation from `distill sft-data`; validation may be empty (then evaluation is off)."""
    from datasets import load_from_disk

    if not (Path(dataset_dir) / "dataset_dict.json").exists():
        hint = f"run `distill sft-data KEPT.jsonl --out {dataset_dir}`"
        raise DistillError(f"{dataset_dir}: not a dataset folder ({hint})")
    data = load_from_disk(dataset_dir)
    if "train" not in data or len(data["train"]) == 0:
        raise DistillError(f"{dataset_dir}: the train split is empty")
    for column in ("prompt", "completion"):
        if column not in data["train"].column_names:
            raise DistillError(f"{dataset_dir}: no {column!r} column; expected the prompt/completion form")
    val = data["validation"] if "validation" in data and len(data["validation"]) else None
    return data["train"], val


def build_trainer(cfg: TrainConfig, callbacks: list | None = None, resuming: bool = False):
    """The SFTTrainer exactly as training uses it (tests take their batches from it)."""
    from trl import SFTTrainer

    from distill.llm.embedded import resolve_model_path

    if cfg.report_to != "none":
        _require(cfg.report_to, f"report_to {cfg.report_to}")
    path = resolve_model_path(cfg.model_name_or_path)
    train, val = load_splits(cfg.dataset_dir)
    processes = world_size()
    args = build_sft_config(cfg, processes, has_eval=val is not None, resuming=resuming)
    if args.world_size != processes:
        raise DistillError(f"WORLD_SIZE says {processes} process(es) but accelerate runs {args.world_size}")
    tokenizer = load_tokenizer(path, cfg.model_name_or_path)
    model = load_model(cfg, path)
    log.info(
        "effective batch %d = per-device %d x accumulation %d x %d process(es); %d train / %d validation examples",
        cfg.global_batch_size, cfg.per_device_train_batch_size, args.gradient_accumulation_steps, processes,
        len(train), len(val) if val is not None else 0,
    )
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=val,
        processing_class=tokenizer,
        peft_config=build_lora_config(cfg),
        callbacks=callbacks,
    )


# ---------------------------------------------------------------------------------------------- outputs


def loss_history(log_history: list[dict]) -> dict:
    """Train and eval loss per optimiser step, from `trainer.state.log_history` (kept across resumes)."""
    train = [
        {k: e[k] for k in ("step", "epoch", "loss", "learning_rate", "grad_norm") if k in e}
        for e in log_history
        if "loss" in e
    ]
    evals = [{k: e[k] for k in ("step", "epoch", "eval_loss") if k in e} for e in log_history if "eval_loss" in e]
    summary = next((e for e in reversed(log_history) if "train_runtime" in e), {})
    return {"train": train, "eval": evals, "summary": summary}


def write_outputs(trainer, cfg: TrainConfig, started: float) -> dict:
    """Adapter + tokenizer (with chat_template.jinja) via save_model on every rank (ZeRO-3 gathers there);
    the small JSON/YAML files on the main process only."""
    from distill.llm.embedded import resolve_model_path
    from distill.store import write_json

    trainer.save_model(cfg.output_dir)
    if not trainer.is_world_process_zero():
        return {}
    out = Path(cfg.output_dir)
    args = trainer.args
    processes = args.world_size
    derived = {
        "world_size": processes,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "effective_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * processes,
    }
    header = "".join(f"# {k}: {v}\n" for k, v in derived.items())
    (out / "train_config.yaml").write_text(
        "# resolved config of this run\n" + header + yaml.safe_dump(cfg.model_dump(), sort_keys=False)
    )
    history = loss_history(trainer.state.log_history)
    write_json(out / "loss_history.json", history)
    info = {
        "format_version": 1,
        "base_model": cfg.model_name_or_path,
        "base_model_path": resolve_model_path(cfg.model_name_or_path),
        "lora_r": cfg.lora_r,
        "lora_alpha": cfg.lora_alpha,
        "lora_target_modules": cfg.lora_target_modules,
        "max_length": cfg.max_length,
        "chat_template": "chat_template.jinja",
        "dataset_dir": cfg.dataset_dir,
        "global_step": trainer.state.global_step,
        "final_train_loss": history["train"][-1]["loss"] if history["train"] else None,
        "final_eval_loss": history["eval"][-1]["eval_loss"] if history["eval"] else None,
        "wall_s": round(time.time() - started, 1),
        **derived,
    }
    write_json(out / ADAPTER_INFO, info)
    return info


def last_checkpoint(output_dir: str) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None


def train(cfg: TrainConfig, callbacks: list | None = None) -> dict:
    """Train (resuming when a checkpoint exists), make sure the final eval loss is logged, save everything."""
    started = time.time()
    resume = last_checkpoint(cfg.output_dir) if cfg.resume else None
    if resume:
        log.info("resuming from %s", resume)
    trainer = build_trainer(cfg, callbacks, resuming=resume is not None)
    trainer.train(resume_from_checkpoint=resume)
    state = trainer.state
    last_eval = max((e["step"] for e in state.log_history if "eval_loss" in e), default=None)
    finished = state.global_step >= state.max_steps
    evaluating = trainer.eval_dataset is not None and trainer.args.eval_strategy != "no"
    if finished and evaluating and last_eval != state.global_step:
        trainer.evaluate()  # e.g. eval_strategy epoch with max_steps ending mid-epoch: the curve still gets its end
    return write_outputs(trainer, cfg, started)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distill.train", description="LoRA SFT of the student planner")
    configure(parser)
    return parser


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser, default=None)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `accelerate launch -m distill.train`; errors are one line, like the CLI's."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except DistillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    if not args.config:
        raise DistillError("--config is required (e.g. configs/smollm2-135m_lora_cpu.yaml)")
    cfg = load_config(TrainConfig, args.config, args.set)
    info = train(cfg)
    if info:
        print(json.dumps({k: info[k] for k in ("global_step", "final_train_loss", "final_eval_loss", "wall_s")}))
        print(f"adapter written to {cfg.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
