"""Step 1: record teacher ReWOO trajectories on train questions.

    python scripts/generate_trajectories.py --config configs/generate_teacher.yaml
    distill generate --config configs/generate_teacher.yaml --set samples_per_question=4

A teacher run costs real money and hours, so: one record per (example, sample) appended and fsynced as soon
as it exists, a rerun of the same command finishes what is missing, and every model and tool call goes
through a content-addressed cache, so even a deleted output is rebuilt without paying again. A rerun resumes only
into records made with the same settings (their fingerprint, see distill.core.run); `--fresh` sets other records
aside. The lock, the manifest, error records and what stops a run are distill.core.run's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from distill.agent.factory import build_agent, retries_of
from distill.core import layout, stage
from distill.core.check import CallKind, TokenCounter, estimate_stage, show_config
from distill.core.config import SERVER_PLACEHOLDER, AgentConfig, ModelSpec, fill_server, validate
from distill.core.data import DatasetSource, check_no_leak, check_unique_ids, load_source, question_set, sample_mix
from distill.core.errors import DistillError
from distill.core.metrics import JUDGE_MAX_TOKENS, judge_messages
from distill.core.run import (CostCap, add_judgement, build_judge, check_fingerprint, fingerprint, manifest_header,
                              model_identities, read_manifest, run_lifecycle, run_records, settings_of, source_digests,
                              with_identity)
from distill.core.store import CallCache, JsonlStore, write_json
from distill.core.tracking import ReportTo, open_tracker, require
from distill.llm import check_prices
from distill.rewoo.prompts import planner_messages, solver_messages
from distill.rewoo.record import TrajectoryRecord
from distill.tools.registry import tool_descriptions
from distill.training import launch

TRAJECTORIES = layout.TRAJECTORIES
ERRORS = "errors.jsonl"  # one line per failed attempt at a record; a rerun retries them


class GenerateConfig(AgentConfig):
    datasets: list[DatasetSource] = Field(default_factory=list)
    """the training questions: [{name, source, n, ...}] (see DatasetSource)"""
    eval_sets: list[DatasetSource] = Field(default_factory=list)
    """leak guard: train questions also found in these sets are refused (or excluded, by leak_policy)"""
    output_dir: str = "runs/teacher"
    """where trajectories.jsonl, the manifest and the call cache go"""
    seed: int = Field(default=0, ge=0)
    """seed of question sampling and of each sample's sampling seed"""
    samples_per_question: int = Field(default=1, ge=1)
    """plans sampled per question; more than 1 is rejection sampling (set temperature above 0)"""
    solve: bool = True
    """false: record plan and evidence only, no Solver call (enough for the filter's `evidence` criterion, which
    never reads the answer; the Solver's prompt is most of a trajectory's unshared prompt tokens)"""
    run_unread_steps: bool = True
    """false: for a question with gold pages, an LLM step that nothing reads (no other tool's step, directly or
    through others; with solve: false and no re-planning, as the Solver and a re-plan read every step) is not run:
    it cannot change what the `evidence` criterion judges, and in the demo such steps were 7 in 10 of the LLM tool's
    calls. The record lists them under `not_run`; every other step, and every step of a question without gold
    pages, runs"""
    concurrency: int = Field(default=4, ge=1)
    """questions in flight"""
    cache: str | None = "auto"
    """auto: <output_dir>/calls.sqlite; a path: that file; null: off"""
    judge: ModelSpec | None = None
    """an optional LLM judge of each answer (the paper's "Acc")"""
    leak_policy: Literal["refuse", "exclude"] = "refuse"
    """refuse: stop when a train question is in eval_sets; exclude: draw around eval questions"""
    report_to: ReportTo = Field(default_factory=list)
    """progress figures to tensorboard (<output_dir>/tensorboard) and/or wandb; in a pipeline, training's report_to
    applies"""
    max_cost_usd: float | None = Field(default=None, ge=0)
    """dollars: the run stops (manifest `capped`, exit 2) once its records, earlier runs' included, cost this much;
    none by default"""

    ADDED = frozenset({"run_unread_steps"})

    def endpoints(self) -> dict[str, ModelSpec]:
        return super().endpoints() | ({"judge": self.judge} if self.judge else {})

    @model_validator(mode="after")
    def _judge_needs_answers(self) -> "GenerateConfig":
        if self.judge is not None and not self.solve:
            raise ValueError("judge: a judge grades the Solver's answers, and solve: false makes none "
                             "(drop the judge or set solve: true)")
        return self


def load_questions(cfg: GenerateConfig):
    if not cfg.datasets:
        raise DistillError("no datasets configured: add a `datasets:` list with name, source and n")
    pools = []
    for ds in cfg.datasets:
        examples = load_source(ds)
        pools.append((examples, ds.n))  # None: all, less those the leak guard excludes
    check_unique_ids((ex for pool, _ in pools for ex in pool), "the datasets")
    eval_questions = question_set(ex for ev in cfg.eval_sets for ex in load_source(ev))
    exclude = eval_questions if cfg.leak_policy == "exclude" else set()
    try:
        mix = sample_mix(pools, cfg.seed, exclude_questions=exclude)
    except DistillError as exc:
        raise DistillError(f"datasets: {exc}") from None
    check_no_leak(mix, eval_questions)
    return mix


def record_key(rec: dict) -> tuple[str, int]:
    return (rec["id"], rec["sample"])


def run_settings(cfg: GenerateConfig) -> dict:
    """What a trajectory depends on: the settings but which questions are drawn (`n`, the samples, the leak
    guard: more questions only add records), each model by what its server serves, and the input files."""
    data = settings_of(cfg.first_named_dump(exclude={"eval_sets", "leak_policy", "samples_per_question"}))
    for ds in data["datasets"]:
        ds.pop("n", None)
    models = {"planner": cfg.planner, "solver": cfg.solver, "llm_tool": cfg.llm_tool, "judge": cfg.judge}
    for name, identity in model_identities(models).items():
        data[name] = with_identity(data[name], identity)
    return data | {"inputs": source_digests([ds.source for ds in cfg.datasets] + [cfg.wikipedia_corpus])}


def check_resumable(out: Path, fp: str, settings: dict, fresh: bool) -> set:
    """Before the manifest is rewritten: the records already in `out` must be made with these settings. Returns
    the keys of the records a resumed run keeps (none when they were set aside)."""
    if not (path := out / TRAJECTORIES).exists():
        return set()
    old = read_manifest(layout.manifest(out))
    made = old and {"fingerprint": old.fingerprint, "settings": old.run_settings}
    with JsonlStore(path, key=record_key) as store:  # it says so when it cuts a torn last line
        records = store.records()
    check_fingerprint(path, records, fp, settings, made, fresh, "trajectories")
    return {record_key(r) for r in records} if path.exists() else set()


def generate(cfg: GenerateConfig, config_path: str | None = None, fresh: bool = False) -> dict:
    """Run (or resume) generation; returns the summary that is also written to summary.json. `fresh` sets
    records made with other settings aside instead of refusing them."""
    check_prices(cfg)
    out = Path(cfg.output_dir)
    examples = load_questions(cfg)
    items = [((ex.id, s), (ex, s)) for ex in examples for s in range(cfg.samples_per_question)]
    manifest = manifest_header("generate", cfg, config_path) | {"planned_records": len(items)}

    def check() -> None:  # once the folder is ours; the models' servers are asked what they serve
        settings = run_settings(cfg)
        manifest.update(fingerprint=fingerprint(settings), run_settings=settings)
        done = len(check_resumable(out, manifest["fingerprint"], settings, fresh) & {k for k, _ in items})
        # counted from the start, so a run that fails before its loop (a full disk at the call cache) still says
        # how far the folder got; the loop's own counts replace these
        manifest.update(counts={"planned": len(items), "done": done, "errors": 0, "not_run": len(items) - done},
                        records_on_disk=done)

    require(cfg.report_to)
    with run_lifecycle(out, manifest, check=check), CallCache.open(cfg.cache, layout.call_cache(out)) as cache, \
            open_tracker(cfg.report_to, out, "generate") as tracker:
        fp = manifest["fingerprint"]
        agent = build_agent(cfg, cache, method="rewoo-teacher", seed=cfg.seed, solve=cfg.solve,
                            run_unread_steps=cfg.run_unread_steps)
        judge_model = build_judge(cfg, cache)

        async def work(item):
            example, sample = item
            rec = await agent.run(example, sample)
            await add_judgement(judge_model, example, rec)
            return rec | {"fingerprint": fp}

        t0 = time.perf_counter()
        with JsonlStore(out / ERRORS) as errors:
            result = run_records(
                out / TRAJECTORIES, items, work, record_key, errors, concurrency=cfg.concurrency, desc="generate",
                keep=lambda r: manifest.update(counts=r.counts(), records_on_disk=r.done), schema=TrajectoryRecord,
                tracker=tracker,
                cap=CostCap(cfg.max_cost_usd),
            )
        summary = result.summary() | {
            "planned_records": len(items),
            "questions": len(examples),
            "wall_s_this_run": round(time.perf_counter() - t0, 2),
            "cache": None if cache is None else {
                "hits": cache.hits, "misses": cache.misses, "model_misses": cache.misses_by_kind.get("model", 0),
            },
        } | retries_of(agent)
        manifest.update(totals=summary)
        write_json(out / layout.SUMMARY, summary)
    return summary


def check_questions(cfg: GenerateConfig, check) -> list:
    """The questions a run would draw, when every source is on this machine; hub datasets are not fetched by a
    check, so there only their count (`n`) is known, and an empty list is returned."""
    if any(ds.source.startswith("hub:") for ds in [*cfg.datasets, *cfg.eval_sets]):
        return []
    try:
        return load_questions(cfg)
    except DistillError as exc:
        check.problem(f"generate datasets: {exc}")
        return []


def check_run(cfg: GenerateConfig, check, counter, prefix: str = "", started=()):
    """`--check` of generation (the pipeline's too): its config, endpoints and prices, and its estimate."""
    show_config(f"{prefix.rstrip('.') or 'generate'}: resolved config", cfg.model_dump(mode="json"))
    check.endpoints(cfg.endpoints(), prefix, started)
    check.unpriced(cfg.endpoints(), cfg.prices, prefix)
    examples = check_questions(cfg, check)
    n = len(examples) if examples else sum(ds.n or 0 for ds in cfg.datasets)
    if not examples:
        print(f"{prefix.rstrip('.') or 'generate'}: hub datasets are not read by a check: {n} questions (their `n`), "
              "prompts counted without the question text")
    questions = [ex.question for ex in examples] or [""]
    items = n * cfg.samples_per_question
    tools = tool_descriptions(cfg.tools)
    plans = [planner_messages(q, tools, cfg.planner_prompt) for q in questions]
    kinds = [CallKind("planner", cfg.planner, items, 1, plans, cfg.planner.max_tokens)]
    if cfg.solve:
        kinds.append(CallKind("solver", cfg.solver, items, 1, [solver_messages(q, (), ()) for q in questions],
                              cfg.solver.max_tokens, grows_by=cfg.planner.max_tokens))
    if cfg.replan:
        kinds.append(CallKind("re-plans (at most)", cfg.planner, items, cfg.max_replans, plans,
                              cfg.planner.max_tokens, grows_by=cfg.planner.max_tokens))
    if cfg.judge is not None:
        answers = [ex.answers for ex in examples] or [[""]]
        kinds.append(CallKind("judge", cfg.judge, items, 1,
                              [judge_messages(q, a, "") for q, a in zip(questions, answers)], JUDGE_MAX_TOKENS))
    estimate = estimate_stage("generate", items, kinds, cfg.prices, counter)
    check.cost_cap(estimate, cfg.max_cost_usd, prefix.rstrip(".") or "generate")
    if not prefix:  # in a pipeline, training's report_to applies, and the pipeline's check names it
        check.report_to(cfg.report_to, "generate")
    return estimate


# ------------------------------------------------------------------------------------------ command line

def _check(cfg: GenerateConfig, check):
    return check_run(cfg, check, TokenCounter())


def _report(cfg: GenerateConfig, summary: dict) -> None:
    print(json.dumps(summary, indent=2))
    print(f"trajectories: {cfg.output_dir}/{TRAJECTORIES}")


# ------------------------------------------------------------------------------------------ in the pipeline

def _resolve(p, url: str | None) -> GenerateConfig:
    paths = {"output_dir": str(layout.stage_dir(p.run, layout.GENERATE)), "cache": str(layout.call_cache(p.run))}
    return validate(GenerateConfig, launch.trackers(p) | fill_server(p.cfg.generate, url) | paths, "generate")


def _show(p, c):
    """The teacher's server, then generate's config, endpoints and estimate."""
    if p.cfg.teacher_server is not None:
        p.check_server(c.world, "teacher_server", c.gpus)
    return check_run(_resolve(p, c.url if p.cfg.teacher_server else None), c.world, c.counter, "generate.", {c.url})


def _unit(p) -> stage.Unit:
    cfg = _resolve(p, SERVER_PLACEHOLDER)
    settings = settings_of(cfg.model_dump(mode="json")) | {"teacher_server": p.server_settings("teacher_server")}
    sources = [ds.source for ds in [*cfg.datasets, *cfg.eval_sets]] + [cfg.wikipedia_corpus]
    return stage.Unit(layout.GENERATE, layout.stage_dir(p.run, layout.GENERATE), settings, source_digests(sources))


def _work(p) -> dict:
    """Records made with other settings are set aside: what the pipeline keeps is what it was told."""
    with p.server("teacher_server") as srv:
        return p.entry("generate")(_resolve(p, srv.base_url if srv else None), p.config_path, fresh=True) \
            | stage.served_by(srv)


STAGE = stage.Stage("generate", GenerateConfig, "configs/generate_teacher.yaml", run=generate, check=_check,
                    report=_report, resolve=_resolve, show=_show, unit=_unit, work=_work)


if __name__ == "__main__":  # `python -m distill.generate` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
