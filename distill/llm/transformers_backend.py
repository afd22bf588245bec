"""In-process transformers backend: no server needed, so the embedded model works anywhere, offline.

Generation runs in a worker thread under a lock: one model, one forward pass at a time, while the event loop
keeps the tools of other questions moving.
"""

from __future__ import annotations

import asyncio
import threading
import time

from distill.llm.base import Completion, Price, Usage
from distill.llm.embedded import resolve_model_path


class TransformersChat:
    def __init__(self, model: str, price: Price = Price(), dtype: str = "float32", device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(model)
        self.name = model
        self.price = price
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), device_map=None if device == "cpu" else device
        )
        self.model.eval()
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The exact token ids the model sees: the chat template with the generation prompt appended."""
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def _generate(self, messages, temperature, max_tokens, stop, seed) -> tuple[str, Usage]:
        import torch

        ids = torch.tensor([self.prompt_ids(messages)], device=self.model.device)
        kwargs = dict(max_new_tokens=max_tokens, pad_token_id=self.tokenizer.eos_token_id)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stop:
            kwargs.update(stop_strings=stop, tokenizer=self.tokenizer)
        with self._lock, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        new = out[0][ids.shape[1]:]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        for s in stop or []:
            text = text.split(s)[0]
        return text, Usage(ids.shape[1], int(new.shape[0]))

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        t0 = time.perf_counter()
        text, usage = await asyncio.to_thread(self._generate, messages, temperature, max_tokens, stop, seed)
        return Completion(text, usage, time.perf_counter() - t0, self.price.cost(usage), self.name)
