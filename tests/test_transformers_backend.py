"""The in-process transformers backend with the real SmolLM2: concurrent calls each get their own `generate` and
the answer they would get alone, seeds make sampling reproducible, and stop strings cut the text and its count."""

from __future__ import annotations

import asyncio

import pytest

from distill.llm.transformers_backend import TransformersChat


@pytest.fixture(scope="module")
def chat():
    return TransformersChat("smollm2-135m-instruct")


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?", "Who wrote Hamlet?"]


async def _all(chat, requests):
    return await asyncio.gather(*(chat.chat(m, **kw) for m, kw in requests))


def test_concurrent_greedy_calls_match_single_calls(chat):
    alone = [asyncio.run(_all(chat, [(_ask(q), {"max_tokens": 8})]))[0] for q in QUESTIONS]
    together = asyncio.run(_all(chat, [(_ask(q), {"max_tokens": 8}) for q in QUESTIONS]))
    assert [c.text for c in together] == [c.text for c in alone]
    for q, c in zip(QUESTIONS, together):
        assert c.usage.prompt_tokens == len(chat.prompt_ids(_ask(q)))
        assert 0 < c.usage.completion_tokens <= 8


def test_a_seed_makes_sampling_reproducible_even_when_calls_overlap(chat):
    """The lock holds torch's global seed and the generate together, so an overlapping call cannot reseed it."""
    prompt = _ask("Write a short poem about the sea.")
    kw = {"max_tokens": 12, "temperature": 1.0}
    first = asyncio.run(_all(chat, [(prompt, kw | {"seed": 7})]))[0]
    mixed = asyncio.run(_all(chat, [(prompt, kw | {"seed": s}) for s in (7, 8, 9, 10, 11)]))
    assert mixed[0].text == first.text
    assert len({c.text for c in mixed}) > 1  # other seeds really sample something else


def test_a_stop_string_cuts_the_text_and_the_token_count(chat):
    prompt = "Write the numbers from 1 to 30, one per line, nothing else."
    free = asyncio.run(_all(chat, [(_ask(prompt), {"max_tokens": 40})]))[0]
    assert ", 5" in free.text  # SmolLM2 writes "1, 2, 3, ...": the stop string below is really reached
    stopped = asyncio.run(_all(chat, [(_ask(prompt), {"max_tokens": 40, "stop": [", 5"]})]))[0]
    assert stopped.text.startswith("1, 2") and ", 5" not in stopped.text
    assert stopped.usage.completion_tokens < free.usage.completion_tokens
