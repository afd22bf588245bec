"""distill report EVAL_DIR [--out DIR]

The report stage: results.json, report.md and the plots, recomputed from `EVAL_DIR/records/*.jsonl` (and
the bookkeeping in `EVAL_DIR/manifest.json`) without any model. Rerun it at any time, e.g. while an
evaluation is still resuming, or with `--out` to put the report elsewhere.
"""

from __future__ import annotations

import argparse


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("eval_dir", metavar="EVAL_DIR", help="an evaluation's output_dir (holds records/)")
    parser.add_argument("--out", help="folder for report.md, results.json and the plots (default: EVAL_DIR)")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from distill.report import summary_lines, write_report

    results = write_report(args.eval_dir, args.out)
    out = Path(args.out or args.eval_dir)
    print("\n".join(summary_lines(results)))
    print(f"report: {out / 'report.md'}")
    print(f"results: {out / 'results.json'}")
    return 0
