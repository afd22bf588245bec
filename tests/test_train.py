"""LoRA SFT (`distill.train`): completion-only loss in the batches the trainer really uses, the training prompt
equal to the inference prompt, adapter-only updates, config arithmetic, and a CPU smoke run end to end."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from test_sft_data import TOOLS, kept_records, write_kept

from distill.core.config import load_config
from distill.core.errors import DistillError
from distill.rewoo.prompts import planner_messages
from distill.sft_data import SftDataConfig, build_sft_data, tool_descriptions
from distill.train import TrainConfig, gradient_accumulation_steps, parse_train_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
SMOKE = CONFIGS / "smollm2-135m_lora_cpu.yaml"
TRAIN_CONFIGS = sorted(CONFIGS.glob("*lora_*.yaml"))


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory) -> Path:
    """12 kept records over 6 questions -> 8 train examples (4 questions) and 4 validation (2 questions)."""
    root = tmp_path_factory.mktemp("sft")
    kept = write_kept(root / "kept.jsonl", kept_records())
    build_sft_data(SftDataConfig(kept=str(kept), out=str(root / "sft"), tools=TOOLS, val_fraction=0.34, seed=0,
                                 tokenizer=None))
    return root / "sft"


@pytest.fixture(scope="module")
def trainer(sft_dir, tmp_path_factory):
    from distill.train import build_trainer

    return build_trainer(TrainConfig.model_validate(_small(sft_dir, tmp_path_factory.mktemp("out"))))


def _small(sft_dir, out, **over) -> dict:
    return {
        "dataset_dir": str(sft_dir), "output_dir": str(out), "dtype": "float32", "per_device_train_batch_size": 2,
        "global_batch_size": 2, "max_steps": 2, "learning_rate": 1e-3, "warmup_ratio": 0.0, "eval_strategy": "no",
        "save_strategy": "no", "logging_steps": 1,
    } | over


def _expected_sequences(tokenizer, sft_dir: Path) -> dict[tuple[int, ...], int]:
    """Full prompt+completion ids of every example -> the number of prompt tokens, from the raw dataset."""
    from datasets import load_from_disk

    out = {}
    for split in ("train", "validation"):
        for ex in load_from_disk(str(sft_dir))[split]:
            full = _ids(tokenizer.apply_chat_template(ex["prompt"] + ex["completion"], tokenize=True))
            prompt = _ids(tokenizer.apply_chat_template(ex["prompt"], add_generation_prompt=True, tokenize=True))
            assert full[: len(prompt)] == prompt
            out[tuple(full)] = len(prompt)
    return out


def _ids(out) -> list[int]:
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _batches(trainer) -> list[dict]:
    return list(trainer.get_train_dataloader())


def test_prompt_tokens_get_no_loss_in_the_trainer_batches(trainer, sft_dir):
    expected = _expected_sequences(trainer.processing_class, sft_dir)
    seen = 0
    for batch in _batches(trainer):
        assert set(batch) >= {"input_ids", "attention_mask", "labels"}
        rows = zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), batch["labels"].tolist())
        for ids, mask, labels in rows:
            length = sum(mask)
            assert mask == [1] * length + [0] * (len(mask) - length)  # right padding
            prompt_len = expected[tuple(ids[:length])]
            assert labels[:prompt_len] == [-100] * prompt_len  # the whole prompt, generation header included
            assert labels[prompt_len:length] == ids[prompt_len:length]  # every completion token, <|im_end|> too
            assert labels[length:] == [-100] * (len(labels) - length)  # padding
            assert ids[length - 2] == trainer.processing_class.convert_tokens_to_ids("<|im_end|>")
            seen += 1
    assert seen == 8  # one epoch of the train split


def test_training_prompt_is_what_inference_sends(trainer, smollm2):
    """The prompt ids in the training batch are the ids TransformersChat sends for the same question."""
    tools = tool_descriptions(TOOLS)
    inference = {}
    for record in kept_records():
        ids = smollm2.prompt_ids(planner_messages(record["question"], tools, "full"))
        inference[tuple(ids)] = record["question"]
    matched = set()
    for batch in _batches(trainer):
        for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
            prompt_len = next(i for i, lab in enumerate(labels) if lab != -100)
            assert tuple(ids[:prompt_len]) in inference, trainer.processing_class.decode(ids[:prompt_len])
            matched.add(inference[tuple(ids[:prompt_len])])
    assert len(matched) == 4


@pytest.mark.slow  # two real optimiser steps: ~30 CPU-seconds
def test_a_few_steps_change_the_adapter_and_not_the_base(trainer):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    lora = [n for n in before if "lora_" in n]
    assert lora and all(trainer.model.get_parameter(n).requires_grad for n in lora)
    assert not any(p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)
    trainer.train()
    assert trainer.state.global_step == 2
    after = dict(trainer.model.named_parameters())
    changed = [n for n in lora if not after[n].detach().equal(before[n])]
    assert len(changed) == len(lora)  # every A and B matrix moved (B starts at zero)
    base = [n for n in before if "lora_" not in n]
    assert len(base) > 200 and all(after[n].detach().equal(before[n]) for n in base)


def test_every_config_file_parses():
    files = sorted(CONFIGS.rglob("*.yaml"))
    assert len(files) >= 9 and len(TRAIN_CONFIGS) == 4
    for path in files:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path
    for path in TRAIN_CONFIGS:
        cfg = load_config(TrainConfig, path)
        first = path.read_text().splitlines()[0]
        assert first.startswith("#"), f"{path.name} must open with the command to run"
        assert cfg.distill.global_batch_size % cfg.sft.per_device_train_batch_size == 0
        assert "effective batch 128" in path.read_text() or path == SMOKE  # the derived numbers in the header
    for path in sorted((CONFIGS / "accelerate").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        for key in ("compute_environment", "distributed_type", "mixed_precision", "num_machines", "num_processes"):
            assert key in data, f"{path.name}: no {key}"
        assert data["distributed_type"] in {"NO", "MULTI_GPU", "DEEPSPEED", "FSDP"}
    acc = {p.stem: yaml.safe_load(p.read_text()) for p in (CONFIGS / "accelerate").glob("*.yaml")}
    assert set(acc) >= {"single_gpu", "multi_gpu", "deepspeed_zero3", "fsdp", "cpu"}
    assert acc["deepspeed_zero3"]["deepspeed_config"]["zero_stage"] == 3
    assert acc["fsdp"]["fsdp_config"]["fsdp_version"] == 2
    assert acc["cpu"]["use_cpu"] is True and acc["cpu"]["mixed_precision"] == "no"
    assert acc["single_gpu"]["num_processes"] == 1


def test_paper_hyperparameters_and_qlora():
    lora = load_config(TrainConfig, CONFIGS / "qwen2.5-7b_lora_gpu.yaml")
    for name in ("qwen2.5-7b_lora_gpu.yaml", "qwen2.5-7b_lora_80gb.yaml"):
        lora = load_config(TrainConfig, CONFIGS / name)
        m, s = lora.model, lora.sft
        assert (m.lora_r, m.lora_alpha, m.lora_dropout, s.learning_rate) == (8, 16, 0.05, 1e-4)
        schedule = (lora.distill.global_batch_size, s.num_train_epochs, s.lr_scheduler_type, s.get_warmup_steps(160))
        assert schedule == (128, 10, "cosine", 5)  # 3% of 160 steps, rounded up
        assert s.bf16 and m.lora_target_modules == "all-linear" and not m.load_in_4bit and s.completion_only_loss
    assert load_config(TrainConfig, CONFIGS / "qwen2.5-7b_lora_gpu.yaml").sft.gradient_checkpointing
    big = load_config(TrainConfig, CONFIGS / "qwen2.5-7b_lora_80gb.yaml").sft
    assert not big.gradient_checkpointing and big.use_liger_kernel and big.padding_free
    assert big.per_device_train_batch_size == 16
    qlora = load_config(TrainConfig, CONFIGS / "qwen2.5-7b_qlora_gpu.yaml")
    assert qlora.model.load_in_4bit and qlora.model.use_bnb_nested_quant and qlora.model.bnb_4bit_quant_type == "nf4"
    assert qlora.sft.per_device_train_batch_size == 4 and qlora.distill.global_batch_size == 128
    smoke = load_config(TrainConfig, SMOKE)
    assert smoke.model.dtype == "float32" and not smoke.sft.bf16 and smoke.sft.report_to == [] and smoke.sft.eval_on_start


def test_the_recipe_is_the_field_defaults_of_trls_own_classes_so_help_parser_and_trainer_agree(tmp_path, capsys):
    """distill's recipe is not a second layer of defaults over TRL's: it is the default of the field the parser
    fills, so a key no config names gets it, `--trl-help` shows it, TRL's own default stays what
    train_config.yaml compares against, and the arguments a checkpoint pickles load again."""
    import pickle

    from trl import ModelConfig, SFTConfig

    from distill.train import main as train_main
    from distill.training import recipe

    cfg = parse_train_config({"dataset_dir": str(tmp_path), "output_dir": str(tmp_path / "a"), "num_train_epochs": 3},
                             processes=1)
    assert isinstance(cfg.sft, SFTConfig) and isinstance(cfg.model, ModelConfig)
    for part in (cfg.sft, cfg.model):
        for f in dataclasses.fields(part):
            if f.name in recipe.SFT and f.name != "num_train_epochs":
                assert f.default == recipe.SFT[f.name] or f.default_factory() == recipe.SFT[f.name], f.name
    parsed = {k: getattr(cfg.sft if hasattr(cfg.sft, k) else cfg.model, k) for k in recipe.SFT}
    assert parsed == recipe.SFT | {"num_train_epochs": 3}  # every recipe key as the parser fills it from nothing
    assert cfg.sft.lr_scheduler_type == "cosine" and cfg.sft.save_total_limit == 2 and cfg.sft.num_train_epochs == 3
    assert SFTConfig.__dataclass_fields__["learning_rate"].default != recipe.SFT["learning_rate"]  # TRL's own: 2e-5
    assert cfg.resolved["learning_rate"] == 1e-4 and cfg.resolved["lora_r"] == 8  # the recipe's, recorded
    again = pickle.loads(pickle.dumps(cfg.sft))  # training_args.bin
    assert type(again) is type(cfg.sft) and again.learning_rate == 1e-4
    grpo = recipe.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert (grpo.save_steps, grpo.save_total_limit, grpo.logging_steps, grpo.report_to) == (10, 1, 1, [])

    assert train_main(argparse.Namespace(trl_help=True, config=None, set=[])) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--learning_rate LEARNING_RATE, --learning-rate LEARNING_RATE The initial learning rate for AdamW. " \
           "(default: 0.0001)" in shown and "--lora_r LORA_R" in shown


@pytest.mark.parametrize(
    "config, expected",
    [("qwen2.5-7b_lora_gpu.yaml", {1: 16, 2: 8, 8: 2}), ("qwen2.5-7b_qlora_gpu.yaml", {1: 32, 2: 16, 8: 4}),
     ("qwen2.5-7b_lora_80gb.yaml", {1: 8, 2: 4, 8: 1}), ("smollm2-135m_lora_cpu.yaml", {1: 2, 2: 1, 8: None})],
)
def test_effective_batch_stays_at_the_target(config, expected):
    """Through the parser, as `accelerate launch` with 1, 2 and 8 processes would resolve it."""
    data = yaml.safe_load((CONFIGS / config).read_text())
    for processes, accumulation in expected.items():
        if accumulation is None:  # the CPU smoke batch of 4 cannot spread over 8 processes of 2
            with pytest.raises(DistillError, match="not divisible"):
                parse_train_config(data, processes=processes)
            continue
        cfg = parse_train_config(data, processes=processes)
        got = cfg.sft.gradient_accumulation_steps
        assert got == accumulation
        assert got * cfg.sft.per_device_train_batch_size * processes == cfg.distill.global_batch_size


def test_sft_config_carries_the_derived_accumulation():
    data = yaml.safe_load((CONFIGS / "qwen2.5-7b_lora_gpu.yaml").read_text()) | {"bf16": False, "report_to": "none"}
    args = parse_train_config(data, processes=2).sft
    assert args.gradient_accumulation_steps == 8 and args.completion_only_loss is True
    assert args.assistant_only_loss is False and args.max_length == 1024
    assert args.get_warmup_steps(160) == 5  # warmup_ratio 0.03 of 160 steps, rounded up, on transformers 4 and 5
    with pytest.raises(DistillError, match="derived"):
        parse_train_config(data | {"gradient_accumulation_steps": 4})


def test_any_trl_key_works_from_yaml_set_and_flags(tmp_path):
    """Options distill never mentions reach TRL's SFTConfig / ModelConfig untouched."""
    from distill.train import load_train_config

    sets = ["neftune_noise_alpha=5", "use_liger_kernel=true", "packing=true", "packing_strategy=bfd",
            "gradient_checkpointing_kwargs={use_reentrant: true}", "use_rslora=true", "learning_rate=3e-4"]
    cfg = load_train_config(str(SMOKE), sets, ["--weight_decay", "0.1", "--lora_dropout=0.1", "--no_resume"])
    s, m = cfg.sft, cfg.model
    assert (s.neftune_noise_alpha, s.use_liger_kernel, s.packing, s.packing_strategy) == (5, True, True, "bfd")
    assert s.gradient_checkpointing_kwargs == {"use_reentrant": True} and m.use_rslora and s.learning_rate == 3e-4
    assert (s.weight_decay, m.lora_dropout, cfg.distill.resume) == (0.1, 0.1, False)
    # the flags are part of the config written beside the adapter, so it reproduces the run
    assert (cfg.resolved["weight_decay"], cfg.resolved["lora_dropout"], cfg.resolved["resume"]) == (0.1, 0.1, False)
    assert load_config(TrainConfig, SMOKE, ["eval_strategy=no"]).sft.eval_strategy == "no"  # YAML's `no` is false


@pytest.mark.parametrize("flags", [
    ["--learning-rate", "2e-4", "--no-gradient-checkpointing", "--weight-decay=0.1", "--no-resume"],
    ["--learning_rate=2e-4", "--no_gradient_checkpointing", "--weight_decay", "0.1", "--no_resume"],
    ["--learning_r", "2e-4", "--no_gradient_c", "--weight_d", "0.1", "--no-res"],  # abbreviations, as argparse takes
])
def test_every_flag_spelling_trl_accepts_is_parsed_and_recorded(flags):
    """Dashes, underscores, `--no-` and abbreviations: TRL's parser alone reads them, and the recorded config
    (the parsed objects as flat keys) loads back to the same objects."""
    from distill.train import load_train_config

    cfg = load_train_config(str(SMOKE), ["gradient_checkpointing=true"], flags)
    assert (cfg.sft.learning_rate, cfg.sft.gradient_checkpointing, cfg.sft.weight_decay) == (2e-4, False, 0.1)
    assert not cfg.distill.resume
    assert {k: cfg.resolved[k] for k in ("learning_rate", "gradient_checkpointing", "weight_decay", "resume")} == {
        "learning_rate": 2e-4, "gradient_checkpointing": False, "weight_decay": 0.1, "resume": False}
    again = parse_train_config(yaml.safe_load(yaml.safe_dump(cfg.resolved)))
    assert again.resolved == cfg.resolved and again.sft.to_dict() == cfg.sft.to_dict()


def test_indivisible_batches_and_bad_configs_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(DistillError, match="not divisible"):
        gradient_accumulation_steps(4, 2, 8)
    with pytest.raises(DistillError, match="lora_rank"):
        load_config(TrainConfig, SMOKE, ["lora_rank=4"])
    with pytest.raises(DistillError, match="sometimes"):  # TRL's own checks, on one line
        load_config(TrainConfig, SMOKE, ["eval_strategy=sometimes"])
    with pytest.raises(DistillError, match="invalid float value"):
        load_config(TrainConfig, SMOKE, ["learning_rate=fast"])
    assert load_config(TrainConfig, SMOKE, ["eval_strategy=no"]).sft.eval_strategy == "no"  # YAML's `no` is false
    from distill.cli import main as cli_main
    from distill.train import launcher_main as train_main

    assert train_main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert train_main(["--config", str(SMOKE), "--no_such_option", "1"]) == 2
    assert train_main(["--config", str(SMOKE), "--set", "lora_rank=4"]) == 2
    err = capsys.readouterr().err
    assert "no_such_option" in err and "lora_rank" in err and len(err.strip().splitlines()) == 3
    assert cli_main(["train", "--config", str(SMOKE), "--set", f"dataset_dir={tmp_path}"]) == 2
    assert "not a dataset folder" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tokenizer_only(tmp_path_factory) -> Path:
    """A model folder with SmolLM2's tokenizer and no weights: a trainer that got as far as loading the model
    would fail there with another error, so a refusal seen here was made before the model loads."""
    from transformers import AutoTokenizer

    from distill.llm.embedded import resolve_model_path

    out = tmp_path_factory.mktemp("tokenizer") / "model"
    AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct")).save_pretrained(out)
    return out


def _dataset_like(sft_dir: Path, out: Path, change) -> Path:
    """The real sft-data output of `sft_dir` with every train row passed through `change(index, row)`."""
    from datasets import DatasetDict, load_from_disk

    data = load_from_disk(str(sft_dir))
    DatasetDict({"train": data["train"].map(change, with_indices=True), "validation": data["validation"]}) \
        .save_to_disk(str(out))
    return out


@pytest.mark.parametrize("case", ["all completions empty", "one 1 MB prompt"])
def test_unusable_training_data_is_refused_before_the_model_loads(case, sft_dir, tokenizer_only, tmp_path, capsys):
    from distill.cli import main as cli_main
    from distill.train import build_trainer

    def change(row, i):
        if case == "all completions empty":
            return {"completion": [{"role": "assistant", "content": " "}]}
        if i == 3:
            return {"prompt": row["prompt"][:-1] + [{"role": "user", "content": "Question: " + "why " * 250_000}]}
        return {}

    data = _dataset_like(sft_dir, tmp_path / "sft", change)
    says = "train: row 1: field `completion`: the completion must be one non-empty" if case.startswith("all") \
        else "in row 3 with"
    with pytest.raises(DistillError, match=says):
        build_trainer(TrainConfig.model_validate(_small(data, tmp_path / "out", model_name_or_path=str(tokenizer_only))))
    capsys.readouterr()  # the progress bars of writing the dataset
    assert cli_main(["train", "--config", str(SMOKE), "--set", f"dataset_dir={data}",
                     "--set", f"model_name_or_path={tokenizer_only}", "--set", f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()


def _stop_at(step: int):
    """Simulates an interruption: checkpoint at `step`, then stop, as if the job had been killed right after."""
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopAt()


@pytest.mark.slow
def test_cpu_smoke_config_trains_resumes_and_merges(sft_dir, tmp_path, smollm2, caplog):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.cli import main as cli_main
    from distill.train import train

    out = tmp_path / "adapter"
    # The smoke config as is, shortened to fit CI: 6 steps of 1 example instead of 12 of 4.
    overrides = [f"dataset_dir={sft_dir}", f"output_dir={out}", "max_steps=6", "global_batch_size=1",
                 "per_device_train_batch_size=1"]
    cfg = load_config(TrainConfig, SMOKE, overrides)
    train(cfg, callbacks=[_stop_at(3)])  # "interrupted" after step 3
    assert (out / "checkpoint-3").is_dir()

    caplog.set_level(logging.INFO, logger="distill.train")
    args = ["train", "--config", str(SMOKE)] + [a for o in overrides for a in ("--set", o)]
    assert cli_main(args) == 0  # the same command again continues
    assert f"resuming from {out / 'checkpoint-3'}" in caplog.text

    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "train_config.yaml", "loss_history.json", "distill_adapter.json"):
        assert (out / name).is_file(), name
    history = json.loads((out / "loss_history.json").read_text())
    assert [e["step"] for e in history["train"]] == [1, 2, 3, 4, 5, 6]
    evals = history["eval"]
    print("eval losses:", [(e["step"], round(e["eval_loss"], 3)) for e in evals])
    assert [e["step"] for e in evals] == [0, 6]  # at start and at the end, none repeated on resume
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.1, evals
    info = json.loads((out / "distill_adapter.json").read_text())
    assert info["base_model"] == "smollm2-135m-instruct" and info["lora_r"] == 8 and info["global_step"] == 6
    assert info["effective_batch_size"] == 1 and info["gradient_accumulation_steps"] == 1
    assert info["lora_target_modules"] == "all-linear" and info["max_length"] == 1024
    assert load_config(TrainConfig, out / "train_config.yaml").resolved == cfg.resolved  # the record reproduces it

    # The saved chat template is the one used in training, and renders the inference prompt exactly.
    saved = AutoTokenizer.from_pretrained(out)
    messages = planner_messages(kept_records()[0]["question"], tool_descriptions(TOOLS), "full")
    prompt = _ids(saved.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    assert prompt == smollm2.prompt_ids(messages)
    assert (out / "chat_template.jinja").read_text() == smollm2.tokenizer.chat_template

    merged = tmp_path / "merged"
    assert cli_main(["merge", str(out), "--out", str(merged), "--dtype", "float32"]) == 0
    assert (merged / "chat_template.jinja").is_file() and (merged / "config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        merged_logits = model(ids).logits[0, -1]
        base_logits = smollm2.model(ids).logits[0, -1]
        new = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=saved.eos_token_id)[0, len(prompt):]
    assert not torch.allclose(merged_logits, base_logits, atol=1e-3)  # the adapter is in the weights
    assert saved.decode(new, skip_special_tokens=True).strip()

    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(info["base_model_path"], dtype=torch.float32)
    with torch.inference_mode():
        peft_logits = PeftModel.from_pretrained(base, str(out))(ids).logits[0, -1]
    assert torch.allclose(merged_logits, peft_logits, atol=1e-3)  # merging changes nothing the adapter computes


GPU_CHECK = ROOT / "scripts" / "gpu_check_train.sh"


def test_gpu_check_script_parses():
    """bash -n and --help: the shell wrapper and the option list load."""
    assert subprocess.run(["bash", "-n", str(GPU_CHECK)]).returncode == 0
    done = subprocess.run([sys.executable, str(GPU_CHECK.with_suffix(".py")), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--tiny" in done.stdout


@pytest.mark.slow
def test_gpu_check_runs_tiny_on_cpu(tmp_path):
    """The H200 script, on a 2-layer model on CPU: the same code path, numbers that mean nothing."""
    env = os.environ | {"OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(GPU_CHECK), "--tiny", "--steps", "3", "--warmup", "1"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check_train.json").read_text())
    assert result["measured_steps"] == 2 and result["tokens"] > 500 and result["tokens_per_s"] > 0
    # r x (in + out) for q, k, v, o, gate, up, down (hidden 64, kv 32, MLP 128), 2 layers
    assert result["n_lora_params"] == 2 * 8 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert 0 < result["mfu"] < 1e-3 and result["first_loss"] > 10  # random init: ~ln(49152) = 10.8


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer randomly initialised Llama with SmolLM2's tokenizer and chat template: for tests of how training
    is launched and batched, where the real weights only cost time (a real step is ~20 s on 2 cores)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from distill.llm.embedded import resolve_model_path

    out = tmp_path_factory.mktemp("tiny") / "model"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.parametrize("spelling", ["dashes", "underscores"])
def test_both_flag_spellings_train_and_no_token_is_written(spelling, sft_dir, tiny_model, tmp_path, capfd,
                                                          monkeypatch, caplog):
    """`python -m distill.train` with TRL-style flags as users type them, one real optimiser step of a 2-layer
    model; a hub token given as a flag and one in the environment reach no file of the run (checkpoints pickle
    the training arguments) and no line it prints."""
    from distill.train import launcher_main

    caplog.set_level(logging.INFO, logger="distill.train")
    flag_token, env_token = "hf_FlagToken0123456789", "hf_EnvToken9876543210"
    monkeypatch.setenv("HF_TOKEN", env_token)
    flags = {"dashes": ["--learning-rate", "2e-4", "--no-gradient-checkpointing", "--hub-token", flag_token],
             "underscores": ["--learning_rate=2e-4", "--no_gradient_checkpointing", f"--hub_token={flag_token}"]}
    out = tmp_path / "adapter"
    sets = [f"dataset_dir={sft_dir}", f"output_dir={out}", f"model_name_or_path={tiny_model}", "max_steps=1",
            "global_batch_size=2", "eval_strategy=no", "save_strategy=steps", "save_steps=1", "warmup_ratio=0",
            "gradient_checkpointing=true", "logging_steps=1"]
    argv = ["--config", str(SMOKE), *(w for s in sets for w in ("--set", s)), *flags[spelling]]
    assert launcher_main(argv) == 0
    info = json.loads((out / "distill_adapter.json").read_text())
    assert info["global_step"] == 1 and (out / "checkpoint-1").is_dir()
    # the folder describes itself: what push, serve, improve, eval and the report read wherever it is moved
    assert (info["student_prompt"], list(info["tools"]), info["train_examples"]) == ("full", TOOLS, 8)
    assert info["teacher"] == {"models": ["teacher"], "prompt": "fewshot"} and info["code_version"].startswith("0.")
    assert sum(c["train"] for c in info["datasets"].values()) == 8
    assert "| planner prompt, tools | `full`, " + ", ".join(TOOLS) + " |" in (out / "README.md").read_text()
    recorded = yaml.safe_load((out / "train_config.yaml").read_text())
    assert recorded["learning_rate"] == 2e-4 and recorded["gradient_checkpointing"] is False
    assert recorded.get("hub_token") is None
    printed = capfd.readouterr()
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "only 8 training examples" in r.getMessage()]
    assert len(warned) == 1 and "(fewer than 100)" in warned[0].getMessage()  # a tiny set is said, loudly
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(progress) == 1 and progress[0].startswith("step 1/1 (100%), ") and "ETA 0s" in progress[0]
    for secret in (flag_token, env_token):
        assert _files_holding(out, secret) == [], secret
        assert secret not in printed.out + printed.err


@pytest.mark.slow
def test_two_processes_keep_the_effective_batch(sft_dir, tiny_model, tmp_path):
    """torchrun with 2 CPU processes (gloo) x accumulation 1 trains like 1 process x accumulation 2."""
    common = ["--config", str(SMOKE), "--set", f"dataset_dir={sft_dir}", "--set", "max_steps=2",
              "--set", f"model_name_or_path={tiny_model}",
              "--set", "eval_strategy=no", "--set", "save_strategy=no", "--set", "warmup_ratio=0"]
    runs = {
        "ddp": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "distill.train"],
        "single": [sys.executable, "-m", "distill.train"],
    }
    history = {}
    for name, launcher in runs.items():
        out = tmp_path / name
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
        # a hang guard, not a speed bound: two processes start slowly on a loaded machine
        done = subprocess.run(launcher + common + ["--set", f"output_dir={out}"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
        info = json.loads((out / "distill_adapter.json").read_text())
        history[name] = json.loads((out / "loss_history.json").read_text())["train"]
        processes = 2 if name == "ddp" else 1
        assert (info["world_size"], info["gradient_accumulation_steps"]) == (processes, 2 // processes)
        assert info["effective_batch_size"] == 4
    losses = {name: [e["loss"] for e in h] for name, h in history.items()}
    assert len(losses["ddp"]) == len(losses["single"]) == 2
    assert losses["ddp"] == pytest.approx(losses["single"], abs=5e-3), losses


# ---------------------------------------------------------------------------------------------- packing


@pytest.mark.slow  # builds a trainer over the real model
def test_packed_batches_keep_examples_apart_and_mask_exactly_the_prompts(sft_dir, tmp_path, monkeypatch):
    """A packed, padding-free batch from the real trainer (real tokenizer, TRL's real collator). The varlen
    flash-attention kernels cannot run on this CPU, so the gate is told they exist and the model stays SDPA:
    only the batches are inspected, never a forward pass over them."""
    import distill.train as T

    monkeypatch.setattr(T, "varlen_attention_available", lambda attn: True)
    cfg = TrainConfig.model_validate(_small(sft_dir, tmp_path, packing=True, attn_implementation="sdpa"))
    trainer = T.build_trainer(cfg)
    expected = _expected_sequences(trainer.processing_class, sft_dir)
    seen = 0
    for batch in _batches(trainer):
        assert "attention_mask" not in batch  # a padded mask would make flash-attention ignore the boundaries
        ids, positions, labels = (batch[k][0].tolist() for k in ("input_ids", "position_ids", "labels"))
        starts = [i for i, p in enumerate(positions) if p == 0] + [len(ids)]
        assert starts[0] == 0 and len(starts) > 2  # several examples share one row
        for a, b in zip(starts, starts[1:]):
            assert positions[a:b] == list(range(b - a))  # positions restart: no attention across examples
            prompt_len = expected[tuple(ids[a:b])]  # each segment is exactly one whole example
            assert labels[a:a + prompt_len] == [-100] * prompt_len
            assert labels[a + prompt_len:b] == ids[a + prompt_len:b]
            seen += 1
    assert seen == 8


@pytest.mark.slow  # builds a trainer over the real model
def test_packing_without_varlen_kernels_falls_back_to_padded_batches(sft_dir, tmp_path, caplog):
    from distill.train import build_trainer

    caplog.set_level(logging.WARNING, logger="distill.train")
    trainer = build_trainer(TrainConfig.model_validate(_small(sft_dir, tmp_path, packing=True, padding_free=True)))
    assert "flash-attention's variable-length kernels" in caplog.text and "unpacked" in caplog.text
    assert not trainer.args.packing and not trainer.args.padding_free
    batch = _batches(trainer)[0]
    assert "attention_mask" in batch and batch["input_ids"].shape[0] == 2  # one row per example


# ---------------------------------------------------------------------------------------------- launching


def test_pipeline_train_stage_launches_one_process_per_gpu():
    from distill.training.launch import ACCELERATE_CONFIGS, launch_command

    data = yaml.safe_load((CONFIGS / "qwen2.5-7b_lora_gpu.yaml").read_text())
    cfg = parse_train_config(data, processes=1)
    train = ["-m", "distill.train", "--config", "stage.yaml"]
    assert launch_command("stage.yaml", cfg, gpus=0) == [sys.executable, *train]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    single, multi = str(ACCELERATE_CONFIGS / "single_gpu.yaml"), str(ACCELERATE_CONFIGS / "multi_gpu.yaml")
    assert launch_command("stage.yaml", cfg, gpus=1) == [*accelerate, single, "--num_processes", "1", *train]
    assert launch_command("stage.yaml", cfg, gpus=8) == [*accelerate, multi, "--num_processes", "8", *train]
    assert parse_train_config(data, processes=8).sft.gradient_accumulation_steps == 2  # what the 8 children get
    named = parse_train_config(data | {"accelerate_config": "configs/accelerate/fsdp.yaml", "num_processes": 2},
                               processes=1)
    assert launch_command("s.yaml", named, gpus=8)[4:7] == ["configs/accelerate/fsdp.yaml", "--num_processes", "2"]
    with pytest.raises(DistillError, match="only 8 GPU"):
        launch_command("s.yaml", parse_train_config(data | {"num_processes": 16}, processes=1), gpus=8)
    smoke = load_config(TrainConfig, SMOKE)
    with pytest.raises(DistillError, match="not divisible"):  # a batch of 4 cannot spread over 8 GPUs
        launch_command("s.yaml", smoke, gpus=8)
    for path in (single, multi):
        assert Path(path).is_file()


def test_gpu_check_arguments_grid_and_table():
    """The sweep's CPU-side parts: options, the grid, the per-point command, the table (no GPU run here)."""
    spec = importlib.util.spec_from_file_location("gpu_check_train", GPU_CHECK.with_suffix(".py"))
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    args = g.parse_args(["--sweep"])
    assert (args.steps, args.warmup, args.batch_size, args.gradient_checkpointing) == (15, 3, 8, True)
    grid = g.sweep_grid(args)
    assert len(grid) == 16 and len({tuple(p.values()) for p in grid}) == 16
    assert grid[0] == {"batch_size": 8, "gradient_checkpointing": True, "liger": False, "packing": False}
    argv = g.point_argv(grid[-1], args, "p.json")
    assert argv[:2] == ["--batch-size", "32"] and "--no-gradient-checkpointing" in argv
    assert "--liger" in argv and "--packing" in argv
    point = g.parse_args(argv)  # a point's command parses back to the point
    assert (point.batch_size, point.gradient_checkpointing, point.liger, point.packing) == (32, False, True, True)
    narrow = g.parse_args(["--sweep", "--sweep-batch", "16", "--sweep-packing", "off"])
    assert len(g.sweep_grid(narrow)) == 4
    with pytest.raises(SystemExit):
        g.sweep_grid(g.parse_args(["--sweep", "--sweep-kernels", "maybe"]))
    big = g.parse_args(["--config", str(CONFIGS / "qwen2.5-7b_lora_80gb.yaml")])
    assert (big.batch_size, big.gradient_checkpointing, big.liger, big.packing) == (16, False, True, True)
    assert g.parse_args(["--config", str(CONFIGS / "qwen2.5-7b_lora_80gb.yaml"), "--batch-size", "32"]).batch_size == 32
    rows = [dict(grid[0], result={"tokens_per_s": 6420.4, "mfu": 0.1842, "peak_memory_gib": 16.94, "packing": False}),
            dict(grid[-1], error="out of memory")]
    table = g.format_table(rows).splitlines()
    assert len(table) == 4 and table[0].count("|") == table[2].count("|") == table[3].count("|")
    assert "| 8 | yes | no | no (no) | 6,420 | 0.184 | 16.9 |" in table[2]
    assert table[3].startswith("| 32 | no | yes | yes |") and "out of memory" in table[3]


@pytest.mark.slow
def test_pipeline_launch_trains_in_a_child_process(sft_dir, tmp_path, monkeypatch):
    """The pipeline's train stage on CPU: the section becomes a config file, one child process trains from it.
    Its hub_token reaches the child through the environment, and no file of the run."""
    from distill.training.launch import launch

    monkeypatch.setenv("HF_TOKEN", "restored at teardown")
    monkeypatch.delenv("HF_TOKEN")
    token = "hf_SectionToken0123456"
    section = yaml.safe_load(SMOKE.read_text()) | {
        "dataset_dir": str(sft_dir), "output_dir": str(tmp_path / "train"), "max_steps": 1, "global_batch_size": 2,
        "eval_strategy": "no", "save_strategy": "no", "use_rslora": True,  # a TRL key distill never mentions
    }
    info = launch(parse_train_config(section | {"hub_token": token}, processes=1), gpus=0)
    assert info["global_step"] == 1 and info["world_size"] == 1 and info["effective_batch_size"] == 2
    assert yaml.safe_load((tmp_path / "train" / "stage_config.yaml").read_text()) == section
    assert _files_holding(tmp_path / "train", token) == [] and os.environ["HF_TOKEN"] == token
    adapter = json.loads((tmp_path / "train" / "adapter_config.json").read_text())
    assert adapter["use_rslora"] is True and adapter["r"] == 8
    card = (tmp_path / "train" / "README.md").read_text()  # distill's card, not TRL's "fine-tuned version of [None]"
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n") and "[None]" not in card
    assert "| optimiser steps | 1 |" in card and "tool_descriptions(" in card


@pytest.mark.slow  # two fresh interpreters import TRL (~10 s each on 2 cores)
def test_importing_trl_leaves_the_vllm_log_level_of_later_servers_alone(tmp_path):
    """TRL sets VLLM_LOGGING_LEVEL=ERROR on import; a server the pipeline starts after checking its train section
    inherited it and logged no vLLM line. Checked in a fresh interpreter, where trl is imported for the first time."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    code = ("import os; from distill.train import parse_train_config; "
            "parse_train_config({'dataset_dir': 'd', 'output_dir': 'o'}, processes=1); "
            "print(os.environ.get('VLLM_LOGGING_LEVEL'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "None", out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", code], env=env | {"VLLM_LOGGING_LEVEL": "DEBUG"}, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "DEBUG", out.stderr[-2000:]


def test_tensorboard_logs_into_the_adapter_folder_unless_told_otherwise(tmp_path):
    """transformers' callback would write to ./runs/ of the working directory, mixing every run."""
    from distill.train import tracking_env

    out = str(tmp_path / "adapter")
    assert tracking_env(["tensorboard"], out, {}) == {"TENSORBOARD_LOGGING_DIR": str(tmp_path / "adapter" / "tensorboard")}
    assert tracking_env(["tensorboard"], out, {"TENSORBOARD_LOGGING_DIR": "/logs"}) == {}
    assert tracking_env(["none"], out, {}) == tracking_env(["wandb"], out, {}) == {}


@pytest.mark.slow  # trains a 2-layer model twice
def test_a_full_disk_while_saving_keeps_the_last_adapter_and_names_the_file(sft_dir, tiny_model, tmp_path,
                                                                             monkeypatch):
    """The adapter is staged and renamed over the old one; the full disk is a fake (an ENOSPC from the
    safetensors write, after half the bytes), since a real one cannot be made here."""
    import errno

    import safetensors.torch

    from distill.train import train

    out = tmp_path / "adapter"
    overrides = [f"dataset_dir={sft_dir}", f"output_dir={out}", f"model_name_or_path={tiny_model}", "max_steps=1",
                 "global_batch_size=1", "per_device_train_batch_size=1", "eval_strategy=no", "save_strategy=no"]
    train(load_config(TrainConfig, SMOKE, overrides))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real_save = safetensors.torch.save_file

    def disk_full(tensors, filename, *args, **kwargs):
        real_save(tensors, filename, *args, **kwargs)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filename))

    monkeypatch.setattr("peft.peft_model.safe_save_file", disk_full)  # what PeftModel.save_pretrained calls
    with pytest.raises(DistillError, match=rf"cannot write {out}/adapter_model.safetensors: No space left on device"):
        train(load_config(TrainConfig, SMOKE, overrides + ["resume=false", "learning_rate=0.5"]))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".staging")]


def test_init_adapter_continues_that_adapter_from_its_weights_and_leaves_the_base(sft_dir, lora_adapter, tmp_path):
    """Expert iteration and GRPO continue the SFT student: at step 0 the trainable weights are the adapter's
    own (a new LoRA would start with lora_B at zero), its rank and targets are kept, and a step moves only them."""
    from safetensors.torch import load_file

    from distill.train import build_trainer, write_outputs

    cfg = TrainConfig.model_validate(_small(sft_dir, tmp_path / "out", max_steps=1, init_adapter=str(lora_adapter),
                                            lora_r=16, lora_target_modules="all-linear"))
    trainer = build_trainer(cfg)
    saved = load_file(str(lora_adapter / "adapter_model.safetensors"))
    params = dict(trainer.model.named_parameters())
    lora = {n: p for n, p in params.items() if "lora_" in n}
    assert len(lora) == len(saved) and all(p.requires_grad for p in lora.values())
    assert not any(p.requires_grad for n, p in params.items() if "lora_" not in n)
    by_key = {k.replace(".weight", ""): v for k, v in saved.items()}  # PEFT saves without the adapter name
    for name, param in lora.items():
        assert param.detach().equal(by_key[name.replace(".default.weight", "")]), name
    base_before = {n: p.detach().clone() for n, p in params.items() if "lora_" not in n}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert sum(not after[n].detach().equal(by_key[n.replace(".default.weight", "")]) for n in lora) == len(lora)
    assert all(after[n].detach().equal(p) for n, p in base_before.items())
    info = write_outputs(trainer, cfg, 0.0)
    assert (info["lora_r"], info["lora_target_modules"]) == (8, ["q_proj", "v_proj"])  # the adapter's, not r 16


def test_init_adapter_must_be_an_adapter_folder(sft_dir, tmp_path):
    from distill.core.errors import DistillError
    from distill.train import build_trainer

    cfg = TrainConfig.model_validate(_small(sft_dir, tmp_path / "out", init_adapter=str(tmp_path)))
    with pytest.raises(DistillError, match="init_adapter .*: no adapter_config.json"):
        build_trainer(cfg)


def test_a_sigterm_to_the_pipeline_stops_its_training_child_too(tmp_path):
    """`kill <pipeline pid>` reaches only the pipeline; an orphaned trainer would run on, holding the folder."""
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    parent = subprocess.Popen([sys.executable, "-c", "import sys; from distill.training.launch import run_child; "
                               f"run_child([sys.executable, '-c', {child!r}])"], cwd=ROOT)
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text():
            break
        parent_done = parent.poll()
        assert parent_done is None, f"the parent exited ({parent_done}) before its child started"
        threading.Event().wait(0.1)
    child_pid = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == -signal.SIGTERM  # it stops as the signal would have stopped it
    for _ in range(600):
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child_pid}/stat").read_text().split(") ")[1].startswith("Z"):
            break  # exited, waiting for init to reap it
        threading.Event().wait(0.1)
    else:
        os.kill(child_pid, signal.SIGKILL)
        raise AssertionError("the training child outlived its pipeline")
