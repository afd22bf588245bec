"""Crash and resume in CI: generation and evaluation SIGKILLed at observed points and resumed.

Each run is killed once in start-up (its manifest says running, no record yet) and then KILLS times, each
right after the record count reaches one or two more than the killed run started from; the workload (24
records each) leaves room for every kill before the end, so no kill depends on the machine's speed. After one
kill a real record line is torn: the file is truncated to the middle of its last record line, no newline, as a
kill inside that write leaves it; the resume must cut it and redo that record, which the final run must hold
exactly once. The kill loop is scripts/kill_resume_check.py's, so the script and CI check the same thing.

The session's vLLM CPU server (tests/conftest.py) serves SmolLM2 for both, so a resumed process starts in
seconds rather than loading a model; the call cache is on, so a resumed run replays the calls its killed
predecessor finished. `pytest -s` shows the kill points.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
from pathlib import Path

import pytest
import yaml

from distill.report import recompute

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
KILLS = 5


def _kill_resume_check():
    spec = importlib.util.spec_from_file_location("kill_resume_check", ROOT / "scripts" / "kill_resume_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def server(vllm_server):
    return vllm_server  # the session's (tests/conftest.py): its base model is smollm2-135m-instruct


def seed() -> int:
    """Random kill points each CI run; the seed is printed so a failure can be replayed (CRASH_SEED=...)."""
    return int(os.environ.get("CRASH_SEED", random.SystemRandom().randrange(10**6)))


def common(server) -> dict:
    spec = {"backend": "openai", "base_url": server.base_url, "model": "smollm2-135m-instruct", "timeout_s": 120}
    return {
        "solver": spec | {"max_tokens": 12},
        "tools": ["Wikipedia", "Calculator"],
        "wikipedia_scope": "question",
        "wikipedia_corpus": None,
        "concurrency": 2,
        "tool_timeout_s": 120,
        "_spec": spec,
    }


def run_check(command: str, cfg: dict, tmp_path: Path) -> dict:
    krc = _kill_resume_check()
    path = tmp_path / f"{command}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    s = seed()
    print(f"\n{command}: CRASH_SEED={s} (set it to replay this kill plan)")
    result = krc.kill_and_resume(command, str(path), Path(cfg["output_dir"]), KILLS, s, log=print)
    assert result["final_exit"] == 0, result["final_stderr"]
    kills = result["kills"]
    assert [p["after_record"] is None for p in kills] == [True] + [False] * KILLS, kills
    for p in kills[1:]:  # each kill came after the record it waited for, with work left to do
        assert 1 <= p["after_record"] <= p["on_disk"] < result["planned"], p
    assert result["status"] == "complete"
    assert result["duplicates"] == 0 and result["lost"] == 0 and result["torn_at_end"] == 0
    assert result["bad_lines"] == 0 and all(p["bad_lines"] == 0 for p in kills)
    assert result["distinct"] == result["records"] == result["planned"]
    tear = result["tear"]
    assert tear is not None and result["torn_tails_repaired"] == 1, tear
    assert tear["final_copies"] == 1, f"the torn record {tear['key']} is on disk {tear['final_copies']}x"
    assert krc.verdict(result)
    manifest = json.loads((Path(cfg["output_dir"]) / "manifest.json").read_text())
    counts = [manifest["counts"]] if command == "generate" else [r["counts"] for r in manifest["runs"].values()]
    assert all(c["errors"] == 0 and c["not_run"] == 0 and c["done"] == c["planned"] for c in counts)
    assert sum(c["planned"] for c in counts) == result["planned"]
    return result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_generation_survives_sigkill_at_observed_points(server, tmp_path):
    base = common(server)
    spec = base.pop("_spec")
    cfg = base | {
        "planner": spec | {"temperature": 0.7, "max_tokens": 48},
        "datasets": [{"name": "hotpotqa", "source": str(DEMO / "train.jsonl"), "split": "train", "n": 12}],
        "samples_per_question": 2,
        "output_dir": str(tmp_path / "gen"),
    }
    result = run_check("generate", cfg, tmp_path)
    assert result["planned"] == 24


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_evaluation_survives_sigkill_at_observed_points(server, tmp_path):
    base = common(server)
    spec = base.pop("_spec")
    cfg = base | {
        "planners": [{"name": "teacher", "prompt": "fewshot", "spec": spec | {"max_tokens": 48}}],
        "baselines": ["react", "direct"],
        "react_max_steps": 2,
        "react_max_tokens": 32,
        "datasets": [{"name": "hotpotqa", "source": str(DEMO / "dev.jsonl"), "split": "dev", "n": 8}],
        "output_dir": str(tmp_path / "eval"),
        "bootstrap_samples": 50,
    }
    result = run_check("eval", cfg, tmp_path)
    assert result["planned"] == 24
    assert recompute(tmp_path / "eval")["per_method"]["teacher"]["n"] == 8  # the records the kills left: a report
