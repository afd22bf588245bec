"""The `distill` command (`distill --help` lists them all).

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
from distill.secrets import mask, mask_log_record

# (argv words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("ask",), "distill.rewoo.agent", "answer one question with the ReWOO agent"),
    (("plan", "check"), "distill.rewoo.plan", "parse and validate a plan"),
    (("generate",), "distill.generate", "record teacher trajectories (resumable)"),
    (("filter",), "distill.filter", "keep correct, well-formed trajectories"),
    (("score",), "distill.metrics", "score predictions with EM/F1 (official HotpotQA/TriviaQA or plain rules)"),
    (("sft-data",), "distill.sft_data", "turn kept trajectories into an SFT dataset"),
    (("train",), "distill.train", "LoRA SFT of the student planner (prefer `accelerate launch -m distill.train`)"),
    (("improve",), "distill.improve", "improve the trained student on its own plans, scored by the Worker"),
    (("merge",), "distill.merge", "merge a LoRA adapter into full weights"),
    (("push",), "distill.push", "share a trained adapter on the Hugging Face Hub, with its model card"),
    (("serve",), "distill.serve", "serve the student planner with vLLM"),
    (("serve-agent",), "distill.agent_server", "serve the whole agent as an OpenAI-compatible chat endpoint, traced"),
    (("eval",), "distill.evaluate", "evaluate planners and baselines"),
    (("report",), "distill.report", "write report.md, results.json and plots from evaluation records"),
    (("pipeline",), "distill.pipeline", "run the whole distillation end to end"),
]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """All commands are listed; the one named in argv (every one when argv is None) gets its full arguments."""
    # the words of argv, options before them skipped: only the command they name has its module imported
    given = None if argv is None else tuple(w for w in argv if not w.startswith("-"))
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
        if given is not None and given[: len(words)] != words:
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
    for handler in logging.getLogger().handlers:
        handler.addFilter(mask_log_record)
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
        print(f"error: {mask(str(exc)) if isinstance(exc, DistillError) else one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished work is saved; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
