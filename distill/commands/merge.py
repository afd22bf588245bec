"""`distill merge ADAPTER --out DIR`: fold a LoRA adapter into full weights (for servers without LoRA support,
or to quantise the student). The base model is the one the adapter was trained on unless --base says otherwise.
"""

from __future__ import annotations

import argparse


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("adapter", help="adapter folder written by `distill train` (adapter_config.json)")
    parser.add_argument("--out", required=True, help="folder for the merged model")
    parser.add_argument("--base", default=None, help="base model (HF id, folder or embedded alias) to merge into")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def main(args: argparse.Namespace) -> int:
    from distill.merge import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    print(f"merged model written to {out}")
    return 0
