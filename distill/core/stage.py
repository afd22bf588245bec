"""The one shape of a config-driven stage command (`distill generate`, `eval`, `improve`): a YAML config in,
`--set` overrides, `--check` to see what a run would read, launch and cost before paying for it, `--fresh` to set
aside what other settings made. Each of those modules declares a `Stage`, and its `configure_parser` and `main`
come from here, so the commands cannot drift apart in their flags, their refusals or their `--check`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from distill.core.check import Check, add_check_args, print_estimates, wants_check
from distill.core.config import add_config_args, add_fresh_arg, load_config
from distill.core.errors import DistillError


@dataclass(frozen=True)
class Stage:
    name: str
    config: type  # the stage's pydantic config class
    example: str  # a shipped config, named when --config is missing
    run: Callable[[Any, str, bool], Any]  # (cfg, config path, fresh) -> what it made
    check: Callable[[Any, Any], Any]  # (cfg, Check) -> a StageEstimate to print, or None
    report: Callable[[Any, Any], None]  # (cfg, what run made): the lines a user reads at the end


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)
    add_fresh_arg(parser)
    add_check_args(parser)


def main(stage: Stage, args: argparse.Namespace) -> int:
    if not args.config:
        raise DistillError(f"--config is required (e.g. {stage.example})")
    cfg = load_config(stage.config, args.config, args.set)
    if wants_check(args):
        check = Check(args.offline)
        estimate = stage.check(cfg, check)
        if estimate is not None:
            print_estimates([estimate])
        check.disk(cfg.output_dir)
        return check.finish()
    stage.report(cfg, stage.run(cfg, args.config, args.fresh))
    return 0
