"""Starting training, beside `distill.train` rather than in it: which config fits the visible GPUs, the command
that runs training (one process per GPU under `accelerate launch`, or one plain process on CPU), the pipeline's
train stage in child processes, and `distill train`'s own entry, whose `--check` says what a launch would run and
fail on before anything loads.

    distill train --config configs/smollm2-135m_lora_cpu.yaml [--check]    # trains in this process (train.main)

train.py keeps the shape of TRL's `trl/scripts/sft.py`; this module imports it, never the reverse.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Mapping

import yaml

from distill import train
from distill.core import layout, stage
from distill.core.check import Check, add_check_args, gpu_count, show_config, wants_check
from distill.core.config import _merge, read_yaml
from distill.core.errors import DistillError
from distill.core.run import settings_of
from distill.core.store import content_digest, read_json
from distill.core.tracking import PACKAGES
from distill.reporting.verdict import small_training_set
from distill.train import TrainConfig, load_train_config, parse_train_section, without_secrets
from distill.training import recipe
from distill.training.merge import ADAPTER_INFO

AUTO = "auto"  # `train: {config: auto}` in a pipeline: the training config for the visible GPUs (GPU_CONFIGS)
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ACCELERATE_CONFIGS = CONFIGS / "accelerate"
# `train.config: auto` in `distill pipeline`: the 7B student's training config for the memory of the smallest
# visible GPU (GiB as the device reports it: a "24 GB" card reports 22-24, a "40 GB" 39-40, an "80 GB" 79-80), the
# largest first. The table "Which training config for which GPU" in docs/gpu-recipe.md is this one, in words.
GPU_CONFIGS: tuple[tuple[int, str, str], ...] = (
    (70, "qwen2.5-7b_lora_80gb.yaml", "80 GB class: no checkpointing, Liger, padding-free"),
    (36, "qwen2.5-7b_lora_gpu.yaml", "40-48 GB class: bf16 LoRA with checkpointing"),
    (20, "qwen2.5-7b_qlora_gpu.yaml", "24 GB class: 4-bit QLoRA"),
)


def config_for_gpus(memory: list[int]) -> tuple[Path, str]:
    """The training config `train.config: auto` picks for GPUs of these total memories (bytes), and why, in words.
    Training runs on every visible GPU at the same per-device batch, so the smallest decides. Without a GPU there is
    no 7B config to pick: the CPU config trains another model (SmolLM2-135M), which the rest of a 7B pipeline
    (its tokenizer, its student server) does not serve, so that is one line asking for a named config."""
    if not memory:
        raise DistillError("train.config: auto picks a 7B training config by the GPUs' memory, but no GPU is visible "
                           "(torch.cuda.device_count() = 0); name a config instead (on a CPU: "
                           "configs/smollm2-135m_lora_cpu.yaml, with a 135M student throughout)")
    gib = min(memory) / 2**30
    which = f"{'the' if len(memory) == 1 else f'the smallest of {len(memory)}'} visible GPU{'s' * (len(memory) > 1)}"
    for floor, name, kind in GPU_CONFIGS:
        if gib >= floor:
            return CONFIGS / name, f"{which} has {gib:.1f} GiB: {kind}, for {floor} GiB and up"
    floor, name, _ = GPU_CONFIGS[-1]
    raise DistillError(f"train.config: auto: {which} has {gib:.1f} GiB, below the {floor} GiB the smallest 7B "
                       f"config (configs/{name}) is sized for; name a config that fits it")


def launch_command(config_path: str | Path, cfg: TrainConfig, gpus: int) -> list[str]:
    """How `distill pipeline` starts training: one process per GPU under `accelerate launch` (settable with
    num_processes), or one plain process on CPU."""
    processes = cfg.distill.num_processes or max(gpus, 1)
    train = ["-m", "distill.train", "--config", str(config_path)]
    if gpus == 0:
        if processes != 1:
            raise DistillError(f"num_processes {processes}: no GPU is visible, training runs as one CPU process")
        return [sys.executable, *train]
    if processes > gpus:
        raise DistillError(f"num_processes {processes} but only {gpus} GPU(s) are visible")
    cfg.accumulation(processes)  # indivisible batches fail here, before the launch
    default = "single_gpu.yaml" if processes == 1 else "multi_gpu.yaml"
    accelerate = cfg.distill.accelerate_config or str(ACCELERATE_CONFIGS / default)
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate,
            "--num_processes", str(processes), *train]


def launch(cfg: TrainConfig, gpus: int | None = None) -> dict:
    """The pipeline's (and improve's) train stage: the parsed config as a config file, trained in child
    process(es), which parse that file once more (a process boundary). The child prints its own one-line error, so
    a failure here only names the stage."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "stage_config.yaml"
    written, _ = without_secrets(cfg.data)  # parsing put a hub_token in the environment the child inherits
    config.write_text("# written by `distill pipeline` from its train section\n"
                      + yaml.safe_dump(written, sort_keys=False))
    if gpus is None:
        from torch.cuda import device_count

        gpus = device_count()
    cmd = launch_command(config, cfg, gpus)
    print(f"[pipeline] {shlex.join(cmd)}", flush=True)
    if run_child(cmd) != 0:
        raise DistillError(f"training failed ({shlex.join(cmd[1:4])}...); its error is printed above")
    return json.loads((out / ADAPTER_INFO).read_text())


def run_child(cmd: list[str]) -> int:
    """Run `cmd`, passing on a SIGTERM sent to this process (`kill`, a scheduler's stop), then stopping as that
    signal would have. Ctrl-C reaches the whole process group by itself; a SIGTERM reaches only its target, and
    without this the trainer would run on, orphaned, holding the GPUs and the output folder."""
    proc = subprocess.Popen(cmd)
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        return proc.wait()
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if received:
        signal.raise_signal(received[0])
    return code


def check_run(cfg: TrainConfig, check, config_path: str | Path, where: str = "train") -> None:
    """`train --check`: the parsed config, the command a pipeline would launch, and what training would fail on
    after loading the model: its data, its trackers (`report_to`), GPUs for a config sized for them, the disk."""
    show_config(f"{where}: resolved config", without_secrets(cfg.resolved)[0])
    gpus = gpu_count()
    try:
        print(f"{where} would run: {shlex.join(launch_command(config_path, cfg, gpus))}")
    except DistillError as exc:
        check.problem(f"{where}: {exc}")
    check.report_to(cfg.sft.report_to, where)
    wants = next((f"{where}.{k}: true" for k in ("bf16", "fp16", "load_in_4bit", "load_in_8bit")
                  if getattr(cfg.sft, k, None) or getattr(cfg.model, k, None)), None)
    check.gpus(where, wants, gpus, "training")
    summary = Path(cfg.distill.dataset_dir) / layout.SUMMARY
    if not (Path(cfg.distill.dataset_dir) / "dataset_dict.json").is_file():
        check.problem(f"{where}.dataset_dir: {cfg.distill.dataset_dir} is not a dataset folder "
                      "(run `distill sft-data`)")
    elif not summary.is_file():
        check.problem(f"{where}.dataset_dir: {summary} is missing: the adapter could not record the prompt and tools "
                      "it is trained on (make the data with `distill sft-data`)")
    else:
        
        splits = (read_json(summary, optional=True) or {}).get("splits") or {}
        examples = (splits.get("train") or {}).get("examples")
        if isinstance(examples, int) and (warning := small_training_set(examples)):
            print(f"{where}: WARNING: {warning}")
    if cfg.sft.use_liger_kernel and importlib.util.find_spec("liger_kernel") is None:
        check.problem(f"{where}.use_liger_kernel: liger_kernel is not installed (pip install liger-kernel)")
    check.disk(cfg.sft.output_dir)


# ------------------------------------------------------------------------------------------ in the pipeline
# Files in a student's sft-data folder that are not its training data: the marker, and the cache files `datasets`
# writes beside the data when training maps over it (a rerun must not take them for new data).
SFT_DATA_NOT_INPUT = (layout.DONE, "cache-*.arrow", "tmp*")


def shared_section(p) -> dict:
    """The pipeline's train section; with `config: auto`, over the config for this machine's GPUs, chosen once and
    said in one line. The choice is part of the section, so training on other GPUs that pick another config
    retrains, as a changed key would."""
    if "train" not in p.memo:
        section = p.cfg.train
        if section.get(stage.STAGE_CONFIG) == AUTO:
            path, why = config_for_gpus(p.gpu_memory())
            shown = os.path.relpath(path)
            shown = shown if not shown.startswith("..") else str(path)
            print(f"[pipeline] train.config auto: {shown} ({why})", flush=True)
            section = _merge(read_yaml(str(path)), {k: v for k, v in section.items() if k != stage.STAGE_CONFIG})
        p.memo["train"] = section
    return p.memo["train"]


def trackers(p) -> dict:
    """Generation and evaluation report their progress where training reports (`train.report_to`) unless
    their own section says otherwise: one tracker for the whole run."""
    try:
        section = shared_section(p)
    except DistillError:  # `auto` with no GPU to pick for: the train section's own check says so
        section = p.cfg.train
    report_to = section.get("report_to", [])
    named = [report_to] if isinstance(report_to, str) else list(report_to)
    return {"report_to": [r for r in named if r in PACKAGES]}


def _resolve(p, url: str | None, name: str) -> TrainConfig:
    """A student's TrainConfig (its own `train:` keys over the shared ones, with its folders), parsed once by
    distill.train's own (TRL) parser and then handed on as that object: to its fingerprint, its check and its
    launch. A compact-prompt student's steps are ~3x cheaper and it must learn the format the full prompt
    spells out, so it may take more of them in the same time."""
    if (layout.TRAIN, name) in p.memo:
        return p.memo[layout.TRAIN, name]
    own = p.students()[name].get("train") or {}
    if not isinstance(own, Mapping):
        raise DistillError(f"students.{name}.train: expected train config keys")
    data = shared_section(p) | own | {"dataset_dir": str(layout.sft_data(p.run, name)),
                                   "output_dir": str(layout.adapter(p.run, name))}
    try:
        cfg = parse_train_section(data, "train (pipeline)")
    except DistillError as exc:  # TRL's parser names no section: say which student's keys were read
        raise DistillError(f"students.{name}.train over train: {exc}" if own else str(exc)) from None
    p.memo[layout.TRAIN, name] = cfg
    return cfg


def _show(p, c, name: str) -> None:
    """A student's train section and the launch command `launch` would run, its report_to integrations and its
    GPUs."""
    cfg = _resolve(p, None, name)
    show_config(f"train {name}: resolved section", cfg.data)
    where = "train" if p.cfg.students is None else f"students.{name}.train over train"
    c.world.report_to(cfg.sft.report_to or [], where)
    if c.gpus is None:
        return
    try:
        cmd = launch_command(layout.adapter(p.run, name) / "stage_config.yaml", cfg, c.gpus)
        print(f"train {name} would run: {shlex.join(cmd)}")
    except DistillError as exc:
        c.world.problem(f"{where}: {exc}")
    wants = next((f"{where}.{k}: true" for k in ("bf16", "fp16") if getattr(cfg.sft, k)), None)
    c.world.gpus(f"train {name}", wants, c.gpus, "training")


def _unit(p, name: str) -> stage.Unit:
    settings = settings_of(recipe.SFT | {k: v for k, v in _resolve(p, None, name).data.items() if k != "dataset_dir"})
    data = layout.sft_data(p.run, name)
    return stage.Unit(layout.TRAIN, layout.adapter(p.run, name), settings,
                      {layout.in_run(p.run, data): content_digest(data, skip=SFT_DATA_NOT_INPUT)}, name)


def _work(p, name: str) -> dict:
    # accelerate launch with one process per visible GPU (one plain process on CPU), from the parsed config
    info = p.entry("train")(_resolve(p, None, name))
    return {k: info.get(k) for k in ("global_step", "final_train_loss", "final_eval_loss", "wall_s")}


STAGE = stage.Stage(layout.TRAIN, TrainConfig, resolve=_resolve, show=_show, unit=_unit, work=_work,
                    after=(layout.SFT_DATA,), per_student=True)


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    train.configure_parser(parser)
    add_check_args(parser)


def main(args: argparse.Namespace) -> int:
    """`distill train`: `--check` here, where the launch command is known; training in this process."""
    if not wants_check(args):
        return train.main(args)
    cfg = load_train_config(args.config, args.set)
    check = Check(args.offline)
    check_run(cfg, check, args.config)
    return check.finish()


if __name__ == "__main__":  # `python -m distill.training.launch` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
