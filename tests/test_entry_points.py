"""No command runs silently empty: every command module (`python -m distill.X`, also what `accelerate launch -m
distill.X` runs) and every script the docs or configs name prints its usage for --help, and a config that is not
there is one line and exit 2. A module without its `__main__` imports, does nothing and exits 0, which is how an
8-GPU `accelerate launch -m distill.improve` once did nothing; this catches it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distill.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").rglob("*.yaml"))]
NAMED_MODULE = re.compile(r"-m (distill(?:\.\w+)+)")
NAMED_SCRIPT = re.compile(r"(?<![\w/.])(scripts/\w+\.py)")


def named(pattern: re.Pattern) -> set[str]:
    return {m for path in SOURCES for m in pattern.findall(path.read_text())}


MODULES = sorted({module for _, module, _ in COMMANDS} | named(NAMED_MODULE))
SCRIPTS = sorted(named(NAMED_SCRIPT))


# what a command needs besides --config before it reads the config
REQUIRED = {"distill.agent.factory": ["Who?"], "distill.filter": ["in.jsonl", "--out", "out.jsonl"],
            "distill.sft_data": ["kept.jsonl", "--out", "sft"], "scripts/kill_resume_check.py": ["generate"]}


def run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_docs_name_the_modules_and_scripts_this_test_runs():
    assert {"distill.train", "distill.improve"} <= set(MODULES)
    assert "scripts/generate_trajectories.py" in SCRIPTS


@pytest.mark.parametrize("argv", [["-m", m] for m in MODULES] + [[s] for s in SCRIPTS],
                         ids=MODULES + SCRIPTS)
def test_help_prints_the_usage(argv):
    done = run([*argv, "--help"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), f"{' '.join(argv)} --help printed {done.stdout[:200]!r}"


@pytest.mark.parametrize("argv", [["-m", m] for m in MODULES] + [[s] for s in SCRIPTS],
                         ids=MODULES + SCRIPTS)
def test_a_missing_config_is_one_line_and_exit_2(argv, tmp_path):
    help_text = run([*argv, "--help"]).stdout
    if "--config" not in help_text:
        pytest.skip(f"{' '.join(argv)} takes no --config")
    done = run([*argv, *REQUIRED.get(argv[-1], []), "--config", str(tmp_path / "missing.yaml")])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, f"exit {done.returncode}: {done.stderr[-500:]}"
    assert len(lines) == 1 and "missing.yaml" in lines[0], done.stderr
