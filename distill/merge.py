"""Merge a LoRA adapter into its base: `PeftModel.from_pretrained(base).merge_and_unload()`.

The merged folder carries the adapter's tokenizer and chat template (the one used in training), so whatever
loads it applies the prompt format the student learnt.
"""

from __future__ import annotations

import json
from pathlib import Path

from distill.errors import DistillError

ADAPTER_INFO = "distill_adapter.json"


def adapter_base(adapter_dir: str | Path) -> str:
    """The base the adapter was trained on: distill's own record first (it keeps the embedded alias, which is
    portable across machines), then PEFT's adapter_config.json."""
    adapter_dir = Path(adapter_dir)
    info = adapter_dir / ADAPTER_INFO
    if info.exists():
        base = json.loads(info.read_text()).get("base_model")
        if base:
            return base
    config = adapter_dir / "adapter_config.json"
    if not config.exists():
        raise DistillError(f"{adapter_dir}: no adapter_config.json (not a LoRA adapter folder)")
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise DistillError(f"{config}: base_model_name_or_path is empty; pass --base")
    return base


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path, base: str | None = None, dtype: str = "auto") -> Path:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.llm.embedded import resolve_model_path

    adapter_dir, out = Path(adapter_dir), Path(out_dir)
    if not (adapter_dir / "adapter_config.json").exists():
        raise DistillError(f"{adapter_dir}: no adapter_config.json (not a LoRA adapter folder)")
    base_path = resolve_model_path(base or adapter_base(adapter_dir))
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype)
    except OSError as exc:
        raise DistillError(f"cannot load base model {base_path!r}: {str(exc).splitlines()[0]}") from None
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    tokenizer_src = adapter_dir if (adapter_dir / "tokenizer_config.json").exists() else Path(base_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_src))
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)  # writes chat_template.jinja
    if not (out / "chat_template.jinja").exists() and tokenizer.chat_template:
        (out / "chat_template.jinja").write_text(tokenizer.chat_template)
    return out
