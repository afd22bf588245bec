"""`distill train --config configs/smollm2-135m_lora_cpu.yaml [--set key=value ...]`: LoRA SFT in this process
(any SFTConfig / ModelConfig key can be set).

The same code as `accelerate launch -m distill.train --config ...`, which is the way to use several GPUs (or
DeepSpeed / FSDP): see docs/TRAINING.md and configs/accelerate/.
"""

from __future__ import annotations

import argparse


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from distill.config import add_config_args

    add_config_args(parser, default=None)


def main(args: argparse.Namespace) -> int:
    from distill.train import run

    return run(args)
