"""Expert iteration end to end on the embedded model: plans sampled from the served adapter, scored by the real
Worker (BM25 over the demo corpus), the best kept, the same adapter trained on them; a SIGKILL while sampling
loses and repeats nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from distill.core.store import read_jsonl
from test_train import tiny_model  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]


def _reward_of(parts: dict) -> float:
    """The planner reward recomputed from its logged parts with the default weights the test's config keeps: an
    invalid plan earns 0, a valid one 0.2 plus what ran and found, less 0.05 per step beyond the gold hops (so a
    valid plan of extra steps whose calls all failed is below 0.2)."""
    from distill.agent.reward import RewardConfig

    w = RewardConfig()
    if not parts["valid"]:
        return 0.0
    found = w.recall_weight * parts["recall"] if parts["recall"] is not None else \
        w.answer_weight * parts["answer_in_evidence"]
    total = w.valid_weight + w.ran_weight * parts["ran"] - w.step_cost * parts["extra_steps"] + found
    return total - min(w.duplicate_step_penalty * parts["duplicate_steps"], max(total, 0.0))


def improve_config(tmp_path: Path, server, adapter: Path, **extra) -> Path:
    served = {"backend": "openai", "base_url": server.base_url, "max_retries": 0}
    cfg = {
        "adapter": str(adapter),
        "output_dir": str(tmp_path / "improve"),
        "planner_prompt": "fewshot",  # the test adapter is a nudged base model: the prompt it can plan with
        # Sampled, but cool enough that a round keeps a plan: this nudged base writes 4-8 valid plans of 12 at 0.5
        # (seeds 0-2), 1-3 at 1.0, where vLLM's batching can turn the one valid sample invalid and stop the round.
        "planner": served | {"model": "planner", "temperature": 0.5, "max_tokens": 96, "stop": ["\nQuestion:"]},
        "solver": served | {"model": "smollm2-135m-instruct", "max_tokens": 16},
        "tools": ["Wikipedia", "LLM"],
        "wikipedia_corpus": str(ROOT / "data/demo/corpus.jsonl"),
        "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/train.jsonl"), "split": "train", "n": 4}],
        "eval_sets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/dev.jsonl"), "split": "dev"}],
        "samples_per_question": 3,
        "min_reward": 0.0,
        "concurrency": 4,  # questions in flight: the kill lands wherever they are, after record 4 is on disk
        "train": {"max_steps": 1, "per_device_train_batch_size": 2, "global_batch_size": 2, "dtype": "float32",
                  "learning_rate": 1e-3, "eval_strategy": "no", "save_strategy": "steps", "save_steps": 1,
                  "report_to": "none",
                  "logging_steps": 1},
    } | extra
    path = tmp_path / "improve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _improve(path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distill.cli", "improve", "--config", str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_a_round_killed_while_sampling_resumes_then_trains_the_same_adapter(tmp_path, vllm_server, lora_adapter):
    from safetensors.torch import load_file

    path = improve_config(tmp_path, vllm_server, lora_adapter)
    samples = tmp_path / "improve" / "round_1" / "samples.jsonl"
    proc = _improve(path)
    kill_after = 4
    while proc.poll() is None:  # killed at a point it observes: after record 4 landed
        if samples.exists() and samples.read_text().count("\n") >= kill_after:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)  # a look every 50 ms, not a spin that takes a core from the run it watches
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read()
    before = samples.read_text()
    assert before.count("\n") >= kill_after

    again = _improve(path)
    out, _ = again.communicate(timeout=1200)
    assert again.returncode == 0, out
    records = read_jsonl(samples)
    assert samples.read_text().startswith(before)  # nothing lost
    keys = [(r["id"], r["sample"]) for r in records]
    assert len(keys) == len(set(keys)) == 4 * 3  # nothing repeated, nothing missing
    for rec in records:
        assert rec["round"] == 1 and set(rec["reward_parts"]) >= {"valid", "ran", "recall", "extra_steps"}
        # the record keeps the reward to 6 decimals: 0.283333 for 0.2833333..., off by more than approx's 1e-6 relative
        assert rec["reward"] == pytest.approx(_reward_of(rec["reward_parts"]), abs=1e-6)
    assert not {r["id"] for r in records} & {json.loads(x)["_id"] for x in (ROOT / "data/demo/dev.jsonl").open()}

    round_dir = tmp_path / "improve" / "round_1"
    kept = read_jsonl(round_dir / "kept.jsonl")
    for rec in kept:  # each question's best valid plan
        same = [r for r in records if r["id"] == rec["id"] and r["plan"]["valid"]]
        assert rec["reward"] == max(r["reward"] for r in same)
    summary = json.loads((round_dir / "summary.json").read_text())
    assert summary["kept"] == len(kept) > 0 and summary["samples"] == 12
    assert summary["mean_reward"] == pytest.approx(sum(r["reward"] for r in records) / 12, abs=1e-4)

    # the round continued the adapter it started from: same modules and rank, weights moved, base untouched
    start = load_file(str(lora_adapter / "adapter_model.safetensors"))
    trained = load_file(str(round_dir / "adapter" / "adapter_model.safetensors"))
    assert set(trained) == set(start) and all("lora_" in k for k in trained)
    assert any(not trained[k].equal(start[k]) for k in trained)
    recorded = yaml.safe_load((round_dir / "adapter" / "train_config.yaml").read_text())
    assert recorded["init_adapter"] == str(lora_adapter)
    assert json.loads((round_dir / "adapter" / "adapter_config.json").read_text())["r"] == 8

    third = _improve(path)
    out, _ = third.communicate(timeout=600)
    assert third.returncode == 0 and "round 1: done, skipped" in out, out
    assert read_jsonl(samples) == records

    # other settings, rerun with --fresh: the round's old adapter and checkpoint are set aside, not resumed from
    assert (round_dir / "adapter" / "checkpoint-1").is_dir()
    changed = improve_config(tmp_path, vllm_server, lora_adapter, min_reward=0.1)  # samples from the call cache
    fourth = subprocess.run([sys.executable, "-m", "distill.cli", "improve", "--config", str(changed), "--fresh"],
                            cwd=ROOT, capture_output=True, text=True, timeout=1200)
    out = fourth.stdout + fourth.stderr
    assert fourth.returncode == 0 and "its adapter was trained with other settings" in out, out
    assert "resuming from" not in out
    [aside] = round_dir.glob("adapter.before-*")
    assert load_file(str(aside / "adapter_model.safetensors")).keys() == trained.keys()
    assert json.loads((round_dir / "summary.json").read_text())["train"]["global_step"] == 1


def test_bad_settings_are_one_line(tmp_path, capsys):
    from distill import cli

    path = tmp_path / "improve.yaml"
    path.write_text(yaml.safe_dump({"adapter": str(tmp_path), "rounds": 2,
                                    "datasets": [{"name": "hotpotqa", "source": "data/demo/train.jsonl"}]}))
    assert cli.main(["improve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rounds > 1 needs `server`" in err


def _tiny_adapter(model: Path, out: Path) -> Path:
    """A LoRA adapter on the tiny model, lora_B off zero (a trained adapter's weights, not a fresh one's)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    peft_model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return out


@pytest.mark.slow  # builds a trainer
def test_one_grpo_step_continues_the_adapter_and_scores_every_completion_of_the_group(tmp_path, tiny_model):
    """TRL's GRPOTrainer with the planner reward (real Worker, BM25 over the demo corpus) on a tiny random
    model: the group's completions are all scored, the parts logged, the adapter it starts from continued."""
    from safetensors.torch import load_file

    from distill.core.config import validate
    from distill.improve import ImproveConfig, improve
    from distill.train import trainable_adapter

    adapter = _tiny_adapter(tiny_model, tmp_path / "adapter")
    start = load_file(str(adapter / "adapter_model.safetensors"))
    model = trainable_adapter(str(tiny_model), adapter)  # what GRPO starts from: the adapter's own weights
    loaded = {n.replace(".default.weight", ""): p for n, p in model.named_parameters() if "lora_" in n}
    assert loaded and all(p.requires_grad and p.detach().equal(start[n + ".weight"]) for n, p in loaded.items())

    cfg = validate(ImproveConfig, {
        "method": "grpo", "adapter": str(adapter), "output_dir": str(tmp_path / "improve"),
        "planner_prompt": "compact", "planner": {"temperature": 1.0, "max_tokens": 24},
        "tools": ["Wikipedia"], "wikipedia_corpus": str(ROOT / "data/demo/corpus.jsonl"),
        "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/train.jsonl"), "split": "train", "n": 2}],
        "eval_sets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/dev.jsonl"), "split": "dev"}],
        "samples_per_question": 4,
        "grpo": {"max_steps": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                 "learning_rate": 1e-2, "save_strategy": "no"},
    })
    result = improve(cfg)
    summary = result["rounds"][0]
    assert summary["steps"] == 1 and summary["samples"] == 4  # one prompt's group of num_generations completions
    history = json.loads((tmp_path / "improve" / "grpo" / "reward_history.json").read_text())
    assert history and {"reward", "reward/valid", "reward/duplicate_steps"} <= set(history[0])  # every part logged
    # the same adapter continued (its modules and rank), not a new one; a random model's plans all score 0, so
    # the group has no advantage to learn from and its weights need not move in one step
    out = tmp_path / "improve" / "grpo" / "adapter"
    assert set(load_file(str(out / "adapter_model.safetensors"))) == set(start)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4


def test_grpo_settings_are_refused_in_one_line(tmp_path):
    from distill.core.config import validate
    from distill.core.errors import DistillError
    from distill.improve import ImproveConfig

    with pytest.raises(DistillError, match="method grpo is one TRL GRPO run"):
        validate(ImproveConfig, {"method": "grpo", "adapter": "a", "rounds": 2})
    with pytest.raises(DistillError, match="grpo: settings of method grpo"):
        validate(ImproveConfig, {"adapter": "a", "grpo": {"max_steps": 1}})


def test_the_old_key_samples_reads_as_samples_per_question_with_one_warning_and_the_same_fingerprint(tmp_path,
                                                                                                      caplog):
    """Configs written before the rename still run, say once which key to write, and digest as they did: a run
    folder made from them is not redone for the new name. Both names at once are one setting given twice."""
    import logging

    from distill.core.config import load_config, validate
    from distill.core.errors import DistillError
    from distill.flywheel import FlywheelConfig, improve_config
    from distill.improve import ImproveConfig, round_settings

    base = {"adapter": str(tmp_path / "adapter"),
            "datasets": [{"name": "hotpotqa", "source": "data/demo/train.jsonl"}]}
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(yaml.safe_dump(base | {"samples": 3}))
    new.write_text(yaml.safe_dump(base | {"samples_per_question": 3}))
    with caplog.at_level(logging.WARNING):
        was = load_config(ImproveConfig, old)
        load_config(ImproveConfig, old)  # read again (each pipeline check does): still one line
        now = load_config(ImproveConfig, new)
    lines = [r.getMessage() for r in caplog.records if "old name" in r.getMessage()]
    assert lines == [f"{old}: samples is the old name of samples_per_question; write samples_per_question (the old "
                     "name still reads, for now)"]
    assert was.samples_per_question == now.samples_per_question == 3
    assert was.model_dump() == now.model_dump()
    settings = round_settings(now, now.adapter)
    assert settings == round_settings(was, was.adapter)
    assert settings["samples"] == 3 and "samples_per_question" not in settings  # digested under the old name
    assert "run_unread_steps" not in settings["reward"]  # added later, at its default: not digested either

    flywheel = {"adapter": "a", "server": {"base_model": "m"},
                "datasets": [{"name": "served", "source": "traces", "metric": "em_f1"}]}
    fw = validate(FlywheelConfig, flywheel | {"samples": 5}, "flywheel.yaml")
    assert improve_config(fw, Path("q.jsonl")).samples_per_question == 5

    for cls, data in ((ImproveConfig, base), (FlywheelConfig, flywheel)):
        with pytest.raises(DistillError, match="samples and samples_per_question are one setting \\(samples is its "
                                               "old name\\): give samples_per_question only"):
            validate(cls, data | {"samples": 3, "samples_per_question": 3})


def test_samples_and_samples_per_question_together_exit_2_in_one_line(tmp_path, capsys):
    from distill import cli

    path = tmp_path / "improve.yaml"
    path.write_text(yaml.safe_dump({"adapter": str(tmp_path), "samples": 2,
                                    "datasets": [{"name": "hotpotqa", "source": "data/demo/train.jsonl"}]}))
    assert cli.main(["improve", "--config", str(path), "--set", "samples_per_question=4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {path}: " in err and \
        "samples and samples_per_question are one setting" in err


@pytest.mark.parametrize("name, processes", [("improve_smollm2_grpo_cpu.yaml", 1), ("improve_qwen2.5-7b_grpo_gpu.yaml", 8)])
def test_shipped_grpo_configs_parse_into_trls_config_and_their_batch_holds_whole_groups(name, processes, tmp_path):
    """TRL needs the completions of a step to be whole groups; the header's effective batch is what TRL gets."""
    import re

    from distill.core.config import load_config
    from distill.improve import ImproveConfig, grpo_args

    path = ROOT / "configs" / name
    cfg = load_config(ImproveConfig, path)
    args = grpo_args(cfg, tmp_path)
    assert args.num_generations == cfg.samples_per_question
    effective = args.per_device_train_batch_size * args.gradient_accumulation_steps * processes
    assert effective % args.num_generations == 0
    header = re.search(r"effective batch (\d+) completions = per-device (\d+) x accumulation (\d+) x (\d+) process",
                       path.read_text())
    assert header and tuple(map(int, header.groups())) == (effective, args.per_device_train_batch_size,
                                                           args.gradient_accumulation_steps, processes)


@pytest.mark.parametrize("grpo, message", [
    ({"max_stepz": 1}, "grpo: unknown key(s) max_stepz; max_stepz: did you mean max_steps? (keys are GRPOConfig"),
    ({"learning_rate": -1}, "grpo: learning_rate: -1 must be > 0"),
    ({"per_device_train_batch_size": 0}, "grpo: per_device_train_batch_size: 0 must be >= 1"),
    ({"lr_scheduler_type": "nope"}, "grpo: nope is not a valid SchedulerType"),
])
def test_grpo_keys_are_read_by_trls_parser_with_sfts_one_line_refusals(grpo, message, tmp_path):
    """`grpo:` goes through distill.train's parser as SFT's config does: a misspelt key names its nearest field,
    a number TRL would take and fail on later is refused, each in one line naming the section."""
    from distill.core.config import load_config
    from distill.core.errors import DistillError
    from distill.improve import ImproveConfig, grpo_args

    cfg = load_config(ImproveConfig, ROOT / "configs" / "improve_smollm2_grpo_cpu.yaml")
    with pytest.raises(DistillError) as error:
        grpo_args(cfg.model_copy(update={"grpo": cfg.grpo | grpo}), tmp_path)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("method", ["expert_iteration", "grpo"])
def test_a_missing_adapter_is_one_line_that_improve_can_act_on_and_makes_nothing(tmp_path, capsys, method):
    """`adapter: null` is no way out for improve (it continues an adapter): the line says what is; nothing is made
    in the output folder, and a stop inside the folder's lock releases it."""
    from distill import cli
    from distill.core.errors import DistillError
    from distill.core.run import folder_lock

    path = tmp_path / "improve.yaml"
    path.write_text(yaml.safe_dump({"method": method, "adapter": str(tmp_path / "adapter"),
                                    "output_dir": str(tmp_path / "improve"), "tools": ["Wikipedia"],
                                    "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/train.jsonl")}]}))
    assert cli.main(["improve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: adapter not found: {tmp_path / 'adapter'} (improve continues the SFT student's adapter: " \
                  "train one with `distill train` and set adapter to its output_dir)\n"
    assert not (tmp_path / "improve").exists()

    with pytest.raises(DistillError, match="stopped"):
        with folder_lock(tmp_path / "locked"):
            raise DistillError("stopped")
    with folder_lock(tmp_path / "locked"):  # released: taken again at once, by this process or another
        pass


def recorded_adapter(out: Path, prompt: str = "compact", tools: tuple[str, ...] = ("Wikipedia", "LLM")) -> Path:
    """An adapter folder as `distill train` leaves it, as far as improve reads it before sampling: the PEFT config,
    a weights file and distill_adapter.json naming the prompt and tools it was trained on."""
    from distill.tools.registry import tool_descriptions

    out.mkdir(parents=True)
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8,
                                                          "base_model_name_or_path": "smollm2-135m-instruct"}))
    (out / "adapter_model.safetensors").write_bytes(b"")
    (out / "distill_adapter.json").write_text(json.dumps({
        "format_version": 2, "base_model": "smollm2-135m-instruct", "student_prompt": prompt,
        "tools": tool_descriptions(tools)}))
    return out


@pytest.mark.parametrize("change", [{"planner_prompt": "full"}, {"tools": ["Wikipedia", "LLM", "Calculator"]}])
def test_improve_refuses_a_prompt_or_tools_the_adapter_was_not_trained_on(tmp_path, capsys, change):
    """Standalone improve reads the adapter's own record: another prompt kind or tool list is one line naming
    both, before any server starts or any folder is made; `improve --check` lists it as a problem."""
    from distill import cli

    adapter = recorded_adapter(tmp_path / "student_compact")
    path = tmp_path / "improve.yaml"
    cfg = {"adapter": str(adapter), "output_dir": str(tmp_path / "improve"), "planner_prompt": "compact",
           "tools": ["Wikipedia", "LLM"], "server": {"gpu_memory_utilization": 0.5},
           "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/train.jsonl"), "n": 2}]} | change
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["improve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "but it was trained on prompt compact with tools Wikipedia, LLM" in err
    assert f"planner prompt {cfg['planner_prompt']} and tools {', '.join(cfg['tools'])}" in err
    assert not (tmp_path / "improve").exists()

    assert cli.main(["improve", "--config", str(path), "--check", "--offline"]) == 2
    assert "problem: improve asks adapter" in capsys.readouterr().err

    path.write_text(yaml.safe_dump(cfg | {"planner_prompt": "compact", "tools": ["Wikipedia", "LLM"]}))
    assert cli.main(["improve", "--config", str(path), "--check", "--offline"]) in (0, 2)
    assert "improve asks adapter" not in capsys.readouterr().err


def test_an_improved_adapter_keeps_the_sft_students_teacher_and_says_where_it_came_from(tmp_path):
    """A round trains on the student's own plans, so its sft-data names the policy as teacher: the improved
    adapter's record keeps the SFT student's teacher and datasets, counts every example it learnt from, and names
    the adapter it continued."""
    from distill.improve import ImproveConfig, inherit_record
    from distill.tools.registry import tool_descriptions

    sft = recorded_adapter(tmp_path / "student_compact")
    info = json.loads((sft / "distill_adapter.json").read_text())
    (sft / "distill_adapter.json").write_text(json.dumps(info | {
        "train_examples": 120, "teacher": {"models": ["Qwen/Qwen2.5-72B-Instruct"], "prompt": "fewshot"},
        "datasets": {"hotpotqa": {"train": 120, "validation": 10}}}))
    out = recorded_adapter(tmp_path / "round_1" / "adapter")
    info = json.loads((out / "distill_adapter.json").read_text())
    (out / "distill_adapter.json").write_text(json.dumps(info | {
        "train_examples": 7, "teacher": {"models": ["policy"], "prompt": "compact"}, "global_step": 2}))
    cfg = ImproveConfig(adapter=str(sft), planner_prompt="compact", tools=["Wikipedia", "LLM"],
                        datasets=[{"name": "hotpotqa", "source": str(ROOT / "data/demo/train.jsonl")}])
    inherit_record(cfg, sft, out, "expert_iteration round 1")
    got = json.loads((out / "distill_adapter.json").read_text())
    assert got["teacher"] == {"models": ["Qwen/Qwen2.5-72B-Instruct"], "prompt": "fewshot"}
    assert got["train_examples"] == 127 and got["global_step"] == 2 and got["student_prompt"] == "compact"
    assert got["tools"] == tool_descriptions(["Wikipedia", "LLM"])
    assert got["improved"] == {"from": str(sft), "how": "expert_iteration round 1", "examples": 7}
