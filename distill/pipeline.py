"""The whole distillation in one command, one run folder, one stage at a time.

    distill pipeline --config configs/demo_smollm2_cpu.yaml [--from train] [--set key=value]

generate -> filter -> sft-data -> train -> eval (the student served by vLLM, against base and teacher
Planners, ReAct and Direct) -> report. A stage whose `DONE.json` exists is skipped; an unfinished one resumes
(generation and evaluation records are appended as they finish, training restarts from its last checkpoint).
`--from STAGE` moves that stage's folder and the later ones aside (nothing is deleted) and reruns them; the
call cache at the run folder's root makes a rerun of generation cost nothing.

Model endpoints may say `base_url: "@server"`: the pipeline starts a vLLM server (the teacher's for
generation, the student's, base model plus LoRA adapter, for evaluation) and fills in its address.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from distill.config import Strict
from distill.errors import DistillError

STAGES = ("generate", "filter", "sft-data", "train", "eval", "report")
SERVER = "@server"


class PipelineConfig(Strict):
    run_dir: str = "runs/demo"
    generate: dict[str, Any]  # GenerateConfig keys (output_dir and cache are set by the pipeline)
    teacher_server: dict[str, Any] | None = None  # ServeConfig keys: a vLLM server for the teacher, or none
    filter: dict[str, Any] = Field(default_factory=dict)  # FilterConfig keys
    sft_data: dict[str, Any] = Field(default_factory=dict)  # tools, val_fraction, seed, tokenizer
    train: dict[str, Any]  # TrainConfig keys (dataset_dir and output_dir are set by the pipeline)
    student_server: dict[str, Any] = Field(default_factory=dict)  # ServeConfig keys (adapter is set)
    eval: dict[str, Any]  # EvalConfig keys (output_dir and cache are set)


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
    def __init__(self, cfg: PipelineConfig, config_path: str | None = None):
        self.cfg = cfg
        self.run = Path(cfg.run_dir)
        self.config_path = config_path
        self.timings: dict[str, float] = {}

    def stage_dir(self, stage: str) -> Path:
        return self.run / stage

    def done(self, stage: str) -> bool:
        return (self.stage_dir(stage) / "DONE.json").exists()

    def mark_done(self, stage: str, info: dict, seconds: float) -> None:
        from distill.store import write_json

        write_json(self.stage_dir(stage) / "DONE.json", {"stage": stage, "seconds": round(seconds, 1)} | info)

    def rerun_from(self, stage: str) -> None:
        """Move the stage's folder and every later one aside, so they rerun from scratch, losing nothing."""
        if stage not in STAGES:
            raise DistillError(f"--from {stage}: unknown stage (one of {', '.join(STAGES)})")
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        for s in STAGES[STAGES.index(stage):]:
            d = self.stage_dir(s)
            if d.exists():
                d.rename(d.with_name(f"{d.name}.before-{stamp}"))

    # ------------------------------------------------------------------ stages
    def server(self, raw: dict | None, adapter: str | None, name: str):
        from contextlib import nullcontext

        if raw is None:
            return nullcontext(None)
        from distill.config import validate
        from distill.serve import ServeConfig, VLLMServer

        data = {"port": 0} | raw | ({"adapter": adapter} if adapter else {})
        cfg = validate(ServeConfig, data, f"{name} (pipeline)")
        print(f"[pipeline] starting vLLM for the {name} (log: {self.run / f'{name}.vllm.log'})", flush=True)
        return VLLMServer(cfg, log_path=self.run / f"{name}.vllm.log")

    def generate(self) -> dict:
        from distill.config import validate
        from distill.generate import GenerateConfig, generate

        with self.server(self.cfg.teacher_server, None, "teacher_server") as srv:
            data = fill_server(self.cfg.generate, srv.base_url if srv else None)
            data |= {"output_dir": str(self.stage_dir("generate")), "cache": str(self.run / "calls.sqlite")}
            return generate(validate(GenerateConfig, data, "generate (pipeline)"), self.config_path)

    def filter(self) -> dict:
        from distill.config import validate
        from distill.filter import FilterConfig, format_report, run_filter

        cfg = validate(FilterConfig, self.cfg.filter, "filter (pipeline)")
        report = run_filter(self.stage_dir("generate") / "trajectories.jsonl", self.stage_dir("filter") / "kept.jsonl", cfg)
        print(format_report(report))
        if report["kept"] == 0:
            raise DistillError("the filter kept no trajectory: more samples_per_question or more questions")
        return {"kept": report["kept"], "input_records": report["input_records"]}

    def sft_data(self) -> dict:
        from distill.sft_data import build_sft_data, format_summary

        summary = build_sft_data(self.stage_dir("filter") / "kept.jsonl", self.stage_dir("sft-data"), **self.cfg.sft_data)
        print(format_summary(summary))
        return {"examples": summary.get("counts", summary)}

    def train(self) -> dict:
        from distill.train import launch

        data = self.cfg.train | {"dataset_dir": str(self.stage_dir("sft-data")), "output_dir": str(self.stage_dir("train"))}
        info = launch(data)  # accelerate launch, one process per visible GPU; one plain process on CPU
        return {k: info.get(k) for k in ("global_step", "final_train_loss", "final_eval_loss", "wall_s")}

    def eval(self) -> dict:
        from distill.config import validate
        from distill.evaluate import EvalConfig, evaluate

        with self.server(self.cfg.student_server, str(self.stage_dir("train")), "student_server") as srv:
            data = fill_server(self.cfg.eval, srv.base_url if srv else None)
            data |= {"output_dir": str(self.stage_dir("eval"))}  # per-method caches: latency stays honest
            results = evaluate(validate(EvalConfig, data, "eval (pipeline)"))
        return {"methods": sorted(results.get("methods", {}))}

    def report(self) -> dict:
        """Put the evaluation's report, results and plots at the run folder's root, with stage timings."""
        src = self.stage_dir("eval")
        dst = self.stage_dir("report")
        dst.mkdir(parents=True, exist_ok=True)
        for f in [*src.glob("*.md"), *src.glob("*.json"), *src.glob("*.png")]:
            if f.name != "DONE.json":
                shutil.copy2(f, self.run / f.name)
        timings = {s: json.loads((self.stage_dir(s) / "DONE.json").read_text())["seconds"] for s in STAGES[:-1]
                   if self.done(s)}
        from distill.store import write_json

        write_json(self.run / "pipeline.json", {"stage_seconds": timings, "config_file": self.config_path})
        return {"stage_seconds": timings}

    def check(self) -> None:
        """Validate every stage's section before the first one runs: a typo in `eval` should not wait an hour."""
        from distill.config import validate
        from distill.evaluate import EvalConfig
        from distill.filter import FilterConfig
        from distill.generate import GenerateConfig
        from distill.serve import ServeConfig
        from distill.train import TrainConfig

        url = "http://127.0.0.1:1/v1"
        validate(GenerateConfig, fill_server(self.cfg.generate, url) | {"output_dir": "x"}, "generate")
        validate(FilterConfig, self.cfg.filter, "filter")
        validate(TrainConfig, self.cfg.train | {"dataset_dir": "x", "output_dir": "x"}, "train")
        validate(EvalConfig, fill_server(self.cfg.eval, url) | {"output_dir": "x"}, "eval")
        for name in ("teacher_server", "student_server"):
            raw = getattr(self.cfg, name)
            if raw is not None:
                validate(ServeConfig, raw, name)
        unknown = set(self.cfg.sft_data) - {"tools", "val_fraction", "seed", "tokenizer"}
        if unknown:
            raise DistillError(f"sft_data: unknown key(s) {', '.join(sorted(unknown))}")

    def run_all(self, start: str | None = None) -> None:
        self.check()
        self.run.mkdir(parents=True, exist_ok=True)
        if start:
            self.rerun_from(start)
        for stage in STAGES:
            if self.done(stage):
                print(f"[pipeline] {stage}: done, skipped", flush=True)
                continue
            print(f"[pipeline] {stage}: running", flush=True)
            self.stage_dir(stage).mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            info = getattr(self, stage.replace("-", "_"))()
            seconds = time.perf_counter() - t0
            self.mark_done(stage, info or {}, seconds)
            print(f"[pipeline] {stage}: finished in {seconds:.0f}s", flush=True)
        print(f"\nreport:  {self.run / 'report.md'}")
        print(f"results: {self.run / 'results.json'}")
