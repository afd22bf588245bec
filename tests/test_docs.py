"""The docs' command blocks run as written: in a block that chains stages, every path a command reads is one an
earlier command wrote, every config loads through its command's own class, the launcher matches the GPU count,
and eval's local planner endpoints are the ones `distill serve` opens. Read from README.md and docs/ as a user
copies them; no model runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from distill.core.config import load_config
from distill.training.launch import GPU_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
STAGE_COMMAND = re.compile(r"\s*(distill (generate|filter|sft-data|serve|serve-agent|eval|report)\b|"
                           r"python scripts/generate_traj|accelerate launch|make demo\b)")


# a link of a chain, not one: a block of `distill improve` alternatives (docs/improve.md) is no recipe
IMPROVE_COMMAND = re.compile(r"\s*distill improve\b")


def command_blocks() -> list[tuple[str, list[list[str]]]]:
    """Each bash block with two or more stage commands, as argv lists (comments and `export` lines dropped); the
    `distill improve` lines of such a block in their place."""
    blocks = []
    for doc in DOCS:
        for n, block in enumerate(re.findall(r"```(?:bash|sh)\n(.*?)```", doc.read_text(), re.S)):
            lines = [line for line in block.replace("\\\n", " ").splitlines()
                     if STAGE_COMMAND.match(line) or IMPROVE_COMMAND.match(line)]
            if sum(bool(STAGE_COMMAND.match(line)) for line in lines) >= 2:
                blocks.append((f"{doc.name} block {n}", [shlex.split(line, comments=True) for line in lines]))
    return blocks


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def sets(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]


def norm(path: str | Path) -> str:
    return str(Path(path))


class Chain:
    """What the commands so far have written (paths) and serve (endpoint -> model names)."""

    def __init__(self, where: str):
        self.where = where
        self.written: set[str] = set()
        self.served: dict[str, set[str]] = {}

    def needs(self, path: str | Path, command: str) -> None:
        assert norm(path) in self.written, f"{self.where}: `{command}` reads {path}, which no earlier command writes"

    def run(self, argv: list[str]) -> None:
        command = " ".join(argv[:3])
        if argv[:2] in (["python", "scripts/generate_trajectories.py"], ["distill", "generate"]):
            from distill.generate import GenerateConfig

            cfg = load_config(GenerateConfig, ROOT / option(argv, "--config"), sets(argv))
            self.written.add(norm(Path(cfg.output_dir) / "trajectories.jsonl"))
        elif argv[:2] in (["distill", "filter"], ["distill", "sft-data"]):
            self.needs(argv[2], command)
            self.written.add(norm(option(argv, "--out")))
        elif argv[:2] == ["accelerate", "launch"]:
            from distill.train import parse_train_config

            launcher = yaml.safe_load((ROOT / option(argv, "--config_file")).read_text())
            processes = int(option(argv, "--num_processes") or launcher["num_processes"])
            assert (processes > 1) == (launcher["distributed_type"] != "NO"), f"{self.where}: {processes} processes " \
                f"with the {launcher['distributed_type']} launcher {option(argv, '--config_file')}"
            section = yaml.safe_load((ROOT / option(argv, "--config")).read_text())
            parse_train_config(section, processes=processes)  # loads, and the batch divides over the processes
            self.needs(section["dataset_dir"], command)
            self.written.add(norm(section["output_dir"]))
        elif argv[:2] == ["distill", "serve"]:
            from distill.serving.serve import ServeConfig, served_name

            cfg = load_config(ServeConfig, ROOT / option(argv, "--config"), sets(argv))
            for adapter in ([cfg.adapter] if cfg.adapter else []) + list(cfg.adapters.values()):
                self.needs(adapter, command)
            names = {served_name(cfg), *cfg.adapters} | ({cfg.lora_name} if cfg.adapter else set())
            self.served[f"http://127.0.0.1:{cfg.port}/v1"] = names
        elif argv[:2] == ["make", "demo"]:
            from distill.pipeline import Pipeline, PipelineConfig

            demo = Pipeline(load_config(PipelineConfig, ROOT / "configs" / "demo_smollm2_cpu.yaml"))
            self.written |= {norm(demo.run / "train" / name) for name in demo.students()}
            self.written |= {norm(path) for path in demo.improved_adapters().values()}
        elif argv[:2] == ["distill", "serve-agent"]:
            from distill.serving.agent_server import AgentServerConfig

            cfg = load_config(AgentServerConfig, ROOT / option(argv, "--config"), sets(argv))
            for role, spec in (("planner", cfg.planner), ("solver", cfg.solver)):
                for url in spec.base_urls:
                    if url.startswith(("http://127.0.0.1", "http://localhost")):
                        assert spec.model in self.served.get(url, ()), (
                            f"{self.where}: the agent's {role} asks {url} for {spec.model}; "
                            f"served there: {sorted(self.served.get(url, ())) or 'nothing'}")
            self.written.add(norm(cfg.traces_dir))
        elif argv[:2] == ["distill", "improve"]:
            from distill.improve import ImproveConfig, final_adapter

            cfg = load_config(ImproveConfig, ROOT / option(argv, "--config"), sets(argv))
            self.needs(cfg.adapter, command)
            for ds in cfg.datasets:  # a file of the checkout is there; anything else an earlier command writes
                if not ds.source.startswith("hub:") and not (ROOT / ds.source).exists():
                    self.needs(ds.source, command)
            self.written.add(norm(final_adapter(cfg)))
        elif argv[:2] == ["distill", "eval"]:
            from distill.evaluate import EvalConfig

            cfg = load_config(EvalConfig, ROOT / option(argv, "--config"), sets(argv))
            for planner in cfg.planners:
                for url in planner.spec.base_urls:
                    if url.startswith(("http://127.0.0.1", "http://localhost")):
                        assert planner.spec.model in self.served.get(url, ()), (
                            f"{self.where}: eval's planner {planner.name} asks {url} for {planner.spec.model}; "
                            f"served there: {sorted(self.served.get(url, ())) or 'nothing'}")
            self.written.add(norm(cfg.output_dir))
        elif argv[:2] == ["distill", "report"]:
            self.needs(argv[2], command)
        else:
            pytest.fail(f"{self.where}: no rule for `{command}`; teach this test what it reads and writes")


def test_the_docs_have_a_chained_recipe():
    assert any(where.startswith("README.md") for where, _ in command_blocks())


@pytest.mark.parametrize("where,commands", command_blocks(), ids=[w for w, _ in command_blocks()])
def test_each_command_reads_what_an_earlier_one_wrote(where, commands):
    chain = Chain(where)
    for argv in commands:
        chain.run(argv)


def test_a_broken_chain_is_caught():
    """The checker itself: the recipe as it once read (sft-data to runs/sft, training reading runs/qwen/sft)."""
    chain = Chain("example")
    chain.written.add(norm("runs/teacher/kept.jsonl"))
    chain.run(shlex.split("distill sft-data runs/teacher/kept.jsonl --out runs/sft"))
    with pytest.raises(AssertionError, match="reads runs/qwen/sft, which no earlier command writes"):
        chain.run(shlex.split("accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 8 "
                              "-m distill.train --config configs/qwen2.5-7b_lora_gpu.yaml"))
    with pytest.raises(AssertionError, match="1 processes with the MULTI_GPU launcher"):
        chain.run(shlex.split("accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 1 "
                              "-m distill.train --config configs/qwen2.5-7b_lora_gpu.yaml"))


def test_a_round_from_traces_needs_an_agent_that_wrote_them():
    """The loop of docs/serving-agent.md: improve reads the traces an agent wrote, serve reads what improve trained."""
    chain = Chain("example")
    chain.run(["make", "demo"])
    improve = shlex.split("distill improve --config configs/improve_from_traces_smollm2_cpu.yaml")
    with pytest.raises(AssertionError, match="reads runs/agent/traces, which no earlier command writes"):
        chain.run(improve)
    chain.run(shlex.split("distill serve --config configs/serve_planner.yaml --set "
                          "adapter=runs/demo/improve/student/round_1/adapter"))
    chain.run(shlex.split("distill serve-agent --config configs/agent_server.yaml"))
    chain.run(improve)
    chain.run(shlex.split("distill serve --config configs/serve_planner.yaml --set "
                          "adapter=runs/agent/improve/round_1/adapter"))


@pytest.mark.parametrize("name", [name for _, name, _ in GPU_CONFIGS])
def test_each_gpu_training_config_fits_the_readme_recipe_and_the_improve_config(name):
    """The README's table offers each of these configs for step 3 of the recipe: with any of them in its place
    the chain still holds (serve reads the adapter it writes), and the 7B GRPO config continues that adapter."""
    where, commands = next((w, c) for w, c in command_blocks() if w.startswith("README.md")
                           and any(option(argv, "--config") == "configs/qwen2.5-7b_lora_gpu.yaml" for argv in c))
    chain = Chain(f"{where} with configs/{name}")
    for argv in commands:
        chain.run([f"configs/{name}" if arg == "configs/qwen2.5-7b_lora_gpu.yaml" else arg for arg in argv])
    written = yaml.safe_load((ROOT / "configs" / name).read_text())["output_dir"]
    improve = yaml.safe_load((ROOT / "configs" / "improve_qwen2.5-7b_grpo_gpu.yaml").read_text())
    assert norm(improve["adapter"]) == norm(written), f"configs/{name} writes {written}; the improve config reads " \
                                                      f"{improve['adapter']}"


def test_the_readme_says_which_endpoint_keys_the_teacher_replaces_and_which_stay():
    """The teacher replaces exactly the keys that say which model an endpoint is; the GPU recipe page names each,
    and a stage config file's other keys (max_concurrency, temperature) stay over the teacher's, as it says."""
    from distill.core.config import ENDPOINT_IDENTITY, validate
    from distill.pipeline import PipelineConfig

    text = " ".join(ROOT.joinpath("docs", "gpu-recipe.md").read_text().split())
    paragraph = text[text.index("**One teacher.**"):text.index("**Training config by GPU.**")]
    replaced = paragraph[paragraph.index("The teacher replaces only"):paragraph.index("every other key")]
    assert set(re.findall(r"`(\w+)`", replaced)) == set(ENDPOINT_IDENTITY)
    teacher = {"backend": "openai", "model": "t", "base_url": "http://t.test/v1", "max_concurrency": 64,
               "temperature": 0.1}
    generate = {"config": str(ROOT / "configs" / "generate_teacher.yaml")}
    cfg = validate(PipelineConfig, {"teacher": teacher, "generate": generate, "train": {}, "eval": {}})
    planner = cfg.generate["planner"]
    assert (planner["model"], planner.get("api_key_env")) == ("t", None)  # the file's model and key are gone
    assert (planner["max_concurrency"], planner["temperature"]) == (16, 0.7)  # generate_teacher.yaml's stay
    assert "max_concurrency: 64" in paragraph and "generate_teacher.yaml" in paragraph
    cfg = validate(PipelineConfig, {"teacher": teacher, "generate": generate | {"planner": {"max_concurrency": 64}},
                                    "train": {}, "eval": {}})
    assert cfg.generate["planner"]["max_concurrency"] == 64  # the pipeline section's own wins
