"""SFT and GRPO under the real `accelerate launch` with 2 CPU processes (torch.distributed over gloo,
configs/accelerate/multi_cpu.yaml), against the same runs in 1 process: the adapter is written by rank 0 alone,
a SIGKILL mid-run resumes from the last checkpoint, the effective batch is per-device x accumulation x processes,
and the adapter's files, tensor shapes and step count match the 1-process run's.

The model is a 2-layer Llama with SmolLM2's tokenizer and chat template (test_train's `tiny_model`): what is
tested is how training is launched and split, where the real weights would only cost time.
Which process writes an adapter is observed, not assumed: a sitecustomize on the children's PYTHONPATH records
every `safetensors.torch.save_file` call with the writer's RANK, then calls the real function."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_improve import _tiny_adapter
from test_train import SMOKE, sft_dir, tiny_model  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = ROOT / "configs" / "accelerate"
GRPO_CPU = ROOT / "configs" / "improve_smollm2_grpo_cpu.yaml"
TIMEOUT_S = 900  # a hang guard, not a speed bound

pytestmark = pytest.mark.slow

SPY = '''
import importlib.abc, importlib.util, json, os, sys

def _record(path):
    with open(os.environ["DISTILL_TEST_WRITES"], "a") as log:
        log.write(json.dumps({"rank": os.environ.get("RANK", "none"), "path": str(path)}) + "\\n")

class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "safetensors.torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            save = module.save_file

            def save_file(tensors, filename, *args, **kwargs):
                _record(filename)
                return save(tensors, filename, *args, **kwargs)

            module.save_file = save_file

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hook())
'''


@pytest.fixture
def env(tmp_path) -> dict:
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(SPY)
    clean = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR")}
    return clean | {"PYTHONPATH": os.pathsep.join([str(spy), str(ROOT)]), "DISTILL_TEST_WRITES": str(tmp_path / "writes.jsonl"),
                    "OMP_NUM_THREADS": "1"}


def writes(env: dict) -> list[dict]:
    path = Path(env["DISTILL_TEST_WRITES"])
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


def launch(config: str, module: str, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE / config),
            "-m", module, *argv]


def run(cmd: list[str], env: dict) -> str:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout + done.stderr


def run_and_kill(cmd: list[str], env: dict, ready: Path, unfinished: Path) -> None:
    """Start `cmd` in its own process group and SIGKILL the whole group (launcher and ranks) once `ready`
    exists, i.e. mid-run: `unfinished` (what only the end of the run writes) must not exist yet."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ready.exists():
            assert proc.poll() is None, f"the run ended before {ready} appeared:\n{proc.stdout.read()[-4000:]}"
            assert time.monotonic() < deadline, f"no {ready} within {TIMEOUT_S} s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not unfinished.exists(), "the kill landed after the run had finished"


def tensor_shapes(adapter: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def adapter_writes(records: list[dict], adapter: Path) -> list[dict]:
    """The writes of the weights that ended up in `adapter`: written there (GRPO) or into a staging folder inside
    it and renamed (SFT); checkpoints and GRPO's reference adapter (`ref/`) are other folders."""
    def into(path: Path) -> bool:
        return path.parent == adapter or (path.parent.name.startswith(".staging.") and path.parent.parent == adapter)

    return [r for r in records if r["path"].endswith("adapter_model.safetensors") and into(Path(r["path"]))]


def test_sft_two_processes_write_once_resume_after_a_kill_and_match_one_process(sft_dir, tiny_model, tmp_path, env):
    """The smoke config as it ships (effective batch 4 = per-device 2 x accumulation 2 x 1 process, or x 1 x 2),
    6 steps, a checkpoint every 2, the 2-process run SIGKILLed once its first checkpoint is on disk."""
    sets = [f"dataset_dir={sft_dir}", f"model_name_or_path={tiny_model}", "max_steps=6", "save_steps=2"]
    argv = ["--config", str(SMOKE), *(w for s in sets for w in ("--set", s))]
    one, two = tmp_path / "one", tmp_path / "two"

    run(launch("cpu.yaml", "distill.train", [*argv, "--set", f"output_dir={one}"]), env)
    writes_one = writes(env)

    cmd = launch("multi_cpu.yaml", "distill.train", [*argv, "--set", f"output_dir={two}"])
    run_and_kill(cmd, env, two / "checkpoint-2" / "trainer_state.json", two / "distill_adapter.json")
    killed_at = max(int(p.name.split("-")[1]) for p in two.glob("checkpoint-*")
                    if (p / "trainer_state.json").is_file())
    writes(env)
    printed = run(cmd, env)
    assert f"resuming from {two / f'checkpoint-{killed_at}'}" in printed
    assert printed.count("adapter written to") == 1  # the main process's line, once for the launch
    writes_two = writes(env)

    infos = {n: json.loads((d / "distill_adapter.json").read_text()) for n, d in (("one", one), ("two", two))}
    for name, processes, accumulation in (("one", 1, 2), ("two", 2, 1)):
        info = infos[name]
        assert (info["world_size"], info["gradient_accumulation_steps"], info["effective_batch_size"]) == (
            processes, accumulation, 4), info
        assert info["global_step"] == 6
    # every adapter file rank 0's and the final adapter written once; the 1-process run writes as many
    assert {r["rank"] for r in writes_two} == {"0"}, writes_two
    assert len(adapter_writes(writes_two, two)) == 1 == len(adapter_writes(writes_one, one))
    files = {n: sorted(p.name for p in d.iterdir() if p.is_file()) for n, d in (("one", one), ("two", two))}
    assert files["one"] == files["two"] and "adapter_model.safetensors" in files["two"]
    assert tensor_shapes(one) == tensor_shapes(two) and tensor_shapes(two)
    history = {n: json.loads((d / "loss_history.json").read_text()) for n, d in (("one", one), ("two", two))}
    assert [e["step"] for e in history["two"]["train"]] == [1, 2, 3, 4, 5, 6]  # none lost or repeated by the kill
    losses = {n: [e["loss"] for e in h["train"]] for n, h in history.items()}
    print("1 process:", losses["one"], "\n2 processes:", losses["two"])
    assert losses["two"] == pytest.approx(losses["one"], abs=5e-3)  # the same optimisation, split in two


def test_grpo_two_processes_keep_the_group_write_once_and_resume(tiny_model, tmp_path, env):
    """`accelerate launch -m distill.improve` with the CPU GRPO config: per-device 2 x accumulation 1 x 2
    processes = 4 completions a step, one question's group, as per-device 4 in 1 process; 2 steps each, then the
    2-process run continued to 3 steps resumes from its checkpoint."""
    adapter = _tiny_adapter(tiny_model, tmp_path / "adapter")
    common = ["--config", str(GRPO_CPU), "--set", f"adapter={adapter}", "--set", "grpo.max_steps=2",
              "--set", "grpo.save_steps=1", "--set", "planner.max_tokens=16", "--set", "datasets.0.n=4"]
    one, two = tmp_path / "one", tmp_path / "two"
    run([sys.executable, "-m", "distill.improve", *common, "--set", f"output_dir={one}"], env)
    writes_one = writes(env)
    cmd = launch("multi_cpu.yaml", "distill.improve", [*common, "--set", f"output_dir={two}",
                                                      "--set", "grpo.per_device_train_batch_size=2"])
    printed = run(cmd, env)
    assert printed.count("adapter: ") == 1  # one report for the launch
    writes_two = writes(env)
    summaries = {n: json.loads((d / "grpo" / "summary.json").read_text()) for n, d in (("one", one), ("two", two))}
    for summary in summaries.values():
        assert summary["steps"] == 2 and summary["samples"] == 2 * 4, summary
    assert {r["rank"] for r in writes_two} == {"0"}, writes_two
    final = {n: d / "grpo" / "adapter" for n, d in (("one", one), ("two", two))}
    assert len(adapter_writes(writes_two, final["two"])) == 1 == len(adapter_writes(writes_one, final["one"]))
    assert tensor_shapes(final["one"]) == tensor_shapes(final["two"]) == tensor_shapes(adapter)
    history = json.loads((two / "grpo" / "reward_history.json").read_text())
    assert [e["step"] for e in history] == [1, 2] and all("reward/valid" in e for e in history)

    resumed = run([*cmd, "--set", "grpo.max_steps=3"], env)
    assert f"resuming from {two / 'grpo' / 'checkpoint-2'}" in resumed
    assert json.loads((two / "grpo" / "summary.json").read_text())["steps"] == 3


def test_an_accelerate_cpu_launch_that_starts_one_process_says_so():
    """accelerate's `--cpu --num_processes 2` (and distributed_type MULTI_CPU) runs the script once without mpirun:
    the environment it leaves is told apart from a real multi-process launch and from a plain 1-process one."""
    from distill.train import single_process_under_accelerate

    one = {"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}
    assert single_process_under_accelerate(one)
    assert not single_process_under_accelerate(one | {"WORLD_SIZE": "2", "RANK": "0"})  # torchrun's ranks
    assert not single_process_under_accelerate({k: v for k, v in one.items() if k != "MASTER_ADDR"})  # asked for 1
    assert not single_process_under_accelerate({"MASTER_ADDR": "10.0.0.1"})  # not accelerate's


@pytest.mark.parametrize("name", ["fsdp.yaml", "deepspeed_zero3.yaml", "multi_gpu.yaml", "multi_cpu.yaml"])
def test_every_accelerate_config_loads_and_its_header_command_names_it(name):
    """Every shipped accelerate config through accelerate's own loader (what `accelerate launch --config_file`
    reads), its header the command it is for. FSDP and DeepSpeed ZeRO-3 are GPU-only (their headers say why),
    so this load is what runs of them here."""
    from accelerate.commands.config.config_args import load_config_from_file

    path = ACCELERATE / name
    cfg = load_config_from_file(str(path))
    header = "".join(line + "\n" for line in path.read_text().splitlines() if line.startswith("#"))
    assert "accelerate launch --config_file configs/accelerate/" + name in header, header
    expected = {"fsdp.yaml": "FSDP", "deepspeed_zero3.yaml": "DEEPSPEED", "multi_gpu.yaml": "MULTI_GPU",
                "multi_cpu.yaml": "MULTI_GPU"}[name]
    assert str(cfg.distributed_type).rpartition(".")[2] == expected
    if name in ("fsdp.yaml", "deepspeed_zero3.yaml"):
        assert cfg.use_cpu is False and "Not on CPU" in header  # the header says why
    if name == "multi_cpu.yaml":
        assert header.startswith("# accelerate launch --config_file configs/accelerate/multi_cpu.yaml")
        assert cfg.use_cpu is True and cfg.num_processes == 2 and cfg.mixed_precision == "no"


def test_the_gpu_check_rehearsal_runs_its_three_parts_tiny_on_cpu(tmp_path):
    """`scripts/gpu_check_train.sh --rehearsal`, the one command for a GPU machine, with --tiny on CPU: the same
    three parts (SFT step rate, one GRPO step with the planner reward, a 2-process launch) on 2-layer models."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env |= {"OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check_train.sh"), "--rehearsal", "--tiny",
                           "--steps", "3", "--warmup", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check_train.json").read_text())
    assert result["ok"] and {"sft", "grpo", "two_processes"} <= set(result)
    sft, grpo, two = (result[part]["result"] for part in ("sft", "grpo", "two_processes"))
    assert sft["measured_steps"] == 2 and sft["tokens_per_s"] > 0 and 0 < sft["mfu"] < 1e-3
    assert grpo["steps"] == 1 and grpo["completions"] == grpo["num_generations"] == 4
    assert (two["world_size"], two["global_step"], two["effective_batch_size"]) == (2, 4, 4)
    assert two["how"] == "no GPU: 2 CPU ranks over gloo" and "adapter_model.safetensors" in two["adapter_files"]
