"""The `distill` command.

    distill ask "Who directed the film that won Best Picture in 1998?" --config configs/ask_smollm2_local.yaml
    distill plan check plan.txt --json
    distill generate --config configs/generate_teacher.yaml
    distill filter runs/x/trajectories.jsonl --out runs/x/kept.jsonl
    distill score --dataset hotpotqa predictions.jsonl
    distill sft-data runs/x/kept.jsonl --out runs/x/sft
    distill merge ADAPTER --out DIR
    distill serve --config configs/serve_planner.yaml
    distill eval --config configs/eval_smollm2_cpu.yaml
    distill pipeline --config configs/demo_smollm2_cpu.yaml

A command is the `configure_parser(parser)` and `main(args) -> int` of the module that does the work (a stage is
one module: its config class, its function and its command line). Only the module of the command given is
imported, and heavy imports stay inside `main`, so `distill --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from distill.errors import DistillError, is_environment_failure, one_line

# (argv words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("ask",), "distill.rewoo.agent", "answer one question with the ReWOO agent"),
    (("plan", "check"), "distill.rewoo.plan", "parse and validate a plan"),
    (("generate",), "distill.generate", "record teacher trajectories (resumable)"),
    (("filter",), "distill.filter", "keep correct, well-formed trajectories"),
    (("score",), "distill.metrics", "score predictions with official EM/F1"),
    (("sft-data",), "distill.sft_data", "turn kept trajectories into an SFT dataset"),
    (("train",), "distill.train", "LoRA SFT of the student planner (prefer `accelerate launch -m distill.train`)"),
    (("merge",), "distill.merge", "merge a LoRA adapter into full weights"),
    (("serve",), "distill.serve", "serve the student planner with vLLM"),
    (("eval",), "distill.evaluate", "evaluate planners and baselines"),
    (("report",), "distill.report", "write report.md, results.json and plots from evaluation records"),
    (("pipeline",), "distill.pipeline", "run the whole distillation end to end"),
]


def _chosen(argv: list[str]) -> tuple[str, ...] | None:
    """The command words in argv (options before them skipped), so only that command's module is imported."""
    words = [w for w in argv if not w.startswith("-")]
    for cmd_words, _, _ in COMMANDS:
        if tuple(words[: len(cmd_words)]) == cmd_words:
            return cmd_words
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """All commands are listed; the one named in argv (every one when argv is None) gets its full arguments."""
    chosen = None if argv is None else _chosen(argv)
    parser = argparse.ArgumentParser(prog="distill", description="Distill a ReWOO Planner into a small model.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module, help_text in COMMANDS:
        if len(words) == 1:
            sub = subparsers.add_parser(words[0], help=help_text, description=help_text)
        else:
            if words[0] not in groups:
                group = subparsers.add_parser(words[0], help=f"{words[0]} tools")
                groups[words[0]] = group.add_subparsers(dest=f"{words[0]}_command", metavar="ACTION", required=True)
            sub = groups[words[0]].add_parser(words[1], help=help_text, description=help_text)
        sub.set_defaults(_module=module)
        if argv is not None and words != chosen:
            continue
        try:
            importlib.import_module(module).configure_parser(sub)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            sub.set_defaults(_missing=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("distill").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    for noisy in ("bm25s", "httpx", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", False):
        print(f"error: command not available in this install ({args._module})", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except Exception as exc:
        # a user's input or world (files, network, a model server) failing is one line and exit 2;
        # anything else is a bug and keeps its traceback. -v shows the traceback in every case.
        if not is_environment_failure(exc):
            raise
        if args.verbose:
            traceback.print_exc()
        print(f"error: {exc if isinstance(exc, DistillError) else one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished work is saved; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
