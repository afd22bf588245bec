"""distill eval --config configs/eval_smollm2_cpu.yaml [--set key=value]

Runs every configured Planner (ReWOO) and baseline (ReAct, Direct) on the same questions with the same
Solver and tools, one resumable record file per method under `<output_dir>/records/`. Rerun the same command
to resume; `distill report <output_dir>` then writes results.json, report.md and the plots from the records.
"""

from __future__ import annotations

import argparse

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from distill.config import load_config
    from distill.errors import DistillError
    from distill.evaluate import RECORDS_DIR, EvalConfig, evaluate

    if not args.config:
        raise DistillError("--config is required (e.g. configs/eval_smollm2_cpu.yaml)")
    cfg = load_config(EvalConfig, args.config, args.set)
    manifest = evaluate(cfg, args.config)
    for name, run in manifest["runs"].items():
        print(f"{name:<16} {run['records']} records")
    print(f"records: {Path(cfg.output_dir) / RECORDS_DIR}")
    print(f"next: distill report {cfg.output_dir}")
    return 0
