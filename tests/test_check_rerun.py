"""`distill pipeline --check` on an existing run folder says what the same command would redo and why, from the
stage markers and fingerprints a run itself goes by, and writes nothing. The run folder is built here from the
pipeline's own units (their DONE.json as a finished run leaves them): no model runs."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from distill.cli import main
from distill.core.config import load_config
from distill.pipeline import Pipeline, PipelineConfig, Unit
from distill.core.store import write_json

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo_smollm2_cpu.yaml"


def pipeline(run: Path, *sets: str) -> Pipeline:
    return Pipeline(load_config(PipelineConfig, DEMO, [f"run_dir={run}", *sets]), entries={"gpus": lambda: []})


@pytest.fixture(autouse=True)
def _in_checkout(monkeypatch):
    monkeypatch.chdir(ROOT)  # the demo config's data paths are relative to the checkout


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run folder whose every stage is done with the demo config's settings (the data a stage writes is stood in
    for by a small file, so the digests later stages take of it exist)."""
    run = tmp_path_factory.mktemp("run") / "demo"
    with contextlib.chdir(ROOT):
        return build_run(run)


def build_run(run: Path) -> Path:
    p = pipeline(run)
    names = list(p.students())
    (run / "generate").mkdir(parents=True)
    (run / "generate" / "trajectories.jsonl").write_text("{}\n")
    for name in names:
        (run / "sft-data" / name).mkdir(parents=True)
        (run / "sft-data" / name / "data.arrow").write_text(name)
    units = [p.unit(p.step("generate")), p.unit(p.step("filter"))]
    for stage in ("sft-data", "train"):
        per_student = {name: p.unit(p.step(stage), name) for name in names}
        units += [*per_student.values(), Unit(stage, run / stage, {}, {n: u.fingerprint for n, u in
                                                                        per_student.items()})]
    units += [p.unit(p.step(s)) for s in ("improve", "eval", "report")]
    for unit in units:
        unit.folder.mkdir(parents=True, exist_ok=True)
        write_json(unit.folder / "DONE.json", unit.head())
    return run


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def lines(capsys) -> list[str]:
    return [line.strip() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]


def test_an_unchanged_run_would_skip_every_stage_and_nothing_is_written(finished_run, capsys):
    before = snapshot(finished_run)
    pipeline(finished_run).show_rerun()
    out = lines(capsys)
    assert out == [f"{stage}: done, would be skipped (same settings and inputs)"
                   for stage in ("generate", "filter", "sft-data", "train", "improve", "eval", "report")]
    assert snapshot(finished_run) == before


def test_a_changed_filter_setting_reruns_the_filter_and_what_is_made_from_it(finished_run, capsys):
    pipeline(finished_run, "filter.max_steps=4").show_rerun()
    out = lines(capsys)
    assert out[0] == "generate: done, would be skipped (same settings and inputs)"
    assert out[1] == "filter: settings changed (max_steps null -> 4): rerunning; sft-data, train, improve, eval, " \
                     "report follow"
    assert "sft-data student: rerunning (filter redone)" in out
    assert out[-1] == "report: rerunning (eval redone)"


def test_a_students_training_key_retrains_it_and_what_is_made_from_it(finished_run, capsys):
    pipeline(finished_run, "students.student.train.learning_rate=0.002").show_rerun()
    out = lines(capsys)
    assert "sft-data: done, would be skipped (same settings and inputs)" in out
    assert ("train student: settings changed (learning_rate 0.001 -> 0.002): rerunning; improve, eval, report "
            "follow") in out
    assert "improve: rerunning (train student redone)" in out  # it improves that student
    assert "eval: rerunning (train student, improve redone)" in out


def test_the_improved_students_data_names_improve_among_what_follows(finished_run, capsys):
    """What follows a redone unit is read from what each stage is made from: new data for the improved student
    retrains it, so its improvement is redone too."""
    pipeline(finished_run, "sft_data.val_fraction=0.2").show_rerun()
    out = lines(capsys)
    assert ("sft-data student: settings changed (val_fraction 0.1 -> 0.2): rerunning; train student, improve, "
            "eval, report follow") in out
    assert "train student: rerunning (sft-data student redone)" in out
    assert "improve: rerunning (train student redone)" in out


def test_from_a_stage_reruns_it_and_the_later_ones(finished_run, capsys):
    pipeline(finished_run).show_rerun("eval")
    out = lines(capsys)
    assert out[-2:] == ["eval: rerunning (--from eval)", "report: rerunning (--from eval)"]
    assert "improve: done, would be skipped (same settings and inputs)" in out


def test_a_new_run_folder_runs_everything(tmp_path, capsys):
    pipeline(tmp_path / "new").show_rerun()
    assert "no run here yet: every stage would run" in capsys.readouterr().out
    assert not (tmp_path / "new").exists()


def test_the_check_command_prints_it(finished_run, capsys):
    rc = main(["pipeline", "--check", "--offline", "--config", str(DEMO), "--set", f"run_dir={finished_run}",
               "--set", "filter.max_steps=4"])
    out = capsys.readouterr().out
    assert rc == 0, out[-2000:]
    assert f"--- {finished_run}: what a rerun would do" in out
    assert "filter: settings changed (max_steps null -> 4): rerunning" in out
