"""More hostile input, each answered with one line and exit 2 (or read as it should be), never a traceback:
a boolean where a number belongs, PEFT's rank_pattern/alpha_pattern of any JSON shape, control characters in a
hand-made trajectory file, and a disk that fills during `distill generate` and `distill eval`.

The full-disk test fills a real tmpfs (mounted for the test; skipped where mounting is not permitted) and
generates against tests/fakes.py's ChatAPI, a stand-in for a hosted teacher API (11 prompt and 2 completion
tokens per call): the disk and the run machinery under test are real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from distill.cli import main
from distill.core.config import ModelSpec, validate
from distill.core.errors import DistillError
from distill.generate import GenerateConfig
from distill.llm.embedded import EMBEDDED_NAME
from distill.serving.serve import ServeConfig
from distill.core.store import read_jsonl
from fakes import chat_api

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl"


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------------------ booleans


@pytest.mark.parametrize("how", ["--set", "file"])
def test_port_true_is_refused_by_serve(tmp_path, capsys, how):
    """YAML's `true` (and `yes`, `on`) is 1 to pydantic's lax int: serve would listen on port 1."""
    if how == "file":
        config = tmp_path / "serve.yaml"
        config.write_text("port: true\n")
        argv = ["serve", "--dry-run", "--config", str(config)]
    else:
        argv = ["serve", "--dry-run", "--set", "port=yes"]
    assert main(argv) == 2
    assert "port: Value error, expected a number, not true" in one_error(capsys)


@pytest.mark.parametrize(("cls", "data", "key"), [
    (ServeConfig, {"port": False}, "port"),
    (ServeConfig, {"max_lora_rank": True}, "max_lora_rank"),
    (ServeConfig, {"gpu_memory_utilization": True}, "gpu_memory_utilization"),
    (ModelSpec, {"max_tokens": True}, "max_tokens"),
    (ModelSpec, {"temperature": True}, "temperature"),
    (GenerateConfig, {"concurrency": True}, "concurrency"),
])
def test_no_number_setting_takes_a_boolean(cls, data, key):
    with pytest.raises(DistillError, match=f"{key}: Value error, expected a number, not "):
        validate(cls, data)


def test_switches_and_numbers_still_read_as_before():
    cfg = validate(ServeConfig, {"port": 8123, "enforce_eager": True, "max_model_len": "2048"})
    assert (cfg.port, cfg.enforce_eager, cfg.max_model_len) == (8123, True, 2048)
    assert validate(GenerateConfig, {"replan": 1, "solve": False}).replan is True


# ------------------------------------------------------------------------------------------ rank_pattern


def peft_adapter(folder: Path, **config) -> Path:
    """adapter_config.json as PEFT itself writes it (LoraConfig.save_pretrained), then edited by hand as a user
    might; the weights file is only looked for, never read, by a dry run."""
    from peft import LoraConfig

    LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
               base_model_name_or_path=EMBEDDED_NAME).save_pretrained(str(folder))
    path = folder / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | config))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def dry_run(adapter: Path) -> list[str]:
    return ["serve", "--dry-run", "--set", f"adapter={adapter}", "--set", "device=cpu"]


@pytest.mark.parametrize(("config", "message"), [
    ({"rank_pattern": ["q_proj", 48]}, "rank_pattern must map module names to ranks (whole numbers from 1), "
                                       'e.g. {"q_proj": 16}; it is a list'),
    ({"rank_pattern": "q_proj=48"}, "rank_pattern must map module names to ranks (whole numbers from 1), "
                                    'e.g. {"q_proj": 16}; it is a string'),
    ({"rank_pattern": 48}, "rank_pattern must map module names to ranks (whole numbers from 1), "
                           'e.g. {"q_proj": 16}; it is a number'),
    ({"rank_pattern": {"q_proj": {"r": 48}}}, "rank_pattern maps 'q_proj' to an object; it must map"),
    ({"rank_pattern": {"q_proj": True}}, "rank_pattern maps 'q_proj' to a boolean"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern maps 'q_proj' to 0"),
    ({"rank_pattern": {"q_proj": 4.5}}, "rank_pattern maps 'q_proj' to 4.5"),
    ({"alpha_pattern": [32]}, "alpha_pattern must map module names to alphas (finite numbers)"),
    ({"alpha_pattern": {"v_proj": "32"}}, "alpha_pattern maps 'v_proj' to a string"),
    ({"r": True}, "no valid LoRA rank `r` (got True)"),
])
def test_a_hand_edited_adapter_config_is_one_line_naming_file_and_key(tmp_path, capsys, config, message):
    adapter = peft_adapter(tmp_path / "adapter", **config)
    assert main(dry_run(adapter)) == 2
    line = one_error(capsys)
    assert f"{(adapter / 'adapter_config.json').resolve()}: {message}" in line, line


@pytest.mark.parametrize(("config", "rank"), [
    ({"rank_pattern": {"q_proj": 48}, "alpha_pattern": {"q_proj": 96.5}}, "64"),
    ({"rank_pattern": None, "alpha_pattern": None}, "8"),
    ({"rank_pattern": {}, "alpha_pattern": {}}, "8"),
])
def test_rank_and_alpha_patterns_of_the_right_shape_are_read(tmp_path, capsys, config, rank):
    adapter = peft_adapter(tmp_path / "adapter", **config)
    assert main(dry_run(adapter)) == 0
    out = capsys.readouterr().out
    assert f"--max-lora-rank {rank}" in out, out


def test_merge_refuses_a_bad_rank_pattern_before_loading_a_model(tmp_path, capsys):
    adapter = peft_adapter(tmp_path / "adapter", rank_pattern=[["q_proj", 48]])
    assert main(["merge", str(adapter), "--out", str(tmp_path / "merged")]) == 2
    assert f"{adapter / 'adapter_config.json'}: rank_pattern must map module names" in one_error(capsys)
    assert not (tmp_path / "merged").exists()


# ------------------------------------------------------------------------------------------ control characters


def trajectory(n: int, question: str) -> dict:
    """A trajectory the filter keeps: a valid one-step plan, run, answered correctly."""
    plan = {"valid": True, "steps": [{"id": "#E1", "description": "look it up", "tool": "Wikipedia",
                                      "input": f"topic {n}", "deps": []}], "errors": []}
    return {"id": f"q{n}", "sample": 0, "dataset": "hotpotqa", "question": question, "answers": ["Paris"],
            "planner": {"model": "teacher", "output": f"Plan: look it up\n#E1 = Wikipedia[topic {n}]"},
            "plan": plan, "evidence": [{"id": "#E1", "status": "ok", "output": "Paris is ..."}],
            "prediction": "Paris", "scores": {"em": 1.0, "f1": 1.0}}


def write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))  # json writes U+0000 as the escape \u0000
    return path


@pytest.mark.parametrize("char", ["\x00", "\x1b", "\x07", "\x7f"])
def test_filter_and_sft_data_refuse_a_control_character_in_the_question(tmp_path, capsys, char):
    good = [trajectory(n, f"Which city is number {n}?") for n in range(3)]
    bad = good[:1] + [trajectory(1, f"Which city{char} is number 1?")] + good[2:]
    code = f"U+{ord(char):04X}"

    trajectories = write_lines(tmp_path / "trajectories.jsonl", bad)
    kept = tmp_path / "kept.jsonl"
    assert main(["filter", str(trajectories), "--out", str(kept)]) == 2
    assert f"{trajectories}:2: field `question`: the question holds the control character {code}" \
        in one_error(capsys)
    assert not kept.exists()

    kept = write_lines(tmp_path / "kept.jsonl", bad)  # a hand-made kept file goes straight to sft-data
    out = tmp_path / "sft"
    assert main(["sft-data", str(kept), "--out", str(out), "--tokenizer", "none"]) == 2
    assert f"{kept}:2: field `question`: the question holds the control character {code}" in one_error(capsys)
    assert not out.exists()

    write_lines(trajectories, good)  # the same file without it goes through both
    assert main(["filter", str(trajectories), "--out", str(kept)]) == 0
    assert main(["sft-data", str(kept), "--out", str(out), "--tokenizer", "none"]) == 0


def test_filter_refuses_a_control_character_in_a_gold_answer(tmp_path, capsys):
    trajectories = write_lines(tmp_path / "t.jsonl", [trajectory(0, "Where?") | {"answers": ["Par\x00is"]}])
    assert main(["filter", str(trajectories), "--out", str(tmp_path / "kept.jsonl")]) == 2
    assert f"{trajectories}:1: field `answers`: a gold answer holds a control character" in one_error(capsys)


def test_tabs_line_breaks_and_c1_controls_still_pass(tmp_path, capsys):
    """The dataset rule exactly: real TriviaQA questions hold C1 controls (mis-decoded cp1252 quotes)."""
    trajectories = write_lines(tmp_path / "t.jsonl", [trajectory(0, "Which\tcity\n is \x93it\x94?")])
    assert main(["filter", str(trajectories), "--out", str(tmp_path / "kept.jsonl")]) == 0


# ------------------------------------------------------------------------------------------ a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def fill(disk: Path, leave: int) -> Path:
    """Fill the disk up to `leave` bytes with a ballast file, which freeing space removes."""
    stat = os.statvfs(disk)
    ballast = disk / f"ballast-{uuid.uuid4().hex[:8]}"
    ballast.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - leave))
    return ballast


def generate_config(tmp_path: Path, out: Path, url: str, **extra) -> Path:
    served = {"backend": "openai", "base_url": url, "model": "planner", "max_retries": 0}
    cfg = {"planner": served, "solver": served, "tools": ["Calculator"], "wikipedia_scope": "question",
           "wikipedia_corpus": None, "output_dir": str(out), "samples_per_question": 8, "concurrency": 2,
           "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "train", "n": 6}]} | extra
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def generate(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distill.cli", "generate", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if "error" in line.lower() or "No space" in line]


def test_generate_on_a_full_disk_names_the_file_keeps_counts_and_resumes(tmp_path, small_disk):
    out = small_disk / "run"
    records = out / "trajectories.jsonl"
    with chat_api() as api:
        config = generate_config(tmp_path, out, api.url, cache=None)
        ballast = fill(small_disk, leave=40 * 1024)  # room for the manifest and a dozen records of the 48
        first = generate(config)
        assert first.returncode == 2, first.stderr[-2000:]
        [line] = error_lines(first.stderr)  # one error, not a second one from closing the file
        assert line.startswith(f"error: run stopped: writing a record failed: cannot write {records}: "
                               "No space left on device ("), line
        written = records.read_bytes()
        assert written.endswith(b"\n")  # no torn line left behind
        on_disk = len(read_jsonl(records))
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "failed" and 0 < on_disk < 48
        assert manifest["counts"] == {"planned": 48, "done": on_disk, "errors": 0, "not_run": 48 - on_disk}
        assert manifest["records_on_disk"] == on_disk
        assert f"cannot write {records}: No space left on device" in manifest["reason"]
        assert line.removeprefix("error: ").startswith(manifest["reason"])

        ballast.unlink()  # space freed: the same command goes on from where it stopped
        calls = api.calls
        second = generate(config)
        assert second.returncode == 0, second.stderr[-2000:]
        assert not error_lines(second.stderr)
        assert records.read_bytes().startswith(written)  # the first run's records kept as they were
        keys = Counter((r["id"], r["sample"]) for r in read_jsonl(records))
        assert len(keys) == 48 and set(keys.values()) == {1}
        # only the missing records were asked for (a planner and a Solver call each)
        assert api.calls - calls == 2 * (48 - on_disk)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert manifest["counts"] == {"planned": 48, "done": 48, "errors": 0, "not_run": 0}


def test_generate_whose_call_cache_cannot_grow_names_the_cache_and_keeps_counts(tmp_path, small_disk):
    """The default `cache: auto` puts the SQLite call cache in the run folder, the first file a full disk
    refuses: the one line names it, and the manifest still has the folder's counts."""
    out = small_disk / "run"
    with chat_api() as api:
        config = generate_config(tmp_path, out, api.url)
        fill(small_disk, leave=24 * 1024)
        first = generate(config)
    assert first.returncode == 2, first.stderr[-2000:]
    [line] = error_lines(first.stderr)
    # SQLite's own words vary with where it ran out ("database or disk is full", "disk I/O error")
    assert line.startswith(f"error: call cache {out / 'calls.sqlite'}: "), line
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and str(out / "calls.sqlite") in manifest["reason"]
    done = len(read_jsonl(out / "trajectories.jsonl")) if (out / "trajectories.jsonl").exists() else 0
    assert manifest["counts"] == {"planned": 48, "done": done, "errors": 0, "not_run": 48 - done}


def test_eval_on_a_full_disk_names_the_file_keeps_counts_and_resumes(tmp_path, small_disk):
    """Eval runs each method through the same loop and record store: the same one line, and per-method counts."""
    out = small_disk / "eval"
    with chat_api() as api:
        served = {"backend": "openai", "base_url": api.url, "model": "planner", "max_retries": 0}
        cfg = {"planners": [{"name": name, "prompt": "full", "spec": served} for name in ("a", "b", "c")],
               "baselines": [], "solver": served, "tools": ["Calculator"], "wikipedia_scope": "question",
               "wikipedia_corpus": None, "output_dir": str(out), "cache": None, "concurrency": 2,
               "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 6}]}
        config = tmp_path / "eval.yaml"
        config.write_text(yaml.safe_dump(cfg))
        command = [sys.executable, "-m", "distill.cli", "eval", "--config", str(config)]
        ballast = fill(small_disk, leave=30 * 1024)  # the manifest and a few of the 18 records
        first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert first.returncode == 2, first.stderr[-2000:]
        [line] = error_lines(first.stderr)
        failed = next(p for p in sorted((out / "records").glob("*.jsonl")) if f"cannot write {p}: No space" in line)
        manifest = json.loads((out / "manifest.json").read_text())
        done = len(read_jsonl(failed))
        assert manifest["status"] == "failed" and line.removeprefix("error: ").startswith(manifest["reason"])
        assert manifest["runs"][failed.stem]["counts"] == {"planned": 6, "done": done, "errors": 0,
                                                            "not_run": 6 - done}

        ballast.unlink()
        second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0 and not error_lines(second.stderr), second.stderr[-2000:]
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert {name: run["counts"]["done"] for name, run in manifest["runs"].items()} == {"a": 6, "b": 6, "c": 6}
        assert all(len(read_jsonl(out / "records" / f"{name}.jsonl")) == 6 for name in "abc")
