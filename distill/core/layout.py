"""A pipeline run folder's layout, written once: the folder and file names inside `run_dir`.

The pipeline writes a run folder one stage folder at a time; provenance and the report read it back, reaching
upstream by the same names (the students' training records, generate's manifest, each stage's DONE.json); the
stages write the files inside their own folders. Spelled in each module, a folder renamed in one would leave the
others looking in the wrong place, and provenance, which reads a missing file as "unknown", would not even say so.
So the layout is here, and every module that spells a path inside a run folder takes it from here. This module
imports nothing from distill: anything may import it.

    <run_dir>/
        calls.sqlite                     generation's call cache (CALL_CACHE)
        <server>.vllm.log                a vLLM server the pipeline started (teacher_server, student_server)
        pipeline.json                    the stages' seconds and the config file (PIPELINE_INFO)
        report.md, results.json, ...     the report (REPORT_MD, RESULTS; its plots and viewer are the report's)
        generate/                        manifest.json, trajectories.jsonl, summary.json, DONE.json
        filter/                          kept.jsonl, DONE.json
        sft-data/<student>/              the SFT dataset, summary.json, DONE.json   (sft-data/DONE.json: all students)
        train/<student>/                 the adapter, distill_adapter.json, loss_history.json, DONE.json
        improve/<student>/               round_<i>/ (... summary.json, adapter/) or grpo/ (summary.json, adapter/),
                                         calls.sqlite, summary.json                  (improve/DONE.json)
        eval/                            manifest.json, records/<method>.jsonl, DONE.json
        report/                          DONE.json (the report stage's marker; its files are at the root)

A stage run on its own (`distill generate`, `distill eval`, ...) writes the same files into its `output_dir`,
so the names of the files inside a stage folder hold for those folders too.
"""

from __future__ import annotations

from pathlib import Path

# --------------------------------------------------------------------------------- stage folders
GENERATE = "generate"
FILTER = "filter"
SFT_DATA = "sft-data"  # one folder per student
TRAIN = "train"  # one adapter folder per student
IMPROVE = "improve"  # one folder per improved student
EVAL = "eval"
REPORT = "report"  # its marker only: the report's files are at the run folder's root

# --------------------------------------------------------------------------------- files
DONE = "DONE.json"  # a stage's marker, or one student's part of a per-student stage
MANIFEST = "manifest.json"  # generate's and eval's run manifest (distill.core.run)
CALL_CACHE = "calls.sqlite"
PIPELINE_INFO = "pipeline.json"
REPORT_MD = "report.md"
RESULTS = "results.json"
TRAJECTORIES = "trajectories.jsonl"  # generate's records
KEPT = "kept.jsonl"  # the filter's kept records
SUMMARY = "summary.json"  # generate's, a student's SFT data's, an improvement round's or run's
LOSS_HISTORY = "loss_history.json"  # in a trained adapter's folder
RECORDS_DIR = "records"  # eval's records: one <method>.jsonl each
ROUND = "round_{}"  # an expert-iteration round's folder in improve/<student>, from 1
GRPO = "grpo"  # a GRPO run's folder in improve/<student>
ADAPTER = "adapter"  # the adapter a round or a GRPO run trains, in its folder


def stage_dir(run: Path, stage: str) -> Path:
    return run / stage


def marker(folder: Path) -> Path:
    """The DONE.json of a stage folder, or of one student's folder."""
    return folder / DONE


def call_cache(folder: Path) -> Path:
    return folder / CALL_CACHE


def server_log(run: Path, server: str) -> Path:
    return run / f"{server}.vllm.log"


def pipeline_info(run: Path) -> Path:
    return run / PIPELINE_INFO


def manifest(stage_folder: Path) -> Path:
    return stage_folder / MANIFEST


def trajectories(run: Path) -> Path:
    return run / GENERATE / TRAJECTORIES


def kept(run: Path) -> Path:
    return run / FILTER / KEPT


def sft_data(run: Path, student: str) -> Path:
    return run / SFT_DATA / student


def adapter(run: Path, student: str) -> Path:
    """A student's SFT adapter: its train folder."""
    return run / TRAIN / student


def improved(run: Path, student: str) -> Path:
    """The improve stage's folder of a student (its rounds, or its GRPO run)."""
    return run / IMPROVE / student


def round_dir(improve_folder: Path, i: int) -> Path:
    return improve_folder / ROUND.format(i)


def records_dir(eval_folder: Path) -> Path:
    return eval_folder / RECORDS_DIR


def records(eval_folder: Path, method: str) -> Path:
    return eval_folder / RECORDS_DIR / f"{method}.jsonl"


def in_run(run: Path, path: Path) -> str:
    """How a DONE.json's inputs name a path of the run: from the run folder, with `/` (`filter/kept.jsonl`)."""
    return path.relative_to(run).as_posix()
