"""Shared fixtures: the real embedded model, one real vLLM server for the session, and the shared data's path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
# Under pytest-xdist each worker (and every process it starts) gets its share of the cores: torch's default of
# one thread per core in every worker oversubscribes them, and spinning OpenMP threads then cost more than the
# second worker gains (test_train.py with 2 workers on 2 cores: 245 s at a thread per core, 152 s at one).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))
# No example has a time limit, whichever test forgets to say so: a loaded machine must not fail a test on time.
settings.register_profile("distill", deadline=None)
settings.load_profile("distill")
FIXTURES = ROOT / "tests" / "fixtures"
BASE_NAME = "smollm2-135m-instruct"  # the base model's name on the session's vLLM server


def shared_data() -> Path:
    return Path(os.environ.get("DISTILL_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct, in process (converted once from the packaged GGUF)."""
    from distill.core.config import ModelSpec
    from distill.llm import build_chat

    return build_chat(ModelSpec(backend="transformers", model=BASE_NAME))


@pytest.fixture
def shared_data_dir() -> Path:
    d = shared_data()
    if not d.exists():
        pytest.skip(f"shared data not found at {d} (set DISTILL_SHARED_DATA)")
    return d


def make_lora_adapter(out: Path, scale: float = 1e-2, seed: int = 0) -> Path:
    """A real PEFT LoRA (r 8, q/v) on the embedded SmolLM2, lora_B nudged off zero so it changes the outputs;
    saved with the tokenizer, so the folder carries the chat template as a trained adapter does."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.llm.embedded import resolve_model_path

    base = resolve_model_path(BASE_NAME)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    peft_model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)  # writes chat_template.jinja too
    return out


@pytest.fixture(scope="session")
def lora_adapter(tmp_path_factory) -> Path:
    return make_lora_adapter(tmp_path_factory.mktemp("adapters") / "planner")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory, lora_adapter):
    """One real vLLM CPU server for every test that needs a server but does not test starting one: the base as
    `smollm2-135m-instruct`, the test adapter as the LoRA module `planner`. A server start costs about a minute
    of both cores; the tests of the server's own start/stop and the pipeline's own servers start their own.
    4096 tokens of context: the seeded-sampling regression needs batches larger than one prefill step. 1 GiB of KV
    cache (about 23k tokens of SmolLM2): each worker keeps its server to the end, and at the default 2 GiB the two
    took 7 GiB of the machine's 24 beside the tests that train or start servers of their own. Runtime LoRA
    loading is on (loopback only), so a test can serve an adapter it trained without a second server start; such a
    test unloads its module again."""
    from distill.serving.serve import ServeConfig, VLLMServer

    cfg = ServeConfig(base_model=BASE_NAME, served_model_name=BASE_NAME, adapters={"planner": str(lora_adapter)},
                      port=0, max_model_len=4096, health_timeout_s=600, cpu_kvcache_space_gb=1,
                      env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(cfg, log_path=log) as server:
        yield server


# Fixtures that load the real model, build a trainer or start a real server: a test that takes one is slow
# whatever it says (`trainer` and `chat` are test_train's and test_transformers_backend's own).
SLOW_FIXTURES = {"smollm2", "lora_adapter", "vllm_server", "trainer", "chat"}
# The modules whose server tests form the second group (the rest: test_pipeline, test_crash_resume, test_faults,
# test_generate, ...), by their measured times.
SERVER_GROUP_B = {"test_improve", "test_evaluate", "test_eval_vllm", "test_serve", "test_traffic_loop",
                  "test_agent_server", "test_agent_swap"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
        if "vllm_server" in fixtures:
            # Under pytest-xdist (`--dist loadgroup`) each group runs whole in one worker, and a worker starts the
            # session's server once (a session fixture is per worker). Two groups of about equal time: with one
            # group its worker ran ~16 of the suite's ~17 minutes while the other worker sat idle for the last ~7.
            module = item.module.__name__.rpartition(".")[2]
            item.add_marker(pytest.mark.xdist_group("vllm_server_b" if module in SERVER_GROUP_B else "vllm_server"))
