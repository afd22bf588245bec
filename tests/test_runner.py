"""The run loop and run lifecycle: every question accounted for, one writer per folder, one-line failures.

Real code paths throughout: the runner with a work function that fails on purpose, the real file lock
held by a real second process, and the real `distill generate` against a port where no server listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from distill.core.errors import DistillError, ServerUnreachable
from distill.core.run import RunningStats, RunStopped, folder_lock, raise_if_stopped, run_lifecycle, run_resumable
from distill.core.store import JsonlStore, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl"
ITEMS = [((f"q{i}", 0), i) for i in range(20)]
KEY = lambda rec: (rec["id"], rec["sample"])  # noqa: E731


def stores(tmp_path):
    return JsonlStore(tmp_path / "records.jsonl"), JsonlStore(tmp_path / "errors.jsonl")


def work_failing_on(bad):
    async def work(i):
        await asyncio.sleep(0.001 * (i % 3))  # finish out of order, as real questions do
        if i in bad:
            raise ValueError(f"odd question {i}\nsecond line")
        return {"id": f"q{i}", "sample": 0}

    return work


def assert_adds_up(result):
    c = result.counts()
    assert c["planned"] == c["done"] + c["errors"] + c["not_run"] == len(ITEMS)
    assert min(c.values()) >= 0


def test_more_failures_than_concurrency_leave_every_question_accounted_for_and_a_rerun_retries_them(tmp_path):
    bad = set(range(1, 20, 2))  # 10 failures with 2 workers: the old loop lost its workers after 2
    store, errors = stores(tmp_path)
    result = run_resumable(ITEMS, work_failing_on(bad), store, KEY, errors=errors, concurrency=2,
                           max_consecutive_errors=100)
    assert result.status == "complete" and result.reason is None
    assert (result.done, result.errors, result.not_run) == (10, 10, 0)
    assert_adds_up(result)
    logged = read_jsonl(tmp_path / "errors.jsonl")
    assert sorted(e["key"][0] for e in logged) == sorted(f"q{i}" for i in bad)
    assert all(e["error"].startswith("ValueError: odd question") and "\n" not in e["error"] for e in logged)
    assert result.summary()["counts"] == result.counts()
    store.close()
    errors.close()

    store, errors = stores(tmp_path)  # the rerun: the fault has passed
    again = run_resumable(ITEMS, work_failing_on(set()), store, KEY, errors=errors, concurrency=2)
    assert (again.status, again.done, again.errors, again.not_run) == ("complete", 20, 0, 0)
    assert len(read_jsonl(tmp_path / "records.jsonl")) == 20


def test_failures_in_a_row_stop_the_run_with_the_reason_and_the_counts_still_add_up(tmp_path):
    store, errors = stores(tmp_path)
    ok_first = set(range(3, 20))  # three records, then every question fails (say, the server died)
    result = run_resumable(ITEMS, work_failing_on(ok_first), store, KEY, errors=errors, concurrency=2)
    assert result.status == "failed"
    assert "3 questions failed in a row" in result.reason and "odd question" in result.reason
    assert result.done <= 3 and 3 <= result.errors < 10 and result.not_run > 0  # stopped early, not at the end
    assert_adds_up(result)
    with pytest.raises(RunStopped, match=f"{result.not_run} of 20 not run"):
        raise_if_stopped(result)


def test_an_unreachable_server_stops_the_run_at_once(tmp_path):
    async def work(i):
        if i == 5:
            raise ServerUnreachable("http://127.0.0.1:1/v1 (teacher): connection refused after 5 retries")
        await asyncio.sleep(0)
        return {"id": f"q{i}", "sample": 0}

    store, errors = stores(tmp_path)
    result = run_resumable(ITEMS, work, store, KEY, errors=errors, concurrency=1)
    assert result.status == "failed" and "connection refused" in result.reason
    assert (result.done, result.errors, result.not_run) == (5, 1, 14)


def test_a_record_that_cannot_be_written_stops_the_run(tmp_path):
    store, errors = stores(tmp_path)
    os.close(store._fd)  # what a vanished disk looks like to the writer: every write fails
    result = run_resumable(ITEMS, work_failing_on(set()), store, KEY, errors=errors, concurrency=2)
    assert result.status == "failed" and "writing a record" in result.reason
    assert result.done == 0 and result.not_run == 20


def test_ctrl_c_stops_between_records_and_the_counts_add_up(tmp_path):
    code = textwrap.dedent(f"""
        import asyncio, json, sys
        from pathlib import Path
        from distill.core.run import RunningStats, run_resumable
        from distill.core.store import JsonlStore

        async def work(i):
            if i >= 3:  # the rest never finish: only the Ctrl-C ends this run, however slow the machine
                await asyncio.Event().wait()
            print("record", i, flush=True)
            return {{"id": f"q{{i}}", "sample": 0}}

        store = JsonlStore(Path({str(tmp_path / "records.jsonl")!r}))
        items = [((f"q{{i}}", 0), i) for i in range(50)]
        result = run_resumable(items, work, store, lambda r: (r["id"], r["sample"]), concurrency=2)
        print(json.dumps([result.status, result.counts()]), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    assert all(proc.stdout.readline().startswith("record") for _ in range(3))
    proc.send_signal(signal.SIGINT)
    last = proc.communicate(timeout=60)[0].strip().splitlines()[-1]
    status, counts = json.loads(last)
    assert status == "interrupted" and 0 < counts["done"] <= 3 and counts["errors"] == 0
    assert counts["done"] + counts["not_run"] == 50 == counts["planned"]
    assert len(read_jsonl(tmp_path / "records.jsonl")) == counts["done"]


def test_lifecycle_marks_the_manifest_and_turns_io_failures_into_one_line(tmp_path):
    out = tmp_path / "run"
    manifest = {"command": "test"}
    with pytest.raises(DistillError, match="ConnectionResetError: peer went away .*rerun to resume"):
        with run_lifecycle(out, manifest):
            assert json.loads((out / "manifest.json").read_text())["status"] == "running"
            raise ConnectionResetError("peer went away")
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["status"] == "failed" and saved["reason"] == "ConnectionResetError: peer went away"

    with pytest.raises(KeyError):  # a bug keeps its traceback, but the manifest still says how it ended
        with run_lifecycle(out, {"command": "test"}):
            raise KeyError("bug")
    assert json.loads((out / "manifest.json").read_text())["status"] == "failed"

    with pytest.raises(KeyboardInterrupt):
        with run_lifecycle(out, {"command": "test"}):
            raise KeyboardInterrupt
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"

    with run_lifecycle(out, {"command": "test"}) as m:
        m["counts"] = {"planned": 0}
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["status"] == "complete" and saved["counts"] == {"planned": 0}

    def refuse() -> None:
        raise DistillError("settings differ")

    with pytest.raises(DistillError, match="settings differ"):  # a refused check leaves the manifest alone
        with run_lifecycle(out, {"command": "other"}, check=refuse):
            pass
    assert json.loads((out / "manifest.json").read_text())["command"] == "test"


def write_generate_config(tmp_path: Path, out: Path) -> Path:
    dead = {"backend": "openai", "model": "teacher", "base_url": "http://127.0.0.1:9/v1", "max_retries": 0,
            "timeout_s": 5}
    cfg = {
        "planner": dead, "solver": dead, "tools": ["Wikipedia", "Calculator"],
        "wikipedia_scope": "question", "wikipedia_corpus": None,
        "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "train", "n": 6}],
        "output_dir": str(out), "concurrency": 2, "cache": None,
    }
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def hold_lock(out: Path) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from distill.core.run import folder_lock
        with folder_lock(Path({str(out)!r})):
            print("locked", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_run_on_a_locked_folder_exits_2_naming_the_holder_and_a_killed_holder_does_not_block(tmp_path):
    out = tmp_path / "run"
    config = write_generate_config(tmp_path, out)
    holder = hold_lock(out)
    try:
        done = subprocess.run([sys.executable, "-m", "distill.cli", "generate", "--config", str(config)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"in use by pid {holder.pid}" in lines[0], done.stderr
        assert not (out / "manifest.json").exists()  # the holder's run is left alone
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert f"pid {holder.pid}" in (out / "run.lock").read_text()  # what the killed holder left behind...
    with folder_lock(out):  # ...does not block: the kernel dropped its lock with the process
        assert f"pid {os.getpid()}" in (out / "run.lock").read_text()


def test_generate_against_a_dead_server_fails_in_one_line_and_the_manifest_says_why(tmp_path):
    out = tmp_path / "run"
    config = write_generate_config(tmp_path, out)
    done = subprocess.run([sys.executable, "-m", "distill.cli", "generate", "--config", str(config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]  # (the progress bar shares stderr)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and last == f"error: {manifest['reason']}"
    # found before the first question: the run's fingerprint asks each server what it serves
    assert "model server http://127.0.0.1:" in manifest["reason"] and "cannot reach it" in manifest["reason"]
    assert not (out / "trajectories.jsonl").exists()


def test_an_io_failure_is_one_line_and_exit_2_and_verbose_keeps_the_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    config = write_generate_config(tmp_path, blocker / "run")  # the output folder cannot be made
    cmd = [sys.executable, "-m", "distill.cli", "generate", "--config", str(config)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: NotADirectoryError:")
    verbose = subprocess.run([sys.executable, "-m", "distill.cli", "-v", *cmd[3:]], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr


def test_running_stats_mean_evidence_recall_over_the_records_that_have_it():
    stats = RunningStats()
    stats.add({"dataset": "triviaqa", "evidence_recall": None, "scores": {"em": 0, "f1": 0.0}})
    assert stats.summary()["evidence_recall"] is None and "recall" not in stats.postfix()  # none has gold pages
    for recall in (1.0, 0.5, 0.0):
        stats.add({"dataset": "hotpotqa", "evidence_recall": {"recall": recall, "all": recall == 1.0}})
    summary = stats.summary()
    assert summary["evidence_recall"] == 0.5 and summary["records"] == 4  # the TriviaQA record is not a 0
    assert "recall 0.50" in stats.postfix()


def test_the_progress_of_sampled_plans_shows_their_mean_reward_and_valid_rate_not_an_em_they_never_have():
    stats = RunningStats()
    assert stats.postfix().startswith("EM -")
    stats.add({"dataset": "hotpotqa", "reward": 1.2, "plan": {"valid": True}, "evidence_recall": {"recall": 1.0}})
    stats.add({"dataset": "hotpotqa", "reward": 0.0, "plan": {"valid": False}})
    line = stats.postfix()
    assert line.startswith("reward 0.600 valid 0.50") and "EM" not in line and "recall 1.00" in line
