"""Serving the student planner with vLLM: the command line, the adapter checks, and (slow) a real server.

The unit tests build adapter folders on disk the way PEFT writes them (adapter_config.json beside the
weights) and read the argv that would start vLLM. The slow tests train nothing: they wrap the real SmolLM2
weights in a freshly initialised, slightly perturbed LoRA adapter (tests/conftest.py) served by the session's
vLLM server; the tests of a server's own start, failure and stop start their own.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from distill.core.errors import DistillError
from distill.serving.serve import (
    ServeConfig,
    VLLMServer,
    allowed_lora_ranks,
    build_command,
    cpu_dtype,
    cpu_flags,
    canonical_model,
    check_adapter_base,
    format_command,
    free_port,
    lora_rank_for,
    model_name,
    port_is_free,
    read_adapter,
    secret_values,
)

ROOT = Path(__file__).resolve().parents[1]
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.11's MaxLoRARanks, for rounding tests
ARCH = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "max_position_embeddings": 8192}


def make_model(folder: Path, *, template: str | None = "{{ base }}", tokenizer: bool = True, **arch) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**ARCH, **arch}))
    (folder / "model.safetensors").write_bytes(b"")
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def make_adapter(
    folder: Path, base: str | None, *, r: int = 8, template: str | None = "{{ adapter }}", **extra
) -> Path:
    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": r, "lora_alpha": 16, "base_model_name_or_path": base, **extra}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return make_model(tmp_path / "base")


@pytest.fixture
def adapter(tmp_path: Path, base: Path) -> Path:
    return make_adapter(tmp_path / "adapter", str(base), r=16)


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


# ---------------------------------------------------------------- build_command


def test_lora_flags_and_rank_come_from_the_adapter(base: Path, adapter: Path) -> None:
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter)), "cpu")
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--model") == str(base.resolve())
    assert "--enable-lora" in argv
    assert flag(argv, "--lora-modules") == f"planner={adapter.resolve()}"
    assert flag(argv, "--max-lora-rank") == "16"
    assert flag(argv, "--served-model-name") == str(base)
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "8000"
    assert model_name(ServeConfig(base_model=str(base), adapter=str(adapter))) == "planner"


def test_lora_name_is_configurable(base: Path, adapter: Path) -> None:
    cfg = ServeConfig(base_model=str(base), adapter=str(adapter), lora_name="student")
    assert cfg.adapter is None and cfg.adapters == {"student": str(adapter)}  # one shape from the validator on
    argv, _ = build_command(cfg, "cpu")
    assert flag(argv, "--lora-modules").startswith("student=")
    assert model_name(cfg) == "student"


def test_several_adapters_are_lora_modules_of_one_server_at_the_largest_rank(tmp_path: Path, base: Path,
                                                                              adapter: Path) -> None:
    compact = make_adapter(tmp_path / "compact", str(base), r=8)
    cfg = ServeConfig(base_model=str(base), adapters={"student": str(adapter), "student_compact": str(compact)})
    argv, _ = build_command(cfg, "cpu")
    i = argv.index("--lora-modules")
    assert argv[i + 1:i + 3] == [f"student={adapter.resolve()}", f"student_compact={compact.resolve()}"]
    assert argv[i + 3].startswith("--")  # nothing else is read as a module
    assert flag(argv, "--max-lora-rank") == "16" and flag(argv, "--max-loras") == "2"
    assert argv.count("--enable-lora") == 1 and model_name(cfg) == "student"
    assert flag(build_command(ServeConfig(base_model=str(base), adapter=str(adapter)), "cpu")[0], "--max-loras") == "1"


def test_max_loras_makes_room_for_modules_loaded_at_runtime(base: Path, adapter: Path) -> None:
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter), max_loras=2), "cpu")
    assert flag(argv, "--max-loras") == "2"


def test_a_module_loaded_at_runtime_is_refused_what_a_restart_would_refuse(tmp_path: Path, base: Path,
                                                                           adapter: Path) -> None:
    """Checked before any HTTP: the server is not started here (the flywheel's end-to-end test loads a module
    into a real vLLM)."""
    server = VLLMServer(ServeConfig(base_model=str(base), adapters={"round_0": str(adapter)}))
    wider = make_adapter(tmp_path / "wider", str(base), r=32)
    with pytest.raises(DistillError, match="LoRA module round_1: rank r=32 is above the rank this server was "
                                           "started with"):
        server.load_adapter("round_1", wider)
    other = make_adapter(tmp_path / "other", str(base), r=8, template="{{ other }}")
    with pytest.raises(DistillError, match="carry different chat templates"):
        server.load_adapter("round_1", other)
    with pytest.raises(DistillError, match="already serves"):
        server.load_adapter("round_0", adapter)
    alien = make_adapter(tmp_path / "alien", str(make_model(tmp_path / "big", hidden_size=1024)))
    with pytest.raises(DistillError, match="hidden_size"):
        server.load_adapter("round_1", alien)
    same = make_adapter(tmp_path / "same", str(base), r=8)
    with pytest.raises(DistillError, match="has not been started"):  # every check passed
        server.load_adapter("round_1", same)
    assert list(server.cfg.adapters) == ["round_0"]


def test_a_module_path_with_a_comma_is_passed_as_json(tmp_path: Path, base: Path) -> None:
    odd = make_adapter(tmp_path / "a,b", str(base))
    argv, _ = build_command(ServeConfig(base_model=str(base), adapters={"s": str(odd)}), "cpu")
    assert json.loads(flag(argv, "--lora-modules")) == {"name": "s", "path": str(odd.resolve())}


def test_every_adapter_is_checked_and_the_error_names_its_module(tmp_path: Path, base: Path, adapter: Path) -> None:
    other = make_adapter(tmp_path / "other", str(make_model(tmp_path / "big", hidden_size=1024)))
    cfg = ServeConfig(base_model=str(base), adapters={"student": str(adapter), "student_compact": str(other)})
    with pytest.raises(DistillError, match="^LoRA module student_compact: the adapter was trained on .*hidden_size"):
        build_command(cfg, "cpu")
    cfg = ServeConfig(base_model=str(base), adapters={"student": str(adapter), "gone": str(tmp_path / "nope")})
    with pytest.raises(DistillError, match="^LoRA module gone: adapter not found"):
        build_command(cfg, "cpu")
    cfg = ServeConfig(base_model=str(base), adapters={"a": str(adapter), "b": str(adapter)}, max_lora_rank=8)
    with pytest.raises(DistillError, match="r=16 exceeds max_lora_rank=8"):
        build_command(cfg, "cpu")


def test_adapters_with_different_chat_templates_are_refused_unless_one_is_set(tmp_path: Path, base: Path,
                                                                               adapter: Path) -> None:
    same = make_adapter(tmp_path / "same", str(base), r=8, template="{{ adapter }}")
    argv, _ = build_command(ServeConfig(base_model=str(base), adapters={"a": str(adapter), "b": str(same)}), "cpu")
    assert flag(argv, "--chat-template") == str(adapter.resolve() / "chat_template.jinja")
    differs = make_adapter(tmp_path / "differs", str(base), template="{{ other }}")
    cfg = ServeConfig(base_model=str(base), adapters={"a": str(adapter), "b": str(differs)})
    with pytest.raises(DistillError, match="LoRA modules a, b carry different chat templates"):
        build_command(cfg, "cpu")
    argv, _ = build_command(cfg.model_copy(update={"chat_template": str(adapter / "chat_template.jinja")}), "cpu")
    assert flag(argv, "--chat-template") == str((adapter / "chat_template.jinja").resolve())


@pytest.mark.parametrize(("fields", "message"), [
    ({"adapter": "x", "adapters": {"planner": "y"}}, "not both; to replace a config file's adapter"),
    ({"adapter": "x", "adapters": {"other": "y"}}, "not both; to replace a config file's adapter"),
    ({"adapters": {"student": "y"}, "served_model_name": "student"}, "also a LoRA module's name"),
    ({"adapters": {"base-m": "y"}, "base_model": "base-m"}, "also a LoRA module's name"),  # the default served name
    ({"adapters": {"a=b": "y"}}, "not a LoRA module name"),
    ({"adapters": {"../up": "y"}}, "not a LoRA module name"),
    ({"adapters": {"a": "y"}, "merged_model": "m"}, "not both"),
])
def test_module_names_must_be_distinct_and_plain(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServeConfig(**fields)


@pytest.mark.parametrize(
    ("r", "requested", "expected"), [(8, None, 8), (12, None, 16), (2, None, 8), (16, 40, 64), (64, 64, 64)]
)
def test_max_lora_rank_rounds_up_to_a_rank_vllm_accepts(r: int, requested: int | None, expected: int) -> None:
    assert lora_rank_for(r, requested, VLLM_RANKS) == expected


def test_rank_pattern_raises_the_rank(tmp_path: Path, base: Path) -> None:
    path = make_adapter(tmp_path / "a", str(base), r=8, rank_pattern={"q_proj": 48})
    assert read_adapter(path).rank == 48
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(path)), "cpu")
    assert flag(argv, "--max-lora-rank") == "64"


def test_rank_above_an_explicit_max_is_refused(tmp_path: Path, base: Path) -> None:
    path = make_adapter(tmp_path / "a", str(base), r=32)
    with pytest.raises(DistillError, match=r"r=32 exceeds max_lora_rank=16"):
        build_command(ServeConfig(base_model=str(base), adapter=str(path), max_lora_rank=16), "cpu")


def test_rank_above_what_vllm_serves_is_refused() -> None:
    with pytest.raises(DistillError, match="largest rank vLLM serves"):
        lora_rank_for(1024, None, VLLM_RANKS)


def test_allowed_ranks_are_read_from_the_installed_vllm() -> None:
    ranks = allowed_lora_ranks()
    assert ranks == tuple(sorted(ranks))
    assert {8, 16, 32, 64}.issubset(ranks)


def test_without_vllm_the_rank_is_left_to_vllm_itself() -> None:
    import distill.serving.serve as serve

    serve.allowed_lora_ranks.cache_clear()
    try:
        saved, sys.modules["vllm.config.lora"] = sys.modules.get("vllm.config.lora"), None  # import fails
        assert serve.allowed_lora_ranks() is None
        assert lora_rank_for(12, None) == 12 and lora_rank_for(12, 40) == 40
    finally:
        if saved is None:
            del sys.modules["vllm.config.lora"]
        else:
            sys.modules["vllm.config.lora"] = saved
        serve.allowed_lora_ranks.cache_clear()


def test_cpu_flags(base: Path, adapter: Path) -> None:
    cfg = ServeConfig(base_model=str(base), adapter=str(adapter), cpu_kvcache_space_gb=3)
    argv, env = build_command(cfg, "cpu")
    assert flag(argv, "--dtype") == cpu_dtype()
    assert "--enforce-eager" in argv
    assert "--gpu-memory-utilization" not in argv and "--tensor-parallel-size" not in argv
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_cpu_dtype_follows_native_bf16_support(tmp_path: Path) -> None:
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    sapphire = tmp_path / "spr"
    sapphire.write_text("processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
    graviton = tmp_path / "arm"
    graviton.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert cpu_flags(str(avx2)) == {"fpu", "sse", "avx", "avx2", "fma"}
    assert cpu_dtype(cpu_flags(str(avx2))) == "float32"
    assert cpu_dtype(cpu_flags(str(sapphire)), env={}) == "bfloat16"
    # torch capped below AVX-512 (an AVX2 machine's kernels) has no native bf16 either
    assert cpu_dtype(cpu_flags(str(sapphire)), env={"ATEN_CPU_CAPABILITY": "avx2"}) == "float32"
    assert cpu_dtype(cpu_flags(str(sapphire)), env={"ATEN_CPU_CAPABILITY": "avx512"}) == "bfloat16"
    assert cpu_dtype(cpu_flags(str(graviton)), env={}) == "bfloat16"
    assert cpu_dtype(cpu_flags(str(tmp_path / "missing"))) == "float32"


def test_cpu_prefills_whole_prompts(tmp_path: Path, base: Path, adapter: Path) -> None:
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter)), "cpu")
    assert "--no-enable-chunked-prefill" in argv
    assert flag(argv, "--max-num-batched-tokens") == "8192"  # the model's context: the longest prompt fits
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter), max_model_len=1024), "cpu")
    assert flag(argv, "--max-num-batched-tokens") == "2048"  # never below vLLM's CPU default
    cfg = ServeConfig(base_model=str(base), adapter=str(adapter), extra_args=["--max-num-batched-tokens=65536"])
    argv, _ = build_command(cfg, "cpu")
    assert argv.count("--max-num-batched-tokens") == 0 and "--max-num-batched-tokens=65536" in argv
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter), chunked_prefill=True), "cpu")
    assert "--enable-chunked-prefill" in argv and "--no-enable-chunked-prefill" not in argv
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter)), "gpu")
    assert "--no-enable-chunked-prefill" not in argv and "--max-num-batched-tokens" not in argv
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter), chunked_prefill=False), "gpu")
    assert "--no-enable-chunked-prefill" in argv


def test_cpu_without_a_known_context_length_asks_for_max_model_len(tmp_path: Path) -> None:
    bare = make_model(tmp_path / "bare", max_position_embeddings=None)
    with pytest.raises(DistillError, match="set max_model_len"):
        build_command(ServeConfig(base_model=str(bare)), "cpu")
    argv, _ = build_command(ServeConfig(base_model=str(bare), max_model_len=4096), "cpu")
    assert flag(argv, "--max-num-batched-tokens") == "4096"


def test_explicit_dtype_wins(base: Path, adapter: Path) -> None:
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter), dtype="bfloat16"), "cpu")
    assert flag(argv, "--dtype") == "bfloat16"


def test_gpu_flags(base: Path, adapter: Path) -> None:
    cfg = ServeConfig(
        base_model=str(base), adapter=str(adapter), gpu_memory_utilization=0.85, tensor_parallel_size=2,
        max_model_len=4096,
    )
    argv, env = build_command(cfg, "gpu")
    assert flag(argv, "--gpu-memory-utilization") == "0.85"
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--max-model-len") == "4096"
    assert flag(argv, "--dtype") == "auto"
    assert "--enforce-eager" not in argv
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_explicit_dtype_and_eager_win_over_the_platform_defaults(base: Path, adapter: Path) -> None:
    cfg = ServeConfig(base_model=str(base), adapter=str(adapter), dtype="float16", enforce_eager=True)
    argv, _ = build_command(cfg, "gpu")
    assert flag(argv, "--dtype") == "float16" and "--enforce-eager" in argv
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter), enforce_eager=False), "cpu")
    assert "--enforce-eager" not in argv


def test_extra_args_and_env_pass_through(base: Path, adapter: Path) -> None:
    cfg = ServeConfig(
        base_model=str(base), adapter=str(adapter), extra_args=["--max-num-seqs", "64", "--seed", "1"],
        env={"OMP_NUM_THREADS": "2"},
    )
    argv, env = build_command(cfg, "cpu")
    assert argv[-4:] == ["--max-num-seqs", "64", "--seed", "1"]
    assert env["OMP_NUM_THREADS"] == "2"


def test_a_small_idle_cpu_machine_gives_the_model_every_core(base: Path, adapter: Path, monkeypatch) -> None:
    """vLLM's own rule keeps one core per engine process off the model: on 2 cores it serves on one. Up to
    SMALL_MACHINE_CORES, on a machine no other process keeps busy, the server gets VLLM_CPU_NUM_OF_RESERVED_CPU=0
    and passive OpenMP waiting; above, or beside busy processes, or for LoRA modules in bfloat16, vLLM's rule
    stands; the setting and exported variables win; a GPU server is left alone. What was chosen is what `binding`
    records."""
    import distill.serving.serve as serve

    for name in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(serve, "busy_cores", lambda: 0.1)
    monkeypatch.setattr(serve, "usable_cores", lambda: 2)
    lora_bf16 = ServeConfig(base_model=str(base), adapter=str(adapter), dtype="bfloat16")
    assert not {"VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_WAIT_POLICY"} & set(build_command(lora_bf16, "cpu")[1])
    no_lora_bf16 = ServeConfig(base_model=str(base), dtype="bfloat16")
    assert build_command(no_lora_bf16, "cpu")[1]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    monkeypatch.setattr(serve, "cpu_dtype", lambda: "bfloat16")  # the dtype distill picks on a CPU with bf16
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in build_command(ServeConfig(base_model=str(base), adapter=str(adapter)),
                                                               "cpu")[1]
    cfg = ServeConfig(base_model=str(base), adapter=str(adapter), dtype="float32")
    for cores, expected in ((1, "0"), (2, "0"), (4, "0"), (5, None), (64, None)):
        monkeypatch.setattr(serve, "usable_cores", lambda cores=cores: cores)
        env = build_command(cfg, "cpu")[1]
        assert env.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == expected, cores
        assert env.get("OMP_WAIT_POLICY") == ("PASSIVE" if expected else None), cores
        assert serve.cpu_binding(env, "cpu") == {
            "cores": cores, "omp_threads_bind": "auto", "omp_wait_policy": "PASSIVE" if expected else "default",
            "reserved_cores": int(expected) if expected else "vllm's rule"}
        assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in build_command(cfg, "gpu")[1]
    assert serve.cpu_binding({}, "gpu") is None
    monkeypatch.setattr(serve, "usable_cores", lambda: 2)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in format_command(*build_command(cfg, "cpu"))  # what --dry-run prints
    monkeypatch.setattr(serve, "busy_cores", lambda: 1.5)  # two busy processes beside it: vLLM's rule
    assert not {"VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_WAIT_POLICY"} & set(build_command(cfg, "cpu")[1])
    pinned = ServeConfig(base_model=str(base), adapter=str(adapter), cpu_reserved_cores=1)
    assert build_command(pinned, "cpu")[1]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    every = ServeConfig(base_model=str(base), adapter=str(adapter), dtype="bfloat16", cpu_reserved_cores=0)
    assert build_command(every, "cpu")[1]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"  # the setting wins for LoRA too
    monkeypatch.setattr(serve, "busy_cores", lambda: 0.0)
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # the user's own choice reaches vLLM untouched
    env = build_command(cfg, "cpu")[1]
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in env and serve.cpu_binding(env, "cpu")["reserved_cores"] == 1
    with pytest.raises(Exception, match="cpu_reserved_cores"):
        ServeConfig(cpu_reserved_cores=-1)


def test_check_and_dry_run_show_the_binding_the_server_will_start_with(base: Path, adapter: Path, monkeypatch,
                                                                        capsys) -> None:
    """A stage's server gets its adapters once they are trained, after `--check`: its line must still show the
    binding chosen for a server of LoRA modules, and say so in words where vLLM's own binding stands."""
    import distill.serving.serve as serve
    from distill.cli import main

    for name in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(serve, "busy_cores", lambda: 0.0)
    monkeypatch.setattr(serve, "usable_cores", lambda: 2)
    lines = {}
    for dtype in ("bfloat16", "float32"):
        cfg = ServeConfig(base_model=str(base), adapters={"student": str(adapter)}, dtype=dtype, device="cpu")
        serve.show_would_run("student_server", cfg, {}, world=None, gpus=None)
        lines[dtype] = capsys.readouterr().out
        assert main(["serve", "--dry-run", "--set", f"base_model={base}", "--set", f"adapter={adapter}", "--set",
                     "device=cpu", "--set", f"dtype={dtype}"]) == 0
        dry = capsys.readouterr().out.splitlines()[0]
        assert ("# vLLM's own CPU binding" in dry) == (dtype == "bfloat16"), dry
    assert "student=" in lines["bfloat16"] and "# vLLM's own CPU binding" in lines["bfloat16"]
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in lines["bfloat16"]
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in lines["float32"] and "# vLLM" not in lines["float32"]


def test_busy_cores_sees_a_busy_process() -> None:
    """The sample of /proc/stat counts what other processes keep busy: one spinning process is about a core."""
    from distill.serving.serve import busy_cores

    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat on this platform")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        stat = Path(f"/proc/{hog.pid}/stat")
        while int(stat.read_text().rsplit(")", 1)[1].split()[11]) < 10:  # past its start-up: 10 ticks of CPU spent
            pass
        busy = busy_cores(0.5)
    finally:
        hog.kill()
        hog.wait()
    assert busy >= 0.6, busy
    assert busy_cores(0.1, stat="/nonexistent") == 0.0


def test_merged_mode_serves_weights_without_lora(tmp_path: Path) -> None:
    merged = make_model(tmp_path / "merged", template="{{ merged }}")
    cfg = ServeConfig(merged_model=str(merged))
    argv, _ = build_command(cfg, "cpu")
    assert flag(argv, "--model") == str(merged.resolve())
    assert "--enable-lora" not in argv and "--lora-modules" not in argv and "--max-lora-rank" not in argv
    assert flag(argv, "--served-model-name") == "planner" == model_name(cfg)
    assert flag(argv, "--chat-template") == str(merged.resolve() / "chat_template.jinja")
    named = ServeConfig(merged_model=str(merged), served_model_name="student")
    assert flag(build_command(named, "cpu")[0], "--served-model-name") == "student" == model_name(named)


def test_merged_mode_checks_the_folder(tmp_path: Path, base: Path, adapter: Path) -> None:
    with pytest.raises(DistillError, match="merged_model not found"):
        build_command(ServeConfig(merged_model=str(tmp_path / "nope")), "cpu")
    bare = make_model(tmp_path / "bare", tokenizer=False)
    with pytest.raises(DistillError, match="no tokenizer files"):
        build_command(ServeConfig(merged_model=str(bare)), "cpu")
    with pytest.raises(DistillError, match="is a LoRA adapter"):
        build_command(ServeConfig(merged_model=str(adapter)), "cpu")
    with pytest.raises(ValueError, match="not both"):
        ServeConfig(adapter=str(adapter), merged_model=str(bare))


def test_base_and_lora_module_need_different_names(adapter: Path) -> None:
    with pytest.raises(ValueError, match="also a LoRA module's name"):
        ServeConfig(adapter=str(adapter), served_model_name="planner")


def test_base_only_mode_uses_the_served_name(base: Path) -> None:
    cfg = ServeConfig(base_model=str(base), served_model_name="teacher")
    argv, _ = build_command(cfg, "cpu")
    assert "--enable-lora" not in argv
    assert flag(argv, "--served-model-name") == "teacher" == model_name(cfg)


# ---------------------------------------------------------------- chat template


def test_chat_template_is_the_adapters_when_it_has_one(base: Path, adapter: Path) -> None:
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter)), "cpu")
    assert flag(argv, "--chat-template") == str(adapter.resolve() / "chat_template.jinja")


def test_chat_template_falls_back_to_the_base(tmp_path: Path, base: Path) -> None:
    path = make_adapter(tmp_path / "a", str(base), template=None)
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(path)), "cpu")
    assert flag(argv, "--chat-template") == str(base.resolve() / "chat_template.jinja")


def test_chat_template_from_an_older_tokenizer_config(tmp_path: Path, base: Path) -> None:
    path = make_adapter(tmp_path / "a", str(base), template=None)
    template = "{% for m in messages %}{{ m }}{% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(path)), "cpu")
    assert flag(argv, "--chat-template") == template


def test_explicit_chat_template_wins(tmp_path: Path, base: Path, adapter: Path) -> None:
    own = tmp_path / "mine.jinja"
    own.write_text("{{ mine }}")
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(adapter), chat_template=str(own)), "cpu")
    assert flag(argv, "--chat-template") == str(own.resolve())
    with pytest.raises(DistillError, match="chat_template not found"):
        build_command(ServeConfig(base_model=str(base), adapter=str(adapter), chat_template="missing.jinja"), "cpu")


def test_no_template_anywhere_leaves_vllm_its_default(tmp_path: Path) -> None:
    bare_base = make_model(tmp_path / "b", template=None)
    path = make_adapter(tmp_path / "a", str(bare_base), template=None)
    argv, _ = build_command(ServeConfig(base_model=str(bare_base), adapter=str(path)), "cpu")
    assert "--chat-template" not in argv


# ---------------------------------------------------------------- adapter and base checks


def test_missing_adapter_is_a_clear_error(tmp_path: Path, base: Path) -> None:
    with pytest.raises(DistillError, match="adapter not found"):
        build_command(ServeConfig(base_model=str(base), adapter=str(tmp_path / "nope")), "cpu")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DistillError, match="no adapter_config.json"):
        read_adapter(empty)
    with pytest.raises(DistillError, match="use merged_model"):
        read_adapter(base)


def test_unservable_adapters_are_refused(tmp_path: Path, base: Path) -> None:
    with pytest.raises(DistillError, match="DoRA"):
        read_adapter(make_adapter(tmp_path / "dora", str(base), use_dora=True))
    with pytest.raises(DistillError, match="LoRA adapters only"):
        read_adapter(make_adapter(tmp_path / "ia3", str(base), peft_type="IA3"))
    no_weights = make_adapter(tmp_path / "nw", str(base))
    (no_weights / "adapter_model.safetensors").unlink()
    with pytest.raises(DistillError, match="no adapter_model"):
        read_adapter(no_weights)
    broken = make_adapter(tmp_path / "broken", str(base))
    (broken / "adapter_config.json").write_text("{not json")
    with pytest.raises(DistillError, match="cannot read"):
        read_adapter(broken)


def test_adapter_for_a_different_architecture_is_refused(tmp_path: Path, base: Path) -> None:
    other = make_model(tmp_path / "bigger", hidden_size=960, num_hidden_layers=32)
    path = make_adapter(tmp_path / "a", str(other))
    with pytest.raises(DistillError, match=r"does not fit base_model .*hidden_size 960 vs 576"):
        build_command(ServeConfig(base_model=str(base), adapter=str(path)), "cpu")
    argv, _ = build_command(ServeConfig(base_model=str(base), adapter=str(path), check_base_model=False), "cpu")
    assert "--enable-lora" in argv


def test_same_architecture_in_another_folder_is_accepted(tmp_path: Path, base: Path) -> None:
    copy = make_model(tmp_path / "copy")
    check_adapter_base(str(copy), str(base))


def test_hub_id_mismatch_is_refused(base: Path) -> None:
    with pytest.raises(DistillError, match="trained on Org/Other-1B"):
        check_adapter_base("Org/Other-1B", str(base))
    check_adapter_base("Org/Same-1B", "Org/Same-1B")


def test_embedded_aliases_and_the_resolved_folder_are_the_same_base() -> None:
    from distill.llm.embedded import cache_root

    folder = str((cache_root() / "models" / "smollm2-135m-instruct").resolve())
    assert canonical_model("smollm2-135m-instruct") == canonical_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert canonical_model("embedded") == canonical_model(folder)
    check_adapter_base(folder, "smollm2-135m-instruct")
    check_adapter_base("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2")


def test_base_folder_from_another_machine_matches_by_name(tmp_path: Path) -> None:
    base = make_model(tmp_path / "smollm2-135m-instruct")
    check_adapter_base("/home/someone/.cache/distill/models/smollm2-135m-instruct", str(base))
    with pytest.raises(DistillError, match="trained on /home/someone/models/other"):
        check_adapter_base("/home/someone/models/other", str(base))


def test_hf_cache_snapshot_path_is_its_hub_id(tmp_path: Path) -> None:
    snap = tmp_path / "hub" / "models--Org--Name" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert canonical_model(str(snap)) == "Org/Name"
    check_adapter_base(str(snap), "Org/Name")


# ---------------------------------------------------------------- ports, keys, configs, CLI


def test_port_zero_is_left_to_vllmserver(base: Path, adapter: Path) -> None:
    with pytest.raises(DistillError, match="port 0"):
        build_command(ServeConfig(base_model=str(base), adapter=str(adapter), port=0), "cpu")


def test_port_helpers_see_a_listening_socket() -> None:
    port = free_port()
    assert port_is_free("127.0.0.1", port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert not port_is_free("127.0.0.1", port)


def test_api_key_goes_through_the_environment_not_argv(base: Path, adapter: Path, monkeypatch) -> None:
    monkeypatch.setenv("PLANNER_KEY", "s3cret")
    cfg = ServeConfig(base_model=str(base), adapter=str(adapter), api_key_env="PLANNER_KEY")
    argv, env = build_command(cfg, "cpu")
    assert env["VLLM_API_KEY"] == "s3cret"
    assert "s3cret" not in " ".join(argv) and "s3cret" not in format_command(argv, env)
    monkeypatch.delenv("PLANNER_KEY")
    with pytest.raises(DistillError, match="PLANNER_KEY"):
        build_command(cfg, "cpu")


def test_keys_tokens_and_secrets_are_masked_everywhere_shown(base: Path, adapter: Path, monkeypatch) -> None:
    monkeypatch.setenv("PLANNER_KEY", "k-123456")
    cfg = ServeConfig(
        base_model=str(base), adapter=str(adapter), api_key_env="PLANNER_KEY",
        env={"HF_TOKEN": "hf_abcdef", "MY_SECRET": "pssst!", "OPENAI_API_KEY": "sk-xyz987", "VLLM_LOGGING_LEVEL": "INFO"},
        extra_args=["--api-key", "argkey-1", "--api-key=argkey-2"],
    )
    argv, env = build_command(cfg, "cpu")
    shown = format_command(argv, env)
    for secret in ("k-123456", "hf_abcdef", "pssst!", "sk-xyz987", "argkey-1", "argkey-2"):
        assert secret not in shown
    assert "HF_TOKEN=*** " in shown and "--api-key '***'" in shown
    assert "VLLM_LOGGING_LEVEL=INFO" in shown and "--api-key=***" in shown
    assert env["HF_TOKEN"] == "hf_abcdef" and "argkey-1" in argv  # vLLM itself still gets them

    server = VLLMServer(cfg)  # its log pump scrubs the values from what vLLM prints about its arguments
    server._secrets = secret_values(argv, env)
    r, w = os.pipe()
    os.write(w, b"INFO non-default args: {'api_key': ['argkey-1'], 'hf_token': 'hf_abcdef'}\n")
    os.close(w)
    with os.fdopen(r, "rb") as stream:
        server._copy_output(stream)
    assert server.tail() == ["INFO non-default args: {'api_key': ['***'], 'hf_token': '***'}"]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.org"])
def test_a_host_others_can_reach_needs_a_key_or_an_explicit_opt_in(
    base: Path, adapter: Path, host: str, monkeypatch, capsys
) -> None:
    cfg = ServeConfig(base_model=str(base), adapter=str(adapter), host=host)
    with pytest.raises(DistillError, match=r"api_key_env .* or allow_unauthenticated: true"):
        build_command(cfg, "cpu")
    build_command(cfg.model_copy(update={"allow_unauthenticated": True}), "cpu")
    monkeypatch.setenv("PLANNER_KEY", "k-123456")
    build_command(cfg.model_copy(update={"api_key_env": "PLANNER_KEY"}), "cpu")
    from distill.cli import main

    code = main(["serve", "--dry-run", "--set", f"base_model={base}", "--set", f"adapter={adapter}", "--set", f"host='{host}'"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "allow_unauthenticated" in err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_hosts_need_no_key(base: Path, adapter: Path, host: str) -> None:
    build_command(ServeConfig(base_model=str(base), adapter=str(adapter), host=host), "cpu")


def test_the_base_an_adapter_was_trained_on_is_read_from_distill_adapter_json_first(tmp_path: Path, base: Path) -> None:
    from distill.training.merge import adapter_base

    path = make_adapter(tmp_path / "a", "/elsewhere/checkpoint-folder")
    (path / "distill_adapter.json").write_text(json.dumps({"base_model": str(base)}))
    assert read_adapter(path).base_model == str(base) == adapter_base(path)
    build_command(ServeConfig(base_model=str(base), adapter=str(path)), "cpu")  # the PEFT field alone: refused
    (path / "distill_adapter.json").unlink()
    assert read_adapter(path).base_model == "/elsewhere/checkpoint-folder" == adapter_base(path)
    with pytest.raises(DistillError, match="trained on /elsewhere/checkpoint-folder"):
        build_command(ServeConfig(base_model=str(base), adapter=str(path)), "cpu")


@pytest.mark.parametrize("name", ["serve_planner.yaml", "serve_planner_merged.yaml"])
def test_shipped_configs_load_and_say_how_to_run(name: str) -> None:
    from distill.core.config import load_config

    path = ROOT / "configs" / name
    assert path.read_text().splitlines()[0].startswith(f"# distill serve --config configs/{name}")
    cfg = load_config(ServeConfig, path)
    assert cfg.host == "127.0.0.1"
    assert model_name(cfg) == "planner"
    assert (cfg.merged_model is not None) == ("merged" in name)


def test_cli_dry_run_prints_the_command(base: Path, adapter: Path, capsys) -> None:
    from distill.cli import main

    code = main(
        ["serve", "--dry-run", "--set", f"base_model={base}", "--set", f"adapter={adapter}", "--set", "device=cpu"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "VLLM_CPU_KVCACHE_SPACE=2" in out and f"--lora-modules planner={adapter.resolve()}" in out
    assert "planner: its record does not say which prompt and tools it was trained on" in out

    (adapter / "distill_adapter.json").write_text(json.dumps({"student_prompt": "compact",
                                                              "tools": {"Wikipedia": "w", "LLM": "l"}}))
    assert main(["serve", "--dry-run", "--set", f"base_model={base}", "--set", f"adapter={adapter}",
                 "--set", "device=cpu"]) == 0
    assert "planner: send planner_prompt compact with tools Wikipedia,LLM (as it was trained)" in capsys.readouterr().out


def test_dry_run_masks_hf_token_flags_and_secret_env_names(base: Path, adapter: Path, capsys, monkeypatch) -> None:
    """`--hf-token` values in extra_args and env entries such as MY_PASSWORD are shown as ***; so is a token that
    this process holds in its own environment, wherever it appears."""
    from distill.cli import main

    monkeypatch.setenv("HF_TOKEN", "hf_ProcessToken123")
    code = main(["serve", "--dry-run", "--set", f"base_model={base}", "--set", f"adapter={adapter}",
                 "--set", "device=cpu", "--set", "extra_args=[--hf-token, hf_FlagToken456, --hf-token=hf_Other789]",
                 "--set", "env={MY_PASSWORD: hunter2hunter2, DB_PASSWD: letmein99, TOKENIZERS_PARALLELISM: 'false'}",
                 "--set", "served_model_name=hf_ProcessToken123"])
    out = capsys.readouterr().out
    assert code == 0
    for secret in ("hf_FlagToken456", "hf_Other789", "hunter2hunter2", "letmein99", "hf_ProcessToken123"):
        assert secret not in out, secret
    assert "--hf-token '***'" in out and "--hf-token=***" in out and "MY_PASSWORD=***" in out
    assert "TOKENIZERS_PARALLELISM=false" in out  # a name that only starts with TOKEN holds no secret


def test_cli_reports_a_missing_adapter_as_an_error(tmp_path: Path, base: Path, capsys) -> None:
    from distill.cli import main

    code = main(["serve", "--dry-run", "--set", f"base_model={base}", "--set", f"adapter={tmp_path / 'nope'}"])
    assert code == 2
    assert "error: adapter not found" in capsys.readouterr().err


def test_serve_script_execs_distill_serve() -> None:
    script = ROOT / "scripts" / "serve_planner.sh"
    assert os.access(script, os.X_OK)
    out = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0 and "--dry-run" in out.stdout


# ---------------------------------------------------------------- slow: a real vLLM server


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllm_server_serves_the_lora_adapter(vllm_server) -> None:
    import httpx
    from openai import OpenAI

    assert vllm_server.base_url == f"http://127.0.0.1:{vllm_server.port}/v1"
    models = httpx.get(f"{vllm_server.base_url}/models", timeout=10).json()
    assert {"planner", "smollm2-135m-instruct"} <= {m["id"] for m in models["data"]}
    client = OpenAI(base_url=vllm_server.base_url, api_key="unused")
    reply = client.chat.completions.create(
        model="planner", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16, temperature=0.0,
    )
    assert reply.choices[0].message.content.strip()
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    # vLLM lists a LoRA module with its folder as root and the base as parent (no log line says it at every level)
    planner = next(m for m in models["data"] if m["id"] == "planner")
    assert (planner["parent"], Path(planner["root"]).name) == ("smollm2-135m-instruct", "planner")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_concurrent_seeded_sampling_on_long_prompts_keeps_the_server_alive(vllm_server) -> None:
    """Regression: with chunked prefill, vllm-cpu's engine died on the first batch of seeded samples whose
    prompts overflow one step's token budget (32 few-shot planner prompts of ~510 tokens > 2048)."""
    import asyncio

    from distill.core.data import load_examples
    from distill.llm.openai_backend import OpenAIChat
    from distill.rewoo.prompts import planner_messages
    from distill.tools.registry import TOOL_DESCRIPTIONS

    examples = load_examples(ROOT / "data" / "demo" / "train.jsonl", "hotpotqa", "train", limit=32)
    tools = {k: TOOL_DESCRIPTIONS[k] for k in ("Wikipedia", "LLM")}
    prompts = [planner_messages(e.question, tools, "fewshot") for e in examples]
    chat = OpenAIChat("smollm2-135m-instruct", [vllm_server.base_url], None, max_concurrency=32, timeout_s=300)

    async def sample_all():
        return await asyncio.gather(*(
            chat.chat(m, temperature=0.5, max_tokens=8, seed=1000 + i) for i, m in enumerate(prompts)
        ), return_exceptions=True)

    outs = asyncio.run(sample_all())
    errors = [o for o in outs if isinstance(o, BaseException)]
    assert not errors, f"{len(errors)} of 32 failed: {errors[0]}"
    assert sum(o.usage.prompt_tokens for o in outs) > 2048  # the batch really overflowed one step's budget
    assert "does not use offset" not in vllm_server.log_path.read_text()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_vllm_server_fails_fast_with_the_log_tail(lora_adapter: Path) -> None:
    """A server that exits is reported as exited, with its log tail, long before the health timeout would."""
    cfg = ServeConfig(adapter=str(lora_adapter), port=0, extra_args=["--no-such-flag"], health_timeout_s=600)
    server = VLLMServer(cfg)
    with pytest.raises(DistillError, match=r"(?s)exited with code \d+ before it was ready.*no-such-flag"):
        server.start()
    assert server.pid is None  # stopped and cleaned up


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_distill_serve_cli_end_to_end(lora_adapter: Path, tmp_path: Path) -> None:
    import httpx

    port = free_port()
    log = (tmp_path / "stderr.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distill.cli", "serve", "--config", "configs/serve_planner.yaml",
         "--set", f"adapter={lora_adapter}", "--set", f"port={port}", "--set", "max_model_len=1024"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        seen: dict[str, str] = {}
        while "model" not in seen:
            line = lines.get(timeout=600)  # a hang guard, not a speed bound: the server prints as it starts
            assert line is not None, f"distill serve exited early: {(tmp_path / 'stderr.log').read_text()[-2000:]}"
            if line.startswith("vLLM is ready (pid "):
                seen["pid"] = line.split("pid ")[1].rstrip(")\n")
            elif ": " in line and line.split(": ", 1)[0] in {"base_url", "model"}:
                key, value = line.rstrip("\n").split(": ", 1)
                seen[key] = value
        assert seen["base_url"] == f"http://127.0.0.1:{port}/v1" and seen["model"] == "planner"
        assert "planner" in {m["id"] for m in httpx.get(f"{seen['base_url']}/models", timeout=10).json()["data"]}
        server_pid = int(seen["pid"])
        proc.send_signal(signal.SIGINT)  # Ctrl-C goes to the CLI; it must forward it to the server
        assert proc.wait(timeout=90) in (0, 130)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert _gone(server_pid) and _group_gone(server_pid)
    assert port_is_free("127.0.0.1", port)
    assert "vLLM stopped" in (tmp_path / "stderr.log").read_text()
