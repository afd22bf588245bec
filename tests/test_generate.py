"""Generation end to end with the real SmolLM2 (in process, and through vLLM), resume after SIGINT and SIGKILL,
and the cache."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from distill.core.config import load_config
from distill.generate import GenerateConfig, generate
from distill.core.store import read_jsonl
from fakes import chat_api

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl"

RECORD_FIELDS = {
    "format_version", "id", "dataset", "question", "answers", "method", "sample", "planner", "plan", "evidence",
    "solver", "prediction", "scores", "tokens", "cost_usd", "wall_s", "llm_calls",
}


def write_config(tmp_path: Path, n: int, samples: int, **extra) -> Path:
    cfg = {
        "planner": {"backend": "transformers", "model": "smollm2-135m-instruct", "temperature": 0.7, "max_tokens": 64},
        "solver": {"backend": "transformers", "model": "smollm2-135m-instruct", "max_tokens": 12},
        "tools": ["Wikipedia", "LLM", "Calculator"],
        "wikipedia_scope": "question",
        "wikipedia_corpus": None,
        "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "train", "n": n}],
        "output_dir": str(tmp_path / "run"),
        "samples_per_question": samples,
        "concurrency": 2,
        "tool_timeout_s": 600,  # a loaded CI machine must not turn an LLM-tool call into a timeout
    } | extra
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_generate_records_every_field_and_a_rerun_calls_no_model(tmp_path):
    cfg = load_config(GenerateConfig, write_config(tmp_path, n=2, samples=1))
    summary = generate(cfg)
    out = Path(cfg.output_dir)
    records = read_jsonl(out / "trajectories.jsonl")
    assert len(records) == 2 and summary["records"] == 2
    for r in records:
        assert RECORD_FIELDS <= set(r)
        assert r["planner"]["messages"][0]["role"] == "system" and r["planner"]["usage"]["prompt_tokens"] > 0
        assert set(r["scores"]) >= {"em", "f1"}
        assert len(r["evidence"]) == len(r["plan"]["steps"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["config"]["samples_per_question"] == 1

    (out / "trajectories.jsonl").unlink()
    again = generate(cfg)
    # every model call came from the cache (a tool call that raised, e.g. Calculator[not arithmetic], is not
    # cached and may run again: it is free and deterministic)
    assert again["cache"]["model_misses"] == 0 and again["cache"]["hits"] > 0
    rerun = read_jsonl(out / "trajectories.jsonl")
    strip = lambda r: (r["id"], r["planner"]["output"], r["prediction"], [e["output"] for e in r["evidence"]])
    assert sorted(map(strip, rerun)) == sorted(map(strip, records))


def run_until(cmd, out_file: Path, lines: int, sig: int, timeout: float = 240) -> int:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if out_file.exists() and out_file.read_bytes().count(b"\n") >= lines:
            proc.send_signal(sig)
            break
        time.sleep(0.2)
    try:
        return proc.wait(timeout=60)
    finally:
        proc.kill()


@pytest.mark.slow
def test_resume_after_sigint_and_sigkill_keeps_each_record_once(tmp_path, vllm_server):
    """Through the session's vLLM server: each resumed process starts in seconds, not a model load."""
    served = {"backend": "openai", "base_url": vllm_server.base_url, "model": "smollm2-135m-instruct"}
    config = write_config(tmp_path, n=4, samples=2, cache=None, planner=served | {"temperature": 0.7, "max_tokens": 64},
                          solver=served | {"max_tokens": 12}, llm_tool=served | {"max_tokens": 32})
    out_file = tmp_path / "run" / "trajectories.jsonl"
    cmd = [sys.executable, "scripts/generate_trajectories.py", "--config", str(config)]

    rc = run_until(cmd, out_file, lines=2, sig=signal.SIGINT)
    assert rc == 130  # a clean stop, said as such
    assert out_file.read_bytes().endswith(b"\n")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"

    n_before = out_file.read_bytes().count(b"\n")
    run_until(cmd, out_file, lines=n_before + 2, sig=signal.SIGKILL)
    with out_file.open("ab") as f:  # what a crash mid-write leaves behind
        f.write(b'{"id": "mini-9", "sample": 0, "planner": {"outp')

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_jsonl(out_file)
    counts = collections.Counter((r["id"], r["sample"]) for r in records)
    assert len(counts) == 8 and set(counts.values()) == {1}
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["status"] == "complete"


def test_generate_refuses_a_folder_made_with_other_settings_and_fresh_sets_it_aside(tmp_path, capsys):
    """A stand-in for an OpenAI-compatible server (its /v1/models names what it serves, as vLLM's does) answers
    every call; the check under test is the folder's."""
    from distill import cli

    with chat_api(adapter=str(tmp_path / "weights")) as api:
        served = {"backend": "openai", "base_url": api.url, "model": "planner", "max_retries": 0}
        path = write_config(tmp_path, n=2, samples=1, planner=served, solver=served, tools=["Calculator"])
        cfg = load_config(GenerateConfig, path)
        generate(cfg)
        out = Path(cfg.output_dir)
        made = (out / "trajectories.jsonl").read_text()
        manifest = json.loads((out / "manifest.json").read_text())
        assert {r["fingerprint"] for r in read_jsonl(out / "trajectories.jsonl")} == {manifest["fingerprint"]}

        capsys.readouterr()
        assert cli.main(["generate", "--config", str(path), "--set", "planner.temperature=0.5"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "trajectories.jsonl holds trajectories made with other settings " \
            "(planner.temperature 0.0 -> 0.5): rerun with --fresh" in err, err
        assert (out / "trajectories.jsonl").read_text() == made  # nothing touched

        assert cli.main(["generate", "--config", str(path), "--set", "samples_per_question=2"]) == 0  # only adds
        assert cli.main(["generate", "--config", str(path), "--set", "planner.temperature=0.5", "--fresh"]) == 0
    aside = list(out.glob("trajectories.jsonl.before-*"))
    assert len(aside) == 1 and len(read_jsonl(aside[0])) == 4  # the 2 + 2 records of the first settings, kept
    new = read_jsonl(out / "trajectories.jsonl")
    assert len(new) == 2 and new[0]["fingerprint"] != manifest["fingerprint"]


def test_generate_reports_its_progress_to_tensorboard_and_refuses_a_missing_tracker(tmp_path, capsys):
    """The same stand-in server; the TensorBoard event file is real and read back with TensorBoard's own reader."""
    import importlib.util

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from distill import cli

    with chat_api(adapter=str(tmp_path / "weights")) as api:
        served = {"backend": "openai", "base_url": api.url, "model": "planner", "max_retries": 0}
        path = write_config(tmp_path, n=3, samples=1, planner=served, solver=served, tools=["Calculator"])
        if importlib.util.find_spec("wandb") is None:  # the tracker named but not installed: refused before any work
            assert cli.main(["generate", "--config", str(path), "--set", "report_to=[wandb]"]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "report_to: wandb needs the package 'wandb' (pip install wandb)" in err
            assert not (tmp_path / "run").exists()
        assert cli.main(["generate", "--config", str(path), "--set", "report_to=[tensorboard]"]) == 0
        out = tmp_path / "run"
        records = read_jsonl(out / "trajectories.jsonl")
        # the tracker is not part of what a record is made from: the same run without it resumes, doing nothing
        calls = api.calls
        assert cli.main(["generate", "--config", str(path)]) == 0
        assert read_jsonl(out / "trajectories.jsonl") == records and api.calls == calls
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    logged = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert [step for step, _ in logged["generate/records"]] == [1, 2, 3]
    assert logged["generate/valid_plan_rate"][-1][1] == pytest.approx(
        sum(r["plan"]["valid"] for r in records) / 3)
    assert logged["generate/tokens"][-1][1] == sum(r["tokens"]["total"] for r in records)


def test_a_judge_without_answers_to_grade_is_refused(tmp_path):
    from distill.core.errors import DistillError

    path = tmp_path / "g.yaml"
    spec = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    path.write_text(yaml.safe_dump({"planner": spec, "solver": spec, "judge": spec, "solve": False}))
    with pytest.raises(DistillError, match="judge: a judge grades the Solver's answers, and solve: false makes none"):
        load_config(GenerateConfig, path)
    assert load_config(GenerateConfig, path, ["solve=true"]).judge is not None


def test_run_unread_steps_at_its_default_leaves_generates_fingerprint_as_it_was(tmp_path, monkeypatch):
    """Added after runs were recorded: at its default it is not digested, so adding it redoes no finished run.
    (No server here: the models' identities, which a run asks its servers for, are left out.)"""
    import distill.generate
    from distill.generate import run_settings

    monkeypatch.setattr(distill.generate, "model_identities", lambda models: {})

    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Q?", "answer": "A"}) + "\n")
    spec = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    cfg = GenerateConfig(planner=spec, solver=spec, tools=["Calculator"],
                         datasets=[{"name": "hotpotqa", "source": str(data), "split": "train", "n": 1}])
    assert "run_unread_steps" not in run_settings(cfg)
    off = cfg.model_copy(update={"run_unread_steps": False, "solve": False})
    assert run_settings(off)["run_unread_steps"] is False
