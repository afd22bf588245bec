"""distill filter TRAJECTORIES.jsonl --out KEPT.jsonl [--config configs/filter.yaml] [--set key=value]

Keeps valid, fully executed, correct trajectories (best sample per question) and prints a report of what
was kept and why the rest was dropped, by dataset and by number of steps.
"""

from __future__ import annotations

import argparse

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trajectories", help="trajectory JSONL written by `distill generate`")
    parser.add_argument("--out", required=True, help="kept records (JSONL); the report goes beside it")
    add_config_args(parser)


def main(args: argparse.Namespace) -> int:
    from distill.config import load_config
    from distill.filter import FilterConfig, format_report, run_filter

    cfg = load_config(FilterConfig, args.config, args.set)
    report = run_filter(args.trajectories, args.out, cfg)
    print(format_report(report))
    print(f"kept: {args.out}")
    return 0
