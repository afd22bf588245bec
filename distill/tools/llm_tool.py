"""The `LLM` tool: one user message to a chat model, its reply as evidence.

Every completion is kept in `calls` so the agent can charge the tool's tokens and cost to the run (the agent
builds a fresh tool per question, so the list is that question's calls)."""

from __future__ import annotations

from typing import Any


class LLMTool:
    name = "LLM"
    description = (
        "A pretrained LLM like yourself. Useful when you need to act with general world knowledge and common "
        "sense. Prioritize it when you are confident in solving the problem yourself. Input can be any instruction."
    )

    def __init__(self, chat_model: Any, max_tokens: int = 256):
        self.model = chat_model
        self.max_tokens = max_tokens
        self.calls: list[Any] = []  # Completion objects: .text, .usage, .cost_usd, .latency_s, .model

    async def run(self, query: str) -> str:
        messages = [{"role": "user", "content": query}]
        completion = await self.model.chat(messages, temperature=0.0, max_tokens=self.max_tokens)
        self.calls.append(completion)
        return completion.text.strip()
