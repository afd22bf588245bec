"""The one interface every tool offers the Worker: a Protocol rather than a base class, so a test double or
a third-party tool only needs the three members."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Tool(Protocol):
    """`run` may raise or return empty text: the Worker turns both into `No evidence found` plus a recorded
    error, so tools report failure honestly instead of inventing evidence."""

    name: str
    description: str

    async def run(self, query: str) -> str: ...
