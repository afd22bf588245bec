"""The `distill` command (`distill --help` lists them all).

A command is the `configure_parser(parser)` and `main(args) -> int` of the module that does the work (a stage is
one module: its config class, its function and its command line). Only the module of the command given is
imported, and heavy imports stay inside `main`, so `distill --help` is instant.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
import traceback
from typing import Callable

from distill import code_version
from distill.core.errors import DistillError, is_environment_failure, one_line
from distill.core.secrets import MaskingFormatter, mask, mask_log_record

# (argv words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("ask",), "distill.agent.factory", "answer one question with the ReWOO agent"),
    (("plan", "check"), "distill.rewoo.plan", "parse and validate a plan"),
    (("generate",), "distill.generate", "record teacher trajectories (resumable)"),
    (("filter",), "distill.filter", "keep correct, well-formed trajectories"),
    (("score",), "distill.core.metrics", "score predictions with EM/F1 (official HotpotQA/TriviaQA or plain rules)"),
    (("sft-data",), "distill.sft_data", "turn kept trajectories into an SFT dataset"),
    (("train",), "distill.training.launch",
     "LoRA SFT of the student planner (prefer `accelerate launch -m distill.train`)"),
    (("improve",), "distill.improve", "improve the trained student on its own plans, scored by the Worker"),
    (("flywheel",), "distill.flywheel", "turn served traffic into the next round, promoted only when it is better"),
    (("promote",), "distill.serving.promote",
     "swap the served agents' planner to a flywheel round's adapter, or roll back"),
    (("merge",), "distill.training.merge", "merge a LoRA adapter into full weights"),
    (("push",), "distill.training.push", "share a trained adapter on the Hugging Face Hub, with its model card"),
    (("serve",), "distill.serving.serve", "serve the student planner with vLLM"),
    (("serve-agent",), "distill.serving.agent_server",
     "serve the whole agent as an OpenAI-compatible chat endpoint, traced"),
    (("eval",), "distill.evaluate", "evaluate planners and baselines"),
    (("report",), "distill.report", "write report.md, results.json and plots from evaluation records"),
    (("pipeline",), "distill.pipeline", "run the whole distillation end to end"),
]


# What each command's `--help` teaches beyond its one line: its main choices and one command to copy.
GUIDE: dict[tuple[str, ...], tuple[str, str]] = {
    ("ask",): ("Plans with the configured Planner, runs the tools, and answers with the Solver; --json prints the "
               "whole trajectory record.",
               'distill ask "Who directed the film that won Best Picture in 1998?" '
               "--config configs/ask_smollm2_local.yaml"),
    ("plan", "check"): ("Reads a plan (`#E1 = Tool[input]` lines) and lists every problem the Worker would refuse it "
                        "for; exit 1 when the plan is invalid.",
                        "distill plan check plan.txt --tools Wikipedia,LLM,Calculator"),
    ("generate",): ("The teacher plans each question (several samples with temperature > 0), the Worker runs the "
                    "tools and the Solver answers; records are appended as they finish, so a rerun resumes. "
                    "--check prints the resolved config and the estimated calls, tokens and dollars, and runs "
                    "nothing.",
                    "distill generate --config configs/generate_teacher.yaml --check"),
    ("filter",): ("Keeps valid, fully executed trajectories that pass the criterion (`criterion:` answer, the "
                  "Solver's answer correct; evidence, every gold supporting page retrieved; or both), the best sample "
                  "per question.",
                  "distill filter runs/teacher/trajectories.jsonl --out runs/teacher/kept.jsonl"),
    ("score",): ("Scores any system's predictions with the official HotpotQA or TriviaQA rules, or plain EM/F1.",
                 "distill score --metric hotpotqa predictions.jsonl --out scored.jsonl"),
    ("sft-data",): ("Writes a prompt/completion dataset from the kept plans, in the student's prompt: full "
                    "(instructions and tool descriptions) or compact (the question and the tool names).",
                    "distill sft-data runs/teacher/kept.jsonl --out runs/student/sft --student-prompt compact"),
    ("train",): ("LoRA (or QLoRA) supervised fine-tuning with TRL; on GPUs launch it with accelerate so every GPU "
                 "trains. The config picks the model, rank, learning rate and batch.",
                 "accelerate launch -m distill.train --config configs/qwen2.5-7b_lora_gpu.yaml"),
    ("improve",): ("Two methods (`method:`): expert_iteration (any machine: sample plans from the served adapter, "
                   "keep each question's best by the planner reward, train on them, round after round) and grpo "
                   "(GPUs: TRL's GRPOTrainer with the planner reward). A killed round resumes.",
                   "distill improve --config configs/improve_smollm2_cpu.yaml"),
    ("flywheel",): ("One round of the loop from served traffic: the questions `serve-agent` got feedback with a "
                    "right answer on since the last round (leak-guarded, deduplicated) are split by a hash into train "
                    "and held-out; one expert-iteration round trains from the adapter in service on the train side; "
                    "both adapters are evaluated on the held-out side with the same Solver and tools; the round is "
                    "promoted only when the paired bootstrap interval of the gate's measure lies above 0 and no "
                    "guard got worse, and with `service:` the running agents switch to it. Every decision is a line "
                    "of promotions.jsonl; too few new questions is one line and exit 0. --check reads the traces "
                    "and counts the round's questions, and runs nothing.",
                    "distill flywheel --config configs/flywheel_smollm2_cpu.yaml --check"),
    ("promote",): ("Loads a flywheel round's adapter into the planner's vLLM server (as LoRA module round_<R>) and "
                   "switches each agent of `service:` to it (POST /v1/admin/planner, with the bearer token from "
                   "service.token_env); --rollback serves again the adapter served before the last promotion. "
                   "Each swap is a line of promotions.jsonl.",
                   "distill promote --config configs/flywheel_smollm2_cpu.yaml --round 1"),
    ("merge",): ("Folds a LoRA adapter into its base model's weights, for serving without LoRA.",
                 "distill merge runs/demo/train/student --out runs/demo/merged"),
    ("push",): ("Uploads an adapter with a model card written from its run (the token is read from the "
                "environment); --dry-run writes the card and uploads nothing.",
                "HF_TOKEN=... distill push runs/demo/train/student --repo-id you/planner --dry-run"),
    ("serve",): ("Starts vLLM's OpenAI-compatible server with the base model and the LoRA adapters (or merged "
                 "weights) and prints the --set flags that point a config at it; CPU settings are picked for you. "
                 "--dry-run prints the vLLM command.",
                 "distill serve --config configs/serve_planner.yaml --set adapter=runs/demo/train/student"),
    ("serve-agent",): ("Serves the whole ReWOO agent (planner, Worker with the config's tools, Solver; built as eval "
                       "builds it) as an OpenAI chat-completions endpoint, streaming the plan and each step; every "
                       "request is traced, and traces with feedback become improve's training questions.",
                       "distill serve-agent --config configs/agent_server.yaml"),
    ("eval",): ("Runs each planner row (student, base, teacher, teacher+replan) and the ReAct and Direct baselines "
                "on the same questions, Solver and tools, into records that `distill report` reads. --check runs "
                "nothing.",
                "distill eval --config configs/eval_smollm2_cpu.yaml"),
    ("report",): ("Recomputes report.md, results.json, report.html and the plots from an evaluation's records; "
                  "calls no model.",
                  "distill report runs/demo/eval"),
    ("pipeline",): ("Runs generate, filter, sft-data, train, improve, eval and report into one run folder; a rerun "
                    "skips the stages whose settings and inputs are unchanged. --check validates every stage, says "
                    "what would run and estimates the cost, and runs nothing; --from STAGE redoes from a stage.",
                    "distill pipeline --config configs/demo_smollm2_cpu.yaml --check --offline"),
}


def command(module: str) -> tuple[Callable, Callable]:
    """A command module's (configure_parser, main): a stage's from its `STAGE` (distill.core.stage, the one shape of
    a config-driven command), any other module's its own."""
    mod = importlib.import_module(module)
    if (declared := getattr(mod, "STAGE", None)) is not None and declared.run is not None:
        from distill.core import stage  # here: its config machinery costs ~0.5 s that `distill --help` should not

        return stage.configure_parser, functools.partial(stage.main, declared)
    return mod.configure_parser, mod.main


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """All commands are listed; the one named in argv (every one when argv is None) gets its full arguments."""
    # the words of argv, options before them skipped: only the command they name has its module imported
    given = None if argv is None else tuple(w for w in argv if not w.startswith("-"))
    parser = argparse.ArgumentParser(
        prog="distill", description="Distill the Planner of a ReWOO agent from a large teacher into a small model.",
        epilog="Start with `distill pipeline --config configs/demo_smollm2_cpu.yaml` (what `make demo` runs); "
               "`distill COMMAND --help` says what each command does, with an example.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (and tracebacks)")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version (and the commit, in a git checkout) and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module, help_text in COMMANDS:
        what, example = GUIDE[words]
        teach = {"help": help_text, "description": f"{help_text[0].upper()}{help_text[1:]}. {what}",
                 "epilog": f"example:\n  {example}", "formatter_class": _Formatter}
        if len(words) == 1:
            sub = subparsers.add_parser(words[0], **teach)
        else:
            if words[0] not in groups:
                group = subparsers.add_parser(words[0], help="; ".join(
                    f"{w[1]}: {h}" for w, _, h in COMMANDS if len(w) > 1 and w[0] == words[0]))
                groups[words[0]] = group.add_subparsers(dest=f"{words[0]}_command", metavar="ACTION", required=True)
            sub = groups[words[0]].add_parser(words[1], **teach)
        sub.set_defaults(_module=module)
        if given is not None and given[: len(words)] != words:
            continue
        try:
            command(module)[0](sub)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            sub.set_defaults(_missing=True)
    return parser


class _Formatter(argparse.HelpFormatter):
    """The description wrapped as prose, the example epilog kept on its own line so it can be copied whole."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Version(argparse.Action):
    """`--version`, asking git only when given: every other command line is parsed without a subprocess."""

    def __call__(self, parser, namespace, values, option_string=None):
        version, _, commit = code_version().partition("+")
        print(f"distill {version}" + (f" (commit {commit})" if commit else ""))
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(mask_log_record)
        handler.setFormatter(MaskingFormatter("%(levelname)s %(name)s: %(message)s"))
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
        return int(command(args._module)[1](args) or 0)
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


def run_module(module: str) -> None:
    """`python -m distill.X` (and `accelerate launch -m distill.X`) is the `distill` command whose module X is, with
    the same parser, help and one-line errors: a command module run by its name never imports quietly and exits 0.
    Each command module ends with `if __name__ == "__main__": run_module(__spec__.name)`."""
    words = next((w for w, m, _ in COMMANDS if m == module), None)
    if words is None:
        raise SystemExit(f"error: {module} is no distill command (COMMANDS lists them)")
    sys.exit(main([*words, *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
