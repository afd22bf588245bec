"""Parse, validate and render ReWOO plans.

The canonical form is the one the paper's Planner writes::

    Plan: Find out who directed Titanic.
    #E1 = Wikipedia[Titanic (1997 film)]
    Plan: Find the director's birth year.
    #E2 = LLM[In what year was the director named in #E1 born?]

Real models (half-trained students above all) wander from it, so the parser is lenient about decoration
(markdown, numbering, code fences, `#E1:` for `#E1 =`) and strict about meaning: a damaged step (`E2 = Tool[x]`,
`#E0`, a control character in front, a tool call inside another's input) is a `malformed_step`, never folded into
Plan text, because the filter trusts `Plan.valid`. Parsing never raises: every fault is a `PlanError` with a stable
`code`.

Model output is untrusted and parsed inside the agent's event loop, so parsing is linear in its length: every
regex quantifier is possessive (or can never give back what it took) and regexes run on positions rather than
copied slices. The Worker runs every step it is given, so a runaway plan is cut here (`max_plan_steps`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from distill.core.errors import DistillError
from distill.tools.registry import DEFAULT_TOOLS

ERROR_CODES = (
    "empty_plan", "unknown_tool", "undefined_ref", "forward_ref", "duplicate_id", "malformed_step",
    "too_long", "too_many_steps",
)

# Far above what a 512-token Planner writes (about 2,000 characters), far below what makes parsing slow.
DEFAULT_MAX_PLAN_CHARS = 8000
# Every stage's default step bound (a config's `max_plan_steps`): HotpotQA needs 2-4 steps.
DEFAULT_MAX_PLAN_STEPS = 6

# A reference is a whole token: `#E1` must not match the start of `#E10`.
REF_RE = re.compile(r"#E\d+(?!\d)")
_VALID_ID_RE = re.compile(r"#E[1-9][0-9]*+")
_ID_FORM = "an id of the form #E<n> with n a positive integer"

# Markdown decoration a model may put in front of a line: a heading, a bullet or a number, then bold/code.
_DECORATION = r"(?:#{1,6}+[ \t]++)?(?:(?:[-*+]|\d++[.)])[ \t]++)?"
_LEAD = r"[ \t]*+" + _DECORATION
# Everything up to the Plan text; the text itself is the rest of the line.
_PLAN_RE = re.compile(
    _LEAD
    + r"(?P<b1>\*\*|__)?[ \t]*+plan[ \t]*+(?:#?\d++[ \t]*+)?(?P<b2>\*\*|__)?"
    + r"[ \t]*+[:：][ \t]*+(?P<b3>\*\*|__)?",
    re.IGNORECASE,
)
_STEP_HEAD_RE = re.compile(_LEAD + r"(?:\*\*|__|`)?(?P<id>#E\d++)(?:\*\*|__|`)?[ \t]*+[=:][ \t]*+")
_TOOL_RE = re.compile(r"(?P<tool>[^\W\d][\w.-]*+)[ \t]*+\[")
# A full step (header and the start of a tool call), used where a looser match would misfire.
_FULL_STEP_RE = re.compile(_STEP_HEAD_RE.pattern + _TOOL_RE.pattern)
# The rest of an id as a damaged model writes it: `E2`, `#E-1`, `#Ex`, `#e1`. It holds no `#`, so searches
# that try every `#E` of a line never scan the same characters twice.
_ID_TAIL = r"[^\s=:\[\]`*#]*+"
_LOOSE_ID = r"(?P<id>#?E" + _ID_TAIL + ")"
# A step written on the same line as its Plan text: "Plan: look it up. #E1 = Wikipedia[x]".
_INLINE_STEP_RE = re.compile(r"#E" + _ID_TAIL + r"[ \t]*+=[ \t]*+" + _TOOL_RE.pattern)
# Characters that may hide in front of a step: whitespace, C0/C1 controls and invisible format characters.
_JUNK = r"[ \t\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]*+"
_LOOSE_STEP_RE = re.compile(
    _JUNK + _DECORATION + r"(?:\*\*|__|`)?" + _LOOSE_ID + r"(?:\*\*|__|`)?[ \t]*+(?P<sep>[=:])[ \t]*+"
    + r"(?P<call>" + _TOOL_RE.pattern + ")?",
    re.IGNORECASE,
)
_FENCE_RE = re.compile(r"[ \t]*+(?:```|~~~)")
# A tool call written inside another step's input (`Wikipedia[LLM[Lemoine] Wozniak]`): the Worker would send
# it to the outer tool as text. The lookbehind starts a match only at the start of a word, so a long word is
# read once, not once per position.
_NESTED_CALL_RE = re.compile(r"(?<![\w.-])[^\W\d][\w.-]*+\[")
_BRACKET_OR_NEWLINE_RE = re.compile(r"[\[\]\n]")


@dataclass(frozen=True)
class Step:
    id: str  # "#E1"
    description: str  # the text after "Plan:"
    tool: str  # "Wikipedia"
    input: str  # raw input, refs not substituted
    deps: tuple[str, ...]  # refs used in input, in order of first use, unique


@dataclass(frozen=True)
class PlanError:
    code: str  # one of ERROR_CODES
    step: str | None
    message: str


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    errors: tuple[PlanError, ...]

    @property
    def valid(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape stored in trajectory records and printed by `distill plan check --json`."""
        steps = [asdict(s) | {"deps": list(s.deps)} for s in self.steps]
        return {"valid": self.valid, "steps": steps, "errors": [asdict(e) for e in self.errors]}


def find_refs(text: str) -> list[str]:
    """Evidence ids used in `text`, unique, in order of first use (the order the Worker should wait on them)."""
    return list(dict.fromkeys(REF_RE.findall(text)))


def substitute(text: str, evidence: Mapping[str, str]) -> str:
    """Replace whole `#En` tokens by their evidence in one pass, so evidence that itself mentions `#E2` stays
    literal and `#E1` is never spliced into `#E10`. Unknown refs are left as written."""
    return REF_RE.sub(lambda m: evidence.get(m.group(0), m.group(0)), text)


def duplicate_steps(steps: Iterable[Step | Mapping[str, Any]]) -> int:
    """How many steps repeat an earlier step's call: the same tool (casefolded) on the same input after
    trivial normalisation (whitespace stripped and collapsed, casefolded). A repeat costs a Worker call and
    Solver tokens and finds nothing new, yet neither validity nor recall sees it: a planner that writes
    `Wikipedia[Eiffel Tower]` four times has three. An input holding `#E` refs is compared as written, before
    any evidence is substituted (`LLM[sum #E1]` twice repeats; `LLM[sum #E2]` does not). Takes parsed `Step`s or
    the step dicts a record stores (`tool`, `input`); one pass, linear in the steps' total length."""
    seen: set[tuple[str, str]] = set()
    repeats = 0
    for step in steps:
        tool, text = (step.get("tool"), step.get("input")) if isinstance(step, Mapping) else (step.tool, step.input)
        key = (str(tool or "").casefold(), " ".join(str(text or "").split()).casefold())
        if key in seen:
            repeats += 1
        else:
            seen.add(key)
    return repeats


def render_plan(plan: Plan) -> str:
    """Canonical text for a plan: what the student is trained to write, and what parse_plan reads back."""
    return "\n".join(f"Plan: {s.description}\n{s.id} = {s.tool}[{s.input}]\n" for s in plan.steps)


def parse_plan(
    text: str,
    tools: Iterable[Any] | None = None,
    *,
    max_plan_chars: int | None = DEFAULT_MAX_PLAN_CHARS,
    max_plan_steps: int | None = None,
    known_ids: Iterable[str] = (),
) -> Plan:
    """Read the steps out of a Planner's output and validate them; never raises.

    `tools` (names, or objects with a `.name`) turns on the unknown_tool check and normalises tool names to
    the registered spelling. A duplicate id is reported and kept, so the record shows what the model wrote.
    The step bound is off by default: it is a policy of the agent's config, not a property of a plan.
    `known_ids` have evidence already (a re-plan continues a plan that ran): refs to them are valid, and a
    step that redefines one is a `duplicate_id` left out, so finished evidence is never run again nor shadowed.
    """
    errors: list[tuple[int, PlanError]] = []
    if max_plan_chars is not None and len(text) > max_plan_chars:
        msg = f"planner output has {len(text)} characters, over max_plan_chars={max_plan_chars}; the rest was not read"
        text = text[:max_plan_chars]
        errors.append((len(text) + 1, PlanError("too_long", None, msg)))
    scanner = _Scanner(text.replace("\r\n", "\n").replace("\r", "\n"))
    scanner.run()
    errors.extend(scanner.errors)
    scanned = scanner.steps
    finished = frozenset(known_ids)
    for pos, step in scanned:
        if step.id in finished:
            msg = f"{step.id} already holds evidence from the plan so far; this step is not run"
            errors.append((pos, PlanError("duplicate_id", step.id, msg)))
    scanned = [(pos, step) for pos, step in scanned if step.id not in finished]
    kept = scanned if max_plan_steps is None else scanned[: max(max_plan_steps, 0)]
    if len(kept) < len(scanned):
        pos, first_cut = scanned[len(kept)]
        over = f"the plan has {len(scanned)} steps, over max_plan_steps={max_plan_steps}"
        errors.append((pos, PlanError("too_many_steps", first_cut.id, f"{over}; {first_cut.id} and later are not run")))
    names = None if tools is None else [str(getattr(t, "name", t)) for t in tools]  # a str has no .name
    registry = None if names is None else {name.casefold(): name for name in names}
    known = ", ".join(sorted(set(registry.values()))) if registry is not None else ""
    steps: list[tuple[int, Step]] = []
    for pos, step in kept:
        if registry is not None:
            canonical = registry.get(step.tool.casefold())
            if canonical is None:
                msg = f"{step.id} uses unknown tool {step.tool!r} (known: {known or 'none'})"
                errors.append((pos, PlanError("unknown_tool", step.id, msg)))
            elif canonical != step.tool:
                step = Step(step.id, step.description, canonical, step.input, step.deps)
        steps.append((pos, step))
    errors.extend(_reference_errors(scanned, len(steps), scanner.malformed_ids, finished))
    errors.sort(key=lambda item: item[0])  # stable: errors of one step keep their check order
    if not steps:
        errors.insert(0, (-1, PlanError("empty_plan", None, "no step of the form '#E1 = Tool[input]' was found")))
    return Plan(tuple(s for _, s in steps), tuple(e for _, e in errors))


def _reference_errors(
    steps: list[tuple[int, Step]], checked: int, malformed_ids: set[str], known: frozenset[str]
) -> list[tuple[int, PlanError]]:
    """Errors of the first `checked` steps, judged against the first definition of each id among all steps
    (a ref to a step past max_plan_steps is a forward ref, not an undefined one). A ref to a malformed step
    is undefined too (no evidence will exist), but the message says why."""
    first: dict[str, int] = {}
    for index, (_, step) in enumerate(steps):
        first.setdefault(step.id, index)
    errors: list[tuple[int, PlanError]] = []
    for index, (pos, step) in enumerate(steps[:checked]):
        if first[step.id] != index:
            errors.append((pos, PlanError("duplicate_id", step.id, f"{step.id} is defined more than once")))
        for ref in step.deps:
            if ref in known:
                continue
            if ref not in first:
                why = "whose step is malformed" if ref in malformed_ids else "which no step defines"
                msg = f"{step.id} refers to {ref}, {why}"
                errors.append((pos, PlanError("undefined_ref", step.id, msg)))
            elif first[ref] >= index:
                where = "itself" if ref == step.id else f"{ref}, which is only defined later"
                errors.append((pos, PlanError("forward_ref", step.id, f"{step.id} refers to {where}")))
    return errors


def _step_like(match: re.Match[str] | None) -> bool:
    """Whether a _LOOSE_STEP_RE match is a damaged step rather than prose: `#E...` assigned with `=`, or any
    id-like token followed by a tool call (`E2 = Tool[`, `#E-1: Tool[`). `Example: Tool[x]` is prose."""
    if match is None:
        return False
    ident = match.group("id")
    if ident.startswith("#"):
        return match.group("sep") == "=" or match.group("call") is not None
    after_e = ident[1:2]
    return match.group("call") is not None and (after_e.isdigit() or after_e in ("-", "+"))


class _Scanner:
    """One left-to-right pass over the text, position based so that an input may span several lines.
    Plan descriptions (lists of line parts) wait in a queue and each step takes the oldest, which pairs them
    both when Plan and step lines alternate and when a model lists all plans first and all steps after."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.steps: list[tuple[int, Step]] = []
        self.errors: list[tuple[int, PlanError]] = []
        self.malformed_ids: set[str] = set()
        self.pending: deque[list[str]] = deque()
        self.continuing = False  # the previous line was Plan text that the next line may continue

    def run(self) -> None:
        pos, end = 0, -1
        while pos < len(self.text):
            if pos > end:  # several steps may share a line: find its end once, not once per step
                end = self._line_end(pos)
            pos = self._line(pos, end)

    def _line_end(self, pos: int) -> int:
        end = self.text.find("\n", pos)
        return len(self.text) if end < 0 else end

    def _line(self, start: int, end: int) -> int:
        """Handle the line text[start:end]; return where scanning resumes (always past `start`)."""
        text, continuing = self.text, self.continuing
        self.continuing = False
        if _FENCE_RE.match(text, start, end):
            return end + 1
        if head := _STEP_HEAD_RE.match(text, start, end):
            return self._step(start, head.group("id"), head.end(), end)
        if plan := _PLAN_RE.match(text, start, end):
            return self._plan_line(start, plan, end)
        loose = _LOOSE_STEP_RE.match(text, start, end)
        if _step_like(loose):
            self._malformed_line(start, loose.group("id"), end)  # type: ignore[union-attr]
        elif continuing and (part := text[start:end].strip()):
            self.pending[-1].append(part)
            self.continuing = True
        return end + 1

    def _plan_line(self, start: int, match: re.Match[str], end: int) -> int:
        desc_start = match.end()
        inline = _INLINE_STEP_RE.search(self.text, desc_start, end)
        desc = self.text[desc_start : inline.start() if inline else end].strip()
        bold = match.group("b1")
        if bold and not (match.group("b2") or match.group("b3")) and desc.endswith(bold):
            desc = desc[: -len(bold)].rstrip()  # "**Plan: text**"
        self.pending.append([desc] if desc else [])
        self.continuing = inline is None
        return inline.start() if inline else end + 1  # an inline step is scanned again from its start

    def _take_description(self) -> str:
        return " ".join(self.pending.popleft()) if self.pending else ""

    def _malformed(self, start: int, step_id: str, msg: str) -> None:
        self.errors.append((start, PlanError("malformed_step", step_id, msg)))
        self.malformed_ids.add(step_id)

    def _malformed_line(self, start: int, written: str, end: int) -> None:
        """A step-like line the strict grammar rejects; it uses up a description like any step."""
        self._take_description()
        found = self.text[start:end].strip()
        step_id = written[:20] if written.startswith("#") else "#" + written[:19]
        valid_id = _VALID_ID_RE.fullmatch(step_id)
        why = "is preceded by an invisible or control character" if valid_id else f"does not have {_ID_FORM}"
        self._malformed(start, step_id, f"{written[:20]!r} looks like a step but {why}: {found[:80]!r}")

    def _step(self, start: int, step_id: str, call: int, line_end: int) -> int:
        """Parse `Tool[input]` from `call`; return where scanning resumes."""
        description = self._take_description()
        tool = _TOOL_RE.match(self.text, call, line_end)
        close = self._matching_bracket(tool.end() - 1) if tool else None
        if tool is None or close is None:
            found = self.text[call:line_end].strip()
            why = "has no 'Tool[input]' call" if tool is None else "has a '[' that is never closed"
            self._malformed(start, step_id, f"{step_id} {why}: {found[:80]!r}")
            return line_end + 1
        if not _VALID_ID_RE.fullmatch(step_id):
            self._malformed(start, step_id, f"{step_id} is not {_ID_FORM}")
            return close + 1
        raw = self.text[tool.end() : close].strip()
        if nested := _NESTED_CALL_RE.search(raw):
            inner = nested.group()[:-1][:40]
            msg = (f"{step_id} calls {inner}[...] inside its {tool.group('tool')} input; a tool call is a step of "
                   f"its own, and a later step refers to its evidence as #En: {raw[:80]!r}")
            self._malformed(start, step_id, msg)
            return close + 1
        self.steps.append((start, Step(step_id, description, tool.group("tool"), raw, tuple(find_refs(raw)))))
        return close + 1

    def _matching_bracket(self, open_at: int) -> int | None:
        """Index of the `]` closing the `[` at open_at, or None. A line that starts a new Plan or step ends
        the search, so one missing `]` costs only its own step, not the steps after it."""
        depth = 0
        for match in _BRACKET_OR_NEWLINE_RE.finditer(self.text, open_at):
            char = match.group()
            if char == "[":
                depth += 1
            elif char == "]":
                depth -= 1
                if depth == 0:
                    return match.start()
            elif self._starts_new_item(match.end()):
                return None
        return None

    def _starts_new_item(self, pos: int) -> bool:
        end = self._line_end(pos)
        return bool(
            _FULL_STEP_RE.match(self.text, pos, end)
            or _PLAN_RE.match(self.text, pos, end)
            or _step_like(_LOOSE_STEP_RE.match(self.text, pos, end))
        )


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    default = ",".join(DEFAULT_TOOLS)
    parser.add_argument("file", nargs="?", default="-", metavar="FILE", help="plan text file; '-' or none reads stdin")
    tools_help = f"comma-separated tool names the plan may use (default {default}); '' skips the tool check"
    parser.add_argument("--tools", default=default, help=tools_help)
    parser.add_argument("--json", action="store_true", help="print the parsed plan as JSON")
    parser.add_argument("--max-plan-steps", type=_positive_int, default=DEFAULT_MAX_PLAN_STEPS, metavar="N",
                        help=f"steps past N are too_many_steps, as in every stage (default {DEFAULT_MAX_PLAN_STEPS})")


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value!r}")
    return int(value)


def main(args: argparse.Namespace) -> int:
    text = read_text(args.file)
    tools = [name.strip() for name in args.tools.split(",") if name.strip()]
    plan = parse_plan(text, tools=tools or None, max_plan_steps=args.max_plan_steps)
    print(json.dumps(plan.to_dict()) if args.json else format_plan(plan))
    return 0 if plan.valid else 1


def read_text(file: str) -> str:
    """The plan as text, read as bytes first: a planner's output or a pasted file can hold any bytes, and
    bytes that are not UTF-8 are one line naming where, not a traceback from the text layer."""
    if file == "-":
        if not hasattr(sys.stdin, "buffer"):  # stdin replaced by a text stream (an embedding program, a test)
            return sys.stdin.read()
        data, what = sys.stdin.buffer.read(), "plan on stdin"
    else:
        path = Path(file)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DistillError(f"plan file not found: {path}") from None
        except OSError as exc:  # a directory, no permission: strerror names which
            raise DistillError(f"cannot read plan file {path}: {exc.strerror or exc}") from None
        what = f"plan file {path}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DistillError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # the newlines text mode would have given


def format_plan(plan: Plan) -> str:
    """Steps as canonical lines with their Plan text and deps underneath, then errors, then a verdict."""
    lines: list[str] = []
    for step in plan.steps:
        lines += [f"{step.id} = {step.tool}[{step.input}]", f"    plan: {step.description or '(none)'}"]
        if step.deps:
            lines.append(f"    deps: {', '.join(step.deps)}")
    if plan.errors:
        lines.append("errors:")
        lines.extend(f"  {e.code} {e.step or '-'}: {e.message}" for e in plan.errors)
    n_steps, n_errors = len(plan.steps), len(plan.errors)
    verdict = "valid" if plan.valid else f"invalid ({n_errors} error{'s' if n_errors != 1 else ''})"
    lines.append(f"{verdict}: {n_steps} step{'s' if n_steps != 1 else ''}")
    return "\n".join(lines)


if __name__ == "__main__":  # `python -m distill.rewoo.plan` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
