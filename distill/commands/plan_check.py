"""`distill plan check [FILE|-] [--tools ...] [--json]`: parse and validate one plan.

Meant for eyeballing what a planner wrote (or a hand-written few-shot example) before it goes into a run:
the human form lists the steps and errors, `--json` prints `Plan.to_dict()` for scripts. Exit 0 means valid.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from distill.errors import DistillError

if TYPE_CHECKING:
    from distill.rewoo.plan import Plan

DEFAULT_TOOLS = "Wikipedia,LLM,Calculator"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-", metavar="FILE", help="plan text file; '-' or none reads stdin")
    parser.add_argument(
        "--tools",
        default=DEFAULT_TOOLS,
        help=f"comma-separated tool names the plan may use (default {DEFAULT_TOOLS}); '' skips the tool check",
    )
    parser.add_argument("--json", action="store_true", help="print the parsed plan as JSON")


def main(args: argparse.Namespace) -> int:
    from distill.rewoo.plan import parse_plan

    text = read_text(args.file)
    tools = [name.strip() for name in args.tools.split(",") if name.strip()]
    plan = parse_plan(text, tools=tools or None)
    if args.json:
        print(json.dumps(plan.to_dict()))
    else:
        print(format_plan(plan))
    return 0 if plan.valid else 1


def read_text(file: str) -> str:
    """The plan as text, read as bytes first: a planner's output or a pasted file can hold any bytes, and
    bytes that are not UTF-8 are one line naming where, not a traceback from the text layer."""
    if file == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # stdin replaced by a text stream (an embedding program, a test): already text
            return sys.stdin.read()
        return _decode(stream.read(), "plan on stdin")
    path = Path(file)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DistillError(f"plan file not found: {path}") from None
    except IsADirectoryError:
        raise DistillError(f"plan file is a directory: {path}") from None
    except OSError as exc:
        raise DistillError(f"cannot read plan file {path}: {exc.strerror or exc}") from None
    return _decode(data, f"plan file {path}")


def _decode(data: bytes, what: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DistillError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # the newlines text mode would have given


def format_plan(plan: Plan) -> str:
    """Steps as canonical lines with their Plan text and deps underneath, then errors, then a verdict."""
    lines: list[str] = []
    for step in plan.steps:
        lines.append(f"{step.id} = {step.tool}[{step.input}]")
        lines.append(f"    plan: {step.description or '(none)'}")
        if step.deps:
            lines.append(f"    deps: {', '.join(step.deps)}")
    if plan.errors:
        lines.append("errors:")
        lines.extend(f"  {e.code} {e.step or '-'}: {e.message}" for e in plan.errors)
    n_steps, n_errors = len(plan.steps), len(plan.errors)
    verdict = "valid" if plan.valid else f"invalid ({n_errors} error{'s' if n_errors != 1 else ''})"
    lines.append(f"{verdict}: {n_steps} step{'s' if n_steps != 1 else ''}")
    return "\n".join(lines)
