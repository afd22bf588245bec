"""The Makefile's demos are `distill pipeline` with `--set` switches that no config file holds: `make demo-full`
(the verdict's scale) and `make demo-real` (the same on real HotpotQA). Each target's own command line, as make
writes it, must pass the pipeline's pre-run check and reach the stages it means to change."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from distill.cli import main
from distill.core.config import load_config
from distill.pipeline import Pipeline, PipelineConfig

ROOT = Path(__file__).resolve().parents[1]
URL = "http://127.0.0.1:1/v1"


def make_command(target: str, *variables: str) -> list[str]:
    """The arguments `make <target>` passes to distill, read with `make -n` (install taken as done)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(["make", "-n", "--no-print-directory", "-o", "install", target,
                           f"VENV={sys.prefix}", *variables], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"make -n {target} printed more than its one command: {lines}"
    argv = shlex.split(lines[0])
    assert argv[:2] == [f"{sys.prefix}/bin/distill", "pipeline"], argv
    return argv[1:]


def pipeline_of(argv: list[str], run_dir: Path) -> Pipeline:
    """The pipeline those arguments make, as `distill pipeline` builds it."""
    config = argv[argv.index("--config") + 1]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] + [f"run_dir={run_dir}"]
    return Pipeline(load_config(PipelineConfig, ROOT / config, sets))


def check(argv: list[str], run_dir: Path, capsys, monkeypatch):
    """`distill pipeline ... --check --offline` into a fresh run folder: its exit code and output."""
    monkeypatch.chdir(ROOT)
    rc = main(argv + ["--set", f"run_dir={run_dir}", "--check", "--offline"])
    assert not run_dir.exists()  # a check writes nothing
    return rc, capsys.readouterr()


def checked(argv: list[str], run_dir: Path, capsys, monkeypatch) -> str:
    rc, out = check(argv, run_dir, capsys, monkeypatch)
    assert rc == 0 and "check: everything this run needs is there" in out.out, out.out[-2000:] + out.err[-2000:]
    return out.out


def test_make_demo_full_passes_its_check_at_the_verdicts_scale(tmp_path, capsys, monkeypatch):
    argv = make_command("demo-full")
    checked(argv, tmp_path / "run", capsys, monkeypatch)
    short = pipeline_of(make_command("demo"), tmp_path / "short")
    full = pipeline_of(argv, tmp_path / "run")
    assert "run_dir=runs/demo_full" in argv  # its own folder: make demo's run is not redone
    improve, short_improve = full.config("improve"), short.config("improve")
    assert (improve.rounds, improve.samples_per_question, improve.train["max_steps"]) == (2, 4, 48)
    assert (short_improve.rounds, short_improve.samples_per_question) == (1, 2)
    assert [d.n for d in full.config("eval", url=URL).datasets] == [105]
    # everything else is the demo's own: the same questions, teacher and students
    assert improve.datasets == short_improve.datasets
    same = {"exclude": {"output_dir", "cache"}}
    assert full.config("generate", url=URL).model_dump(**same) == short.config("generate", url=URL).model_dump(**same)


def test_make_demo_real_reads_hotpotqa_from_the_hub_by_default(tmp_path, capsys, monkeypatch):
    argv = make_command("demo-real")
    out = checked(argv, tmp_path / "run", capsys, monkeypatch)
    assert "hub datasets are not read by a check" in out  # --offline: the Hub is never called
    pipeline = pipeline_of(argv, tmp_path / "run")
    gen, improve, ev = pipeline.config("generate", url=URL), pipeline.config("improve"), pipeline.config("eval", url=URL)
    hub = "hub:hotpotqa/hotpot_qa:distractor"
    for stage in (gen, improve):
        assert [(d.source, d.split, d.n) for d in stage.datasets] == [(hub, "train", 128)]
        assert [(d.source, d.split) for d in stage.eval_sets] == [(hub, "validation")]
    assert [(d.source, d.split, d.n) for d in ev.datasets] == [(hub, "validation", 200)]
    # each question searches its own paragraphs, never the demo's corpus
    for stage in (gen, improve, ev):
        assert (stage.wikipedia_scope, stage.wikipedia_corpus) == ("question", None)
    assert improve.rounds == 2  # make demo-full's settings


def official_file(path: Path, prefix: str, n: int) -> Path:
    """n HotpotQA records in the official JSON layout, each with its own two paragraphs."""
    rows = [{"_id": f"{prefix}-{i}", "question": f"Which of {prefix} place {i} and river {i} is older?",
             "answer": f"place {i}", "type": "comparison", "level": "easy",
             "supporting_facts": [[f"Place {i}", 0], [f"River {i}", 0]],
             "context": [[f"Place {i}", [f"Place {i} was founded in {1000 + i}."]],
                         [f"River {i}", [f"River {i} was named in {1500 + i}."]]]} for i in range(n)]
    path.write_text(json.dumps(rows))
    return path


def test_make_demo_real_reads_local_copies_of_the_official_files(tmp_path, capsys, monkeypatch):
    train = official_file(tmp_path / "hotpot_train_v1.1.json", "train", 130)
    dev = official_file(tmp_path / "hotpot_dev_distractor_v1.json", "dev", 200)
    argv = make_command("demo-real", f"HOTPOTQA_TRAIN={train}", f"HOTPOTQA_DEV={dev}")
    checked(argv, tmp_path / "run", capsys, monkeypatch)
    ev = pipeline_of(argv, tmp_path / "run").config("eval", url=URL)
    assert [(d.source, d.n) for d in ev.datasets] == [(str(dev), 200)]


def test_make_demo_real_refuses_too_few_local_questions(tmp_path, capsys, monkeypatch):
    n_train = 100
    train = official_file(tmp_path / "train.json", "train", n_train)
    dev = official_file(tmp_path / "dev.json", "dev", 200)
    argv = make_command("demo-real", f"HOTPOTQA_TRAIN={train}", f"HOTPOTQA_DEV={dev}")
    rc, out = check(argv, tmp_path / "run", capsys, monkeypatch)
    assert rc == 2 and f"has only {n_train} unused distinct questions, 128 requested" in out.out + out.err, out.err
