"""Tool names, their planner descriptions and construction from a list of names. The descriptions are
listed verbatim in the planner prompt: changing one changes what the teacher saw and the student learns.

A config may name a tool of its own as `module:Class` (importable from where distill runs): a class with a
`name` (what plans call it), a `description` (its prompt line) and an `async def run(self, query) -> str`,
built with no arguments. Its results go through the run's call cache like Wikipedia's unless the class sets
`cacheable = False`.
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import lru_cache
from typing import Any, Iterable

from distill.core.errors import DistillError
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


# What a plan can call a tool: the plan parser's tool-name grammar.
_TOOL_NAME_RE = re.compile(r"[^\W\d][\w.-]*")


@lru_cache(maxsize=None)
def plugin_tool(spec: str) -> type:
    """The class a `module:Class` entry names, checked before any model is paid: an import error, a missing
    member or a name that plans cannot spell is one line naming the entry."""
    module_name, _, attr = spec.strip().partition(":")
    if not module_name or not attr:
        raise DistillError(f"tool {spec!r}: a tool of your own is written module:Class")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error in the user's module: say which entry and why, in one line
        raise DistillError(f"tool {spec!r}: cannot import {module_name} "
                           f"({type(exc).__name__}: {str(exc)[:200]})") from None
    cls = getattr(module, attr, None)
    if not inspect.isclass(cls):
        raise DistillError(f"tool {spec!r}: {module_name} has no class {attr!r}")
    name, description = getattr(cls, "name", None), getattr(cls, "description", None)
    if not isinstance(name, str) or not _TOOL_NAME_RE.fullmatch(name):
        raise DistillError(f"tool {spec!r}: its `name` must be a word a plan can call as Name[...], not {name!r}")
    if name.lower() in {known.lower() for known in TOOL_DESCRIPTIONS}:
        raise DistillError(f"tool {spec!r}: its name {name!r} is a built-in tool's")
    if not isinstance(description, str) or not description.strip():
        raise DistillError(f"tool {spec!r}: its `description` (the planner prompt's line for it) is empty")
    if not inspect.iscoroutinefunction(getattr(cls, "run", None)):
        raise DistillError(f"tool {spec!r}: it needs `async def run(self, query: str) -> str`")
    return cls


def _resolve(raw: str) -> tuple[str, str]:
    """(canonical name, description) of one config entry: a built-in name in any case, or module:Class."""
    if ":" in raw:
        cls = plugin_tool(raw)
        return cls.name, cls.description.strip()
    by_key = {known.lower(): known for known in TOOL_DESCRIPTIONS}
    name = by_key.get(raw.strip().lower())
    if name is None:
        raise DistillError(f"unknown tool {raw!r}; known tools: {', '.join(TOOL_DESCRIPTIONS)}, or module:Class")
    return name, TOOL_DESCRIPTIONS[name]


def tool_descriptions(names: Iterable[str]) -> dict[str, str]:
    """Name -> description, in the order given, spelled as the registry spells them (configs are written by
    hand). Every stage's prompt tool list comes through here, so the student is served the list it was
    trained on; a repeat or an empty list is refused, since either would change the prompt."""
    out: dict[str, str] = {}
    for raw in names:
        name, description = _resolve(raw)
        if name in out:
            raise DistillError(f"tool {name!r} is listed twice")
        out[name] = description
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
    tools: dict[str, Tool] = {}
    for raw in names:
        name, _ = _resolve(raw)
        tool = made[name] if name in made else _build_plugin(raw)
        if tool is None:
            raise DistillError(f"tool {name!r} is listed but {missing[name]}")
        tools[name] = tool
    tool_descriptions(names)  # the same refusals (a repeat, an empty list) as the prompt's list
    return tools


def _build_plugin(spec: str) -> Tool:
    try:
        return plugin_tool(spec)()
    except Exception as exc:  # the user's constructor: one line, not its traceback
        raise DistillError(f"tool {spec!r}: building it failed ({type(exc).__name__}: {str(exc)[:200]})") from None
