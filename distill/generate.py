"""Step 1: record teacher ReWOO trajectories on train questions.

    python scripts/generate_trajectories.py --config configs/generate_teacher.yaml
    distill generate --config configs/generate_teacher.yaml --set samples_per_question=4

A teacher run costs real money and hours, so: one record per (example, sample) appended and fsynced as soon
as it exists, a rerun of the same command finishes what is missing, and every model and tool call goes
through a content-addressed cache, so even a deleted output is rebuilt without paying again.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import Field

from distill.config import AgentConfig, ModelSpec, Strict
from distill.errors import DistillError

TRAJECTORIES = "trajectories.jsonl"


class DatasetSource(Strict):
    """Where questions come from: `hub:<name>[:<config>]` or a local .json/.jsonl file."""

    name: Literal["hotpotqa", "triviaqa"] | str
    source: str
    split: str = "train"
    n: int | None = None  # how many distinct questions to draw; None = all


class GenerateConfig(AgentConfig):
    datasets: list[DatasetSource] = Field(default_factory=list)
    eval_sets: list[DatasetSource] = Field(default_factory=list)  # leak guard: refuse train questions found here
    output_dir: str = "runs/teacher"
    seed: int = 0
    samples_per_question: int = 1  # >1: rejection sampling, several plans per question
    concurrency: int = 4  # questions in flight
    cache: str | None = "auto"  # auto = <output_dir>/calls.sqlite; null turns the cache off
    judge: ModelSpec | None = None  # optional LLM judge (the paper's "Acc")
    leak_policy: Literal["refuse", "exclude"] = "refuse"  # exclude: draw around eval questions instead of failing


def code_version() -> str:
    from distill import __version__

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__


def manifest_header(command: str, cfg, config_path: str | None) -> dict:
    """What every run manifest starts with: enough to tell later what produced the records beside it."""
    return {
        "command": command,
        "config_file": config_path,
        "config": cfg.model_dump(mode="json"),
        "code_version": code_version(),
        "python": platform.python_version(),
        "started_at": datetime.now(timezone.utc).isoformat(),
    }


def load_questions(cfg: GenerateConfig):
    from distill.data import check_no_leak, load_examples, question_set, sample_mix

    if not cfg.datasets:
        raise DistillError("no datasets configured: add a `datasets:` list with name, source and n")
    pools = []
    for ds in cfg.datasets:
        examples = load_examples(ds.source, ds.name, ds.split)
        pools.append((examples, ds.n if ds.n is not None else len(examples)))
    eval_questions: set[str] = set()
    for ev in cfg.eval_sets:
        eval_questions |= question_set(load_examples(ev.source, ev.name, ev.split))
    exclude = eval_questions if cfg.leak_policy == "exclude" else set()
    try:
        mix = sample_mix(pools, cfg.seed, exclude_questions=exclude)
    except DistillError as exc:
        raise DistillError(f"datasets: {exc}") from None
    check_no_leak(mix, eval_questions)
    return mix


def resolve_cache(cfg: GenerateConfig, out: Path):
    from distill.store import CallCache

    if cfg.cache is None:
        return None
    return CallCache(out / "calls.sqlite" if cfg.cache == "auto" else cfg.cache)


def record_key(rec: dict) -> tuple[str, int]:
    return (rec["id"], rec["sample"])


def generate(cfg: GenerateConfig, config_path: str | None = None) -> dict:
    """Run (or resume) generation; returns the summary that is also written to summary.json."""
    from distill.rewoo.agent import build_agent
    from distill.runner import run_resumable
    from distill.store import JsonlStore, write_json

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    examples = load_questions(cfg)
    cache = resolve_cache(cfg, out)
    agent = build_agent(cfg, cache, method="rewoo-teacher", seed=cfg.seed)
    judge_model = None
    if cfg.judge is not None:
        from distill.llm import build_chat

        judge_model = build_chat(cfg.judge, cfg.prices, cache)

    async def work(item):
        example, sample = item
        rec = await agent.run(example, sample)
        if judge_model is not None and example.answers:
            from distill.metrics import judge

            verdict = await judge(judge_model, example.question, example.answers, rec["prediction"])
            rec["scores"]["judge"] = verdict["verdict"]
            rec["judge"] = verdict
        return rec

    items = [((ex.id, s), (ex, s)) for ex in examples for s in range(cfg.samples_per_question)]
    manifest = manifest_header("generate", cfg, config_path) | {"planned_records": len(items), "status": "running"}
    write_json(out / "manifest.json", manifest)
    store = JsonlStore(out / TRAJECTORIES)
    if store.repaired:
        print(f"note: {store.path} ended in a torn line from an earlier crash; it was cut and will be redone")
    t0 = time.perf_counter()
    try:
        stats = run_resumable(
            items, work, store, record_key, concurrency=cfg.concurrency, desc="generate"
        )
    except KeyboardInterrupt:
        manifest.update(status="interrupted", records_on_disk=len(store))
        write_json(out / "manifest.json", manifest)
        raise
    finally:
        store.close()
    summary = stats.summary() | {
        "planned_records": len(items),
        "questions": len(examples),
        "wall_s_this_run": round(time.perf_counter() - t0, 2),
        "cache": None if cache is None else {
            "hits": cache.hits, "misses": cache.misses, "model_misses": cache.misses_by_kind.get("model", 0),
        },
    }
    manifest.update(status="complete", finished_at=datetime.now(timezone.utc).isoformat(), totals=summary)
    write_json(out / "manifest.json", manifest)
    write_json(out / "summary.json", summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry for scripts/generate_trajectories.py; the same as `distill generate`."""
    from distill.cli import main as cli_main

    return cli_main(["generate", *(argv or [])])


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
