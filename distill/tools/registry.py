"""Tool names, their planner descriptions and construction from a list of names. The descriptions are
listed verbatim in the planner prompt: changing one changes what the teacher saw and the student learns."""

from __future__ import annotations

from typing import Any, Iterable

from distill.errors import DistillError
from distill.tools.base import Tool

TOOL_DESCRIPTIONS: dict[str, str] = {
    "Wikipedia": (
        "Worker that searches for similar page contents from Wikipedia. Useful when you need to get holistic "
        "knowledge about people, places, companies, historical events, or other subjects. "
        "Input should be a search query."
    ),
    "LLM": (
        "A pretrained LLM like yourself. Useful when you need to act with general world knowledge and common "
        "sense. Prioritize it when you are confident in solving the problem yourself. Input can be any instruction."
    ),
    "Calculator": "Evaluates an arithmetic expression exactly. Input must be the expression alone, e.g. 12*(3+4).",
}


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
    from distill.tools.calculator import Calculator
    from distill.tools.llm_tool import LLMTool

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
