"""In-process transformers backend: no server needed, so the embedded model works anywhere, offline.

Concurrent requests are batched: callers await futures while one worker thread takes every pending request
with the same sampling mode and runs them as one left-padded `generate`. On a CPU a batch of 16 costs little
more than one sequence, so a Worker or a generation run with many questions in flight gets near-batch
throughput without a server. The price: a sampled output depends on which requests shared its batch, so
sampling is reproducible only through the call cache (`max_batch_size: 1` restores per-call seeding).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from dataclasses import dataclass, field

from distill.llm.base import Completion, Price, Usage
from distill.llm.embedded import resolve_model_path


@dataclass
class _Request:
    ids: list[int]
    temperature: float
    max_tokens: int
    stop: list[str] | None
    seed: int | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)


class TransformersChat:
    def __init__(
        self,
        model: str,
        price: Price = Price(),
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_size: int = 16,
        min_prefix_tokens: int = 64,
        batch_window_s: float = 0.02,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(model)
        self.name = model
        self.price = price
        self.max_batch_size = max(1, max_batch_size)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), device_map=None if device == "cpu" else device
        )
        self.model.eval()
        self._pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self._cv = threading.Condition()
        self._pending: list[_Request] = []
        self._worker: threading.Thread | None = None
        self._closing = False
        self.batches: list[int] = []  # sizes of the batches run, for benchmarks and tests
        self.batch_window_s = batch_window_s
        self.min_prefix_tokens = min_prefix_tokens  # shorter shared prefixes are prefilled with the rest
        self._prefix: tuple[tuple[int, ...], list] | None = None  # the last shared prefix and its keys/values
        self.prefix_builds = 0
        atexit.register(self.close)

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the batching thread, cutting a running `generate` short: a process exiting (Ctrl-C included)
        must not be torn down while torch is inside a forward pass on another thread."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout_s)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The exact token ids the model sees: the chat template with the generation prompt appended."""
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        req = _Request(self.prompt_ids(messages), temperature, max_tokens, stop, seed, loop, loop.create_future())
        with self._cv:
            self._pending.append(req)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="transformers-batcher", daemon=True)
                self._worker.start()
            self._cv.notify()
        text, usage = await req.future
        return Completion(text, usage, time.perf_counter() - t0, self.price.cost(usage), self.name)

    def _take_batch(self) -> list[_Request]:
        """Oldest request first, plus every pending one with the same sampling mode and stop strings, up to the
        batch size: one shared stop list lets a batch end as soon as every row has hit a stop."""
        with self._cv:
            while not self._pending and not self._closing:
                self._cv.wait()
            # Callers started together (asyncio.gather) arrive one by one, each after tokenizing its prompt:
            # wait while they keep coming (up to 10 windows), else the first would run alone, and a lone
            # 128-token generate costs about as much as a batch of 16.
            deadline = time.monotonic() + 10 * self.batch_window_s
            while len(self._pending) < self.max_batch_size and not self._closing:
                seen, left = len(self._pending), deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(min(self.batch_window_s, left))
                if len(self._pending) == seen:
                    break
            if self._closing:
                return []
            head = self._pending[0]
            batch = [r for r in self._pending if _mode(r) == _mode(head)][: self.max_batch_size]
            for r in batch:
                self._pending.remove(r)
            return batch

    def _serve(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return
            try:
                results = self._generate(batch)
            except Exception as exc:  # every waiting caller gets the error, none hangs
                for r in batch:
                    _deliver(r, _set_exception, exc)
                continue
            for r, res in zip(batch, results):
                _deliver(r, _set_result, res)

    def _inputs(self, batch: list[_Request]):
        """Token ids, attention mask and a KV cache for one `generate`.

        Prompts sharing a long prefix (the few-shot planner and ReAct system prompts, identical for every
        question) are laid out as [prefix][padding][own suffix]: the prefix's keys and values are computed
        once, kept for the next batch, and repeated across the rows, so only the suffixes are prefilled.
        On a CPU, prefill of a ~500-token few-shot prompt is most of a planner call. Masked padding in the
        middle is harmless: positions come from the attention mask's running sum."""
        import torch

        n = self._reusable_prefix(batch)
        if n < self.min_prefix_tokens:
            n = 0  # plain left padding
        prefix = batch[0].ids[:n]
        tail = max(len(r.ids) - n for r in batch)
        ids = [prefix + [self._pad] * (tail - len(r.ids) + n) + r.ids[n:] for r in batch]
        mask = [[1] * n + [0] * (tail - len(r.ids) + n) + [1] * (len(r.ids) - n) for r in batch]
        cache = self._prefix_cache(prefix, len(batch)) if n else None
        dev = self.model.device
        return torch.tensor(ids, device=dev), torch.tensor(mask, device=dev), cache

    def _reusable_prefix(self, batch: list[_Request]) -> int:
        """Length of the prefix to take from the cache: the stored one when every row extends it, else the
        batch's common prefix (never for a lone request: its whole prompt would evict a useful prefix)."""
        if self._prefix is not None:
            stored = self._prefix[0]
            if all(len(r.ids) > len(stored) and tuple(r.ids[: len(stored)]) == stored for r in batch):
                return len(stored)
        if len(batch) < 2:
            return 0
        common = len(os.path.commonprefix([r.ids for r in batch]))  # works on any sequences
        return min(common, min(len(r.ids) for r in batch) - 1)

    def _prefix_cache(self, prefix: list[int], rows: int):
        import torch
        from transformers import DynamicCache

        key = tuple(prefix)
        with torch.inference_mode():
            if self._prefix is None or self._prefix[0] != key:
                out = self.model(torch.tensor([prefix], device=self.model.device), use_cache=True)
                self._prefix = (key, [(layer.keys, layer.values) for layer in out.past_key_values.layers])
                self.prefix_builds += 1
            cache = DynamicCache()
            for i, (k, v) in enumerate(self._prefix[1]):
                cache.update(k.expand(rows, -1, -1, -1).contiguous(), v.expand(rows, -1, -1, -1).contiguous(), i)
        return cache

    def _generate(self, batch: list[_Request]) -> list[tuple[str, Usage]]:
        import torch

        ids, mask, cache = self._inputs(batch)
        width = ids.shape[1]
        head = batch[0]
        kwargs = dict(max_new_tokens=max(r.max_tokens for r in batch), pad_token_id=self._pad)
        if head.temperature > 0:
            kwargs.update(do_sample=True, temperature=head.temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if head.stop:  # every row of the batch has the same stops (_take_batch); a row stops alone
            kwargs.update(stop_strings=list(head.stop), tokenizer=self.tokenizer)
        from transformers import StoppingCriteria, StoppingCriteriaList

        closing = self

        class _OnClose(StoppingCriteria):
            def __call__(self, input_ids, scores, **kw):
                return torch.full((input_ids.shape[0],), closing._closing, dtype=torch.bool, device=input_ids.device)

        with torch.inference_mode():
            if head.seed is not None:
                torch.manual_seed(head.seed)
            out = self.model.generate(
                ids, attention_mask=mask, past_key_values=cache,
                stopping_criteria=StoppingCriteriaList([_OnClose()]), **kwargs,
            )
        self.batches.append(len(batch))
        results = []
        for row, r in zip(out[:, width:].tolist(), batch):
            row = row[: r.max_tokens]
            if self.tokenizer.eos_token_id in row:
                row = row[: row.index(self.tokenizer.eos_token_id)]
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            cut = min((text.find(s) for s in r.stop or [] if s in text), default=-1)
            if cut >= 0:  # count only what a server would have returned before the stop string
                text = text[:cut]
                row = self.tokenizer.encode(text, add_special_tokens=False)
            results.append((text, Usage(len(r.ids), len(row))))
        return results


def _mode(req: _Request) -> tuple:
    return req.temperature, tuple(req.stop or ())


def _deliver(req: _Request, setter, value) -> None:
    try:
        req.loop.call_soon_threadsafe(setter, req.future, value)
    except RuntimeError:  # the caller's event loop is gone (interrupted run): nobody is waiting
        pass


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
