"""The one stage type. Each stage module declares a `STAGE`: what its command is (for `distill generate`, `eval`,
`improve`: a YAML config in, `--set` overrides, `--check` to see what a run would read, launch and cost before
paying for it, `--fresh` to set aside what other settings made; their `configure_parser` and `main` come from here,
so the commands cannot drift apart in their flags, their refusals or their `--check`), and what it is in the
pipeline: how its config resolves in a run folder, what `--check` prints of it, what its marker is made from (a
`Unit`), its work, and the stages it reads. distill.pipeline runs the stages; it is the one place that knows their
order.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from distill.core.check import Check, add_check_args, print_estimates, wants_check
from distill.core.config import add_config_args, add_fresh_arg, load_config, read_json_model
from distill.core.errors import DistillError
from distill.core.run import describe_changes, fingerprint

STAGE_CONFIG = "config"  # the key of a pipeline section that names the stage's own config file


def served_by(server) -> dict:
    """What a stage's marker keeps of the vLLM server it ran against: on a CPU, how it shared the machine."""
    binding = getattr(server, "binding", None)
    return {"server_cpu_binding": binding} if binding else {}


class StageMarker(BaseModel):
    """`DONE.json`: a finished stage, or one student's part of a per-student stage, with what it was made from:
    its settings (the resolved section, less distill.core.run's RUNTIME_KEYS), the digests of its inputs, and their
    fingerprint. A rerun compares the fingerprint to decide, and the settings and inputs to say why."""

    model_config = ConfigDict(extra="allow")

    stage: str | None = None
    fingerprint: str | None = None  # None: a marker written before stages kept one
    settings: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0


def read_marker(path: Path) -> StageMarker | None:
    """The marker at `path`, None when the work is not done; one that cannot be read is one line naming it."""
    return read_json_model(path, StageMarker, "stage marker", "delete it to redo that stage")


def label(stage: str, student: str | None = None) -> str:
    """A unit's name in the lines a run prints and in what it is made from: `filter`, `train planner`."""
    return stage if student is None else f"{stage} {student}"


@dataclass
class Unit:
    """One piece of work with its own marker: a stage, or one student's sft-data or training."""

    stage: str
    folder: Path
    settings: Any
    inputs: dict[str, Any]
    student: str | None = None
    followers: tuple[str, ...] = ()  # what must be redone after it (Pipeline.followers): named in its rerun line

    @property
    def label(self) -> str:
        return label(self.stage, self.student)

    @property
    def fingerprint(self) -> str:
        return fingerprint({"settings": self.settings, "inputs": self.inputs})

    def head(self) -> dict:
        return {"stage": self.stage, "fingerprint": self.fingerprint, "settings": self.settings, "inputs": self.inputs}

    def why(self, marker: StageMarker | None, after: list[str]) -> str | None:
        """Why this unit must run, as its line says it; None when its marker says it is done as configured."""
        if marker is None:
            return "running (not done yet)"
        if after:
            return f"rerunning ({', '.join(after)} redone)"
        if marker.fingerprint == self.fingerprint:
            return None
        if marker.fingerprint is None:
            reason = "made before stages kept fingerprints"
        elif marker.settings != self.settings:
            reason = f"settings changed ({describe_changes(marker.settings, self.settings)})"
        elif changed := sorted(k for k in marker.inputs.keys() | self.inputs.keys()
                               if marker.inputs.get(k) != self.inputs.get(k)):
            reason = f"input changed ({', '.join(changed)})"
        else:
            reason = "fingerprint changed"
        return f"{reason}: rerunning" + (f"; {', '.join(self.followers)} follow" if self.followers else "")


@dataclass(frozen=True)
class CheckContext:
    """What every stage's `--check` reads: the problems so far (a distill.core.check.Check), the address standing for
    the servers the pipeline starts, the visible GPUs (None: unknown) and the token counter of the estimates."""

    world: Any
    url: str
    gpus: int | None
    counter: Any


@dataclass(frozen=True)
class Stage:
    """A stage. Its command, where it is config-driven (`run` set; otherwise the module has its own
    `configure_parser` and `main`), and its place in the pipeline, where it has one (`resolve` set). The pipeline's
    hooks take the running pipeline (`p`: its config, run folder, servers and students) as their first argument,
    and a student's name last where the stage is made per student."""

    name: str  # its command, and its folder in a run (distill.core.layout)
    config: type  # the stage's pydantic config class
    example: str | None = None  # a shipped config, named when --config is missing
    run: Callable[[Any, str, bool], Any] | None = None  # (cfg, config path, fresh) -> what it made
    check: Callable[[Any, Any], Any] | None = None  # (cfg, Check) -> a StageEstimate to print, or None
    report: Callable[[Any, Any], None] | None = None  # (cfg, what run made): the lines a user reads at the end
    # in the pipeline
    resolve: Callable[..., Any] | None = None  # (p, url[, student]) -> its config, checked before any stage runs
    show: Callable[..., Any] | None = None  # (p, CheckContext[, student]) -> `--check`'s lines; a StageEstimate
    unit: Callable[..., Unit] | None = None  # (p[, student]) -> the settings and input digests of one unit
    work: Callable[..., dict] | None = None  # (p[, student]) -> what its DONE.json keeps
    after: tuple[str, ...] = ()  # the stages it is made from: on a rerun, what follows a redone unit
    per_student: bool = False  # one unit and folder per student
    # a stage made once from per-student ones: the students it reads (improve: the one it improves; None: all)
    students: Callable[[Any], Any] | None = None


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser)
    add_fresh_arg(parser)
    add_check_args(parser)


def main(stage: Stage, args: argparse.Namespace) -> int:
    if not args.config:
        raise DistillError(f"--config is required (e.g. {stage.example})")
    cfg = load_config(stage.config, args.config, args.set)
    if wants_check(args):
        check = Check(args.offline)
        estimate = stage.check(cfg, check)
        if estimate is not None:
            print_estimates([estimate])
        check.disk(cfg.output_dir)
        return check.finish()
    stage.report(cfg, stage.run(cfg, args.config, args.fresh))
    return 0
