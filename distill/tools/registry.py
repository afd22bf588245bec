"""Tool names, their planner descriptions and construction from a list of names. The descriptions are
listed verbatim in the planner prompt: changing one changes what the teacher saw and the student learns."""

from __future__ import annotations

from typing import Any, Iterable

from distill.errors import DistillError
from distill.tools.base import Tool
from distill.tools.calculator import Calculator
from distill.tools.llm_tool import LLMTool
from distill.tools.wikipedia import DESCRIPTION as WIKIPEDIA_DESCRIPTION

# Each description lives with its tool; this is the one list of them, in the prompt's order.
TOOL_DESCRIPTIONS: dict[str, str] = {
    "Wikipedia": WIKIPEDIA_DESCRIPTION, "LLM": LLMTool.description, "Calculator": Calculator.description,
}
# The tools every stage gives the Planner unless its config says otherwise.
DEFAULT_TOOLS: tuple[str, ...] = tuple(TOOL_DESCRIPTIONS)


def tool_descriptions(names: Iterable[str]) -> dict[str, str]:
    """Name -> description, in the order given, spelled as the registry spells them (configs are written by
    hand). Every stage's prompt tool list comes through here, so the student is served the list it was
    trained on; a repeat or an empty list is refused, since either would change the prompt."""
    by_key = {known.lower(): known for known in TOOL_DESCRIPTIONS}
    out: dict[str, str] = {}
    for raw in names:
        name = by_key.get(raw.strip().lower())
        if name is None:
            raise DistillError(f"unknown tool {raw!r}; known tools: {', '.join(TOOL_DESCRIPTIONS)}")
        if name in out:
            raise DistillError(f"tool {name!r} is listed twice")
        out[name] = TOOL_DESCRIPTIONS[name]
    if not out:
        raise DistillError("no tools given")
    return out


def build_tools(
    names: Iterable[str], *, wikipedia: Tool | None, llm_model: Any = None, llm_max_tokens: int = 256
) -> dict[str, Tool]:
    """The named tools, keyed by canonical name in the order given. The Wikipedia backend comes built because
    choosing it (online, local corpus, per-question scope) is the caller's decision."""
    made = {
        "Wikipedia": wikipedia,
        "LLM": None if llm_model is None else LLMTool(llm_model, max_tokens=llm_max_tokens),
        "Calculator": Calculator(),
    }
    missing = {"Wikipedia": "no Wikipedia backend was configured", "LLM": "no model was given for it"}
    tools = {name: made[name] for name in tool_descriptions(names)}
    for name, tool in tools.items():
        if tool is None:
            raise DistillError(f"tool {name!r} is listed but {missing[name]}")
    return tools
