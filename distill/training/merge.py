"""Merge a LoRA adapter into its base: `PeftModel.from_pretrained(base).merge_and_unload()`.

The merged folder carries the adapter's tokenizer and chat template (the one used in training), so whatever
loads it applies the prompt format the student learnt.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from distill.core import layout
from distill.core.errors import DistillError
from distill.core.store import read_json
from distill.llm.embedded import resolve_model_path

ADAPTER_INFO = "distill_adapter.json"


_JSON_KINDS = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def lora_patterns(config_path: Path, cfg: dict) -> dict[str, dict[str, int | float]]:
    """PEFT's per-module overrides in adapter_config.json (`rank_pattern`: {module name pattern: rank},
    `alpha_pattern`: {pattern: alpha}), checked before PEFT or vLLM reads them: a hand-edited file of another
    shape would fail deep inside either with a traceback. Null or absent is no override."""
    rules = {"rank_pattern": ("ranks (whole numbers from 1)", lambda v: type(v) is int and v >= 1),
             "alpha_pattern": ("alphas (finite numbers)",
                               lambda v: type(v) in (int, float) and math.isfinite(v))}
    out: dict[str, dict[str, int | float]] = {}
    for key, (what, fits) in rules.items():
        value = cfg.get(key)
        if value is None:
            out[key] = {}
            continue
        example = '{"q_proj": 16}'
        if not isinstance(value, dict):
            raise DistillError(f"{config_path}: {key} must map module names to {what}, e.g. {example}; it is "
                               f"{_JSON_KINDS.get(type(value), 'a value')}")
        for name, item in value.items():
            if not fits(item):
                shown = repr(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else \
                    _JSON_KINDS.get(type(item), "a value")
                raise DistillError(f"{config_path}: {key} maps {name!r:.60} to {shown}; it must map module names "
                                   f"to {what}, e.g. {example}")
        out[key] = value
    return out


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


def training_record(adapter_dir: str | Path) -> dict:
    """What `distill train` recorded about the adapter in `distill_adapter.json` ({} without one). The prompt,
    tools, teacher and data are copied there at train time, so the folder describes itself wherever it is
    moved; an adapter recorded before that falls back to its SFT data's summary.json while that is reachable."""
    path = Path(adapter_dir) / ADAPTER_INFO
    info = read_json(path) if path.is_file() else {}
    if info.get("student_prompt") is None and info.get("dataset_dir"):
        summary = Path(str(info["dataset_dir"])) / layout.SUMMARY
        if summary.is_file():
            found = read_json(summary)
            splits = found.get("splits") if isinstance(found.get("splits"), dict) else {}
            info = {"student_prompt": found.get("student_prompt"),
                    "tools": found.get("tool_descriptions") or found.get("tools"),
                    "train_examples": (splits.get("train") or {}).get("examples"),
                    "train_questions": (splits.get("train") or {}).get("questions"),
                    "validation_examples": (splits.get("validation") or {}).get("examples")} | info
    return info


def trained_prompt(adapter_dir: str | Path) -> tuple[str | None, list[str] | None, dict[str, str] | None]:
    """(prompt kind, tool names, {name: description} where recorded) the adapter was trained on; None where
    its records do not say."""
    info = training_record(adapter_dir)
    tools = info.get("tools")
    names = list(tools) if isinstance(tools, (dict, list)) and tools else None
    return info.get("student_prompt"), names, tools if isinstance(tools, dict) and tools else None


# a part of a student's prompt: its kind, or its tool list ({name: description}, or the names)
PromptPart = str | Mapping[str, str] | Sequence[str]


def same_as_trained(trained: PromptPart, sent: PromptPart) -> bool:
    """Whether a student is sent what it was trained on, one part of its prompt at a time: the prompt kind, or the
    tool list. Every "as trained" check decides through here, an adapter's record after training as a student's
    sft_data settings before it, so they cannot disagree on what counts as the same prompt. Tools compare by
    their descriptions where the training side recorded them ({name: description}: the prompt shows them), else
    by their names in order."""
    if isinstance(trained, str):
        return trained == sent
    if isinstance(trained, Mapping):
        return dict(trained) == dict(sent)
    return list(trained) == list(sent)


def check_as_trained(adapter_dir: str | Path, prompt: str, tools: dict[str, str], who: str) -> None:
    """A student asked with another prompt kind or tool list than it was trained on answers a prompt it never
    saw (and plans with tools it has no line for): refused in one line naming both. An adapter whose records do
    not say passes (nothing to compare)."""
    kind, names, descriptions = trained_prompt(adapter_dir)
    if kind is None or names is None:
        return
    same_tools = same_as_trained(descriptions or names, tools)
    if not same_as_trained(kind, prompt) or not same_tools:
        raise DistillError(
            f"{who} asks adapter {adapter_dir} with planner prompt {prompt} and tools {', '.join(tools)}, but it "
            f"was trained on prompt {kind} with tools {', '.join(names)}"
            + ("" if same_tools or list(tools) != names else " (same names, other descriptions)")
            + ": use those (the adapter's distill_adapter.json says so)")


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
    config_path = adapter_dir / "adapter_config.json"
    lora_patterns(config_path, read_json(config_path))  # one line now, not a traceback inside PEFT
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


if __name__ == "__main__":  # `python -m distill.training.merge` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
