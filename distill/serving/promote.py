"""`distill promote`: swap the served agents' planner to a flywheel round's adapter, or back.

    distill promote --config configs/flywheel_smollm2_cpu.yaml --round 2
    distill promote --config configs/flywheel_smollm2_cpu.yaml --rollback

The work is distill.flywheel's (`promote`, `rollback`), which `distill flywheel` also calls when its gate passes;
this module is only the command line, since a command is one module's `configure_parser` and `main`.
"""

from __future__ import annotations

import argparse

from distill.flywheel import configure_promote_parser, promote_main


def configure_parser(parser: argparse.ArgumentParser) -> None:
    configure_promote_parser(parser)


def main(args: argparse.Namespace) -> int:
    return promote_main(args)


if __name__ == "__main__":  # `python -m distill.serving.promote` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
