"""distill eval --config configs/eval_smollm2_cpu.yaml [--set key=value] [--report-only]

Runs every configured Planner (ReWOO) and baseline (ReAct, Direct) on the same questions with the same
Solver and tools, one resumable record file per method, then writes results.json, report.md and the plots.
Rerun the same command to resume; --report-only rebuilds the report from the records without any model.
"""

from __future__ import annotations

import argparse

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)
    parser.add_argument(
        "--report-only", action="store_true", help="recompute the report from <output_dir>/records; run no model"
    )


def summary_lines(results: dict) -> list[str]:
    """One line per method: the headline numbers, so a terminal run shows the outcome at a glance."""
    lines = []
    for name in results["methods"]:
        pm = results["per_method"][name]
        em = pm["em"]["mean"] if pm["em"] else float("nan")
        f1 = pm["f1"]["mean"] if pm["f1"] else float("nan")
        lines.append(
            f"{name:<16} {pm['kind']:<7} n={pm['n']:<5} EM {em:.3f}  F1 {f1:.3f}  "
            f"tokens/q {pm['tokens_mean']['total']:.0f}  LLM calls/q {pm['llm_calls_mean']:.2f}  "
            f"${pm['cost_per_question_usd']:.5f}/q  p50 {pm['latency_s']['p50']:.2f}s"
        )
    return lines


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from distill.config import load_config
    from distill.errors import DistillError
    from distill.evaluate import EvalConfig, evaluate
    from distill.report import write_report

    if not args.config:
        raise DistillError("--config is required (e.g. configs/eval_smollm2_cpu.yaml)")
    cfg = load_config(EvalConfig, args.config, args.set)
    results = write_report(cfg.output_dir) if args.report_only else evaluate(cfg, args.config)
    out = Path(cfg.output_dir)
    print("\n".join(summary_lines(results)))
    print(f"report: {out / 'report.md'}")
    print(f"results: {out / 'results.json'}")
    return 0
