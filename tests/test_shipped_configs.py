"""Every shipped config runs as shipped, or its header says what it needs first: its command's own pre-run check
(`--check --offline`, `serve --dry-run`) finds no problem other than the ones its header names (an API key to
export, GPUs, an adapter an earlier command writes). Each header begins with the command that uses the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distill.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# file name prefix -> the check its command offers
CHECKS = {"generate_": ["generate", "--check", "--offline"], "eval_": ["eval", "--check", "--offline"],
          "pipeline_": ["pipeline", "--check", "--offline"], "demo_": ["pipeline", "--check", "--offline"],
          "serve_": ["serve", "--dry-run"]}
# A problem a check may report for a config, and the words its header must hold to say so
NEEDS = [
    (r"environment variable OPENAI_API_KEY is not set", "OPENAI_API_KEY=..."),
    (r"no GPU is visible", "on GPUs"),
    (r"adapter not found: runs/demo/train/", "after make demo"),
    (r"merged_model not found: runs/demo/merged", "after: distill merge"),
]


def header(path: Path) -> str:
    lines = path.read_text().splitlines()
    return "\n".join(line for line in lines[:next(i for i, l in enumerate(lines) if not l.startswith("#"))])


def problems(output: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in output.splitlines() if line.startswith(("problem: ", "error: "))]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_header_begins_with_its_command(path):
    first = header(path).splitlines()[0]
    assert f"configs/{path.name}" in first or first.startswith("# make demo"), \
        f"{path.name}: the first line should be the command that uses it, got {first!r}"


@pytest.mark.parametrize("path", [p for p in CONFIGS if any(p.name.startswith(k) for k in CHECKS)],
                         ids=lambda p: p.name)
def test_the_check_finds_only_what_the_header_names(path, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    argv = next(v for k, v in CHECKS.items() if path.name.startswith(k)) + ["--config", f"configs/{path.name}"]
    if argv[0] == "pipeline":
        argv += ["--set", f"run_dir={tmp_path / 'run'}"]  # a fresh run folder, which the check does not create
    rc = main(argv)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    said = header(path)
    for problem in problems(text):
        assert any(re.search(p, problem) and words in said for p, words in NEEDS), \
            f"{path.name}: its check reports {problem!r}, which its header does not name"
    assert rc == (2 if problems(text) else 0)
    if argv[0] == "pipeline":
        assert not (tmp_path / "run").exists()


def test_configs_that_use_the_demo_student_ask_it_as_it_was_trained():
    """The demo student is trained on one prompt kind and tool list (demo_smollm2_cpu.yaml); improve and eval refuse
    to send it another once it exists, which an offline check before `make demo` cannot see. Each config that
    samples from it (an improve `adapter`, an eval row on the `planner` module serve_planner.yaml serves it as)
    asks the same, so its documented command runs after `make demo`."""
    import yaml

    from distill.evaluate import EvalConfig
    from distill.improve import ImproveConfig
    from distill.core.config import load_config

    demo = yaml.safe_load((ROOT / "configs" / "demo_smollm2_cpu.yaml").read_text())
    trained = (demo["students"]["student"]["student_prompt"], demo["agent"]["tools"])  # sft_data's, from `agent:`
    served = yaml.safe_load((ROOT / "configs" / "serve_planner.yaml").read_text())
    assert served["adapter"] == "runs/demo/train/student"
    asked = {}
    for path in CONFIGS:
        data = yaml.safe_load(path.read_text())
        if data.get("adapter") == "runs/demo/train/student" and "tools" in data:
            cfg = load_config(ImproveConfig, str(path), [])
            asked[path.name] = (cfg.planner_prompt, cfg.tools)
        if path.name.startswith("eval_") and "smollm2" in path.name:
            cfg = load_config(EvalConfig, str(path), [])
            for row in cfg.planners:
                if row.spec.model == served.get("lora_name", "planner"):
                    asked[f"{path.name} {row.name}"] = (row.prompt, cfg.tools)
    assert {"improve_smollm2_cpu.yaml", "improve_smollm2_grpo_cpu.yaml", "eval_smollm2_cpu.yaml student"} <= set(asked)
    wrong = {name: got for name, got in asked.items() if got != trained}
    assert not wrong, f"the demo student was trained on {trained}; these ask otherwise: {wrong}"
