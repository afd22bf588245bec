"""Progress figures of generation and evaluation, sent where training sends its own (`report_to`).

A 4k-question generation or a sweep of evaluation rows runs for hours; a user who follows training in
TensorBoard or W&B wants the running EM, evidence recall, valid-plan rate, tokens and dollars of those runs in
the same place, under the same run folder. TensorBoard writes to `<output_dir>/tensorboard`, as training does
(`distill.train.tracking_env`), so `tensorboard --logdir runs/<run>` shows every stage of a run; W&B logs to
the project in `WANDB_PROJECT` (default `distill`), one W&B run per stage, its figures under the run loop's
name (`generate/em`, `teacher/evidence_recall`, ...) against the records done.

Trackers are optional packages: a setting that names one not installed is refused before any work.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, Literal

from pydantic import BeforeValidator

from distill.core.errors import DistillError

Integration = Literal["tensorboard", "wandb", "none"]
# Every `report_to` integration training (transformers' Trainer under TRL) supports: the module it imports, and
# the pip package that provides it. What `--check` and every stage ask of a named tracker.
INTEGRATIONS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow"),
    "comet_ml": ("comet_ml", "comet-ml"), "trackio": ("trackio", "trackio"), "neptune": ("neptune", "neptune"),
    "clearml": ("clearml", "clearml"), "dvclive": ("dvclive", "dvclive"), "azure_ml": ("azureml", "azureml-core"),
    "codecarbon": ("codecarbon", "codecarbon"), "dagshub": ("dagshub", "dagshub"), "flyte": ("flytekit", "flytekit"),
    "swanlab": ("swanlab", "swanlab"),
}
# the trackers generation and evaluation send their progress figures to (a subset of training's)
PACKAGES = {name: INTEGRATIONS[name] for name in ("tensorboard", "wandb")}


def _as_list(value):
    """`report_to: wandb` and `--set report_to=wandb` mean the one-item list, as TRL reads them."""
    return [value] if isinstance(value, str) else value


# `report_to` of generate and eval: a list (a single name is accepted), spelled as training's
ReportTo = Annotated[list[Integration], BeforeValidator(_as_list)]
# the running figures logged (RunningStats.summary keys with a number)
FIGURES = ("records", "em", "f1", "valid_plan_rate", "evidence_recall", "tokens", "cost_usd", "errors")


def trackers(report_to: list[str]) -> list[str]:
    """The trackers named, without `none` (TRL's spelling of no tracker)."""
    return [r for r in dict.fromkeys(report_to) if r != "none"]


def require(report_to: list[str], setting: str = "report_to") -> None:
    """Refuse a tracker whose package is missing before any work (training's other integrations, e.g.
    mlflow, are checked by their module's name)."""
    for name in trackers(_as_list(report_to)):
        module, package = INTEGRATIONS.get(name, (name, name))
        if importlib.util.find_spec(module) is None:
            raise DistillError(f"{setting}: {name} needs the package {module!r} (pip install {package})")


class Tracker:
    """One stage's tracker: `log(loop, stats)` after each record, `close()` at the end."""

    def __init__(self, report_to: list[str], output_dir: str | Path, stage: str):
        require(report_to)
        self.writers: list = []
        self.wandb = None
        names = trackers(report_to)
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self.writers.append(SummaryWriter(str(Path(output_dir) / "tensorboard")))
        if "wandb" in names:
            import wandb

            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "distill"), job_type=stage,
                                    name=f"{Path(output_dir).parent.name}/{stage}", dir=str(output_dir),
                                    reinit="create_new")
        self.defined: set[str] = set()

    def log(self, loop: str, figures: dict) -> None:
        step = int(figures.get("records") or 0)
        values = {f"{loop}/{k}": float(figures[k]) for k in FIGURES if isinstance(figures.get(k), (int, float))}
        for writer in self.writers:
            for tag, value in values.items():
                writer.add_scalar(tag, value, step)
        if self.wandb is not None:
            if loop not in self.defined:  # each loop (an eval method) counts its own records
                self.wandb.define_metric(f"{loop}/*", step_metric=f"{loop}/records")
                self.defined.add(loop)
            self.wandb.log(values)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.wandb is not None:
            self.wandb.finish()


@contextmanager
def open_tracker(report_to: list[str], output_dir: str | Path, stage: str) -> Iterator[Tracker | None]:
    """The stage's tracker (None when `report_to` names none), closed however the stage ends."""
    if not trackers(report_to):
        yield None
        return
    tracker = Tracker(report_to, output_dir, stage)
    try:
        yield tracker
    finally:
        tracker.close()
