"""`distill sft-data KEPT.jsonl --out DIR`: kept trajectories -> the student's SFT dataset.

    distill sft-data runs/x/kept.jsonl --out runs/x/sft --tools Wikipedia,LLM,Calculator --val-fraction 0.1

Writes a HF DatasetDict (train/validation, conversational prompt/completion) with `save_to_disk`, plus
`preview.jsonl` and `summary.json`, and prints counts and token lengths. `--tools` must be the tools the
student will be served with: they are listed in its prompt.
"""

from __future__ import annotations

import argparse


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kept", metavar="KEPT.jsonl", help="kept trajectory records (output of `distill filter`)")
    parser.add_argument("--out", required=True, help="dataset folder to write")
    parser.add_argument(
        "--tools", default="Wikipedia,LLM,Calculator", help="comma-separated tools of the student prompt"
    )
    parser.add_argument("--val-fraction", type=float, default=0.1, help="share of questions held out for validation")
    parser.add_argument("--seed", type=int, default=0, help="seed of the question split")
    parser.add_argument(
        "--tokenizer", default="smollm2-135m-instruct", help="tokenizer for the length summary ('none' to skip)"
    )


def main(args: argparse.Namespace) -> int:
    from distill.sft_data import build_sft_data, format_summary

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    summary = build_sft_data(
        args.kept, args.out, tools=tools, val_fraction=args.val_fraction, seed=args.seed, tokenizer=args.tokenizer
    )
    print(format_summary(summary))
    print(f"wrote {args.out} (save_to_disk), {args.out}/preview.jsonl, {args.out}/summary.json")
    return 0
