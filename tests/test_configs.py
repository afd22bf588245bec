"""Every shipped config loads through the class of the command it is written for, so a renamed or retyped
field cannot leave a config behind; pipeline configs also pass the pipeline's own pre-run check of every stage."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from distill.serving.agent_server import AgentServerConfig
from distill.core.config import AgentConfig, load_config, read_yaml
from distill.core.errors import DistillError
from distill.evaluate import EvalConfig
from distill.improve import ImproveConfig
from distill.filter import FilterConfig
from distill.flywheel import FlywheelConfig
from distill.generate import GenerateConfig
from distill.pipeline import Pipeline, PipelineConfig
from distill.serving.serve import ServeConfig
from distill.train import parse_train_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def train_config(data: dict):
    """A training config through distill.train's own (TRL) parser, with the folders the pipeline would set."""
    return parse_train_config(data | {"dataset_dir": "d", "output_dir": "o"}, processes=1)


def load_pipeline(path: Path) -> Pipeline:
    pipeline = Pipeline(load_config(PipelineConfig, path))
    pipeline.check()
    return pipeline


LOADERS = {  # file name prefix -> how the command that reads it loads it
    "agent_": lambda p: load_config(AgentServerConfig, p),
    "ask_": lambda p: load_config(AgentConfig, p),
    "generate_": lambda p: load_config(GenerateConfig, p),
    "filter": lambda p: load_config(FilterConfig, p),
    "flywheel_": lambda p: load_config(FlywheelConfig, p),
    "eval_": lambda p: load_config(EvalConfig, p),
    "improve_": lambda p: load_config(ImproveConfig, p),
    "serve_": lambda p: load_config(ServeConfig, p),
    "pipeline_": load_pipeline,
    "demo_": load_pipeline,
    "qwen2.5-7b_": lambda p: train_config(read_yaml(p)),
    "smollm2-135m_": lambda p: train_config(read_yaml(p)),
}


def loader_for(path: Path):
    matches = [load for prefix, load in LOADERS.items() if path.name.startswith(prefix)]
    assert len(matches) == 1, f"{path.name}: no config class known for it (add it to LOADERS)"
    return matches[0]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_loads_through_its_class(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # stage configs named by pipeline configs are relative to the checkout
    assert loader_for(path)(path) is not None


@pytest.mark.parametrize("path", sorted((CONFIGS / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_parse(path):
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and data.get("distributed_type"), path.name


def test_the_7b_pipeline_runs_its_stage_configs(monkeypatch):
    """The sections name the stage configs, so what `distill train/eval --config` runs is what the pipeline runs."""
    monkeypatch.chdir(ROOT)
    pipeline = load_pipeline(CONFIGS / "pipeline_hotpot_trivia_7b.yaml")
    alone = train_config(read_yaml(CONFIGS / "qwen2.5-7b_lora_gpu.yaml"))
    assert train_config(pipeline.cfg.train) == alone
    evaluation = load_config(EvalConfig, CONFIGS / "eval_hotpot_trivia_7b.yaml")
    assert pipeline.cfg.eval["react_max_steps"] == evaluation.react_max_steps
    assert pipeline.cfg.eval["judge"] == evaluation.judge.model_dump(exclude_unset=True)
    assert list(pipeline.cfg.eval["planners"]) == [p.name for p in evaluation.planners]
    assert pipeline.cfg.eval["planners"]["student"]["spec"]["base_url"] == "@server"
    assert pipeline.cfg.generate == read_yaml(CONFIGS / "generate_teacher.yaml")


def test_the_demo_report_sets_its_zero_shot_planners_against_the_teacher_at_a_fifth_of_its_prompt(monkeypatch):
    """The demo's prompt budget names the rows its report compared before it was a setting: every ReWOO planner
    on a zero-shot prompt, against the few-shot teacher."""
    monkeypatch.chdir(ROOT)
    ev = load_pipeline(CONFIGS / "demo_smollm2_cpu.yaml").config("eval", url="http://127.0.0.1:1/v1")
    zero_shot = [p.name for p in ev.planners if p.prompt != "fewshot"]
    assert ev.prompt_budget.model_dump() == {"reference": "teacher", "methods": zero_shot, "max_prompt_fraction": 0.2}


def test_make_clean_keeps_the_run_folders(tmp_path):
    """runs/ holds paid trajectories, the call cache and adapters: `make clean` removes only what install made."""
    import shutil
    import subprocess

    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    (tmp_path / "runs" / "demo" / "calls.sqlite").write_text("paid")
    (tmp_path / ".venv").mkdir()
    done = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / "demo" / "calls.sqlite").read_text() == "paid" and not (tmp_path / ".venv").exists()


def test_set_reaches_one_item_of_a_list():
    """`--set generate.datasets.0.n=5` changes the first dataset's n and keeps the others, in a stage config and
    through a pipeline section that names its stage config (`config: FILE`)."""
    cfg = load_config(GenerateConfig, CONFIGS / "generate_teacher.yaml", ["datasets.0.n=5"])
    before = load_config(GenerateConfig, CONFIGS / "generate_teacher.yaml")
    assert cfg.datasets[0].n == 5 and cfg.datasets[0].name == before.datasets[0].name
    assert cfg.datasets[1:] == before.datasets[1:]
    pipeline = load_config(PipelineConfig, CONFIGS / "demo_smollm2_cpu.yaml", ["generate.datasets.0.n=5"])
    gen = Pipeline(pipeline).config("generate", url="http://127.0.0.1:1/v1")
    assert gen.datasets[0].n == 5 and gen.datasets[0].source == "data/demo/train.jsonl"
    # its generate section is `config: generate_teacher.yaml`: the index reaches into that file
    real = load_config(PipelineConfig, CONFIGS / "pipeline_hotpot_trivia_7b.yaml", ["generate.datasets.0.n=5"])
    gen = Pipeline(real).config("generate", url="http://127.0.0.1:1/v1")
    assert gen.datasets[0].n == 5 and gen.datasets[1:] == before.datasets[1:]
    with pytest.raises(DistillError, match=r"--set datasets.7: datasets has 2 item\(s\), numbered from 0"):
        load_config(GenerateConfig, CONFIGS / "generate_teacher.yaml", ["datasets.7.n=5"])
