"""`distill sft-data KEPT.jsonl --out DIR`: kept trajectories -> the student's SFT dataset.

    distill sft-data runs/x/kept.jsonl --out runs/x/sft --tools Wikipedia,LLM,Calculator --val-fraction 0.1

Writes a HF DatasetDict (train/validation, conversational prompt/completion) with `save_to_disk`, plus
`preview.jsonl` and `summary.json`, and prints counts and token lengths. `--tools` must be the tools the
student will be served with: they are listed in its prompt. Settings are `SftDataConfig`'s fields; the
flags override `--config`, which `--set` overrides in turn.
"""

from __future__ import annotations

import argparse

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kept", metavar="KEPT.jsonl", help="kept trajectory records (output of `distill filter`)")
    parser.add_argument("--out", required=True, help="dataset folder to write")
    parser.add_argument(
        "--tools", help="comma-separated tools of the student prompt (default Wikipedia,LLM,Calculator)"
    )
    parser.add_argument("--val-fraction", type=float, help="share of questions held out for validation (default 0.1)")
    parser.add_argument("--seed", type=int, help="seed of the question split (default 0)")
    parser.add_argument("--tokenizer", help="tokenizer for the length summary ('none' to skip)")
    add_config_args(parser)


def main(args: argparse.Namespace) -> int:
    from distill.config import parse_overrides, read_yaml, validate
    from distill.sft_data import SftDataConfig, build_sft_data, format_summary

    flags = {"kept": args.kept, "out": args.out, "tools": args.tools, "val_fraction": args.val_fraction,
             "seed": args.seed, "tokenizer": args.tokenizer}
    data = (read_yaml(args.config) if args.config else {}) | {k: v for k, v in flags.items() if v is not None}
    cfg = validate(SftDataConfig, data | parse_overrides(args.set), args.config or "sft-data")
    summary = build_sft_data(cfg)
    print(format_summary(summary))
    print(f"wrote {cfg.out} (save_to_disk), {cfg.out}/preview.jsonl, {cfg.out}/summary.json")
    return 0
