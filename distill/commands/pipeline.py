"""distill pipeline --config configs/demo_smollm2_cpu.yaml [--from STAGE] [--set key=value]

Runs generate -> filter -> sft-data -> train -> eval -> report in one run folder; rerun to resume.
"""

from __future__ import annotations

import argparse

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)
    parser.add_argument("--from", dest="start", metavar="STAGE",
                        help="rerun from this stage (generate, filter, sft-data, train, eval, report)")


def main(args: argparse.Namespace) -> int:
    from distill.config import load_config
    from distill.errors import DistillError
    from distill.pipeline import Pipeline, PipelineConfig

    if not args.config:
        raise DistillError("--config is required (e.g. configs/demo_smollm2_cpu.yaml)")
    cfg = load_config(PipelineConfig, args.config, args.set)
    Pipeline(cfg, args.config).run_all(args.start)
    return 0
