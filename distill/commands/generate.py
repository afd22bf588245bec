"""distill generate --config configs/generate_teacher.yaml [--set key=value]

Records teacher trajectories; rerun the same command to resume after a crash or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)


def main(args: argparse.Namespace) -> int:
    from distill.config import load_config
    from distill.errors import DistillError
    from distill.generate import GenerateConfig, generate

    if not args.config:
        raise DistillError("--config is required (e.g. configs/generate_teacher.yaml)")
    cfg = load_config(GenerateConfig, args.config, args.set)
    summary = generate(cfg, args.config)
    print(json.dumps(summary, indent=2))
    print(f"trajectories: {cfg.output_dir}/trajectories.jsonl")
    return 0
