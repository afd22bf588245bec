"""The whole distillation end to end on a reduced demo config (real SmolLM2, real vLLM servers, real TRL), and
the pipeline's stage wiring and config checks without any model."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import yaml

from distill.pipeline import STAGES

RUN_STAGES = tuple(s for s in STAGES if s != "improve")  # the stages of a pipeline without an improve section
from distill.core.store import write_json, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def reduced_demo(tmp_path: Path, teacher_url: str) -> Path:
    """The demo config, shortened; the teacher is the test session's server (the same base model the demo's
    teacher_server serves), so the pipeline starts one server of its own, the students' with their adapters."""
    from distill.pipeline import PipelineConfig

    # written elsewhere, so the stage configs it names (beside it) get their full paths
    cfg = PipelineConfig.relative_to_file(yaml.safe_load((ROOT / "configs" / "demo_smollm2_cpu.yaml").read_text()),
                                          ROOT / "configs")
    cfg["run_dir"] = str(tmp_path / "run")
    del cfg["teacher_server"]
    gen = cfg["generate"]
    assert cfg["teacher"]["base_url"] == "@server"  # eval's teacher rows stay on the students' server
    for role in ("planner", "solver", "llm_tool"):
        gen.setdefault(role, {})["base_url"] = teacher_url  # the section's own key wins over the teacher's
    gen["datasets"][0]["n"] = 5
    gen["samples_per_question"] = 3
    gen["planner"]["temperature"] = 0.5  # a tiny teacher writes more well-formed plans when less random
    gen["planner"]["max_tokens"] = 128
    gen["solve"] = True  # the answer criterion below needs the Solver's answers
    gen["solver"]["max_tokens"] = 12
    cfg["filter"] = {"min_f1": 0.0}  # keep every valid, fully run plan: this test is about the machinery
    # 1 step of 1 example, one validation pass and one checkpoint: the demo's step of 4 examples is ~20 s here
    short = {"max_steps": 1, "eval_steps": 1, "save_steps": 1, "eval_on_start": False,
             "global_batch_size": 1, "per_device_train_batch_size": 1}
    cfg["train"] |= short | {"max_length": 768}
    for student in cfg["students"].values():  # a student's own train keys would override the step
        if "train" in student:
            student["train"] |= short
    ev = cfg["eval"]
    # improve runs for real in tests/test_improve.py (and its wiring below): here it would start a third server
    del cfg["improve"]
    ev["planners"] = [p for p in ev["planners"] if not p.get("compare_to")]
    ev["prompt_budget"]["methods"] = [m for m in ev["prompt_budget"]["methods"] if not m.endswith("_improved")]
    # the robustness sweep and re-planning have tests of their own: one method at one rate shows the wiring
    ev["planners"] = [p for p in ev["planners"] if not p.get("replan")]
    ev["robustness"] = {"rates": [1.0], "methods": ["teacher"], "n": 1}
    ev["datasets"][0]["n"] = 2
    ev["react_max_steps"] = 2
    ev["react_max_tokens"] = 48
    ev["solver"]["max_tokens"] = 12
    for p in ev["planners"]:
        p["spec"]["max_tokens"] = 96
    path = tmp_path / "demo_reduced.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_pipeline_runs_every_stage_then_skips_them(tmp_path, vllm_server):
    config = reduced_demo(tmp_path, vllm_server.base_url)
    cmd = [sys.executable, "-m", "distill.cli", "pipeline", "--config", str(config)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run = tmp_path / "run"
    for stage in ("generate", "filter", "sft-data", "train", "eval", "report"):
        assert (run / stage / "DONE.json").exists(), stage
    students = list(yaml.safe_load(config.read_text())["students"])
    for name in students:  # trained, and served as LoRA modules of one server
        assert (run / "train" / name / "adapter_config.json").exists()
        records = [json.loads(l) for l in (run / "eval" / "records" / f"{name}.jsonl").read_text().splitlines()]
        assert len(records) == 2 and all(r["planner"]["model"] == name for r in records)
    results = json.loads((run / "results.json").read_text())
    assert {"teacher", *students} <= set(results["methods"])
    assert set(results["prompt_budget"]["rows"]) >= set(students)  # the demo's eval setting
    assert "## Prompt budget" in (run / "report.md").read_text()
    assert list(run.glob("*.png"))
    assert first.stdout.strip().splitlines()[-1].startswith("results:")

    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("done, skipped") == 6


# ------------------------------------------------------------------------------------- stage wiring (fast)
# Generation, training, the vLLM servers and evaluation are replaced (they need models); filter, sft-data and
# the report run for real on what the replacements write.


def wiring_config(tmp_path: Path) -> dict:
    served = {"backend": "openai", "base_url": "@server", "model": "smollm2-135m-instruct"}
    return {
        "run_dir": str(tmp_path / "run"),
        "teacher_server": {"base_model": "smollm2-135m-instruct"},
        "generate": {"planner": served, "solver": served, "tools": ["Wikipedia", "LLM", "Calculator"],
                     "datasets": [{"name": "hotpotqa", "source": "data/demo/train.jsonl", "n": 6}],
                     "eval_sets": [{"name": "hotpotqa", "source": "data/demo/dev.jsonl", "split": "validation"}]},
        "filter": {"min_f1": 0.5},
        "sft_data": {"tools": ["Wikipedia", "LLM", "Calculator"], "val_fraction": 0.34, "tokenizer": "none"},
        "train": {"config": str(ROOT / "configs" / "smollm2-135m_lora_cpu.yaml"), "max_steps": 2},
        "eval": {
            "planners": {"student": {"prompt": "zeroshot", "spec": served | {"model": "planner"}}},
            "baselines": ["direct"],
            "solver": served,
            "datasets": [{"name": "hotpotqa", "source": "data/demo/dev.jsonl", "n": 3}],
        },
    }


class Recorder:
    """Stands in for the stages that need a model; remembers what each was handed, in order."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    def entries(self) -> dict:
        return {"server": self.server, "generate": self.generate, "train": self.train, "eval": self.evaluate}

    def server(self, cfg, log_path):
        from contextlib import contextmanager
        from types import SimpleNamespace

        self.calls.append(("server", cfg))

        @contextmanager
        def running():
            yield SimpleNamespace(base_url=f"http://{'student' if cfg.adapters else 'teacher'}.test/v1",
                                  binding={"cores": 2, "reserved_cores": 0, "omp_threads_bind": "auto"})

        return running()

    def generate(self, cfg, config_path, fresh=False):
        from test_sft_data import kept_records

        self.calls.append(("generate", cfg))
        records = kept_records()  # 12 samples of 6 questions, every step run
        for r in records:
            r["evidence"] = [{"id": s["id"], "status": "ok"} for s in r["plan"]["steps"]]
        write_jsonl(Path(cfg.output_dir) / "trajectories.jsonl", records)
        return {"records": len(records)}

    def train(self, cfg):
        from datasets import load_from_disk

        self.calls.append(("train", cfg.data))
        # sft-data's real output, read as TRL does: mapping over it leaves `datasets`' cache files in the folder
        load_from_disk(cfg.distill.dataset_dir)["train"].map(lambda row: {"n": len(row["completion"])})
        out = Path(cfg.output_dir)
        (out / "adapter_config.json").write_text("{}")
        # "weights" that differ as a real adapter's would: with the training examples and the steps
        examples = json.loads((Path(cfg.distill.dataset_dir) / "summary.json").read_text())["splits"]["train"]["examples"]
        (out / "adapter_model.safetensors").write_text(json.dumps({"examples": examples, "steps": cfg.sft.max_steps}))
        return {"global_step": cfg.sft.max_steps, "final_train_loss": 1.5, "final_eval_loss": 1.6, "wall_s": 0.1}

    def evaluate(self, cfg, config_path, fresh=False):
        from test_report import rec

        self.calls.append(("eval", cfg))
        out = Path(cfg.output_dir)
        # the student answers as many questions right as its (first) adapter's training examples allow
        weights = sorted((out.parent / "train").glob("*/adapter_model.safetensors"))[0]
        right = min(3, json.loads(weights.read_text())["examples"] // 4)
        write_jsonl(out / "records" / "student.jsonl",
                    [rec("student", f"q{i}", "Paris" if i < right else "Rome", "Paris") for i in range(3)])
        write_jsonl(out / "records" / "direct.jsonl",
                    [rec("direct", f"q{i}", "Rome", "Paris", kind="direct", steps=0) for i in range(3)])
        manifest = {"methods": [{"name": "student"}, {"name": "direct"}], "reference": "student",
                    "bootstrap_samples": 50, "seed": 0, "examples": [["hotpotqa", f"q{i}"] for i in range(3)]}
        write_json(out / "manifest.json", manifest)
        return manifest


def test_each_stage_gets_its_folders_and_settings_and_done_json_its_counts(tmp_path, monkeypatch, capsys):
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig
    from distill.report import recompute

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    recorder = Recorder()
    Pipeline(validate(PipelineConfig, wiring_config(tmp_path)), "p.yaml", recorder.entries()).run_all()

    assert [name for name, _ in recorder.calls] == ["server", "generate", "train", "server", "eval"]
    for stage in ("generate", "eval"):  # how the CPU server it ran against shared the machine
        done = json.loads((run / stage / "DONE.json").read_text())
        assert done["server_cpu_binding"] == {"cores": 2, "reserved_cores": 0, "omp_threads_bind": "auto"}, stage
    assert "server_cpu_binding" not in json.loads((run / "train" / "DONE.json").read_text())
    calls = dict(recorder.calls[1:3]) | {"eval": recorder.calls[4][1]}
    teacher_server, student_server = recorder.calls[0][1], recorder.calls[3][1]
    assert teacher_server.adapter is None and not teacher_server.adapters and teacher_server.port == 0
    # one student, named as its LoRA module always was
    assert student_server.adapters == {"planner": str(run / "train" / "planner")} and student_server.port == 0
    gen = calls["generate"]
    assert gen.output_dir == str(run / "generate") and gen.cache == str(run / "calls.sqlite")
    assert gen.planner.base_url == gen.solver.base_url == "http://teacher.test/v1"
    train = calls["train"]
    assert (train["dataset_dir"], train["output_dir"]) == (str(run / "sft-data" / "planner"),
                                                           str(run / "train" / "planner"))
    assert train["max_steps"] == 2 and train["learning_rate"] == 1e-3  # the override on top of the named stage config
    ev = calls["eval"]
    assert ev.output_dir == str(run / "eval") and ev.planners[0].spec.base_url == "http://student.test/v1"

    done = {s: json.loads((run / s / "DONE.json").read_text()) for s in RUN_STAGES}
    made_from = {"fingerprint", "settings", "inputs"}
    assert {k: v for k, v in done["filter"].items() if k not in made_from} | {"seconds": 0} == {
        "stage": "filter", "seconds": 0, "kept": 6, "input_records": 12}
    assert done["filter"]["settings"]["min_f1"] == 0.5 and list(done["filter"]["inputs"]) == [
        "generate/trajectories.jsonl"]
    summary = json.loads((run / "sft-data" / "planner" / "summary.json").read_text())
    examples = done["sft-data"]["students"]["planner"]["examples"]
    assert examples == {s: v["examples"] for s, v in summary["splits"].items()}
    assert sum(examples.values()) == 6 and examples["validation"] >= 1
    assert done["train"]["students"]["planner"]["global_step"] == 2 and done["eval"]["methods"] == ["student", "direct"]
    assert set(done["report"]["stage_seconds"]) == set(RUN_STAGES[:-1])
    assert json.loads((run / "results.json").read_text()) == recompute(run / "eval")
    from distill.report import PLOTS

    assert (run / "report.md").exists() and sorted(p.name for p in run.glob("*.png")) == sorted(PLOTS.values())
    assert not (run / "eval" / "results.json").exists()  # evaluation writes records; the report stage the rest
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"results: {run / 'results.json'}"

    again = Recorder()
    Pipeline(validate(PipelineConfig, wiring_config(tmp_path)), "p.yaml", again.entries()).run_all()
    assert again.calls == [] and capsys.readouterr().out.count("done, skipped") == len(RUN_STAGES)


def test_a_stage_is_one_declaration_its_place_in_the_order_and_the_engine_runs_skips_and_follows_it(
        tmp_path, monkeypatch, capsys):
    """Adding a stage is its `Stage` (here a toy one, which counts the kept plans) and its place in the order
    (distill.pipeline.PIPELINE; here handed to the engine): the engine runs it after what it is made from, skips
    it when nothing changed, reruns it when the filter is redone, names it among what follows, and `--from` it
    sets it and the later stages aside; the report's provenance lists its fingerprint in its place."""
    from distill.core import layout
    from distill.core.config import validate
    from distill.core.stage import Stage, Unit
    from distill.core.store import content_digest, read_jsonl
    from distill.pipeline import PIPELINE, Pipeline, PipelineConfig

    def unit(p) -> Unit:
        kept = layout.kept(p.run)
        return Unit("count", p.run / "count", {"counts": "kept"}, {layout.in_run(p.run, kept): content_digest(kept)})

    def work(p) -> dict:
        return {"kept": len(read_jsonl(layout.kept(p.run)))}

    toy = Stage("count", dict, resolve=lambda p, url: {}, show=lambda p, c: print("count: the kept plans"), unit=unit,
                work=work, after=(layout.FILTER,))
    order = (*PIPELINE[:2], toy, *PIPELINE[2:])
    monkeypatch.chdir(ROOT)
    run, cfg = tmp_path / "run", wiring_config(tmp_path)

    def pipeline() -> Pipeline:
        return Pipeline(validate(PipelineConfig, cfg), "p.yaml", Recorder().entries(), order)

    pipeline().run_all()
    out = capsys.readouterr().out
    assert out.index("[pipeline] filter: running") < out.index("[pipeline] count: running") < out.index(
        "[pipeline] sft-data planner: running")
    done = json.loads((run / "count" / "DONE.json").read_text())
    assert done["kept"] == json.loads((run / "filter" / "DONE.json").read_text())["kept"] == 6
    assert "count" in json.loads((run / "report" / "DONE.json").read_text())["stage_seconds"]
    # the report's provenance lists its fingerprint in its place, with nothing else declared for it
    fingerprints = json.loads((run / "results.json").read_text())["provenance"]["fingerprints"]
    assert list(fingerprints) == ["generate", "filter", "count", "sft-data", "train", "eval"]
    assert fingerprints["count"] == {"fingerprint": done["fingerprint"]}

    pipeline().run_all()
    assert "[pipeline] count: done, skipped (same settings and inputs)" in capsys.readouterr().out

    cfg["filter"]["min_f1"] = 0.4
    pipeline().run_all()
    out = capsys.readouterr().out
    assert ("[pipeline] filter: settings changed (min_f1 0.5 -> 0.4): rerunning; count, sft-data, train, eval, "
            "report follow") in out
    assert "[pipeline] count: rerunning (filter redone)" in out

    pipeline().run_all(start="count")
    out = capsys.readouterr().out
    assert "[pipeline] filter: done, skipped" in out and "[pipeline] count: running (not done yet)" in out
    assert list(run.glob("count.before-*")) and list(run.glob("sft-data.before-*"))
    # the folders set aside keep their markers: the report lists the stages, not them
    fingerprints = json.loads((run / "results.json").read_text())["provenance"]["fingerprints"]
    assert list(fingerprints) == ["generate", "filter", "count", "sft-data", "train", "eval"]


def two_students(tmp_path: Path) -> dict:
    cfg = wiring_config(tmp_path)
    cfg["students"] = {"student": {"student_prompt": "full"},
                       "student_compact": {"student_prompt": "compact", "train": {"max_steps": 3}}}
    served = cfg["eval"]["planners"]["student"]["spec"]
    cfg["eval"]["planners"] = {"student": {"prompt": "full", "spec": served | {"model": "student"}},
                               "student_compact": {"prompt": "compact", "spec": served | {"model": "student_compact"}}}
    return cfg


def test_two_students_train_on_the_same_kept_examples_and_share_one_server(tmp_path, monkeypatch):
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig
    from distill.sft_data import build_sft_data
    from datasets import load_from_disk

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    recorder = Recorder()

    def sft_data(cfg):  # the real stage, seen on the way in
        recorder.calls.append(("sft-data", cfg))
        return build_sft_data(cfg)

    entries = recorder.entries() | {"sft-data": sft_data}
    Pipeline(validate(PipelineConfig, two_students(tmp_path)), "p.yaml", entries).run_all()

    assert [n for n, _ in recorder.calls] == ["server", "generate", "sft-data", "sft-data", "train", "train", "server",
                                               "eval"]
    sft = [c for n, c in recorder.calls if n == "sft-data"]
    assert [(c.student_prompt, c.out) for c in sft] == [
        ("full", str(run / "sft-data" / "student")), ("compact", str(run / "sft-data" / "student_compact"))]
    assert sft[0].kept == sft[1].kept == str(run / "filter" / "kept.jsonl")
    assert sft[0].tools == sft[1].tools and sft[0].val_fraction == sft[1].val_fraction == 0.34  # shared sft_data keys
    trains = [c for n, c in recorder.calls if n == "train"]
    assert [(t["dataset_dir"], t["output_dir"]) for t in trains] == [
        (str(run / "sft-data" / name), str(run / "train" / name)) for name in ("student", "student_compact")]
    # a student's own train keys override the shared section for it alone
    assert [t["max_steps"] for t in trains] == [two_students(tmp_path)["train"]["max_steps"], 3]
    assert trains[0]["learning_rate"] == trains[1]["learning_rate"]
    servers = [c for n, c in recorder.calls if n == "server"]
    assert servers[1].adapter is None and servers[1].adapters == {
        "student": str(run / "train" / "student"), "student_compact": str(run / "train" / "student_compact")}
    ev = recorder.calls[-1][1]
    assert [(p.name, p.prompt, p.spec.model, p.spec.base_url) for p in ev.planners] == [
        ("student", "full", "student", "http://student.test/v1"),
        ("student_compact", "compact", "student_compact", "http://student.test/v1")]

    # the same examples under two prompts: same questions and plans, the compact prompt the shorter
    full, compact = (load_from_disk(str(run / "sft-data" / n)) for n in ("student", "student_compact"))
    for split in ("train", "validation"):
        assert full[split]["id"] == compact[split]["id"] and full[split]["completion"] == compact[split]["completion"]
        assert all(len(str(c)) < len(str(f)) for f, c in zip(full[split]["prompt"], compact[split]["prompt"]))
    done = {s: json.loads((run / s / "DONE.json").read_text()) for s in ("sft-data", "train")}
    prompts = [done["sft-data"]["students"][n]["student_prompt"] for n in ("student", "student_compact")]
    assert prompts == ["full", "compact"]
    assert set(done["train"]["students"]) == {"student", "student_compact"}

    # a crash after the first student trained: the rerun trains only the second, then evaluates both again
    (run / "train" / "DONE.json").unlink()
    (run / "train" / "student_compact" / "DONE.json").unlink()
    for stage in ("eval", "report"):
        (run / stage / "DONE.json").unlink()
    again = Recorder()
    Pipeline(validate(PipelineConfig, two_students(tmp_path)), "p.yaml", again.entries()).run_all()
    assert [n for n, _ in again.calls] == ["train", "server", "eval"]
    assert again.calls[0][1]["output_dir"] == str(run / "train" / "student_compact")
    assert json.loads((run / "train" / "DONE.json").read_text())["students"]["student"]["global_step"] == 2


def test_a_student_added_to_a_finished_run_is_built_and_evaluated_alone(tmp_path, monkeypatch, capsys):
    """The per-student markers decide, not the stage's: the new student gets sft-data and training, the old one
    is not redone, and eval and report run again (eval resumes, so only the new rows cost anything)."""
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    one = two_students(tmp_path)
    one["students"].pop("student_compact")
    one["eval"]["planners"].pop("student_compact")
    Pipeline(validate(PipelineConfig, one), "p.yaml", Recorder().entries()).run_all()
    assert not (run / "sft-data" / "student_compact").exists()

    capsys.readouterr()
    again = Recorder()
    Pipeline(validate(PipelineConfig, two_students(tmp_path)), "p.yaml", again.entries()).run_all()
    assert [n for n, _ in again.calls] == ["train", "server", "eval"]
    assert again.calls[0][1]["output_dir"] == str(run / "train" / "student_compact")
    assert set(again.calls[1][1].adapters) == {"student", "student_compact"}
    out = capsys.readouterr().out
    assert "generate: done, skipped" in out and "filter: done, skipped" in out
    assert "sft-data student: done, skipped" in out and "train student: done, skipped" in out
    assert (run / "sft-data" / "student_compact" / "DONE.json").exists()
    assert set(json.loads((run / "train" / "DONE.json").read_text())["students"]) == {"student", "student_compact"}


def run_pipeline(cfg: dict, recorder: Recorder | None = None, start: str | None = None) -> Recorder:
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig

    recorder = recorder or Recorder()
    Pipeline(validate(PipelineConfig, cfg), "p.yaml", recorder.entries()).run_all(start)
    return recorder


def test_a_changed_filter_setting_reruns_filter_and_everything_after_and_the_report_changes(tmp_path, monkeypatch,
                                                                                            capsys):
    """Then an unchanged rerun does no work at all: no server, no stage, no model."""
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    run_pipeline(wiring_config(tmp_path))
    before = json.loads((run / "results.json").read_text())
    capsys.readouterr()

    cfg = wiring_config(tmp_path)
    cfg["filter"]["best_per_question"] = False  # every correct sample, not the best one per question: 12 kept, not 6
    again = run_pipeline(cfg)
    out = capsys.readouterr().out
    # sft-data and the report run for real; generation (and its teacher server) is not redone
    assert [n for n, _ in again.calls] == ["train", "server", "eval"]
    assert "[pipeline] generate: done, skipped (same settings and inputs)" in out
    assert ("[pipeline] filter: settings changed (best_per_question true -> false): rerunning; "
            "sft-data, train, eval, report follow") in out
    assert "[pipeline] sft-data planner: rerunning (filter redone)" in out
    assert json.loads((run / "filter" / "DONE.json").read_text())["kept"] == 12
    after = json.loads((run / "results.json").read_text())
    assert after["per_method"]["student"]["em"]["mean"] > before["per_method"]["student"]["em"]["mean"]
    assert list(run.glob("train/planner.before-*/adapter_model.safetensors"))  # the old student is kept, aside

    capsys.readouterr()
    third = run_pipeline(cfg)
    out = capsys.readouterr().out
    assert third.calls == [] and out.count("done, skipped (same settings and inputs)") == len(RUN_STAGES)
    assert json.loads((run / "results.json").read_text()) == after


def test_the_report_intro_set_on_a_finished_run_rewrites_only_the_report(tmp_path, monkeypatch, capsys):
    """`report: {intro: demo}` is the report stage's own setting: no model, no server, the same results."""
    from distill.report import INTROS, recompute

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    run_pipeline(wiring_config(tmp_path))
    assert INTROS["demo"] not in (run / "report.md").read_text()
    before = json.loads((run / "results.json").read_text())
    capsys.readouterr()

    again = run_pipeline(wiring_config(tmp_path) | {"report": {"intro": "demo"}})
    out = capsys.readouterr().out
    assert again.calls == [] and "[pipeline] eval: done, skipped (same settings and inputs)" in out
    assert "[pipeline] report: settings changed" in out
    assert (run / "report.md").read_text().startswith(f"# Evaluation report\n\n{INTROS['demo']}\n\n")
    assert 'class="intro"' in (run / "report.html").read_text()
    assert json.loads((run / "results.json").read_text()) == before == recompute(run / "eval")


def test_a_changed_student_train_key_retrains_only_that_student_and_re_evaluates(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    run_pipeline(two_students(tmp_path))
    capsys.readouterr()

    cfg = two_students(tmp_path)
    cfg["students"]["student_compact"]["train"]["max_steps"] = 4
    again = run_pipeline(cfg)
    out = capsys.readouterr().out
    assert [n for n, _ in again.calls] == ["train", "server", "eval"]
    assert again.calls[0][1]["output_dir"] == str(run / "train" / "student_compact")
    assert again.calls[0][1]["max_steps"] == 4
    assert "[pipeline] sft-data: done, skipped (same settings and inputs)" in out
    assert "[pipeline] train student: done, skipped (same settings and inputs)" in out
    assert ("[pipeline] train student_compact: settings changed (max_steps 3 -> 4): rerunning; eval, report follow"
            in out)
    assert "[pipeline] eval: rerunning (train student_compact redone)" in out
    done = json.loads((run / "train" / "DONE.json").read_text())["students"]
    assert done["student"]["global_step"] == 2 and done["student_compact"]["global_step"] == 4


def test_an_adapter_changed_by_hand_is_evaluated_again(tmp_path, monkeypatch, capsys):
    """Eval's inputs are the weights it serves: a student's folder replaced outside the pipeline is noticed."""
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    run_pipeline(wiring_config(tmp_path))
    (run / "train" / "planner" / "adapter_model.safetensors").write_text('{"examples": 12, "steps": 9}')
    capsys.readouterr()
    again = run_pipeline(wiring_config(tmp_path))
    assert [n for n, _ in again.calls] == ["server", "eval"]
    assert "[pipeline] eval: input changed (train/planner): rerunning; report follow" in capsys.readouterr().out


@pytest.mark.parametrize("marker, text", [
    ("filter/DONE.json", "{not json"),
    ("filter/DONE.json", "[1, 2]"),
    ("sft-data/planner/DONE.json", '{"seconds": "soon"}'),
])
def test_a_corrupt_marker_is_one_line_naming_it(tmp_path, monkeypatch, capsys, marker, text):
    from distill import cli

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    run_pipeline(wiring_config(tmp_path))
    (run / marker).write_text(text)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(wiring_config(tmp_path)))
    capsys.readouterr()
    assert cli.main(["pipeline", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / marker}") and err.count("\n") == 1, err


def test_a_corrupt_manifest_is_one_line_naming_it(tmp_path, capsys):
    from distill import cli

    (tmp_path / "eval" / "records").mkdir(parents=True)
    write_jsonl(tmp_path / "eval" / "records" / "direct.jsonl", [{"method": "direct", "id": "q"}])
    for text in ("{torn", '{"examples": "all"}'):
        (tmp_path / "eval" / "manifest.json").write_text(text)
        assert cli.main(["report", str(tmp_path / "eval")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {tmp_path / 'eval' / 'manifest.json'}") and err.count("\n") == 1, err


def test_a_second_pipeline_on_the_same_run_dir_is_refused(tmp_path, monkeypatch):
    from distill.core.errors import DistillError
    from distill.core.run import folder_lock

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    with folder_lock(run):  # the first pipeline, still running
        with pytest.raises(DistillError, match=f"{run} is in use by pid"):
            run_pipeline(wiring_config(tmp_path))
    assert not (run / "generate").exists()
    run_pipeline(wiring_config(tmp_path))  # once it is done, the folder is free


def fails_before_any_stage(tmp_path: Path, cfg: dict, message: str, capsys) -> None:
    """One line, exit 2, and no run folder: the pre-run check caught it."""
    from distill import cli

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("change, message", [
    (lambda c: c["eval"]["planners"]["student_compact"].update(prompt="full"),
     "eval planner student_compact serves student student_compact with prompt full, but it is trained on "
     "student_prompt compact"),
    (lambda c: c["eval"].update(tools=["Wikipedia", "LLM"]), "eval tools ['Wikipedia', 'LLM'] differ from student"),
    (lambda c: c.update(students={"a b": {}}), "students: Value error, 'a b' is not a student name"),
    (lambda c: c.update(students={}), "students: Value error, name at least one student"),
    (lambda c: c["students"]["student"].update(student_promt="full"), "students.student (pipeline): student_promt"),
    (lambda c: c["student_server"].update(served_model_name="student"), "also a LoRA module's name"),
    (lambda c: c["students"]["student_compact"]["train"].update(max_stepz=3),
     "students.student_compact.train over train: train config: unknown key(s) max_stepz"),
    (lambda c: c["eval"]["planners"]["student"]["spec"].update(model="planner"),
     "eval planner student asks the student server for model 'planner', which it does not serve"),
    (lambda c: c.update(students={"student": {"student_prompt": "full"}}),
     "eval planner student_compact asks the student server for model 'student_compact'"),
    (lambda c: c["generate"].update(eval_sets=[{"name": "hotpotqa", "source": "data/demo/train.jsonl"}]),
     "generate.eval_sets does not list eval dataset data/demo/dev.jsonl: add {name: hotpotqa, source: "
     "data/demo/dev.jsonl, split: validation} there"),
])
def test_a_student_served_otherwise_than_trained_fails_before_any_stage(tmp_path, monkeypatch, capsys, change,
                                                                         message):
    monkeypatch.chdir(ROOT)
    cfg = two_students(tmp_path)
    cfg["student_server"] = {}
    change(cfg)
    fails_before_any_stage(tmp_path, cfg, message, capsys)


@pytest.mark.parametrize("section, value, message", [
    ("eval", {"react_max_step": 3}, "eval: react_max_step: unknown key; did you mean react_max_steps?"),
    ("sft_data", {"val_fractoin": 0.1}, "sft_data (pipeline): val_fractoin: unknown key; did you mean val_fraction?"),
    ("train", {"config": str(ROOT / "configs" / "smollm2-135m_lora_cpu.yaml"), "lora_rank": 4},
     "train config: unknown key(s) lora_rank"),
    # relative to the pipeline config file's folder (here the test's own), not to the working directory
    ("train", {"config": "configs/nope.yaml"}, "config not found: {tmp}/configs/nope.yaml"),
    ("student_server", {"gpu_memory_utilisation": 0.5}, "student_server: gpu_memory_utilisation"),
    ("report", {"intro": "paper"}, "unknown intro 'paper'; known: demo"),
    ("report", {"title": "x"}, "report: title"),
])
def test_a_bad_key_in_any_section_fails_before_any_stage_one_line_exit_2(tmp_path, monkeypatch, capsys,
                                                                           section, value, message):
    monkeypatch.chdir(ROOT)
    cfg = wiring_config(tmp_path)
    cfg[section] = (cfg.get(section, {}) if "config" not in value else {}) | value
    fails_before_any_stage(tmp_path, cfg, message.replace("{tmp}", str(tmp_path)), capsys)


@contextmanager
def relay_to(port: int) -> Iterator[int]:
    """A TCP relay on a new port to the session's vLLM server: the same server listening elsewhere, as the
    pipeline's next start of its teacher server would be (a second real start costs a minute of both cores)."""
    import asyncio
    import threading

    ready, box = threading.Event(), {}

    async def pipe(reader, writer) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        box.update(port=server.sockets[0].getsockname()[1], loop=asyncio.get_running_loop(), stop=asyncio.Event())
        ready.set()
        async with server:
            await box["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    ready.wait()
    try:
        yield box["port"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join()


class RelayedTeacher(Recorder):
    """The real generation stage against the session's vLLM server, reached through a new port at every start;
    filter, training and evaluation stand in (what they do with the trajectories is not under test here)."""

    def __init__(self, server_port: int):
        super().__init__()
        self.server_port = server_port
        self.ports: list[int] = []

    def entries(self) -> dict:
        from distill.generate import generate

        return super().entries() | {"generate": generate, "filter": self.filter}

    def server(self, cfg, log_path):
        if cfg.adapters:
            return super().server(cfg, log_path)

        @contextmanager
        def started():
            with relay_to(self.server_port) as port:
                self.ports.append(port)
                yield SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")

        return started()

    def filter(self, inp, out, cfg):
        """The real filter's report; what it keeps from a 135M teacher may be nothing, so fixed records are kept."""
        from distill.filter import run_filter
        from test_sft_data import kept_records

        report = run_filter(inp, out, cfg)
        write_jsonl(out, kept_records())
        return report | {"kept": 12}


@pytest.mark.slow
def test_from_generate_on_a_new_port_replays_every_call_from_the_cache(tmp_path, monkeypatch, vllm_server):
    from urllib.parse import urlparse

    monkeypatch.chdir(ROOT)
    cfg = wiring_config(tmp_path)
    cfg["generate"] |= {"tools": ["Wikipedia", "LLM"], "concurrency": 2}
    cfg["generate"]["datasets"][0]["n"] = 2
    cfg["generate"]["planner"] = cfg["generate"]["planner"] | {"max_tokens": 64}
    cfg["generate"]["solver"] = cfg["generate"]["solver"] | {"max_tokens": 12}
    teacher = RelayedTeacher(urlparse(vllm_server.base_url).port)
    run_pipeline(cfg, teacher)
    summary = json.loads((tmp_path / "run" / "generate" / "summary.json").read_text())
    assert summary["records"] == 2 and summary["cache"]["misses"] > 0

    run_pipeline(cfg, teacher, start="generate")
    summary = json.loads((tmp_path / "run" / "generate" / "summary.json").read_text())
    assert len(set(teacher.ports)) == 2  # the teacher listened elsewhere the second time
    assert summary["records"] == 2 and summary["cache"]["misses"] == 0 and summary["cache"]["hits"] > 0


def test_generation_and_evaluation_report_where_training_reports_unless_their_section_says(tmp_path):
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig

    cfg = wiring_config(tmp_path)
    cfg["train"] = cfg["train"] | {"report_to": ["tensorboard", "mlflow"]}  # mlflow: training's alone
    pipe = Pipeline(validate(PipelineConfig, cfg), "p.yaml")
    assert pipe.config("generate", url="http://127.0.0.1:1/v1").report_to == ["tensorboard"]
    assert pipe.config("eval", url="http://127.0.0.1:1/v1").report_to == ["tensorboard"]
    cfg["eval"] = cfg["eval"] | {"report_to": ["none"]}
    assert Pipeline(validate(PipelineConfig, cfg), "p.yaml").config("eval", url="http://127.0.0.1:1/v1").report_to == ["none"]


def with_improve(tmp_path: Path, **improve) -> dict:
    cfg = two_students(tmp_path)
    cfg["improve"] = {"student": "student_compact", "samples_per_question": 2, "train": {"max_steps": 1}} | improve
    served = cfg["eval"]["planners"]["student"]["spec"]
    cfg["eval"]["planners"]["student_compact_improved"] = {
        "prompt": "compact", "spec": served | {"model": "student_compact_improved"}, "compare_to": "student_compact"}
    return cfg


class ImproveRecorder(Recorder):
    def entries(self) -> dict:
        return super().entries() | {"improve": self.improve}

    def improve(self, cfg, config_path, fresh=False):
        self.calls.append(("improve", cfg))
        adapter = Path(cfg.output_dir) / "round_1" / "adapter"
        adapter.mkdir(parents=True, exist_ok=True)
        (adapter / "adapter_model.safetensors").write_text(json.dumps({"samples": cfg.samples_per_question}))
        summary = {"mean_reward": 0.5, "mean_best_reward": 0.8, "kept": 3, "valid_plan_rate": 0.75}
        return {"rounds": [summary], "adapter": str(adapter)}


def test_the_improve_stage_continues_its_student_and_eval_serves_the_result_beside_it(tmp_path, monkeypatch,
                                                                                       capsys):
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    cfg = with_improve(tmp_path)
    recorder = ImproveRecorder()
    Pipeline(validate(PipelineConfig, cfg), "p.yaml", recorder.entries()).run_all()
    assert [n for n, _ in recorder.calls] == ["server", "generate", "train", "train", "improve", "server", "eval"]
    imp = dict(recorder.calls)["improve"]
    assert (imp.adapter, imp.output_dir) == (str(run / "train" / "student_compact"), str(run / "improve" / "student_compact"))
    assert imp.planner_prompt == "compact" and imp.tools == ["Wikipedia", "LLM", "Calculator"]  # the student's own
    assert [d.source for d in imp.datasets] == ["data/demo/train.jsonl"]  # generation's questions
    assert [d.source for d in imp.eval_sets] == ["data/demo/dev.jsonl"]  # and its leak guard
    assert imp.server == cfg.get("student_server", {})  # the students' server settings
    assert imp.samples_per_question == 2
    served = [c for n, c in recorder.calls if n == "server"][1]
    assert served.adapters["student_compact_improved"] == str(run / "improve" / "student_compact" / "round_1" / "adapter")
    row = next(p for p in recorder.calls[-1][1].planners if p.name == "student_compact_improved")
    assert row.compare_to == "student_compact"

    again = ImproveRecorder()
    Pipeline(validate(PipelineConfig, with_improve(tmp_path)), "p.yaml", again.entries()).run_all()
    assert again.calls == []
    capsys.readouterr()
    third = ImproveRecorder()
    Pipeline(validate(PipelineConfig, with_improve(tmp_path, samples_per_question=4)), "p.yaml",
             third.entries()).run_all()
    assert [n for n, _ in third.calls] == ["improve", "server", "eval"]
    out = capsys.readouterr().out
    assert "improve: settings changed (samples 2 -> 4): rerunning; eval, report follow" in out, out


def test_a_run_made_with_improves_old_key_samples_is_not_redone_for_its_new_name(tmp_path, monkeypatch):
    """improve's stage fingerprint digests samples_per_question under its old name, samples: the same value
    under either name is the same stage."""
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    old = with_improve(tmp_path)
    old["improve"]["samples"] = old["improve"].pop("samples_per_question")
    first = ImproveRecorder()
    Pipeline(validate(PipelineConfig, old), "p.yaml", first.entries()).run_all()
    assert "improve" in [n for n, _ in first.calls]
    again = ImproveRecorder()
    Pipeline(validate(PipelineConfig, with_improve(tmp_path)), "p.yaml", again.entries()).run_all()
    assert again.calls == []


def test_an_improved_row_on_another_prompt_than_its_student_fails_before_any_stage(tmp_path, monkeypatch, capsys):
    cfg = with_improve(tmp_path)
    cfg["eval"]["planners"]["student_compact_improved"]["prompt"] = "full"
    fails_before_any_stage(tmp_path, cfg, "eval planner student_compact_improved serves student "
                           "student_compact_improved with prompt full, but it is trained on student_prompt compact",
                           capsys)


def test_a_grpo_improve_section_serves_the_grpo_runs_adapter(tmp_path, monkeypatch):
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    cfg = with_improve(tmp_path)
    cfg["improve"] = {"student": "student_compact", "method": "grpo", "grpo": {"max_steps": 2}}
    pipe = Pipeline(validate(PipelineConfig, cfg), "p.yaml")
    pipe.check()
    assert pipe.config("improve").method == "grpo"
    assert pipe.server_config("student_server").adapters["student_compact_improved"] == str(
        tmp_path / "run" / "improve" / "student_compact" / "grpo" / "adapter")


# ------------------------------------------------------------------------------------- the teacher, named once

def with_teacher(tmp_path: Path) -> dict:
    """The wiring config with the teacher named once and every endpoint that repeats it saying only its own role's
    settings. The eval teacher rows ask the students' server for the base model, which it serves."""
    cfg = wiring_config(tmp_path)
    cfg["teacher"] = {"backend": "openai", "base_url": "@server", "model": "smollm2-135m-instruct",
                      "max_concurrency": 3}
    cfg["generate"]["planner"] = {"temperature": 0.7, "max_tokens": 300}
    cfg["generate"]["llm_tool"] = {"max_tokens": 48}
    del cfg["generate"]["solver"], cfg["eval"]["solver"]
    cfg["eval"]["planners"] = {"teacher": {"prompt": "fewshot", "spec": {"max_tokens": 200}},
                               "teacher+replan": {"prompt": "fewshot", "replan": True, "spec": {}},
                               **cfg["eval"]["planners"]}
    cfg["eval"]["judge"] = {"max_tokens": 8}
    return cfg


def test_the_teacher_named_once_is_every_endpoint_that_repeats_it(tmp_path, monkeypatch):
    """Generation's planner, Solver and LLM tool and eval's teacher rows, Solver and judge take the teacher, each
    with its role's own settings on top; the student's row is not the teacher's."""
    monkeypatch.chdir(ROOT)
    recorder = run_pipeline(with_teacher(tmp_path))
    calls = dict(recorder.calls)
    gen, ev = calls["generate"], calls["eval"]
    assert {(e.model, e.base_url, e.max_concurrency) for e in (gen.planner, gen.solver, gen.llm_tool)} == {
        ("smollm2-135m-instruct", "http://teacher.test/v1", 3)}  # the teacher on the teacher's server
    assert (gen.planner.temperature, gen.planner.max_tokens) == (0.7, 300) and gen.llm_tool.max_tokens == 48
    assert gen.solver.max_tokens == 64  # a section without a Solver: the teacher with the Solver's own default
    rows = {p.name: p.spec for p in ev.planners}
    served = [rows["teacher"], rows["teacher+replan"], ev.solver, ev.judge]
    assert {(e.model, e.base_url) for e in served} == {("smollm2-135m-instruct", "http://student.test/v1")}
    assert rows["teacher"].max_tokens == 200 and ev.judge.max_tokens == 8 and rows["teacher+replan"].max_tokens == 512
    assert (rows["student"].model, rows["student"].max_concurrency) == ("planner", 8)  # not a teacher row


def test_the_teacher_replaces_the_model_a_stage_config_names_and_the_pipelines_own_keys_win(monkeypatch):
    """The 7B pipeline's stage configs name gpt-4o-mini everywhere, for their own commands: one `teacher` setting
    changes all of them, whole (no api_key_env left over for a local server), and leaves the roles' settings."""
    from distill.core.config import load_config
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    path = ROOT / "configs" / "pipeline_hotpot_trivia_7b.yaml"
    local = ["teacher.base_url=http://127.0.0.1:8001/v1", "teacher.model=Qwen/Qwen2.5-72B-Instruct",
             "teacher.api_key_env=null"]  # a teacher on a server of one's own, which takes no key
    pipe = Pipeline(load_config(PipelineConfig, path, local + ["eval.judge.model=gpt-4o",
                                                              "eval.judge.api_key_env=OPENAI_API_KEY"]))
    gen, ev = pipe.config("generate", url=None), pipe.config("eval", url="http://127.0.0.1:1/v1")
    rows = {p.name: p.spec for p in ev.planners}
    teacher = [gen.planner, gen.solver, rows["teacher"], rows["teacher+replan"], ev.solver]
    assert {(e.model, e.base_url, e.api_key_env) for e in teacher} == {
        ("Qwen/Qwen2.5-72B-Instruct", "http://127.0.0.1:8001/v1", None)}
    assert (gen.planner.temperature, gen.planner.max_tokens, gen.solver.max_tokens) == (0.7, 512, 64)  # the file's
    assert (ev.judge.model, ev.judge.base_url, ev.judge.api_key_env) == ("gpt-4o", "http://127.0.0.1:8001/v1",
                                                                         "OPENAI_API_KEY")  # said in the section
    assert (rows["student"].model, rows["base"].model) == ("planner", "base")


def test_the_agent_named_once_is_every_stages_tools_and_wikipedia_and_a_sections_own_keys_win(monkeypatch, capsys):
    """`agent:` names the tools and Wikipedia once: generate, improve and eval run them (over improve's own file),
    sft_data lists the tools in the student's prompt; a section's own key wins; a key that is not the agent's is
    one line naming it."""
    from distill import cli
    from distill.core.config import load_config
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    demo = ROOT / "configs" / "demo_smollm2_cpu.yaml"
    pipe = Pipeline(load_config(PipelineConfig, demo, ["agent.wikipedia_top_k=5", "agent.tools=[Wikipedia]",
                                                       "eval.wikipedia_top_k=2"]))
    url = "http://127.0.0.1:1/v1"
    gen, imp, ev = pipe.config("generate", url=url), pipe.config("improve", url=url), pipe.config("eval", url=url)
    assert gen.tools == imp.tools == ev.tools == pipe.cfg.sft_data["tools"] == ["Wikipedia"]
    assert (gen.wikipedia_top_k, imp.wikipedia_top_k, ev.wikipedia_top_k) == (5, 5, 2)  # improve's file says 3
    assert gen.evidence_max_chars == imp.evidence_max_chars == ev.evidence_max_chars == 500
    assert "tools" not in pipe.cfg.filter and "wikipedia_top_k" not in pipe.cfg.sft_data

    assert cli.main(["pipeline", "--config", str(demo), "--set", "agent.planner_prompt=compact", "--check",
                     "--offline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "planner_prompt is not one of the agent's keys" in err[0], err


def test_a_new_teacher_redoes_generation_and_everything_made_from_it(tmp_path, monkeypatch, capsys):
    """The teacher is part of the resolved sections, so of their fingerprints, as any endpoint setting is."""
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    cfg = wiring_config(tmp_path)  # eval names its Solver itself: only generation takes the teacher
    cfg["teacher"] = {"backend": "openai", "base_url": "@server", "model": "smollm2-135m-instruct"}
    del cfg["generate"]["planner"], cfg["generate"]["solver"]
    run_pipeline(cfg)
    assert json.loads((run / "generate" / "DONE.json").read_text())["settings"]["planner"]["model"] == \
        "smollm2-135m-instruct"
    capsys.readouterr()
    assert run_pipeline(cfg).calls == []  # the same teacher: nothing to do

    cfg["teacher"]["model"] = "qwen-teacher"
    again = run_pipeline(cfg)
    out = capsys.readouterr().out
    assert [n for n, _ in again.calls] == ["server", "generate", "train", "server", "eval"]
    assert dict(again.calls)["generate"].planner.model == "qwen-teacher"
    assert ("[pipeline] generate: settings changed (planner.model smollm2-135m-instruct -> qwen-teacher, "
            "solver.model smollm2-135m-instruct -> qwen-teacher): rerunning; filter, sft-data, train, eval, report "
            "follow") in out, out


def test_check_shows_the_teacher_filled_in_and_warns_when_evals_teacher_is_another_model(tmp_path, monkeypatch,
                                                                                          capsys):
    """A warning, not a refusal (a user may mean it), in one line, from `--check` and from a run's start."""
    from distill import cli

    monkeypatch.chdir(ROOT)
    cfg = with_teacher(tmp_path)
    cfg["eval"]["planners"]["teacher+replan"] |= {"prompt": "full", "spec": {"model": "planner"}}  # the student
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["pipeline", "--check", "--offline", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: eval planner teacher+replan (planner) is not the model that writes the training "
                        "plans: generate.planner is smollm2-135m-instruct"], err
    assert ("--- teacher: smollm2-135m-instruct (generate planner, solver, llm_tool; eval solver, judge, teacher)"
            in out.splitlines())
    shown = yaml.safe_load(out.split("--- generate: resolved config\n")[1].split("\n---")[0])
    assert {(shown[r]["model"], shown[r]["max_concurrency"]) for r in ("planner", "solver", "llm_tool")} == {
        ("smollm2-135m-instruct", 3)}
    assert (shown["planner"]["temperature"], shown["planner"]["max_tokens"]) == (0.7, 300)
    assert not (tmp_path / "run").exists()

    run_pipeline(cfg)  # and at the start of a run, which goes on
    assert capsys.readouterr().err.count("warning: eval planner teacher+replan (planner)") == 1
    assert (tmp_path / "run" / "report" / "DONE.json").exists()
    del cfg["teacher"], cfg["eval"]["planners"]["teacher+replan"]  # each section naming its own: same check
    cfg["generate"] |= {"planner": {"backend": "openai", "base_url": "@server", "model": "smollm2-135m-instruct"}}
    cfg["eval"]["planners"]["teacher"] = {"prompt": "full", "spec": {"backend": "openai", "base_url": "@server",
                                                                     "model": "planner"}}
    from distill.core.config import validate
    from distill.pipeline import Pipeline, PipelineConfig

    Pipeline(validate(PipelineConfig, cfg)).check()
    assert capsys.readouterr().err.startswith("warning: eval planner teacher (planner) is not the model")


# ------------------------------------------------------------------------------------- paths in a pipeline config

def test_a_stage_config_is_read_from_the_folder_of_the_file_that_names_it(tmp_path, monkeypatch):
    """A pipeline config and its stage configs move together; `--set` paths are the command line's, relative to
    the working directory; absolute ones are kept."""
    from distill.core.config import load_config, read_yaml
    from distill.core.errors import DistillError
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    folder = tmp_path / "mine"
    folder.mkdir()
    cpu = ROOT / "configs" / "smollm2-135m_lora_cpu.yaml"
    (folder / "train.yaml").write_text(yaml.safe_dump(read_yaml(cpu) | {"learning_rate": 3e-4}))
    cfg = wiring_config(tmp_path)
    cfg["train"] = {"config": "train.yaml", "max_steps": 2}
    (folder / "p.yaml").write_text(yaml.safe_dump(cfg))

    def train(*overrides: str) -> dict:
        return Pipeline(load_config(PipelineConfig, folder / "p.yaml", list(overrides))).config("train", "planner").data

    assert train()["learning_rate"] == 3e-4 and train()["max_steps"] == 2  # mine/train.yaml, not ROOT's
    assert train("train.config=configs/smollm2-135m_lora_cpu.yaml")["learning_rate"] == 1e-3  # from the cwd
    assert train(f"train.config={folder / 'train.yaml'}")["learning_rate"] == 3e-4
    (folder / "p.yaml").write_text(yaml.safe_dump(cfg | {"train": {"config": str(cpu)}}))
    assert train()["learning_rate"] == 1e-3  # an absolute path as it is
    (folder / "p.yaml").write_text(yaml.safe_dump(cfg | {"train": {"config": "configs/smollm2-135m_lora_cpu.yaml"}}))
    with pytest.raises(DistillError, match=f"config not found: {folder}/configs/smollm2-135m_lora_cpu.yaml"):
        train()


# ------------------------------------------------------------------------------------- train.config: auto
# This machine has no GPU: the GPUs' memory is the one thing made up here (the `gpus` entry), in the sizes the
# cards report (MiB): L4 23034, RTX 4090 24564, A100-40GB 40536, A6000 48685, H100 81559, H200 143771, T4 15360.

def gpus(*mib: int):
    return lambda: [m << 20 for m in mib]


@pytest.mark.parametrize("mib, chosen", [
    ((23034,), "qwen2.5-7b_qlora_gpu.yaml"),
    ((24564,), "qwen2.5-7b_qlora_gpu.yaml"),
    ((40536,), "qwen2.5-7b_lora_gpu.yaml"),
    ((48685, 48685), "qwen2.5-7b_lora_gpu.yaml"),
    ((81559,), "qwen2.5-7b_lora_80gb.yaml"),
    ((143771,) * 8, "qwen2.5-7b_lora_80gb.yaml"),
    ((81559, 24564), "qwen2.5-7b_qlora_gpu.yaml"),  # every GPU trains at the same per-device batch: the smallest
])
def test_train_config_auto_picks_the_readmes_config_for_the_gpus_memory(tmp_path, monkeypatch, capsys, mib, chosen):
    from distill.core.config import read_yaml, validate
    from distill.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(ROOT)
    cfg = wiring_config(tmp_path)
    cfg["train"] = {"config": "auto", "max_steps": 2}
    pipe = Pipeline(validate(PipelineConfig, cfg), "p.yaml", {"gpus": gpus(*mib)})
    pipe.check()
    section = pipe.config("train", "planner").data
    assert section == read_yaml(ROOT / "configs" / chosen) | {"max_steps": 2} | {
        "dataset_dir": str(tmp_path / "run" / "sft-data" / "planner"), "output_dir": str(tmp_path / "run" / "train" / "planner")}
    lines = [line for line in capsys.readouterr().out.splitlines() if "train.config auto" in line]
    gib = min(mib) / 1024
    assert len(lines) == 1 and lines[0].startswith(f"[pipeline] train.config auto: configs/{chosen} (") and \
        f"has {gib:.1f} GiB" in lines[0], lines  # once, however often the section is read
    # which config is part of what training is made from: other GPUs that pick another retrain
    other = Pipeline(validate(PipelineConfig, cfg), "p.yaml", {"gpus": gpus(143771 if gib < 70 else 23034)})
    assert other.unit(other.step("train"), "planner").fingerprint != pipe.unit(pipe.step("train"), "planner").fingerprint


@pytest.mark.parametrize("mib, message", [
    ((), "train.config: auto picks a 7B training config by the GPUs' memory, but no GPU is visible"),
    ((15360,), "train.config: auto: the visible GPU has 15.0 GiB, below the 20 GiB the smallest 7B config "
               "(configs/qwen2.5-7b_qlora_gpu.yaml) is sized for"),
])
def test_train_config_auto_without_a_gpu_it_fits_is_one_line_before_any_stage(tmp_path, monkeypatch, capsys, mib,
                                                                               message):
    import distill.core.check

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(distill.core.check, "gpu_memory", gpus(*mib))  # the GPU this machine lacks, faked
    cfg = wiring_config(tmp_path)
    cfg["train"] = {"config": "auto"}
    fails_before_any_stage(tmp_path, cfg, message, capsys)


def test_an_error_in_a_planner_given_as_a_mapping_names_the_row_by_its_key():
    """eval's `planners` may be a mapping (configs/eval_hotpot_trivia_7b.yaml): the error names the key the user
    wrote, not the row's place in the list it becomes; a list's rows keep their index."""
    from distill.core.config import validate
    from distill.core.errors import DistillError
    from distill.evaluate import EvalConfig

    rows = {"teacher": {"prompt": "fewshot", "spec": {}}, "base": {"spec": {"model": "b", "max_tokens": 0}}}
    with pytest.raises(DistillError) as exc:
        validate(EvalConfig, {"planners": rows}, "eval")
    assert str(exc.value) == "eval: planners.base.spec.max_tokens: Input should be greater than or equal to 1; " \
                             "planners.base.prompt: Field required"
    with pytest.raises(DistillError, match=r"^eval: planners\.1\.prompt: Field required$"):
        validate(EvalConfig, {"planners": [{"name": "teacher", "prompt": "fewshot", "spec": {}},
                                           {"name": "base", "spec": {"model": "b"}}]}, "eval")
