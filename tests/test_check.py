"""`--check`: every missing prerequisite one line (all of them, exit 2), the estimate's numbers as the config implies
them, and nothing written. No model is called: endpoints are a local port nobody listens on, in-process models
only have their (real, local) tokenizer loaded."""

from __future__ import annotations

import socket

import pytest
import yaml

from distill import cli
from distill.core.check import Check, importable
from test_generate import MINI, write_config
from test_pipeline import ROOT, wiring_config


def unused_port() -> int:
    """A local port nobody listens on: bound, then released (nothing in the test listens there after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def problems(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("problem: ")]


def test_generate_check_lists_every_missing_prerequisite_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DISTILL_CHECK_KEY", raising=False)
    url = f"http://127.0.0.1:{unused_port()}/v1"
    planner = {"backend": "openai", "base_url": url, "model": "teacher", "api_key_env": "DISTILL_CHECK_KEY",
               "prompt_per_mtok": 1.0, "completion_per_mtok": 2.0}
    solver = {"backend": "openai", "base_url": "https://api.invalid/v1", "model": "unpriced",
              "api_key_env": "DISTILL_CHECK_KEY"}
    path = write_config(tmp_path, n=2, samples=1, planner=planner, solver=solver, tools=["Calculator"])

    assert cli.main(["generate", "--check", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    found = problems(err)
    assert len(found) == 4, err
    assert found[0] == "problem: planner.api_key_env, solver.api_key_env: environment variable DISTILL_CHECK_KEY " \
                       "is not set"
    assert found[1].startswith(f"problem: planner: model server {url} (model teacher): cannot reach it")
    assert found[2].startswith("problem: solver: model server https://api.invalid/v1")  # no network here either
    assert found[3].startswith("problem: solver: model 'unpriced' at https://api.invalid/v1 has no price")
    assert "output_dir: " + str(tmp_path / "run") in out  # the resolved config is shown
    assert not (tmp_path / "run").exists()
    assert cli.main(["generate", "--offline", "--config", str(path)]) == 2  # --offline alone would run for real
    assert capsys.readouterr().err == "error: --offline goes with --check (a run calls its endpoints)\n"

    # --offline calls nothing and says so: the key and the price are still missing
    assert cli.main(["generate", "--check", "--offline", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert f"planner: teacher at {url} (--offline: not called)" in out
    assert [p.split(":")[1] for p in problems(err)] == [" planner.api_key_env, solver.api_key_env", " solver"]
    assert not (tmp_path / "run").exists()


def test_the_estimate_follows_from_the_config_and_the_real_prompts(tmp_path, capsys):
    local = {"backend": "transformers", "model": "smollm2-135m-instruct", "prompt_per_mtok": 0.0,
             "completion_per_mtok": 1_000_000.0}  # a dollar per completion token: the dollars are the tokens
    planner, solver = local | {"max_tokens": 100}, local | {"max_tokens": 10}
    path = write_config(tmp_path, n=4, samples=2, planner=planner, solver=solver, tools=["Calculator"],
                        judge=local | {"max_tokens": 1})
    assert cli.main(["generate", "--check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    # 4 questions x 2 samples = 8 records, each planner + solver + judge = 24 calls; replies at their max_tokens
    # (the judge's is its own 8): 8 x (100 + 10 + 8) = 944 completion tokens, $944
    line = next(l for l in out.splitlines() if l.startswith("generate: "))
    assert line.startswith("generate: 8 questions, 24 model calls, ") and "+ 944 completion tokens, $944.00" in line
    assert "smollm2-135m-instruct's tokenizer" in line  # counted with the local tokenizer, not chars/4

    from distill.core.config import load_config
    from distill.generate import GenerateConfig, load_questions
    from distill.llm.embedded import resolve_model_path
    from distill.rewoo.prompts import planner_messages
    from distill.tools.registry import tool_descriptions
    from transformers import AutoTokenizer

    cfg = load_config(GenerateConfig, path)
    tok = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    prompts = [planner_messages(ex.question, tool_descriptions(cfg.tools), cfg.planner_prompt)
               for ex in load_questions(cfg)]
    mean = sum(len(tok.encode("\n".join(m["content"] for m in p))) for p in prompts) / len(prompts)
    assert f"planner (smollm2-135m-instruct): 8 x 1 calls, prompt ~{mean:.0f} tokens, reply <= 100" in out
    assert not (tmp_path / "run").exists()


def test_eval_check_counts_each_method_over_its_questions(tmp_path, capsys):
    cfg = {"baselines": ["react", "direct"], "solver": {"backend": "transformers", "max_tokens": 16},
           "react_max_steps": 3, "react_max_tokens": 20, "tools": ["Calculator"],
           "datasets": [{"name": "hotpotqa", "source": str(MINI), "n": 5}], "output_dir": str(tmp_path / "eval")}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["eval", "--check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    # react: 5 questions x at most 3 turns, direct: 5 x 1 = 20 calls; replies 15 x 20 + 5 x 16 = 380 tokens
    assert "eval: 5 questions, 20 model calls, " in out and "+ 380 completion tokens, $0.00" in out
    assert not (tmp_path / "eval").exists()


def test_pipeline_check_finds_a_missing_report_to_integration_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    cfg = wiring_config(tmp_path)
    cfg["train"]["report_to"] = "wandb"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    missing = not importable("wandb")
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == (2 if missing else 0)
    out, err = capsys.readouterr()
    assert "teacher_server would run: " in out and "-m vllm.entrypoints.openai.api_server" in out
    assert "train planner would run: " in out and "-m distill.train --config" in out
    assert "generate.planner: smollm2-135m-instruct on the server the pipeline starts (not called)" in out
    assert out.count("\ngenerate: 6 questions, 12 model calls") == 1 and "\ntotal: " in out
    if missing:
        assert problems(err) == ["problem: train.report_to: wandb is not installed (pip install wandb)"]
    assert not (tmp_path / "run").exists()


def test_an_integration_is_checked_by_the_module_it_imports(monkeypatch):
    """wandb's absence, or tensorboard's, as the check sees it: by the module name it would import; a single
    name is the one-item list, as TRL reads it."""
    from distill.core.tracking import INTEGRATIONS

    check = Check()
    check.report_to(["none", "tensorboard"], "train")
    assert check.problems == [] and importable("tensorboard")
    monkeypatch.setitem(INTEGRATIONS, "wandb", ("wandb_not_installed_here", "wandb"))
    check.report_to("wandb", "train")
    check.report_to(["comet_ml"], "eval")
    assert check.problems[0] == "train.report_to: wandb is not installed (pip install wandb)"
    assert check.problems[1:] == [] if importable("comet_ml") else \
        ["eval.report_to: comet_ml is not installed (pip install comet-ml)"]


def test_every_command_that_spends_checks_its_trackers(tmp_path, monkeypatch, capsys):
    """generate, eval, train and improve --check each find a tracker whose package is not installed (a name TRL
    knows, its module made absent here), and an estimate above max_cost_usd is a problem line."""
    from distill.core.tracking import INTEGRATIONS
    from test_improve import recorded_adapter
    from test_sft_data import kept_records, write_kept
    from distill.sft_data import SftDataConfig, build_sft_data

    monkeypatch.chdir(ROOT)
    monkeypatch.setitem(INTEGRATIONS, "wandb", ("wandb_not_installed_here", "wandb"))
    missing = "report_to: wandb is not installed (pip install wandb)"
    local = {"backend": "transformers", "model": "smollm2-135m-instruct", "prompt_per_mtok": 0.0,
             "completion_per_mtok": 1_000_000.0}  # a dollar per completion token
    path = write_config(tmp_path, n=2, samples=1, planner=local | {"max_tokens": 10}, solver=local | {"max_tokens": 5},
                        tools=["Calculator"])
    assert cli.main(["generate", "--check", "--config", str(path), "--set", "report_to=wandb",
                     "--set", "max_cost_usd=0.05"]) == 2
    found = problems(capsys.readouterr().err)
    assert f"problem: generate.{missing}" in found
    assert "problem: generate: the estimate $30.00 exceeds max_cost_usd $0.05: the run would stop capped, less than " \
           "1% of the way; raise max_cost_usd or ask fewer questions" in found

    cfg = {"baselines": ["direct"], "solver": {"backend": "transformers", "max_tokens": 16}, "tools": ["Calculator"],
           "datasets": [{"name": "hotpotqa", "source": str(MINI), "n": 2}], "output_dir": str(tmp_path / "eval"),
           "report_to": ["wandb"]}
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(cfg))
    assert cli.main(["eval", "--check", "--config", str(tmp_path / "eval.yaml"), "--set", "max_cost_usd=0"]) == 2
    assert problems(capsys.readouterr().err) == [f"problem: eval.{missing}"]

    sft = tmp_path / "sft"
    build_sft_data(SftDataConfig(kept=str(write_kept(tmp_path / "kept.jsonl", kept_records())), out=str(sft),
                                 tokenizer=None))
    assert cli.main(["train", "--check", "--config", str(ROOT / "configs/smollm2-135m_lora_cpu.yaml"),
                     "--set", f"dataset_dir={sft}", "--set", f"output_dir={tmp_path / 'adapter'}",
                     "--set", "report_to=[wandb]"]) == 2
    out, err = capsys.readouterr()
    assert problems(err) == [f"problem: train.{missing}"] and "train would run: " in out
    assert "WARNING: only 10 training examples" in out
    assert not (tmp_path / "adapter").exists()

    adapter = recorded_adapter(tmp_path / "student")
    improve = {"adapter": str(adapter), "output_dir": str(tmp_path / "improve"), "planner_prompt": "compact",
               "tools": ["Wikipedia", "LLM"], "server": {"gpu_memory_utilization": 0.5},
               "datasets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/train.jsonl"), "n": 2}],
               "train": {"report_to": ["wandb"], "global_batch_size": 2, "per_device_train_batch_size": 2}}
    (tmp_path / "improve.yaml").write_text(yaml.safe_dump(improve))
    assert cli.main(["improve", "--check", "--offline", "--config", str(tmp_path / "improve.yaml")]) == 2
    assert f"problem: improve.train.{missing}" in problems(capsys.readouterr().err)
    assert not (tmp_path / "improve").exists()


def test_pipeline_check_sizes_train_config_auto_and_the_launch_by_the_same_gpu_query(tmp_path, monkeypatch, capsys):
    """One query of the GPUs (distill.core.check.gpu_memory) both counts them for the launch and sizes the training
    config `auto` picks. This machine has no GPU: two H100s are made up, and nothing else is."""
    import distill.core.check

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(distill.core.check, "gpu_memory", lambda: [81559 << 20] * 2)
    cfg = wiring_config(tmp_path)
    cfg["train"] = {"config": "auto", "max_steps": 2}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert problems(err) == []
    assert out.count("[pipeline] train.config auto: configs/qwen2.5-7b_lora_80gb.yaml (the smallest of 2 visible "
                     "GPUs has 79.6 GiB: 80 GB class") == 1
    shown = yaml.safe_load(out.split("--- train planner: resolved section\n")[1].split("\n---")[0].split("\ntrain ")[0])
    assert (shown["per_device_train_batch_size"], shown["use_liger_kernel"], shown["max_steps"]) == (16, True, 2)
    launch = next(line for line in out.splitlines() if line.startswith("train planner would run: "))
    assert "accelerate.commands.launch" in launch and "--num_processes 2" in launch
    assert not (tmp_path / "run").exists()


def test_pipeline_check_covers_the_improve_section(tmp_path, monkeypatch, capsys):
    """The 7B GRPO config as the improve section: its resolved config and what it would run are shown, its LLM
    tool's endpoint is checked as every stage's is (OPENAI_API_KEY), its tools against the student's prompt, its
    tracker and its GPUs (other tools than the student's are a problem); with the student's own tools, expert iteration shows the command each round trains with."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = wiring_config(tmp_path)
    cfg["improve"] = {"config": str(ROOT / "configs" / "improve_qwen2.5-7b_grpo_gpu.yaml")}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    shown = yaml.safe_load(out.split("--- improve: resolved config\n")[1].split("\nimprove would run: ")[0])
    assert (shown["method"], shown["adapter"]) == ("grpo", str(tmp_path / "run" / "train" / "planner"))
    assert f"improve would run: TRL's GRPOTrainer in this process from {tmp_path / 'run' / 'train' / 'planner'} " \
           "(200 steps, 8 completions per question)" in out
    assert "improve.solver: gpt-4o-mini at https://api.openai.com/v1 (--offline: not called)" in out
    found = problems(err)
    assert not [p for p in found if "improve.tools" in p]  # the shipped config samples with the student's tools
    assert "problem: improve.solver.api_key_env: environment variable OPENAI_API_KEY is not set" in found
    assert ("problem: improve: no GPU is visible (torch.cuda.device_count() = 0), but improve.grpo.bf16: true sizes "
            "it for GPUs") in found  # this machine has none
    assert ("problem: improve.grpo.report_to: tensorboard is not installed (pip install tensorboard)" in found) == \
           (not importable("tensorboard"))

    cfg["improve"]["tools"] = ["Wikipedia", "LLM"]  # not the prompt the student was trained on
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == 2
    assert "problem: improve.tools ['Wikipedia', 'LLM'] differ from student planner's sft_data tools ['Wikipedia', " \
           "'LLM', 'Calculator']: it was trained on a prompt listing those" in problems(capsys.readouterr()[1])

    cfg["improve"] = {"samples_per_question": 2, "train": {"max_steps": 1}}  # the run's own tools, prompt and server
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    line = next(l for l in out.splitlines() if l.startswith("improve would run: "))
    assert line.startswith("improve would run: 1 round(s), each sampling 2 plans per question from each round's vLLM "
                           "server (LoRA module 'policy'), then training: ")
    assert line.endswith(f"-m distill.train --config {tmp_path}/run/improve/planner/round_1/adapter/stage_config.yaml")
    assert problems(err) == [] and not (tmp_path / "run").exists()


def test_a_self_hosted_teacher_without_a_price_is_one_line_naming_teacher(tmp_path, monkeypatch, capsys):
    """Every generate and eval endpoint that takes the pipeline's `teacher:` has its price: unpriced, that is one
    line naming teacher.prompt_per_mtok and the endpoints taking it, from --check and before a run alike; an
    endpoint the section gives another model keeps its own line. The estimate says the price is unknown, not $0."""
    monkeypatch.chdir(ROOT)
    url = f"http://10.255.255.1:{unused_port()}/v1"  # off this machine; --offline calls nothing
    cfg = wiring_config(tmp_path)
    del cfg["teacher_server"]
    cfg["teacher"] = {"backend": "openai", "base_url": url, "model": "big-teacher"}
    cfg["generate"] = {k: v for k, v in cfg["generate"].items() if k not in ("planner", "solver")}
    cfg["generate"]["judge"] = {"max_tokens": 8}
    cfg["eval"]["planners"]["teacher"] = {"prompt": "fewshot", "spec": {}}
    cfg["eval"]["solver"] = {}
    cfg["eval"]["judge"] = {"model": "other-judge"}  # its own model at the teacher's address: its own price
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert problems(err) == [
        f"problem: teacher: model 'big-teacher' at {url} has no price (generate.planner, generate.solver, "
        "generate.judge, eval.solver, eval.planners.teacher.spec take it): set teacher.prompt_per_mtok and "
        "teacher.completion_per_mtok (dollars per million tokens, 0 if it is free), or add the model to `prices:`",
        f"problem: eval.judge: model 'other-judge' at {url} has no price: set eval.judge.prompt_per_mtok and "
        "eval.judge.completion_per_mtok (dollars per million tokens, 0 if it is free), or add the model to `prices:`"]
    line = next(l for l in out.splitlines() if l.startswith("generate: "))
    assert "an unknown price (no price for big-teacher)" in line and "$0.00" not in line
    assert "total: " in out and "an unknown price (no price for big-teacher, other-judge)" in out

    from distill.core.config import load_config
    from distill.core.errors import DistillError
    from distill.pipeline import Pipeline, PipelineConfig

    with pytest.raises(DistillError) as exc:  # a run stops before any stage, with the same lines
        Pipeline(load_config(PipelineConfig, path), str(path)).check()
    assert str(exc.value).startswith("teacher: model 'big-teacher'") and str(exc.value).count("has no price") == 2
