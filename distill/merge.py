"""Merge a LoRA adapter into its base: `PeftModel.from_pretrained(base).merge_and_unload()`.

The merged folder carries the adapter's tokenizer and chat template (the one used in training), so whatever
loads it applies the prompt format the student learnt.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distill.errors import DistillError
from distill.llm.embedded import resolve_model_path

ADAPTER_INFO = "distill_adapter.json"


def read_json(path: Path) -> dict:
    """A JSON object from a model or adapter folder, or one DistillError line."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DistillError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise DistillError(f"{path}: expected a JSON object")
    return data


def trained_base(adapter_dir: str | Path) -> str | None:
    """The base the adapter was trained on, for merge and serve alike: distill's own record first (it keeps
    the embedded alias, which is portable across machines), then PEFT's adapter_config.json."""
    adapter_dir = Path(adapter_dir)
    for name, key in ((ADAPTER_INFO, "base_model"), ("adapter_config.json", "base_model_name_or_path")):
        if (adapter_dir / name).is_file():
            base = read_json(adapter_dir / name).get(key)
            if isinstance(base, str) and base:
                return base
    return None


def adapter_base(adapter_dir: str | Path, base: str | None = None) -> str:
    """The base to merge into: `base` where given, else the one the adapter was trained on."""
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").exists():
        raise DistillError(f"{adapter_dir}: no adapter_config.json (not a LoRA adapter folder)")
    base = base or trained_base(adapter_dir)
    if not base:
        raise DistillError(f"{adapter_dir / 'adapter_config.json'}: base_model_name_or_path is empty; pass --base")
    return base


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path, base: str | None = None, dtype: str = "auto") -> Path:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir, out = Path(adapter_dir), Path(out_dir)
    base_path = resolve_model_path(adapter_base(adapter_dir, base))
    try:
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)  # "float32" etc.: transformers maps it
    except OSError as exc:
        raise DistillError(f"cannot load base model {base_path!r}: {str(exc).splitlines()[0]}") from None
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    tokenizer_src = adapter_dir if (adapter_dir / "tokenizer_config.json").exists() else Path(base_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_src))
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)  # writes chat_template.jinja
    return out


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("adapter", help="adapter folder written by `distill train` (adapter_config.json)")
    parser.add_argument("--out", required=True, help="folder for the merged model")
    parser.add_argument("--base", default=None, help="base model (HF id, folder or embedded alias) to merge into")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def main(args: argparse.Namespace) -> int:
    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    print(f"merged model written to {out}")
    return 0
