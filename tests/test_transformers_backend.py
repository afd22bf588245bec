"""The in-process transformers backend with the real SmolLM2: concurrent calls are batched, a batch only mixes
requests that can share one `generate` (sampling mode, stop strings), and batching does not change answers."""

from __future__ import annotations

import asyncio

import pytest

from distill.llm.transformers_backend import TransformersChat


@pytest.fixture(scope="module")
def chat():
    model = TransformersChat("smollm2-135m-instruct", max_batch_size=8)
    yield model
    model.close()


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?", "Who wrote Hamlet?"]


async def _all(chat, requests):
    return await asyncio.gather(*(chat.chat(m, **kw) for m, kw in requests))


def test_concurrent_greedy_calls_share_a_batch_and_match_single_calls(chat):
    alone = [asyncio.run(_all(chat, [(_ask(q), {"max_tokens": 8})]))[0] for q in QUESTIONS]
    chat.batches.clear()
    together = asyncio.run(_all(chat, [(_ask(q), {"max_tokens": 8}) for q in QUESTIONS]))
    assert max(chat.batches) > 1, chat.batches
    assert sum(chat.batches) == len(QUESTIONS)
    assert [c.text for c in together] == [c.text for c in alone]  # left padding is masked out
    for q, c in zip(QUESTIONS, together):
        assert c.usage.prompt_tokens == len(chat.prompt_ids(_ask(q)))
        assert 0 < c.usage.completion_tokens <= 8


def test_a_shared_prompt_prefix_is_computed_once_and_changes_no_answer(chat):
    """The few-shot planner prompt is the same for every question: its keys/values are reused across rows and
    batches, and greedy answers equal those of each prompt run alone without any reuse."""
    from distill.rewoo.prompts import planner_messages
    from distill.tools.registry import TOOL_DESCRIPTIONS

    tools = {k: TOOL_DESCRIPTIONS[k] for k in ("Wikipedia", "LLM")}
    prompts = [planner_messages(q, tools, fewshot=True) for q in QUESTIONS[:3]]
    chat.min_prefix_tokens = 10**9  # reference: no reuse at all
    alone = [asyncio.run(_all(chat, [(m, {"max_tokens": 10})]))[0] for m in prompts]
    chat.min_prefix_tokens, chat.prefix_builds = 64, 0
    chat.batches.clear()
    together = asyncio.run(_all(chat, [(m, {"max_tokens": 10}) for m in prompts]))
    again = asyncio.run(_all(chat, [(m, {"max_tokens": 10}) for m in prompts[:1]]))  # a lone call reuses it too
    assert max(chat.batches) > 1 and chat.prefix_builds == 1, (chat.batches, chat.prefix_builds)
    assert [c.text for c in together] == [c.text for c in alone]
    assert [c.text for c in again] == [c.text for c in alone[:1]]
    assert together[0].usage.prompt_tokens == len(chat.prompt_ids(prompts[0]))


def test_sampling_modes_and_stop_lists_never_share_a_batch(chat):
    chat.batches.clear()
    requests = [(_ask(q), {"max_tokens": 4}) for q in QUESTIONS[:2]]
    requests += [(_ask(q), {"max_tokens": 4, "temperature": 0.8, "seed": 1}) for q in QUESTIONS[:2]]
    requests += [(_ask(q), {"max_tokens": 4, "stop": ["\n"]}) for q in QUESTIONS[:2]]
    asyncio.run(_all(chat, requests))
    assert sum(chat.batches) == 6
    assert len(chat.batches) >= 3 and max(chat.batches) <= 2, chat.batches


def test_a_batch_with_a_stop_string_cuts_every_row_there(chat):
    prompt = "Write the numbers from 1 to 30, one per line, nothing else."
    free = asyncio.run(_all(chat, [(_ask(prompt), {"max_tokens": 40})]))[0]
    assert ", 5" in free.text  # SmolLM2 writes "1, 2, 3, ...": the stop string below is really reached
    chat.batches.clear()
    stopped = asyncio.run(_all(chat, [(_ask(prompt), {"max_tokens": 40, "stop": [", 5"]}) for _ in range(3)]))
    assert sum(chat.batches) == 3 and max(chat.batches) > 1, chat.batches
    for c in stopped:
        assert c.text.startswith("1, 2") and ", 5" not in c.text
        assert c.usage.completion_tokens < free.usage.completion_tokens
