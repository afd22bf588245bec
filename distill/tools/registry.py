"""Tool names, their one-line planner descriptions, and construction from a list of names.

The descriptions are listed verbatim in the planner prompt, so they live in one place: changing one
changes what the teacher saw and what the student is trained on.
"""

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


def canonical_name(name: str) -> str:
    """Map a configured name to its registry spelling; configs written by hand often get the case wrong."""
    for known in TOOL_DESCRIPTIONS:
        if known.lower() == name.strip().lower():
            return known
    raise DistillError(f"unknown tool {name!r}; known tools: {', '.join(TOOL_DESCRIPTIONS)}")


def tool_descriptions(names: Iterable[str]) -> dict[str, str]:
    """Name -> description, in the order given and spelled as the registry spells them.

    The only place tool names become the planner prompt's tool list: generation, sft-data, eval and ask all
    come through here, so the student is served exactly the list it was trained on. Case is fixed (configs
    are written by hand); a repeat or an empty list is refused, since either would change the prompt.
    """
    out: dict[str, str] = {}
    for raw in names:
        name = canonical_name(raw)
        if name in out:
            raise DistillError(f"tool {name!r} is listed twice")
        out[name] = TOOL_DESCRIPTIONS[name]
    if not out:
        raise DistillError("no tools given")
    return out


def build_tools(
    names: Iterable[str], *, wikipedia: Tool | None, llm_model: Any = None, llm_max_tokens: int = 256
) -> dict[str, Tool]:
    """Build the named tools, keyed by canonical name in the order given.

    The Wikipedia backend is passed in already built because choosing it (online, local corpus, per-question
    scope) is the caller's decision; the LLM tool is built here around `llm_model` (a ChatModel).
    """
    return {
        name: _build_one(name, wikipedia=wikipedia, llm_model=llm_model, llm_max_tokens=llm_max_tokens)
        for name in tool_descriptions(names)
    }


def _build_one(name: str, *, wikipedia: Tool | None, llm_model: Any, llm_max_tokens: int = 256) -> Tool:
    if name == "Wikipedia":
        if wikipedia is None:
            raise DistillError("tool 'Wikipedia' is listed but no Wikipedia backend was configured")
        return wikipedia
    if name == "LLM":
        if llm_model is None:
            raise DistillError("tool 'LLM' is listed but no model was given for it")
        from distill.tools.llm_tool import LLMTool

        return LLMTool(llm_model, max_tokens=llm_max_tokens)
    from distill.tools.calculator import Calculator

    return Calculator()
