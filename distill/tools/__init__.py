"""Tools the ReWOO Worker can call: each is a `Tool` (name, description, async run(query) -> str)."""

from __future__ import annotations

from distill.tools.base import Tool
from distill.tools.calculator import Calculator
from distill.tools.llm_tool import LLMTool
from distill.tools.registry import TOOL_DESCRIPTIONS, build_tools
from distill.tools.wikipedia import LocalWikipedia, OnlineWikipedia, ScopedWikipedia

__all__ = [
    "Tool",
    "Calculator",
    "LLMTool",
    "LocalWikipedia",
    "OnlineWikipedia",
    "ScopedWikipedia",
    "TOOL_DESCRIPTIONS",
    "build_tools",
]
