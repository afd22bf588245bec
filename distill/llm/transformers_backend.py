"""In-process transformers backend: no server needed, so the embedded model works anywhere, offline.

For machines without a vLLM server (`distill ask`, tests). One `generate` per call, one at a time under a lock,
off the event loop's thread: correctness and per-call seeding over throughput, which is the server's job.
"""

from __future__ import annotations

import asyncio
import threading
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.llm.base import Completion, Price, Usage
from distill.llm.embedded import resolve_model_path


class TransformersChat:
    def __init__(self, model: str, price: Price = Price(), dtype: str = "float32", device: str = "cpu"):
        path = resolve_model_path(model)
        self.name = model
        self.price = price
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), device_map=None if device == "cpu" else device
        )
        self._pad = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                     else self.tokenizer.eos_token_id)
        self._lock = threading.Lock()  # torch's global seed and one model: one generate at a time

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The exact token ids the model sees: the chat template with the generation prompt appended."""
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        t0 = time.perf_counter()
        ids = self.prompt_ids(messages)
        text, usage = await asyncio.to_thread(self._generate, ids, temperature, max_tokens, stop, seed)
        return Completion(text, usage, time.perf_counter() - t0, self.price.cost(usage), self.name)

    def _generate(self, ids: list[int], temperature: float, max_tokens: int, stop, seed) -> tuple[str, Usage]:
        kwargs = dict(max_new_tokens=max_tokens, pad_token_id=self._pad)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        with self._lock, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            inputs = torch.tensor([ids], device=self.model.device)
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
        row = out[0, len(ids):].tolist()
        if self.tokenizer.eos_token_id in row:
            row = row[: row.index(self.tokenizer.eos_token_id)]
        text = self.tokenizer.decode(row, skip_special_tokens=True)
        cut = min((text.find(s) for s in stop or [] if s in text), default=-1)
        if cut >= 0:  # count only what a server would have returned before the stop string
            text = text[:cut]
            row = self.tokenizer.encode(text, add_special_tokens=False)
        return text, Usage(len(ids), len(row))
