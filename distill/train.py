"""LoRA SFT of the student Planner, written the way TRL's `trl/scripts/sft.py` is: TRL's own argument classes.

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m distill.train \
        --config configs/qwen2.5-7b_lora_gpu.yaml [--set key=value ...] [--learning_rate 2e-4 ...]
    distill train --config configs/smollm2-135m_lora_cpu.yaml          # one process, same code

Config keys are the fields of TRL's `SFTConfig` and `ModelConfig` (any TRL option works without a code change)
plus `DistillArguments`. The config names the *effective* batch, so the optimisation is the same on 1 GPU or 8.
Rerunning after an interruption resumes from the last checkpoint in `output_dir`.

improve's GRPO goes through the same parser (TRL's `GRPOConfig`) and the same `train()`, so both methods resume,
train and save one way; its reward and prompts are improve's. Which config fits the GPUs and how the processes
are started is `distill.training.launch`'s, which imports this module and never the reverse.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import importlib.util
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from distill import code_version
from distill.core import layout
from distill.core.config import add_config_args, load_config, refuse_url_credentials, suggestion
from distill.core.errors import DistillError
from distill.core.secrets import MaskingFormatter, is_secret_name, mask, mask_log_record, masked_mapping, remember
from distill.core.store import read_json, replace_files, write_json
from distill.core.tracking import require as require_trackers
from distill.llm.embedded import resolve_model_path
from distill.reporting.verdict import small_training_set
from distill.sft_data import check_rows
from distill.training import recipe
from distill.training.merge import ADAPTER_INFO
from distill.training.push import model_card_problem, write_model_card

log = logging.getLogger("distill.train")


@dataclass
class DistillArguments:
    """What TRL's argument classes lack."""

    dataset_dir: str | None = field(default=None, metadata={"help": "`distill sft-data` output folder"})
    global_batch_size: int = field(
        default=128, metadata={"help": "effective batch = per-device x accumulation x processes"}
    )
    resume: bool = field(default=True, metadata={"help": "continue from the last checkpoint in output_dir"})
    accelerate_config: str | None = field(
        default=None, metadata={"help": "`distill pipeline` only: accelerate config (default: single/multi GPU)"}
    )
    num_processes: int | None = field(
        default=None, metadata={"help": "`distill pipeline` only: training processes (default: one per GPU)"}
    )
    init_adapter: str | None = field(
        default=None, metadata={"help": "continue this LoRA adapter (its weights and LoRA config) instead of a new one"}
    )


@dataclass
class TrainConfig:
    """The three argument classes with the flat dict they came from (which alone decides equality);
    `model_validate` lets `distill.core.config.load_config` and the pipeline treat it like the other stages' configs.
    `resolved` is the parsed objects as flat keys, flags included: what `train_config.yaml` records."""

    data: dict
    distill: DistillArguments = field(compare=False)
    sft: Any = field(compare=False)
    model: Any = field(compare=False)
    resolved: dict = field(default_factory=dict, compare=False)

    @classmethod
    def model_validate(cls, data: dict, context: Any = None) -> TrainConfig:
        """pydantic's signature: `validate` passes every class where its keys came from as `context` (pydantic
        configs name it in a renamed key's warning); TRL's parser has no renamed keys to warn of."""
        return parse_train_config(data)

    @property
    def output_dir(self) -> str:
        return self.sft.output_dir

    @property
    def resume(self) -> bool:
        return self.distill.resume

    def accumulation(self, processes: int) -> int:
        per_device = self.sft.per_device_train_batch_size
        return gradient_accumulation_steps(self.distill.global_batch_size, per_device, processes)


@dataclass
class GRPORun:
    """A GRPO run: TRL's `GRPOConfig` (`parse_grpo_config`) and what GRPOTrainer takes beside it. The policy
    continues an adapter (`init_adapter` on its base), as improve's expert iteration does; the reward functions
    and the prompts are the caller's (improve's planner reward over its training questions), so this module
    needs nothing of theirs. Its adapter is written to `<output_dir>/adapter`, beside the checkpoints."""

    args: Any
    model_name_or_path: str
    init_adapter: str
    reward_funcs: list
    train_dataset: Any
    resume: bool = True

    @property
    def output_dir(self) -> str:
        return self.args.output_dir


def _fail(message: str, where: str = "train config"):
    raise DistillError(f"{where}: {message}")


def parse_train_config(data: dict, argv: list[str] | None = None, processes: int | None = None) -> TrainConfig:
    """TRL's `TrlParser` over our flat dict (YAML + `--set`) and TRL-style flags; every problem is one line."""
    import torch

    if "gradient_accumulation_steps" in data:
        _fail("gradient_accumulation_steps is derived from global_batch_size and the number of processes; "
              "set global_batch_size instead")
    # YAML reads a bare `no` (as in `--set eval_strategy=no`) as false
    given = {k: "no" if v is False and k.endswith("_strategy") else v for k, v in data.items()}
    if "warmup_ratio" in given and "warmup_ratio" not in {f.name for f in dataclasses.fields(recipe.SFTConfig)}:
        # configs say warmup_ratio; transformers 5 dropped the field and reads a warmup_steps below 1 as a ratio
        ratio = given.pop("warmup_ratio")
        if "warmup_steps" in given:
            _fail("set warmup_ratio or warmup_steps, not both")
        if not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            _fail(f"warmup_ratio must be a number in [0, 1), got {ratio!r}")
        given["warmup_steps"] = float(ratio)
    accelerator = torch.cuda.is_available() or torch.backends.mps.is_available() or torch.xpu.is_available()
    dynamic = {"use_cpu": not accelerator, "disable_tqdm": not sys.stderr.isatty()}
    distill, sft, model = _parse(_sft_classes(), dynamic | given, given, argv,
                                 "SFTConfig, ModelConfig and DistillArguments fields: see docs/TRAINING.md")
    if not distill.dataset_dir:
        _fail("dataset_dir is required")
    if not model.use_peft:
        _fail("distill trains a LoRA adapter: use_peft must be true")
    if sft.data_seed is None:
        sft.data_seed = sft.seed
    if sft.hub_token:  # every checkpoint pickles the arguments (training_args.bin): the token goes where
        remember(sft.hub_token)  # huggingface_hub reads one anyway, the environment, which children inherit
        os.environ["HF_TOKEN"], sft.hub_token = sft.hub_token, None
    resolved = resolved_keys((distill, sft, model), _defaults(**dynamic), set(given) | set(recipe.SFT))
    cfg = TrainConfig(dict(data), distill, sft, model, resolved)
    sft.gradient_accumulation_steps = cfg.accumulation(world_size() if processes is None else processes)
    return cfg


def parse_train_section(data: dict, source: str) -> TrainConfig:
    """A train config from a section the caller put together (the pipeline's student, an improvement round): one
    parse by TRL's parser, after the URL-credential refusal every config gets, named for what it is rather than
    behind `validate`, which reads like pydantic's and is not here."""
    refuse_url_credentials(data, source)
    return parse_train_config(data)


def parse_grpo_config(keys: dict):
    """TRL's `GRPOConfig` through the same parser and the same one-line refusals as SFT's config (an unknown key
    with its nearest names, a number out of range), each naming the `grpo` section."""
    (args,) = _parse((recipe.GRPOConfig,), keys, keys, None, "GRPOConfig fields: see docs/improve.md", where="grpo")
    return args


def _sft_classes() -> tuple:
    return DistillArguments, recipe.SFTConfig, recipe.ModelConfig


def _parse(classes: tuple, keys: dict, given: dict, argv: list[str] | None, keys_are: str,
           where: str = "train config") -> tuple:
    """`classes` filled by TRL's `TrlParser` from `keys` and TRL-style flags: a key no class has, a number TRL
    would take and fail on later, and anything its parser refuses are one line each. `given`: the keys the user
    set, whose bounds are checked before TRL's own checks could fail on them less clearly."""
    parser = _parser(classes, where)
    if unknown := parser.set_defaults_with_config(**keys):
        names = [u[2:] for u in unknown[::2]]
        known = [f.name for cls in classes for f in dataclasses.fields(cls)]
        hints = "".join(suggestion(n, known).replace("; did you mean", f"; {n}: did you mean") for n in names)
        _fail(f"unknown key(s) {', '.join(names)}{hints} (keys are {keys_are})", where)
    check_bounds(given, classes, where)
    try:
        parts = parser.parse_args_into_dataclasses(args=list(argv or []))
    except (ValueError, TypeError) as exc:
        _fail(str(exc).splitlines()[0], where)
    check_bounds({k: v for part in parts for k, v in vars(part).items() if k in BOUNDS}, classes, where)
    return tuple(parts)


def _parser(classes: tuple | None = None, where: str = "train config"):
    from trl import TrlParser

    parser = TrlParser(classes := classes or _sft_classes(), prog="distill.train")
    for name in (name for cls in classes for name in recipe.turned_off(cls)):
        parser.add_argument(f"--no_{name}", f"--no-{name.replace('_', '-')}", action="store_false", dest=name,
                            help=f"set {name} false")
    # argparse would print the whole usage of ~200 TRL options, then exit
    parser.error = functools.partial(_fail, where=where)
    return parser


@functools.cache
def _defaults(**dynamic) -> tuple:
    """TRL's own defaults on this machine, which `resolved_keys` leaves out: each of TRL's argument classes (not
    the recipe's) built from the machine's keys alone, as TRL's parser would build it from an empty command line,
    without parsing twice."""
    classes = DistillArguments, recipe.trl_class("SFTConfig"), recipe.trl_class("ModelConfig")
    return tuple(cls(**{k: v for k, v in dynamic.items() if k in {f.name for f in dataclasses.fields(cls) if f.init}})
                 for cls in classes)


# Settings of TRL's argument classes that TRL itself leaves unchecked, and the ranges where they make sense:
# (lowest, whether the lowest is allowed). A batch of 0 would end in a ZeroDivisionError, a negative rate in nonsense.
BOUNDS: dict[str, tuple[float, bool]] = {
    "per_device_train_batch_size": (1, True), "per_device_eval_batch_size": (1, True),
    "global_batch_size": (1, True), "num_processes": (1, True), "learning_rate": (0, False),
    "num_train_epochs": (0, False), "lora_r": (1, True), "lora_alpha": (0, False), "max_length": (1, True),
    "logging_steps": (0, False), "eval_steps": (0, False), "save_steps": (0, False), "weight_decay": (0, True),
    "max_grad_norm": (0, True), "dataloader_num_workers": (0, True), "warmup_steps": (0, True),
    "lora_dropout": (0, True),
}


def check_bounds(values: dict, classes: tuple | None = None, where: str = "train config") -> None:
    """One line naming the setting, for the numbers TRL would take and fail on later (or never)."""
    nullable = {f.name for cls in classes or _sft_classes() for f in dataclasses.fields(cls) if f.default is None}
    for name, value in values.items():
        if name not in BOUNDS or (value is None and name in nullable):
            continue
        shown = repr(value)
        if isinstance(value, str):  # TRL's parser reads numbers from text, "inf" and "nan" too; other text it refuses
            try:
                value = float(value)
            except ValueError:
                continue
        low, inclusive = BOUNDS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            _fail(f"{name}: expected a finite number, got {shown}", where)
        if value < low or (value == low and not inclusive):
            _fail(f"{name}: {shown} must be {'>=' if inclusive else '>'} {low:g}", where)
        if name == "lora_dropout" and value >= 1:
            _fail(f"{name}: {shown} must be < 1", where)


def _plain(value: Any) -> Any:
    """A parsed value as YAML can hold it (TRL's enums, its accelerator config object)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value):
        return _plain(dataclasses.asdict(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# Derived, not set: gradient_accumulation_steps from global_batch_size (refused as a key).
NOT_RECORDED = {"gradient_accumulation_steps"}


def resolved_keys(parts, defaults, named: set[str]) -> dict:
    """The parsed objects as the flat keys a config file takes: every key the config or distill's recipe named,
    and every other one whose value differs from TRL's default (so a flag in any spelling TRL accepts is
    recorded). Loading the result again gives the same objects."""
    out = {}
    for part, default in zip(parts, defaults):
        for f in dataclasses.fields(part):
            if not f.init or f.name in NOT_RECORDED:
                continue
            value, base = _plain(getattr(part, f.name)), _plain(getattr(default, f.name))
            if f.name in named or value != base:
                out[f.name] = value
    return out


def load_train_config(path: str | None, overrides: list[str] | None = None, argv: list[str] | None = None):
    """The YAML and its `--set` overrides through the one config loader, then TRL-style flags through TRL's
    own parser: every spelling it accepts (`--learning-rate`, `--no-resume`, an abbreviation) works."""
    if not path:
        raise DistillError("--config is required (e.g. configs/smollm2-135m_lora_cpu.yaml)")
    cfg = load_config(TrainConfig, path, overrides)
    return parse_train_config(cfg.data, argv) if argv else cfg


def world_size() -> int:
    """From the launcher's environment, on purpose before accelerate's state exists: `PartialState()` here would
    fix its backend and timeout before TrainingArguments could (`build_trainer` checks the two agree)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Rank 0 of the launch (or the only process), from the launcher's environment as `world_size`: the one
    process that takes a run folder's lock and writes the files beside the trainer's own."""
    return int(os.environ.get("RANK", "0")) == 0


def single_process_under_accelerate(env: Mapping[str, str]) -> bool:
    """Whether `accelerate launch` was asked for several CPU processes and started one: its `--cpu` flag and
    `distributed_type: MULTI_CPU` run the script once unless mpirun is set up, leaving only the rendezvous address
    it sets for more than one process (configs/accelerate/multi_cpu.yaml starts them under torchrun)."""
    launched_by_accelerate = "ACCELERATE_MIXED_PRECISION" in env and env.get("ACCELERATE_USE_CPU") == "True"
    ranks = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    return launched_by_accelerate and "MASTER_ADDR" in env and not any(k in env for k in ranks)


def gradient_accumulation_steps(global_batch_size: int, per_device: int, processes: int) -> int:
    per_step = per_device * processes
    if global_batch_size % per_step:
        raise DistillError(
            f"global_batch_size {global_batch_size} is not divisible by per_device_train_batch_size {per_device} "
            f"x {processes} process(es) = {per_step}; change one of them"
        )
    return global_batch_size // per_step


def without_secrets(data: dict) -> tuple[dict, dict]:
    """A flat train config split into what a file may hold (known secret values masked) and its secret keys
    (`hub_token`), which no file gets."""
    withheld = {k: v for k, v in data.items() if is_secret_name(k) and v}
    return masked_mapping({k: v for k, v in data.items() if k not in withheld}), withheld


def _require(module: str, why: str, package: str | None = None) -> None:
    if importlib.util.find_spec(module) is None:
        raise DistillError(f"{why} needs the package {module!r} (pip install {package or module})")


def varlen_attention_available(attn_implementation: str | None) -> bool:
    """Whether the model would run flash-attention's variable-length kernels (needs the package and a GPU)."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    usable = {None: is_flash_attn_2_available, "flash_attention_2": is_flash_attn_2_available,
              "flash_attention_3": is_flash_attn_3_available}
    return attn_implementation in usable and usable[attn_implementation]()


def choose_batching(cfg: TrainConfig) -> None:
    """Packed / padding-free batches only where the attention kernels keep examples apart (position_ids); SDPA and
    eager would attend across the examples of a packed row."""
    sft, model = cfg.sft, cfg.model
    if not (sft.packing or sft.padding_free):
        return
    if varlen_attention_available(model.attn_implementation):
        model.attn_implementation = model.attn_implementation or "flash_attention_2"
        return
    log.warning(
        "packing/padding_free need flash-attention's variable-length kernels (attn_implementation "
        "flash_attention_2 with flash-attn installed and a CUDA GPU); attn_implementation is %s here, so training "
        "runs on unpacked, padded batches (no attention across examples)", model.attn_implementation or "the default",
    )
    sft.packing = sft.padding_free = False


def model_init_kwargs(cfg: TrainConfig) -> dict:
    """TRL's sft.py's `from_pretrained` arguments, plus QLoRA's one copy per DDP rank."""
    import torch
    from accelerate import PartialState
    from trl import get_quantization_config

    kwargs = {"revision": cfg.model.model_revision, "dtype": cfg.model.dtype,
              "attn_implementation": cfg.model.attn_implementation}
    quantization = get_quantization_config(cfg.model)
    if quantization is not None:
        _require("bitsandbytes", "load_in_4bit / load_in_8bit (QLoRA)")
        if not torch.cuda.is_available():
            raise DistillError("load_in_4bit / load_in_8bit (QLoRA) needs a CUDA GPU")
        kwargs |= {"quantization_config": quantization, "device_map": {"": PartialState().local_process_index}}
    return kwargs | (cfg.sft.model_init_kwargs or {})


def load_splits(dataset_dir: str):
    """train and validation from `distill sft-data`; validation may be empty (then evaluation is off)."""
    from datasets import load_from_disk

    if not (Path(dataset_dir) / "dataset_dict.json").exists():
        raise DistillError(f"{dataset_dir}: not a dataset folder "
                           f"(run `distill sft-data KEPT.jsonl --out {dataset_dir}`)")
    data = load_from_disk(dataset_dir)
    if not data.get("train"):
        raise DistillError(f"{dataset_dir}: the train split is empty")
    for column in ("prompt", "completion"):
        if column not in data["train"].column_names:
            raise DistillError(f"{dataset_dir}: no {column!r} column; expected the prompt/completion form")

    for split in ("train", "validation"):
        if data.get(split):
            check_rows(data[split], f"{dataset_dir}/{split}")
    return data["train"], data.get("validation") or None


def check_prompt_lengths(splits: dict, tokenizer, max_length: int | None, dataset_dir: str) -> None:
    """Before the model loads: a prompt of max_length tokens or more leaves nothing of its completion to train
    on (TRL truncates from the end), and a run of them ends in an empty sampler after minutes of loading."""
    if not max_length:
        return
    for name, split in splits.items():
        too_long = []
        for i, prompt in enumerate(split["prompt"] if split is not None else []):
            if isinstance(prompt, list):
                ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            else:
                ids = tokenizer(str(prompt), add_special_tokens=False)["input_ids"]
            if len(ids) >= max_length:
                too_long.append((i, len(ids)))
        if too_long:
            row, tokens = too_long[0]
            raise DistillError(
                f"{dataset_dir}: {len(too_long)} {name} prompt(s) of max_length ({max_length}) tokens or more, "
                f"the first in row {row} with {tokens:,}: nothing of their completions would be trained on; "
                "leave them out or raise max_length")


def tracking_env(report_to: list[str], output_dir: str, env: Mapping[str, str]) -> dict[str, str]:
    """Where the trackers write, unless the user said: transformers' TensorBoard callback writes to `./runs/`
    of the working directory (beside distill's run folders, every run mixed in one) when TENSORBOARD_LOGGING_DIR
    is unset; here each training logs into its own `<output_dir>/tensorboard`."""
    if "tensorboard" in report_to and not env.get("TENSORBOARD_LOGGING_DIR"):
        return {"TENSORBOARD_LOGGING_DIR": str(Path(output_dir) / "tensorboard")}
    return {}


def progress_callback(lines: int = 20):
    """A TrainerCallback that logs `step i/n (p%), s/step, ETA, last loss` about `lines` times a run: off a
    terminal (a log file, a pipeline's stage log, a batch job) transformers' tqdm bar is off, and hours of
    training would print nothing between evaluations."""
    from transformers import TrainerCallback

    class ProgressLog(TrainerCallback):
        def __init__(self):
            self.started: tuple[float, int] | None = None
            self.loss: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.started = (time.monotonic(), state.global_step)  # a resumed run counts from its checkpoint

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.loss = logs["loss"]

        def on_step_end(self, args, state, control, **kwargs):
            total, step = state.max_steps, state.global_step
            every = max(1, total // lines)
            if not state.is_world_process_zero or (step % every and step != total) or self.started is None:
                return
            t0, first = self.started
            per_step = (time.monotonic() - t0) / max(step - first, 1)
            eta = per_step * (total - step)
            loss = f", last logged loss {self.loss:.4f}" if self.loss is not None else ""
            log.info("step %d/%d (%d%%), %.2f s/step, ETA %s%s", step, total, 100 * step // max(total, 1),
                     per_step, _duration(eta), loss)

    return ProgressLog()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def build_trainer(cfg: TrainConfig | GRPORun, callbacks: list | None = None, resuming: bool = False):
    """The SFTTrainer (or GRPOTrainer) exactly as training uses it (tests take their batches from it)."""
    from transformers import AutoTokenizer

    if isinstance(cfg, GRPORun):
        return grpo_trainer(cfg, callbacks)

    recipe.import_trl()
    from trl import SFTTrainer, get_peft_config

    args = cfg.sft
    require_trackers(args.report_to)
    os.environ.update(tracking_env(args.report_to, args.output_dir, os.environ))
    if args.use_liger_kernel:
        _require("liger_kernel", "use_liger_kernel", "liger-kernel")
    path = resolve_model_path(cfg.model.model_name_or_path)
    train, val = load_splits(cfg.distill.dataset_dir)
    if args.world_size != world_size():
        raise DistillError(f"WORLD_SIZE says {world_size()} process(es) but accelerate runs {args.world_size}")
    if val is None or args.eval_strategy == "no":  # transformers still evaluates at step 0 under "no"
        args.eval_strategy, args.eval_on_start = "no", False
    if resuming:
        args.eval_on_start = False  # its step-0 result is already in the restored log history
    choose_batching(cfg)
    args.model_init_kwargs = model_init_kwargs(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise DistillError(f"{cfg.model.model_name_or_path}: the tokenizer has no chat template; the planner prompt "
                           "is a chat")
    check_prompt_lengths({"train": train, "validation": val}, tokenizer, args.max_length, cfg.distill.dataset_dir)

    if not cfg.distill.init_adapter and (warning := small_training_set(len(train))):  # improve's rounds are small
        log.warning("%s: %s", cfg.distill.dataset_dir, warning)
    log.info(
        "effective batch %d = per-device %d x accumulation %d x %d process(es); %d train / %d validation examples",
        cfg.distill.global_batch_size, args.per_device_train_batch_size, args.gradient_accumulation_steps,
        args.world_size, len(train), len(val) if val is not None else 0,
    )
    try:
        model, peft_config = path, get_peft_config(cfg.model)
        if cfg.distill.init_adapter and not resuming:  # a resumed run's checkpoint already holds the adapter
            model, peft_config = continued_adapter(cfg, path), None
        if args.disable_tqdm:  # off a terminal: a progress line in the log instead of an invisible bar
            callbacks = [*(callbacks or []), progress_callback()]
        return SFTTrainer(
            model=model, args=args, train_dataset=train, eval_dataset=val, processing_class=tokenizer,
            peft_config=peft_config, callbacks=callbacks,
        )
    except OSError as exc:
        raise DistillError(f"cannot load model {cfg.model.model_name_or_path!r}: {str(exc).splitlines()[0]}") from None


def grpo_trainer(run: GRPORun, callbacks: list | None = None):
    from transformers import AutoTokenizer

    recipe.import_trl()
    from trl import GRPOTrainer

    path = resolve_model_path(run.model_name_or_path)
    return GRPOTrainer(model=trainable_adapter(path, run.init_adapter), reward_funcs=run.reward_funcs, args=run.args,
                       train_dataset=run.train_dataset, processing_class=AutoTokenizer.from_pretrained(path),
                       callbacks=callbacks)


def trainable_adapter(path: str, adapter: str | Path, model_init_kwargs: dict | None = None):
    """The base model at `path` (loaded as TRL loads it) with `adapter`'s LoRA weights, trainable: expert
    iteration and GRPO continue the SFT student, they do not start a new adapter."""
    from peft import PeftModel
    from trl.trainer.utils import create_model_from_path

    folder = Path(adapter)
    if not (folder / "adapter_config.json").is_file():
        raise DistillError(f"init_adapter {folder}: no adapter_config.json "
                           "(a LoRA adapter folder, e.g. train's output)")
    base = create_model_from_path(path, **(model_init_kwargs or {}))
    return PeftModel.from_pretrained(base, str(folder), is_trainable=True)


def continued_adapter(cfg: TrainConfig, path: str):
    """`init_adapter` on the base, trainable; its rank and targets are the adapter's own, as recorded."""
    model = trainable_adapter(path, cfg.distill.init_adapter, cfg.sft.model_init_kwargs)
    cfg.sft.model_init_kwargs = None  # used here; TRL warns about them beside a loaded model
    lora = model.peft_config["default"]
    cfg.model.lora_r, cfg.model.lora_alpha = lora.r, lora.lora_alpha
    cfg.model.lora_target_modules = sorted(lora.target_modules) if lora.target_modules else None
    return model


def write_outputs(trainer, cfg: TrainConfig | GRPORun, started: float) -> dict:
    """save_model on every rank (ZeRO-3 gathers there) writes the adapter, tokenizer and chat_template.jinja;
    the small files only on the main process. loss_history.json: train and eval loss per optimiser step, from
    the log history that resumes keep. A GRPO run's records are its caller's (the reward is), so it gets the
    log history to write them from."""
    if isinstance(cfg, GRPORun):
        trainer.save_model(str(Path(cfg.args.output_dir) / layout.ADAPTER))
        return {"global_step": trainer.state.global_step, "log_history": trainer.state.log_history,
                "main_process": trainer.is_world_process_zero()}

    # staged, then renamed over the old adapter: a full disk mid-save keeps the last adapter whole and names the
    # file that failed (every rank stages; only the main process writes files, ZeRO-3 gathers on all of them)
    with replace_files(cfg.sft.output_dir) as staging:
        trainer.save_model(str(staging))
    if not trainer.is_world_process_zero():
        return {}
    out, args, model, logs = Path(cfg.sft.output_dir), trainer.args, cfg.model, trainer.state.log_history
    derived = {
        "world_size": args.world_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "effective_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
    }
    recorded, withheld = without_secrets(cfg.resolved)
    header = "# the config of this run, as parsed (loadable again)\n" + "".join(
        [f"# {k}: {v}\n" for k, v in derived.items()] + [f"# {k}: not recorded (a secret)\n" for k in withheld])
    (out / "train_config.yaml").write_text(header + yaml.safe_dump(recorded, sort_keys=False))
    history = {
        "train": [{k: e[k] for k in ("step", "epoch", "loss", "learning_rate", "grad_norm") if k in e}
                  for e in logs if "loss" in e],
        "eval": [{k: e[k] for k in ("step", "epoch", "eval_loss") if k in e} for e in logs if "eval_loss" in e],
        "summary": next((e for e in reversed(logs) if "train_runtime" in e), {}),
    }
    write_json(out / layout.LOSS_HISTORY, history)
    info = {
        "format_version": 1, "base_model": model.model_name_or_path,
        "base_model_path": resolve_model_path(model.model_name_or_path),
        "lora_r": model.lora_r, "lora_alpha": model.lora_alpha, "lora_target_modules": model.lora_target_modules,
        "max_length": args.max_length, "chat_template": "chat_template.jinja", "dataset_dir": cfg.distill.dataset_dir,
        "global_step": trainer.state.global_step,
        "final_train_loss": history["train"][-1]["loss"] if history["train"] else None,
        "final_eval_loss": history["eval"][-1]["eval_loss"] if history["eval"] else None,
        "wall_s": round(time.time() - started, 1), **derived,
    } | trained_on(cfg.distill.dataset_dir, len(trainer.train_dataset),
                   len(trainer.eval_dataset) if trainer.eval_dataset is not None else 0)
    write_json(out / ADAPTER_INFO, info)

    if problem := model_card_problem(out):
        log.warning("no model card written: %s", problem)
    else:
        write_model_card(out)  # in place of TRL's card, which names no loadable base and ignores the planner prompt
    return info


def trained_on(dataset_dir: str, train_examples: int, validation_examples: int) -> dict:
    """What the adapter learnt from, copied from its SFT data's summary.json into distill_adapter.json: the
    dataset folder is named by a path that means nothing once the adapter is moved or pushed, and push, serve,
    improve, eval and the report must know the prompt and tools it was trained on without it. The counts are
    the rows training read."""
    summary = read_json(Path(dataset_dir) / layout.SUMMARY, optional=True) or {}
    splits = summary.get("splits") if isinstance(summary.get("splits"), dict) else {}
    tools = summary.get("tool_descriptions") or summary.get("tools")
    if not summary:
        log.warning("%s has no summary.json (not written by `distill sft-data`): the adapter will not record the "
                    "prompt and tools it is trained on, and push will refuse to write its card", dataset_dir)
    return {
        "format_version": 2, "student_prompt": summary.get("student_prompt"), "tools": tools,
        "train_examples": train_examples, "train_questions": (splits.get("train") or {}).get("questions"),
        "validation_examples": validation_examples,
        "teacher": summary.get("teacher"), "datasets": summary.get("datasets"),
        "sft_data": ({k: summary.get(k) for k in ("source", "val_fraction", "seed", "code_version")}
                     if summary else None),
        "code_version": code_version(),
    }


def last_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint a run can resume from: a kill while the trainer saved one leaves its folder without
    trainer_state.json (written last, after the weights, optimizer and RNG states) or with that file cut short,
    and resuming from it would fail where the one before it works."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    steps = sorted((int(p.name.rpartition("-")[2]), p) for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
                   if p.is_dir() and p.name.rpartition("-")[2].isdigit())
    for _, path in reversed(steps):
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            log.warning("%s is incomplete (the run stopped while saving it): not resumed from", path)
            continue
        return str(path)
    return None


def train(cfg: TrainConfig | GRPORun, callbacks: list | None = None) -> dict:
    """SFT or GRPO, one way: build the trainer, resume from the last complete checkpoint in output_dir, train,
    write."""
    started = time.time()
    if single_process_under_accelerate(os.environ):
        log.warning("accelerate launch started 1 process: its --cpu flag and distributed_type MULTI_CPU start one "
                    "unless mpirun is set up; for several CPU processes use --config_file "
                    "configs/accelerate/multi_cpu.yaml. Training runs as 1 process, at the same effective batch.")
    resume = last_checkpoint(cfg.output_dir) if cfg.resume else None
    if resume:
        log.info("resuming from %s", resume)
    trainer = build_trainer(cfg, callbacks, resuming=resume is not None)
    trainer.train(resume_from_checkpoint=resume)
    state = trainer.state
    last_eval = max((e["step"] for e in state.log_history if "eval_loss" in e), default=None)
    evaluating = trainer.eval_dataset is not None and trainer.args.eval_strategy != "no"
    if state.global_step >= state.max_steps and evaluating and last_eval != state.global_step:
        trainer.evaluate()  # e.g. eval_strategy epoch with max_steps ending mid-epoch: the curve still gets its end
    info = write_outputs(trainer, cfg, started)
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) >= Version("5.18.0"):
        trainer.end()  # as TRL's sft.py: finish the trackers and destroy the process group, after the last save
    return info


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)
    parser.add_argument("--trl-help", action="store_true",
                        help="print every option of TRL's SFTConfig and ModelConfig (a config key or a flag), with "
                             "distill's recipe as their defaults, and exit")


def main(args: argparse.Namespace, rest: list[str] | None = None) -> int:
    if args.trl_help:
        print(_parser().format_help())
        return 0
    cfg = load_train_config(args.config, args.set, rest)
    info = train(cfg)
    if info:
        print(json.dumps({k: info[k] for k in ("global_step", "final_train_loss", "final_eval_loss", "wall_s")}))
        print(f"adapter written to {cfg.sft.output_dir}")
    return 0


def launcher_main(argv: list[str] | None = None) -> int:
    """Entry of `accelerate launch -m distill.train` and scripts/train.py: flags other than --config/--set are
    TRL's own (`--learning_rate 2e-4`). Errors are one line, like the CLI's."""
    # no abbreviations of --config/--set here, so that every abbreviated flag reaches TRL's parser
    parser = argparse.ArgumentParser(prog="distill.train", description="LoRA SFT of the student planner",
                                     allow_abbrev=False)
    configure_parser(parser)
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.addFilter(mask_log_record)
        handler.setFormatter(MaskingFormatter("%(levelname)s %(name)s: %(message)s"))
    try:
        if "--check" in rest:  # it knows the launch command, which is distill.training.launch's, so the CLI owns it
            raise DistillError("run --check as `distill train --check --config ...`: a check launches nothing")
        return main(args, rest)
    except DistillError as exc:
        print(f"error: {mask(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(launcher_main())
