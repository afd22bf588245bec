"""The whole distillation in one command, one run folder, one stage at a time.

    distill pipeline --config configs/demo_smollm2_cpu.yaml [--from train] [--set key=value]

generate -> filter -> sft-data -> train -> eval (the students served by vLLM, against base and teacher
Planners, ReAct and Direct) -> report. A stage whose `DONE.json` exists is skipped, unless an earlier stage did
new work or a student was added since (then it runs again, and what it finished stays done); an unfinished one
resumes (generation and evaluation records are appended as they finish, training restarts from its last
checkpoint).

`students: {name: sft_data overrides [+ train: {train overrides}]}` trains several students on the same kept
examples (e.g. one on the `full` prompt, one on the `compact` one): sft-data and train run once per student
into `sft-data/<name>` and `train/<name>`, each with its own DONE.json, and evaluation serves every adapter from
one vLLM server as the LoRA module `<name>`. Without `students` there is one, named as student_server names its
LoRA module (`planner`). `--from STAGE` moves that stage's folder and the later ones aside (nothing is deleted)
and reruns them; the call cache at the run folder's root makes a rerun of generation cost nothing.

Model endpoints may say `base_url: "@server"`: the pipeline starts a vLLM server (the teacher's for
generation, the students', base model plus LoRA adapters, for evaluation) and fills in its address.
"""

from __future__ import annotations

import argparse
import json
import pkgutil
import time
from contextlib import nullcontext
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import Field, ValidationInfo, field_validator

from distill.config import Strict, add_config_args, load_config, validate
from distill.errors import DistillError
from distill.store import write_json

STAGES = ("generate", "filter", "sft-data", "train", "eval", "report")
SERVER = "@server"
STAGE_CONFIG = "config"
# The library function behind each stage, and the server class; `Pipeline(entries=...)` swaps some of them so
# a test can check what every stage is handed without running a model.
ENTRIES = {
    "server": "distill.serve:VLLMServer",
    "generate": "distill.generate:generate",
    "filter": "distill.filter:run_filter",
    "sft-data": "distill.sft_data:build_sft_data",
    "train": "distill.train:launch",
    "eval": "distill.evaluate:evaluate",
    "report": "distill.report:write_report",
}


class PipelineConfig(Strict):
    """Each stage section holds that stage's config keys, or `config: FILE` (a stage config, e.g.
    configs/eval_hotpot_trivia_7b.yaml, read relative to the working directory) plus keys that override it."""

    run_dir: str = "runs/demo"
    generate: dict[str, Any]  # GenerateConfig keys (output_dir and cache are set by the pipeline)
    teacher_server: dict[str, Any] | None = None  # ServeConfig keys: a vLLM server for the teacher, or none
    filter: dict[str, Any] = Field(default_factory=dict)  # FilterConfig keys
    sft_data: dict[str, Any] = Field(default_factory=dict)  # SftDataConfig keys (kept and out are set)
    # {name: SftDataConfig keys over sft_data, plus `train:` TrainConfig keys over train}; see the top
    students: dict[str, dict[str, Any]] | None = None
    train: dict[str, Any]  # TrainConfig keys (dataset_dir and output_dir are set by the pipeline)
    student_server: dict[str, Any] = Field(default_factory=dict)  # ServeConfig keys (adapters are set)
    eval: dict[str, Any]  # EvalConfig keys (output_dir is set)

    @field_validator("generate", "teacher_server", "filter", "sft_data", "train", "student_server", "eval",
                     mode="before")
    @classmethod
    def _stage_config(cls, value: Any, info: ValidationInfo) -> Any:
        """A section that names its stage config runs exactly what that stage's own command would, so the
        two cannot drift apart."""
        if not isinstance(value, Mapping) or STAGE_CONFIG not in value:
            return value
        from distill.config import _merge, read_yaml

        path = value[STAGE_CONFIG]
        if not isinstance(path, str):
            raise DistillError(f"{info.field_name}.{STAGE_CONFIG}: expected the path of a stage config")
        return _merge(read_yaml(path), {k: v for k, v in value.items() if k != STAGE_CONFIG})

    @field_validator("students")
    @classmethod
    def _student_names(cls, value: dict | None) -> dict | None:
        """A student's name is its folder and the model name clients ask the server for."""
        from distill.serve import MODULE_NAME

        if value is not None and not value:
            raise ValueError("name at least one student, or leave `students` out for one")
        if bad := [name for name in value or {} if not MODULE_NAME.fullmatch(name)]:
            raise ValueError(f"{bad[0]!r} is not a student name (letters, digits, _ . -)")
        return value


def fill_server(obj: Any, url: str | None) -> Any:
    if isinstance(obj, dict):
        return {k: fill_server(v, url) for k, v in obj.items()}
    if isinstance(obj, list):
        return [fill_server(v, url) for v in obj]
    if obj == SERVER:
        if url is None:
            raise DistillError(f"a model says base_url: {SERVER} but this stage starts no server")
        return url
    return obj


class Pipeline:
    def __init__(self, cfg: PipelineConfig, config_path: str | None = None,
                 entries: Mapping[str, Callable] | None = None):
        self.cfg = cfg
        self.run = Path(cfg.run_dir)
        self.config_path = config_path
        self.entries = dict(entries or {})

    def entry(self, name: str) -> Callable:
        return self.entries.get(name) or pkgutil.resolve_name(ENTRIES[name])

    def once(self, folder: Path, label: str, step: Callable[[], dict], **head) -> dict:
        """`step()` unless `folder/DONE.json` says it finished; the marker keeps what it returned and its time,
        so a rerun after a crash redoes only what did not finish."""
        marker = folder / "DONE.json"
        if marker.exists():
            print(f"[pipeline] {label}: done, skipped", flush=True)
            return json.loads(marker.read_text())
        print(f"[pipeline] {label}: running", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        info = head | step() | {"seconds": round(time.perf_counter() - t0, 1)}
        write_json(marker, info)
        print(f"[pipeline] {label}: finished in {info['seconds']:.0f}s", flush=True)
        return info

    def rerun_from(self, stage: str) -> None:
        """Move the stage's folder and every later one aside, so they rerun from scratch, losing nothing."""
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        for d in (self.run / s for s in STAGES[STAGES.index(stage):]):
            if d.exists():
                d.rename(d.with_name(f"{d.name}.before-{stamp}"))

    # ------------------------------------------------------------------ stage settings, checked before any stage
    def students(self) -> dict[str, dict]:
        """{name: sft_data overrides}; without `students`, one student named as its LoRA module always was."""
        if self.cfg.students is not None:
            return self.cfg.students
        from distill.serve import ServeConfig

        return {self.cfg.student_server.get("lora_name") or ServeConfig.model_fields["lora_name"].default: {}}

    def generate_config(self, url: str | None):
        from distill.generate import GenerateConfig

        paths = {"output_dir": str(self.run / "generate"), "cache": str(self.run / "calls.sqlite")}
        return validate(GenerateConfig, fill_server(self.cfg.generate, url) | paths, "generate")

    def filter_config(self):
        from distill.filter import FilterConfig

        return validate(FilterConfig, self.cfg.filter, "filter")

    def sft_data_config(self, name: str):
        from distill.sft_data import SftDataConfig

        paths = {"kept": str(self.run / "filter" / "kept.jsonl"), "out": str(self.run / "sft-data" / name)}
        where = "sft_data" if self.cfg.students is None else f"students.{name}"
        own = {k: v for k, v in self.students()[name].items() if k != "train"}
        return validate(SftDataConfig, self.cfg.sft_data | own | paths, f"{where} (pipeline)")

    def train_section(self, name: str) -> dict:
        """A student's train section (its own `train:` keys over the shared ones) with its folders, checked by
        distill.train's own (TRL) parser. A compact-prompt student's steps are ~3x cheaper and it must learn the
        format the full prompt spells out, so it may take more of them in the same time."""
        from distill.train import TrainConfig

        own = self.students()[name].get("train") or {}
        if not isinstance(own, Mapping):
            raise DistillError(f"students.{name}.train: expected train config keys")
        data = self.cfg.train | own | {"dataset_dir": str(self.run / "sft-data" / name),
                                       "output_dir": str(self.run / "train" / name)}
        try:
            validate(TrainConfig, data, "train (pipeline)")
        except DistillError as exc:  # TRL's parser names no section: say which student's keys were read
            raise DistillError(f"students.{name}.train over train: {exc}" if own else str(exc)) from None
        return data

    def server_config(self, name: str):
        """`teacher_server`, or `student_server` loading every student's adapter as the LoRA module of its name."""
        from distill.serve import ServeConfig

        students = {"adapter": None, "adapters": {n: str(self.run / "train" / n) for n in self.students()}}
        data = {"port": 0} | getattr(self.cfg, name) | (students if name == "student_server" else {})
        return validate(ServeConfig, data, name)

    def eval_config(self, url: str | None):
        from distill.evaluate import EvalConfig

        # per-method caches in the output folder: latency stays honest
        return validate(EvalConfig, fill_server(self.cfg.eval, url) | {"output_dir": str(self.run / "eval")}, "eval")

    def check(self) -> None:
        """Validate every stage's section before the first one runs: a typo in `eval` should not wait an hour."""
        from distill.serve import served_name

        url = "http://127.0.0.1:1/v1"
        self.generate_config(url)
        self.filter_config()
        sft = {name: self.sft_data_config(name) for name in self.students()}
        for name in sft:
            self.train_section(name)
        ev = self.eval_config(url)
        if self.cfg.teacher_server is not None:
            self.server_config("teacher_server")
        served = {served_name(self.server_config("student_server")), *sft}
        check_students_served_as_trained(sft, ev, url, served)

    # ------------------------------------------------------------------ stages
    def server(self, name: str):
        if getattr(self.cfg, name) is None:
            return nullcontext(None)
        print(f"[pipeline] starting vLLM for the {name} (log: {self.run / f'{name}.vllm.log'})", flush=True)
        return self.entry("server")(self.server_config(name), log_path=self.run / f"{name}.vllm.log")

    def generate(self) -> dict:
        with self.server("teacher_server") as srv:
            return self.entry("generate")(self.generate_config(srv.base_url if srv else None), self.config_path)

    def filter(self) -> dict:
        from distill.filter import format_report

        report = self.entry("filter")(
            self.run / "generate" / "trajectories.jsonl", self.run / "filter" / "kept.jsonl", self.filter_config()
        )
        print(format_report(report))
        if report["kept"] == 0:
            raise DistillError("the filter kept no trajectory: more samples_per_question or more questions")
        return {"kept": report["kept"], "input_records": report["input_records"]}

    def new_students(self, stage: str, marker: Path) -> list[str]:
        """Students the config names that this per-student stage's marker does not list (added since it ran)."""
        if stage not in ("sft-data", "train"):
            return []
        return sorted(set(self.students()) - set(json.loads(marker.read_text()).get("students", {})))

    def each_student(self, stage: str, step: Callable[[str], dict]) -> dict:
        """`step(name)` for every student, each with its own `<stage>/<name>/DONE.json`."""
        return {"students": {name: self.once(self.run / stage / name, f"{stage} {name}", partial(step, name))
                             for name in self.students()}}

    def sft_data(self) -> dict:
        from distill.sft_data import format_summary

        def build(name: str) -> dict:
            summary = self.entry("sft-data")(self.sft_data_config(name))
            print(format_summary(summary))
            return {"student_prompt": summary["student_prompt"],
                    "examples": {split: s["examples"] for split, s in summary["splits"].items()}}

        return self.each_student("sft-data", build)

    def train(self) -> dict:
        def train(name: str) -> dict:
            # accelerate launch with one process per visible GPU (one plain process on CPU), from the checked section
            info = self.entry("train")(self.train_section(name))
            return {k: info.get(k) for k in ("global_step", "final_train_loss", "final_eval_loss", "wall_s")}

        return self.each_student("train", train)

    def eval(self) -> dict:
        with self.server("student_server") as srv:
            manifest = self.entry("eval")(self.eval_config(srv.base_url if srv else None), self.config_path)
        return {"methods": [m["name"] for m in manifest["methods"]]}

    def report(self) -> dict:
        """The report from the evaluation's records, at the run folder's root, with the stage timings."""
        from distill.report import prompt_budget_summary, summary_lines

        results = self.entry("report")(self.run / "eval", self.run)
        print("\n".join(summary_lines(results) + prompt_budget_summary(results)))
        timings = {s: json.loads((self.run / s / "DONE.json").read_text())["seconds"] for s in STAGES[:-1]}
        write_json(self.run / "pipeline.json", {"stage_seconds": timings, "config_file": self.config_path})
        return {"stage_seconds": timings}

    def run_all(self, start: str | None = None) -> None:
        self.check()
        self.run.mkdir(parents=True, exist_ok=True)
        if start:
            self.rerun_from(start)
        redo = False
        for stage in STAGES:
            marker = self.run / stage / "DONE.json"
            if marker.exists() and (redo or self.new_students(stage, marker)):
                marker.unlink()  # an earlier stage did new work, or a student was added: finished parts stay done
            redo = redo or not marker.exists()
            self.once(self.run / stage, stage, getattr(self, stage.replace("-", "_")), stage=stage)
        print(f"\nreport:  {self.run / 'report.md'}")
        print(f"results: {self.run / 'results.json'}")


def check_students_served_as_trained(sft: Mapping[str, Any], ev: Any, url: str, served: set[str]) -> None:
    """Every model eval asks this pipeline's server for must be one it serves (the base or a student), and a row
    serving a student must give it the prompt it is trained on (kind and tools): otherwise the run fails after
    training, or the student is measured on a prompt it never saw and nothing else would say so."""
    from distill.tools.registry import tool_descriptions

    specs = [(f"planner {row.name}", row.spec) for row in ev.planners]
    specs += [("solver", ev.solver), ("llm_tool", ev.llm_tool), ("judge", ev.judge)]
    for what, spec in specs:
        if spec is not None and spec.base_url == url and spec.model not in served:
            raise DistillError(f"eval {what} asks the student server for model {spec.model!r}, which it does not "
                               f"serve (it serves {', '.join(sorted(served))}: the base model and the students)")
    for row in ev.planners:
        cfg = sft.get(row.spec.model) if row.spec.base_url == url else None
        if cfg is None:
            continue
        if row.prompt != cfg.student_prompt:
            raise DistillError(f"eval planner {row.name} serves student {row.spec.model} with prompt {row.prompt}, "
                               f"but it is trained on student_prompt {cfg.student_prompt}")
        if list(tool_descriptions(ev.tools)) != cfg.tools:
            raise DistillError(f"eval tools {ev.tools} differ from student {row.spec.model}'s sft_data tools "
                               f"{cfg.tools}: its prompt lists them")


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)
    parser.add_argument("--from", dest="start", metavar="STAGE", type=lambda v: v.replace("_", "-"), choices=STAGES,
                        help="rerun from this stage (generate, filter, sft-data, train, eval, report)")


def main(args: argparse.Namespace) -> int:
    if not args.config:
        raise DistillError("--config is required (e.g. configs/demo_smollm2_cpu.yaml)")
    cfg = load_config(PipelineConfig, args.config, args.set)
    Pipeline(cfg, args.config).run_all(args.start)
    return 0
