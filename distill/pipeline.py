"""The whole distillation in one command, one run folder, one stage at a time.

    distill pipeline --config configs/demo_smollm2_cpu.yaml [--from train] [--set key=value]

generate -> filter -> sft-data -> train -> eval (the students served by vLLM, against base and teacher
Planners, ReAct and Direct) -> report. A run is iterated (another filter, learning rate or planner, then the
same command again), so every stage knows what it was made from: its `DONE.json` holds the fingerprint of its
resolved section (after `config:` files, `--set` and defaults; settings of speed and patience left out) and of
its inputs (the digests of the files it reads, the adapter weights eval serves). On a rerun a stage whose
fingerprint is unchanged is skipped; a changed one is redone, and so is everything made from it, per student:
a changed `students.<name>.train` key retrains that student alone, then eval and the report follow. Each stage
prints one line saying which it did and why (`filter: settings changed (min_f1 0.5 -> 0.9): rerunning;
sft-data, train, eval, report follow`). An unfinished stage resumes (generation and evaluation records are
appended as they finish, training restarts from its last checkpoint); a redone student's folders and records
made with other settings are set aside (renamed `*.before-<time>`), never deleted. A second pipeline on the
same `run_dir` is refused while one runs.

`students: {name: sft_data overrides [+ train: {train overrides}]}` trains several students on the same kept
examples (e.g. one on the `full` prompt, one on the `compact` one): sft-data and train run once per student
into `sft-data/<name>` and `train/<name>`, each with its own DONE.json, and evaluation serves every adapter from
one vLLM server as the LoRA module `<name>`. Without `students` there is one, named as student_server names its
LoRA module (`planner`). `--from STAGE` moves that stage's folder and the later ones aside (nothing is deleted)
and reruns them; the call cache at the run folder's root, which knows a model by what it serves rather than
the port it listens on, makes a rerun of generation cost nothing.

Model endpoints may say `base_url: "@server"`: the pipeline starts a vLLM server (the teacher's for
generation, the students', base model plus LoRA adapters, for evaluation) and fills in its address.

`teacher:` names the model that writes the training plans once; every generate and eval endpoint that would
otherwise repeat it takes it (PipelineConfig says which, `with_teacher` what wins), and `--check` and the run's
start warn in one line when an eval teacher row asks another model than generate's planner. `config: FILE` in a
pipeline config is read from that file's folder; `train: {config: auto}` picks the training config by the visible
GPUs' memory (distill.training.launch.config_for_gpus).

`--check` runs no stage and writes nothing: every section validated, each stage's resolved config and the
commands it would launch, what the run needs (keys, endpoints, integrations, GPUs, disk: one line per problem,
exit 2) and its estimated calls, tokens and dollars (see distill.core.check).
"""

from __future__ import annotations

import argparse
import os
import pkgutil
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml
from pydantic import Field, ValidationInfo, field_validator

from distill import evaluate
from distill import filter as filtering
from distill import generate, improve, report, sft_data
from distill.core import layout
from distill.core.check import Check, TokenCounter, add_check_args, print_estimates, wants_check
from distill.core.config import (ENDPOINT_IDENTITY, SERVER_PLACEHOLDER, AgentConfig, ModelSpec, Strict, _merge,
                                 add_config_args, load_config, read_yaml, validate)
from distill.core.errors import DistillError
from distill.core.run import folder_lock, set_aside
from distill.core.stage import STAGE_CONFIG, CheckContext, Stage, Unit, label, read_marker
from distill.core.store import write_json
from distill.improve import final_adapter
from distill.report import ReportConfig
from distill.serving.serve import MODULE_NAME, ServeConfig, served_name, served_settings, show_would_run
from distill.tools.registry import tool_descriptions
from distill.training import launch
from distill.training.launch import AUTO
from distill.training.merge import same_as_trained

IMPROVED = "{}_improved"  # the LoRA module (and eval row model) of a student's improved adapter
SERVER = SERVER_PLACEHOLDER  # the pipeline fills in the address of the stage's own server
# The sections that are a stage's config (or a server's): each may name its stage config file (`config: FILE`).
SECTIONS = ("generate", "teacher_server", "filter", "sft_data", "train", "improve", "student_server", "eval")
# The endpoints that take the pipeline's `teacher:` by default, per stage, beside eval's teacher rows
# (`is_teacher_row`).
# The model that writes the plans also answers from them and runs the LLM tool while generating, and the paper's
# evaluation keeps it as every method's Solver and judge. improve's endpoints are the student's and its base's.
TEACHER_ROLES = {"generate": ("planner", "solver", "llm_tool", "judge"), "eval": ("solver", "llm_tool", "judge")}
# The pipeline's `agent:` keys (AgentConfig's tools and Wikipedia, and how the Worker runs them), per stage that
# takes them: every agent of the run plans with the same tool list and retrieves from the same Wikipedia, and the
# student's training data lists the same tools.
AGENT_KEYS = ("tools", *(name for name in AgentConfig.model_fields if name.startswith("wikipedia_")),
              "worker_max_concurrency", "tool_timeout_s", "evidence_max_chars")
AGENT_TAKERS = {"generate": AGENT_KEYS, "sft_data": ("tools",), "improve": AGENT_KEYS, "eval": AGENT_KEYS}
# The library function behind each stage, and the server class; `Pipeline(entries=...)` swaps some of them so
# a test can check what every stage is handed without running a model.
ENTRIES = {
    "server": "distill.serving.serve:VLLMServer",
    "generate": "distill.generate:generate",
    "filter": "distill.filter:run_filter",
    "sft-data": "distill.sft_data:build_sft_data",
    "train": "distill.training.launch:launch",
    "improve": "distill.improve:improve",
    "eval": "distill.evaluate:evaluate",
    "report": "distill.report:write_report",
    "gpus": "distill.core.check:gpu_memory",  # the visible GPUs' memory: a test without a GPU passes made-up sizes
}


def is_teacher_row(name: str) -> bool:
    """An eval planner row that is the teacher: `teacher`, or one of its variants (`teacher+replan`)."""
    return name == "teacher" or name.startswith("teacher+")


def teacher_endpoints(stage: str, section: Mapping[str, Any], change: Callable[[str, dict], dict]) -> dict:
    """The section with `change(name, endpoint)` applied to each endpoint in it that takes the teacher: its roles,
    and for eval the spec of each teacher row (named as the row), whether `planners` is a list or a mapping."""
    out = dict(section)
    for role in TEACHER_ROLES[stage]:
        if isinstance(out.get(role), Mapping):
            out[role] = change(role, dict(out[role]))

    def row(name: Any, entry: Any) -> Any:
        if not isinstance(name, str) or not is_teacher_row(name) or not isinstance(entry or {}, Mapping):
            return entry
        spec = (entry or {}).get("spec") or {}
        return {**(entry or {}), "spec": change(name, dict(spec))} if isinstance(spec, Mapping) else entry

    planners = out.get("planners") if stage == "eval" else None
    if isinstance(planners, Mapping):
        out["planners"] = {name: row(name, entry) for name, entry in planners.items()}
    elif isinstance(planners, list):
        out["planners"] = [row(e.get("name"), e) if isinstance(e, Mapping) else e for e in planners]
    return out


def with_teacher(stage: str, file: Mapping[str, Any], own: Mapping[str, Any], teacher: Mapping[str, Any]) -> dict:
    """A generate or eval section with the teacher in every endpoint that takes it: the teacher's keys, then the
    role's own keys from the stage config file less the ones that say which model it is (ENDPOINT_IDENTITY: the
    file names its own teacher, for its own command: in the pipeline the teacher replaces it whole; every other
    key of the file's, max_tokens, temperature, stop, max_concurrency, timeout_s, max_retries..., stays over the
    teacher's), then what the pipeline's section says itself, which wins. A role the section leaves out that always
    has an endpoint (generate's planner, the Solver) is the teacher with that role's own defaults (AgentConfig's: a
    Solver's max_tokens 64)."""
    section = _merge(teacher_endpoints(stage, file, lambda _, e: {k: v for k, v in e.items()
                                                                  if k not in ENDPOINT_IDENTITY}), dict(own))
    for role in TEACHER_ROLES[stage]:
        field = AgentConfig.model_fields.get(role)  # judge is not an agent's: optional wherever it is
        if role not in section and field and (default := field.get_default(call_default_factory=True)):
            section[role] = default.model_dump(exclude_unset=True)
    return teacher_endpoints(stage, section, lambda _, e: dict(teacher) | e)


class PipelineConfig(Strict):
    """Each stage section holds that stage's config keys, or `config: FILE` (a stage config, e.g.
    eval_hotpot_trivia_7b.yaml) plus keys that override it.

    Paths, and what they are relative to: `config: FILE` in a pipeline config file is read from that file's
    folder (configs/pipeline_hotpot_trivia_7b.yaml names `generate_teacher.yaml`, beside it), so a pipeline
    config and its stage configs move together; one given with `--set` (or in a config built in code) is relative
    to the working directory, as is every other path: `run_dir`, and the paths inside the sections and inside the
    stage configs (datasets' `source`, `wikipedia_corpus`, ...), exactly as each stage's own command reads them
    from the same files, so that the two cannot drift apart. Absolute paths are used as they are.

    `teacher:` (ModelSpec keys) is the model that writes the training plans, named once. generate's planner,
    solver, llm_tool and judge and eval's teacher rows (`teacher`, `teacher+...`), solver, llm_tool and judge take
    it by default; see `with_teacher` for what wins where. It becomes part of those sections, so their
    fingerprints hold it as they hold any endpoint: a new teacher redoes generation and everything after.

    `agent:` (AgentConfig's `tools`, `wikipedia_*`, `worker_max_concurrency`, `tool_timeout_s`,
    `evidence_max_chars`) is the agent's tools and Wikipedia, named once: generate, improve and eval take every key
    and sft_data takes `tools`, over what a section's `config: FILE` says and under what the section says itself.

    `train: {config: auto}` picks the training config by the visible GPUs' memory
    (distill.training.launch.config_for_gpus), when the pipeline starts, saying which and why."""

    run_dir: str = "runs/demo"
    """the run folder: one subfolder per stage, the call cache at its root"""
    # declared before the sections: their validator reads it
    teacher: ModelSpec | None = None
    """the teacher's endpoint, named once: generate's planner, Solver, LLM tool and judge and eval's teacher rows,
    Solver, LLM tool and judge take it; null: every section names its models"""
    agent: dict[str, Any] | None = None
    """the tools and Wikipedia every agent of the run uses (AgentConfig keys: tools, wikipedia_*, ...), named once:
    generate, improve and eval take them, sft_data its tools; null: every section names its own"""
    generate: dict[str, Any]
    """GenerateConfig keys, or config: FILE plus overrides (output_dir and cache are set by the pipeline)"""
    teacher_server: dict[str, Any] | None = None
    """ServeConfig keys: a vLLM server for the teacher ("@server"), or none"""
    filter: dict[str, Any] = Field(default_factory=dict)
    """FilterConfig keys"""
    sft_data: dict[str, Any] = Field(default_factory=dict)
    """SftDataConfig keys (kept and out are set by the pipeline)"""
    students: dict[str, dict[str, Any]] | None = None
    """{name: SftDataConfig keys over sft_data, plus train: TrainConfig keys over train}: several students on the
    same kept plans"""
    train: dict[str, Any]
    """TrainConfig keys, or config: FILE, or config: auto (picked by GPU memory); dataset_dir and output_dir are set"""
    improve: dict[str, Any] | None = None
    """ImproveConfig keys plus student: NAME (default: the first): improve that student after training"""
    student_server: dict[str, Any] = Field(default_factory=dict)
    """ServeConfig keys of the students' server (adapters are set)"""
    eval: dict[str, Any]
    """EvalConfig keys (output_dir is set)"""
    report: dict[str, Any] = Field(default_factory=dict)
    """ReportConfig keys: `intro: demo` opens the demo's report with what the demo is and is not"""

    @field_validator("report")
    @classmethod
    def _report(cls, value: dict[str, Any]) -> dict[str, Any]:
        return validate(ReportConfig, dict(value), "report").model_dump(exclude_defaults=True)

    @field_validator("agent")
    @classmethod
    def _agent(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if bad := sorted(set(value or {}) - set(AGENT_KEYS)):
            raise ValueError(f"{bad[0]} is not one of the agent's keys ({', '.join(AGENT_KEYS)}): the endpoints are "
                             "the sections' and teacher's")
        return value

    @field_validator(*SECTIONS, mode="before")
    @classmethod
    def _stage_config(cls, value: Any, info: ValidationInfo) -> Any:
        """A section that names its stage config runs exactly what that stage's own command would, so the
        two cannot drift apart; generate and eval take the teacher where they do not say otherwise, and the
        stages that run an agent take the run's `agent:` the same way."""
        if not isinstance(value, Mapping):
            return value
        name, path = info.field_name, value.get(STAGE_CONFIG)
        if path is not None and not isinstance(path, str):
            raise DistillError(f"{name}.{STAGE_CONFIG}: expected the path of a stage config")
        if path == AUTO:
            if name != "train":
                raise DistillError(f"{name}.{STAGE_CONFIG}: auto picks a training config by the GPUs' memory: "
                                   "train only")
            return value  # chosen by the Pipeline, which knows the GPUs
        own = {k: v for k, v in value.items() if k != STAGE_CONFIG}
        file = read_yaml(path) if path is not None else {}
        if agent := {k: v for k, v in (info.data.get("agent") or {}).items() if k in AGENT_TAKERS.get(name, ())}:
            file = _merge(file, agent)  # the run's agent over the stage file's, under the section's own keys
        teacher = info.data.get("teacher")
        if name in TEACHER_ROLES and teacher is not None:
            return with_teacher(name, file, own, teacher.model_dump(mode="json", exclude_unset=True))
        return _merge(file, own) if path is not None or agent else value

    @classmethod
    def relative_to_file(cls, data: dict, folder: Path) -> dict:
        """The `config: FILE` paths of a pipeline config file, read from its folder
        (distill.core.config.load_config)."""
        out = dict(data)
        for name in SECTIONS:
            section = out.get(name)
            if isinstance(section, Mapping) and isinstance(path := section.get(STAGE_CONFIG), str) \
                    and path != AUTO and not Path(path).is_absolute():
                out[name] = {**section, STAGE_CONFIG: str(folder / path)}
        return out

    @field_validator("students")
    @classmethod
    def _student_names(cls, value: dict | None) -> dict | None:
        """A student's name is its folder and the model name clients ask the server for."""
        if value is not None and not value:
            raise ValueError("name at least one student, or leave `students` out for one")
        if bad := [name for name in value or {} if not MODULE_NAME.fullmatch(name)]:
            raise ValueError(f"{bad[0]!r} is not a student name (letters, digits, _ . -)")
        return value


def teacher_slots(cfg: PipelineConfig) -> list[tuple[str, str, dict]]:
    """(stage, role or teacher row, endpoint) for each generate and eval endpoint that takes the teacher."""
    out: list[tuple[str, str, dict]] = []
    for stage in TEACHER_ROLES:
        if isinstance(section := getattr(cfg, stage), Mapping):
            teacher_endpoints(stage, section, lambda name, e, stage=stage: out.append((stage, name, e)) or e)
    return out


def teacher_priced(cfg: PipelineConfig) -> dict[str, str]:
    """{endpoint, as check lines name it: `teacher`} for each generate and eval endpoint that is the teacher
    (its model at its address, so it has the teacher's price too): pricing `teacher` prices them all."""
    if (t := cfg.teacher) is None:
        return {}
    return {f"{stage}.{f'planners.{name}.spec' if is_teacher_row(name) else name}": "teacher"
            for stage, name, e in teacher_slots(cfg)
            if (e.get("model"), e.get("base_url"), e.get("backend", t.backend)) == (t.model, t.base_url, t.backend)}


def teacher_takers(cfg: PipelineConfig) -> str:
    """Where the teacher went: per stage, the endpoints that take it and name its model."""
    took = [(stage, name) for stage, name, e in teacher_slots(cfg) if e.get("model") == cfg.teacher.model]
    return "; ".join(f"{stage} {', '.join(n for s, n in took if s == stage) or 'none'}" for stage in TEACHER_ROLES)


# The stages in the order they run, each declared by its own module (distill.core.stage.Stage).
PIPELINE = (generate.STAGE, filtering.STAGE, sft_data.STAGE, launch.STAGE, improve.STAGE, evaluate.STAGE, report.STAGE)
STAGES = tuple(s.name for s in PIPELINE)  # `--from`'s choices: the stage folders, in order


class Pipeline:
    """The engine: the stages in order, each unit skipped or redone by its fingerprint and what it is made from,
    the servers the stages run against, and the students. What a stage is, it says itself (its `STAGE`)."""

    def __init__(self, cfg: PipelineConfig, config_path: str | None = None,
                 entries: Mapping[str, Callable] | None = None, order: tuple[Stage, ...] = PIPELINE):
        self.cfg, self.order = cfg, order
        self.run = Path(cfg.run_dir)
        self.config_path = config_path
        self.entries = dict(entries or {})
        self.redone: set[str] = set()  # labels of the units that did work in this run
        # `--check` walks the stages as a run would, reading the markers and writing nothing (`dry`), and says
        # what each would do; `forced` holds the stages `--from` would set aside
        self.dry = False
        self.forced: tuple[str, ...] = ()
        self.memo: dict[Any, Any] = {}  # what is worked out once per run: the GPUs, each student's TrainConfig

    def entry(self, name: str) -> Callable:
        return self.entries.get(name) or pkgutil.resolve_name(ENTRIES[name])

    def gpu_memory(self) -> list[int]:
        """The visible GPUs' total memory in bytes, asked once (distill.core.check.gpu_memory, or the `gpus` entry)."""
        if "gpus" not in self.memo:
            self.memo["gpus"] = list(self.entry("gpus")())
        return self.memo["gpus"]

    def once(self, stage: Stage, unit: Unit) -> dict:
        """The stage's work for the unit unless its marker holds its fingerprint and nothing it is made from was
        redone in this run; the marker keeps what the work returned, its time and what it was made from."""
        student = () if unit.student is None else (unit.student,)
        path = layout.marker(unit.folder)
        marker = None if unit.stage in self.forced else read_marker(path)
        why = (f"rerunning (--from {self.forced[0]})" if unit.stage in self.forced
               else unit.why(marker, [d for d in self.made_from(stage, *student) if d in self.redone]))
        self.say(unit.label, why)
        if why is None:
            return marker.model_dump()
        self.redone.add(unit.label)
        if self.dry:
            return marker.model_dump() if marker is not None else {}
        if marker is not None:
            path.unlink()  # a rerun that crashes must not leave the old marker standing for it
            if unit.student is not None:  # a student's folder: training must not resume an old checkpoint
                set_aside(unit.folder)
        unit.folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        info = unit.head() | stage.work(self, *student) | {"seconds": round(time.perf_counter() - t0, 1)}
        write_json(path, info)
        print(f"[pipeline] {unit.label}: finished in {info['seconds']:.0f}s", flush=True)
        return info

    def say(self, label: str, why: str | None) -> None:
        """A unit's line: what a run does and why, or, indented under `--check`, what it would do."""
        prefix, skip = ("  ", "done, would be skipped") if self.dry else ("[pipeline] ", "done, skipped")
        print(f"{prefix}{label}: {why or f'{skip} (same settings and inputs)'}", flush=True)

    def run_stage(self, stage: Stage) -> None:
        """A stage made once is one unit. A per-student one is a unit per student, each with its own
        `<stage>/<name>/DONE.json`, so that a student added or retrained redoes that student alone; the stage's
        marker lists them all (and is skipped as a whole when none has work)."""
        if not stage.per_student:
            self.once(stage, self.unit(stage))
            return
        units = {name: self.unit(stage, name) for (name,) in self.each(stage)}
        whole = Unit(stage.name, layout.stage_dir(self.run, stage.name), {},
                     {name: u.fingerprint for name, u in units.items()})
        marker = read_marker(layout.marker(whole.folder))
        after = [d for name in units for d in self.made_from(stage, name) if d in self.redone]
        if (stage.name not in self.forced and marker is not None and marker.fingerprint == whole.fingerprint
                and not after and all(read_marker(layout.marker(u.folder)) is not None for u in units.values())):
            self.say(stage.name, None)
            return
        students = {name: self.once(stage, unit) for name, unit in units.items()}
        if self.dry:
            return
        keep = {name: {k: v for k, v in info.items() if k not in ("settings", "inputs")}
                for name, info in students.items()}
        seconds = round(sum(info["seconds"] for info in students.values()), 1)
        write_json(layout.marker(whole.folder), whole.head() | {"students": keep, "seconds": seconds})

    def stages(self) -> tuple[Stage, ...]:
        """The stages this pipeline runs: `improve` only where it has a section."""
        return tuple(s for s in self.order if s.name != layout.IMPROVE or self.cfg.improve is not None)

    def each(self, stage: Stage) -> list[tuple[str, ...]]:
        """The arguments of a stage's units: one per student, or none."""
        return [(name,) for name in self.students()] if stage.per_student else [()]

    def unit(self, stage: Stage, *student: str) -> Unit:
        return replace(stage.unit(self, *student), followers=self.followers(stage, *student))

    def made_from(self, stage: Stage, student: str | None = None) -> list[str]:
        """The units this one is made from: one of them redone in this run redoes it. A student's unit is made
        from that student's units, a stage made once from those of the students it reads (`Stage.students`)."""
        out = []
        for up in (s for s in self.stages() if s.name in stage.after):
            reads = stage.students(self) if stage.students else self.students()
            students = ([student] if stage.per_student else reads) if up.per_student else [None]
            out += [label(up.name, n) for n in students]
        return out

    def followers(self, stage: Stage, student: str | None = None) -> tuple[str, ...]:
        """What a unit's rerun redoes after it, as its line names them: the same student's units by label
        (`train planner`), the others by stage (`sft-data, train, eval`)."""
        redone, out = {label(stage.name, student)}, []
        for later in self.stages()[self.stages().index(stage) + 1:]:
            for n in (self.students() if later.per_student else [None]):
                if redone & set(self.made_from(later, n)):
                    redone.add(label(later.name, n))
                    out.append(label(later.name, n) if n == student else later.name)
        return tuple(dict.fromkeys(out))

    def show_rerun(self, start: str | None = None) -> None:
        """`--check` on a run folder: what the same command would redo and why, stage by stage, from the markers
        and fingerprints a run itself goes by (run_all walked with nothing run and nothing written)."""
        if not layout.stage_dir(self.run, layout.GENERATE).is_dir():
            print(f"--- {self.run}: no run here yet: every stage would run")
            return
        print(f"--- {self.run}: what a rerun would do" + (f" (--from {start})" if start else ""))
        walker = Pipeline(self.cfg, self.config_path, self.entries, self.order)
        walker.dry, walker.memo = True, self.memo
        walker.forced = self.names()[self.names().index(start):] if start else ()
        try:
            walker.run_all()
        except DistillError as exc:  # a stage's settings that do not resolve: said by the check already
            print(f"  (cannot tell the rest: {exc})")

    def rerun_from(self, stage: str) -> None:
        """Move the stage's folder and every later one aside, so they rerun from scratch, losing nothing."""
        for d in (layout.stage_dir(self.run, s) for s in self.names()[self.names().index(stage):]):
            if d.exists():
                set_aside(d)

    # ------------------------------------------------------------------ stage settings, checked before any stage
    def students(self) -> dict[str, dict]:
        """{name: sft_data overrides}; without `students`, one student named as its LoRA module always was."""
        if self.cfg.students is not None:
            return self.cfg.students
        return {self.cfg.student_server.get("lora_name") or ServeConfig.model_fields["lora_name"].default: {}}

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.order)

    def step(self, name: str) -> Stage:
        return next(s for s in self.order if s.name == name)

    def config(self, name: str, *student: str, url: str | None = None):
        """A stage's config as this run resolves it (`url`: the address of the stage's own server)."""
        return self.step(name).resolve(self, url, *student)

    def server_config(self, name: str):
        """`teacher_server`, or `student_server` loading every student's adapter as the LoRA module of its name."""
        adapters = {n: str(layout.adapter(self.run, n)) for n in self.students()} | self.improved_adapters()
        students = {"adapter": None, "adapters": adapters}
        data = {"port": 0} | getattr(self.cfg, name) | (students if name == "student_server" else {})
        return validate(ServeConfig, data, name)

    def improved_student(self) -> str | None:
        if self.cfg.improve is None:
            return None
        name = self.cfg.improve.get("student") or next(iter(self.students()))
        if name not in self.students():
            raise DistillError(f"improve.student: {name!r} is not a student of this pipeline "
                               f"({', '.join(self.students())})")
        return name

    def improved_adapters(self) -> dict[str, str]:
        """{LoRA module: folder} of the improved adapter (the last round's), when there is an improve stage."""
        if (name := self.improved_student()) is None:
            return {}

        return {IMPROVED.format(name): str(final_adapter(self.config(layout.IMPROVE)))}

    def check(self, world=None, start: str | None = None) -> None:
        """Validate every stage's section before the first one runs: a typo in `eval` should not wait an hour, nor
        a paid endpoint without a price run up a bill no cap sees. With `world` (a distill.core.check.Check: `--check`)
        every problem is collected rather than raised, and each stage's config, commands, prerequisites and
        estimate are printed (see `check_world`)."""
        attempt, url = partial(collect, world), "http://127.0.0.1:1/v1"
        made = {label(step.name, *student): attempt(step.resolve, self, url, *student)
                for step in self.stages() for student in self.each(step)}
        gen, ev, imp = check_sections(self, made, attempt, url)
        if world is not None:
            self.check_world(world, url, start)
            return

        prices = Check(offline=True, shared_prices=teacher_priced(self.cfg))  # the same lines as `--check`'s
        if imp is not None:
            imp = improve.in_pipeline(self, url)  # its rounds' endpoints, as the check sees them
        for prefix, cfg in (("generate.", gen), ("eval.", ev), ("improve.", imp)):
            if cfg is not None:
                prices.unpriced(cfg.endpoints(), cfg.prices, prefix)
        if prices.problems:
            raise DistillError("; ".join(prices.problems))

    def check_world(self, world, url: str, start: str | None = None) -> None:
        """`--check`: each stage's resolved config and the commands it would launch, what the run needs of this
        machine and the endpoints (one line per problem in `world`), and the estimate; nothing is written."""
        counter, attempt = TokenCounter(), partial(collect, world)
        world.shared_prices |= teacher_priced(self.cfg)
        gpus = attempt(lambda: len(self.gpu_memory()))
        if self.cfg.teacher is not None:
            print(f"--- teacher: {self.cfg.teacher.model} ({teacher_takers(self.cfg)})")
        estimates = [attempt(step.show, self, CheckContext(world, url, gpus, counter), *student)
                     for step in self.stages() for student in self.each(step)]
        self.show_rerun(start)
        print_estimates([e for e in estimates if e is not None])
        world.disk(self.run)

    def check_server(self, world, name: str, gpus: int | None) -> None:
        """The vLLM command line the stage's server would run, and whether it wants GPUs this machine lacks."""
        try:
            cfg = self.server_config(name)
        except DistillError as exc:
            world.problem(f"{name}: {exc}")
            return
        show_would_run(name, cfg, getattr(self.cfg, name) or {}, world, gpus)

    # ------------------------------------------------------------------ what each unit is made from
    def server_settings(self, name: str) -> dict | None:
        return None if getattr(self.cfg, name) is None else served_settings(self.server_config(name))

    # ------------------------------------------------------------------ stages
    def server(self, name: str):
        if getattr(self.cfg, name) is None:
            return nullcontext(None)
        log = layout.server_log(self.run, name)
        print(f"[pipeline] starting vLLM for the {name} (log: {log})", flush=True)
        return self.entry("server")(self.server_config(name), log_path=log)

    def run_all(self, start: str | None = None) -> None:
        """Every stage in order, each unit skipped when its marker says it is done as configured; a unit that
        does work makes the units made from it work too. One pipeline per run folder at a time."""
        if self.dry:
            lock = nullcontext()
        else:
            self.check()
            self.run.mkdir(parents=True, exist_ok=True)
            lock = folder_lock(self.run)
        with lock:
            if start and not self.dry:
                self.rerun_from(start)
            for stage in self.stages():
                self.run_stage(stage)
        if self.dry:
            return
        print(f"\nreport:  {self.run / layout.REPORT_MD}")
        print(f"results: {self.run / layout.RESULTS}")


def collect(world, step: Callable, *args) -> Any:
    """`step(*args)`; under `--check` (a distill.core.check.Check as `world`) its error is one more problem line, and
    None, so that every problem is said at once."""
    try:
        return step(*args)
    except DistillError as exc:
        if world is None:
            raise
        world.problem(str(exc))
        return None


def check_sections(p: Pipeline, made: Mapping[str, Any], attempt: Callable, url: str) -> tuple:
    """What no stage can check alone: the teacher's server, the improved and served students on the prompt and
    tools they were trained on, the leak guard over eval's datasets, the teacher eval compares against. Returns
    the generate, eval and improve configs (None where one did not resolve)."""
    gen, ev, imp = made[layout.GENERATE], made[layout.EVAL], made.get(layout.IMPROVE)
    sft = {name: made[label(layout.SFT_DATA, name)] for name in p.students()}
    if p.cfg.teacher_server is not None:
        attempt(p.server_config, "teacher_server")
    if imp is not None and (improved := p.improved_student()) is not None:
        if sft[improved] is not None:
            attempt(check_improved_as_trained, imp, sft[improved], improved)
        sft[IMPROVED.format(improved)] = sft[improved]  # served on the prompt and tools it was trained on
    student_server = attempt(p.server_config, "student_server")
    if ev is not None and student_server is not None and None not in sft.values():
        attempt(check_students_served_as_trained, sft, ev, url, {served_name(student_server), *sft})
    if gen is not None and ev is not None:
        attempt(check_leak_guard_covers_eval, gen, ev)
        if line := teacher_mismatch(gen, ev):
            print(f"warning: {line}", file=sys.stderr, flush=True)
    return gen, ev, imp


def teacher_mismatch(gen: Any, ev: Any) -> str | None:
    """One line when an eval teacher row asks another model than the one whose plans the students learn (generate's
    planner): then the report's teacher is not the students' teacher. A warning, not a refusal: a user may mean it
    (a newer model of the same family as the reference, say)."""
    rows = [p for p in ev.planners if is_teacher_row(p.name) and p.spec.model != gen.planner.model]
    if not rows:
        return None
    named = ", ".join(f"{p.name} ({p.spec.model})" for p in rows)
    return (f"eval planner{'s' * (len(rows) > 1)} {named} {'is' if len(rows) == 1 else 'are'} not the model that "
            f"writes the training plans: generate.planner is {gen.planner.model}")


def check_leak_guard_covers_eval(gen: Any, ev: Any) -> None:
    """The leak guard keeps `generate.eval_sets` questions out of training; a dataset eval scores on that it
    does not list would be checked against nothing, and a leaked question would inflate the student's score.

    A hub dataset is matched by its source and split. A local file is matched by its path alone: a file has no
    splits (all its rows are read whatever `split` says, which only labels them), and the default split differs
    between generate's entries (`train`) and eval's (`validation`), so the same file listed in both would
    otherwise not match. The line suggests the eval entry itself (name, source, split, columns, metric), so that
    the guard reads the file as eval does."""
    def where(ds) -> tuple[str, str | None]:
        return (ds.source, ds.split) if ds.source.startswith("hub:") else (os.path.normpath(ds.source), None)

    guarded = {where(ds) for ds in gen.eval_sets}
    if missing := [ds for ds in ev.datasets if where(ds) not in guarded]:
        ds = missing[0]
        entry = {k: v for k, v in ds.model_dump(mode="json", include={"name", "source", "split", "columns",
                                                                       "metric"}).items() if v is not None}
        entry = {k: entry[k] for k in ("name", "source", "split", "columns", "metric") if k in entry}
        shown = yaml.safe_dump(entry, default_flow_style=True, width=float("inf"), sort_keys=False).strip()
        split = f" (split {ds.split})" if ds.source.startswith("hub:") else ""
        raise DistillError(f"generate.eval_sets does not list eval dataset {ds.source}{split}: add {shown} there, "
                           "so the leak guard keeps its questions out of training")


def check_improved_as_trained(imp: Any, sft: Any, student: str) -> None:
    """improve samples the student's plans from the prompt it was trained on: its kind and its tool list. Other
    tools would be a prompt the student never saw, and plans calling tools it has no line for."""
    if not same_as_trained(sft.student_prompt, imp.planner_prompt):
        raise DistillError(f"improve.planner_prompt {imp.planner_prompt} differs from student {student}'s "
                           f"student_prompt {sft.student_prompt}: it was trained on that prompt")
    if not same_as_trained(sft.tools, tool_descriptions(imp.tools)):
        raise DistillError(f"improve.tools {imp.tools} differ from student {student}'s sft_data tools {sft.tools}: "
                           "it was trained on a prompt listing those")


def check_students_served_as_trained(sft: Mapping[str, Any], ev: Any, url: str, served: set[str]) -> None:
    """Every model eval asks this pipeline's server for must be one it serves (the base or a student), and a row
    serving a student must give it the prompt it is trained on (kind and tools): otherwise the run fails after
    training, or the student is measured on a prompt it never saw and nothing else would say so."""
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
        if not same_as_trained(cfg.student_prompt, row.prompt):
            raise DistillError(f"eval planner {row.name} serves student {row.spec.model} with prompt {row.prompt}, "
                               f"but it is trained on student_prompt {cfg.student_prompt}")
        if not same_as_trained(cfg.tools, tool_descriptions(ev.tools)):
            raise DistillError(f"eval tools {ev.tools} differ from student {row.spec.model}'s sft_data tools "
                               f"{cfg.tools}: its prompt lists them")


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)
    add_check_args(parser)
    parser.add_argument("--from", dest="start", metavar="STAGE", type=lambda v: v.replace("_", "-"), choices=STAGES,
                        help=f"rerun from this stage ({', '.join(STAGES)})")


def main(args: argparse.Namespace) -> int:
    if not args.config:
        raise DistillError("--config is required (e.g. configs/demo_smollm2_cpu.yaml)")
    cfg = load_config(PipelineConfig, args.config, args.set)
    if wants_check(args):
        world = Check(args.offline)
        Pipeline(cfg, args.config).check(world, args.start)
        return world.finish()
    Pipeline(cfg, args.config).run_all(args.start)
    return 0


if __name__ == "__main__":  # `python -m distill.pipeline` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
