"""Step 2: keep the teacher trajectories worth imitating.

    distill filter runs/teacher/trajectories.jsonl --out runs/teacher/kept.jsonl [--config configs/filter.yaml]

A record is kept when its plan parsed with no errors, every step ran, and it passes the criterion; of the
passing samples of one question only the best is kept. The criterion is the paper's (`answer`: the Solver's
answer is correct), or one that judges the plan alone (`evidence`: every gold supporting page was retrieved,
whatever a weak Solver then said), or both. Questions without gold pages (TriviaQA) fall back to `answer`
under `evidence`, since there is nothing else to judge their plans by. The report accounts for every input
record: each is either kept or dropped for exactly one (the first failing) reason, and says how many each
criterion would keep.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any, Iterable, Literal, NamedTuple, get_args

from pydantic import Field, field_validator, model_validator

from distill.core import layout, stage
from distill.core.check import show_config
from distill.core.config import Strict, add_config_args, load_config, validate
from distill.core.data import _bad_characters
from distill.core.errors import DistillError
from distill.core.metrics import hotpot_normalize
from distill.core.run import settings_of
from distill.core.store import FirstPerKey, content_digest, iter_jsonl, write_json, write_jsonl
from distill.rewoo.record import TrajectoryRecord

REASONS = (
    "invalid_plan", "step_failed", "too_many_steps", "unused_evidence", "evidence_missed", "incorrect",
    "not_best_sample",
)
Criterion = Literal["answer", "evidence", "answer_and_evidence"]


class FilterInput(TrajectoryRecord):
    """A trajectory as the filter reads it. Its question becomes a training prompt and its answers judge it, so
    a hand-made file is held to the rule a dataset row is (`distill.core.data`): no control characters, which
    generate and eval never send a model either."""

    @field_validator("question")
    @classmethod
    def _askable(cls, value: str) -> str:
        if bad := _bad_characters(value):
            raise ValueError(f"the question holds the control character U+{ord(bad[0]):04X}")
        return value

    @field_validator("answers")
    @classmethod
    def _plain_answers(cls, value: list[str]) -> list[str]:
        if any(_bad_characters(a) for a in value):
            raise ValueError("a gold answer holds a control character")
        return value


class KeptRecord(FilterInput):
    """A trajectory the filter kept, as `distill sft-data` reads it: a valid plan with at least one step."""

    @model_validator(mode="after")
    def _kept(self) -> "KeptRecord":
        if self.plan.valid is not True or not self.plan.steps:
            raise ValueError("plan: a kept record has a valid plan with at least one step (read the output of "
                             "`distill filter`, not the trajectories)")
        return self


class FilterConfig(Strict):
    criterion: Criterion = "answer"
    """answer: the Solver's answer is correct (the paper's); evidence: every gold supporting page was retrieved;
    answer_and_evidence: both"""
    min_f1: float = Field(default=0.8, ge=0.0, le=1.0)
    """an answer is correct with EM on any alias or F1 at least this (datasets in f1_datasets only)"""
    f1_datasets: list[str] = ["hotpotqa"]
    """datasets where the F1 rule applies; elsewhere EM only"""
    use_judge: bool = False
    """correct when the stored judge verdict says so (needs a judged run)"""
    accept_contained_answer: bool = False
    """also correct when a normalised gold alias occurs in the prediction"""
    max_steps: int | None = Field(default=None, ge=1)
    """drop plans with more steps than this; unset: no limit"""
    reject_unused_evidence: bool = False
    """drop plans where some #E is never used by a later step or the Solver"""
    best_per_question: bool = True
    """keep only the best passing sample of each question"""


def is_correct(rec: dict, cfg: FilterConfig) -> bool:
    scores = rec.get("scores") or {}
    if cfg.use_judge:
        return scores.get("judge") is True
    return (scores.get("em", 0) >= 1
            or (cfg.accept_contained_answer and contains_answer(rec))
            or (rec.get("dataset") in cfg.f1_datasets and scores.get("f1", 0.0) >= cfg.min_f1))


def contains_answer(rec: dict) -> bool:
    """Lenient correctness for small teachers that answer in a sentence ("The Volga is longer than the Rhine")."""
    pred = f" {hotpot_normalize(rec.get('prediction') or '')} "
    return any(f" {a} " in pred for a in map(hotpot_normalize, rec.get("answers") or []) if a)


def unused_evidence(rec: dict) -> bool:
    """Evidence nobody refers to is wasted tool work; the last step feeds the solver, so it always counts."""
    steps = rec["plan"]["steps"]
    used = {d for s in steps for d in s["deps"]}
    return any(s["id"] not in used for s in steps[:-1])


def first_failure(rec: dict, cfg: FilterConfig) -> str | None:
    plan = rec.get("plan") or {}
    if not plan.get("valid") or not plan.get("steps"):
        return "invalid_plan"
    evidence = rec.get("evidence", [])
    # a step generation left out on purpose (`not_run`: nothing the filter reads takes in its output) is no failure
    expected = len(plan["steps"]) - len(rec.get("not_run") or ())
    if len(evidence) != expected or any(e.get("status") != "ok" for e in evidence):
        return "step_failed"
    if cfg.max_steps is not None and len(plan["steps"]) > cfg.max_steps:
        return "too_many_steps"
    if cfg.reject_unused_evidence and unused_evidence(rec):
        return "unused_evidence"
    recall = rec.get("evidence_recall")
    judge_evidence = cfg.criterion != "answer" and recall is not None
    if judge_evidence and not recall.get("all"):
        return "evidence_missed"
    judge_answer = cfg.criterion != "evidence" or recall is None
    if judge_answer and not is_correct(rec, cfg):
        return "incorrect"
    return None


def rank(rec: dict) -> tuple:
    """Best sample first: higher F1, then fewer steps, then fewer tokens, then the earliest sample."""
    return (-(rec.get("scores") or {}).get("f1", 0.0), len(rec["plan"]["steps"]), rec.get("tokens", {}).get("total", 0),
            rec.get("sample", 0))


class Row(NamedTuple):
    """What choosing and the report need of one record, none of its text: the filter holds one per record while
    it reads a file (tens of bytes, against kilobytes a trajectory), then reads the file again to write the kept."""

    line: int
    id: str
    dataset: Any
    steps: int
    recall: tuple[Any, bool] | None  # (recall, all gold pages) where the record has gold pages


def _row(rec: dict, line: int = 0) -> Row:
    dataset = rec.get("dataset", "?")
    recall = rec.get("evidence_recall")
    return Row(line, rec.get("id", ""), sys.intern(dataset) if isinstance(dataset, str) else dataset,
               len((rec.get("plan") or {}).get("steps") or []),
               None if recall is None else (recall["recall"], bool(recall["all"])))


class Selection:
    """The filter's choice, made one record at a time: each record's first failing reason, and per question
    the best passing sample so far (a tie keeps the earlier). With `criteria`, also how many each criterion
    would keep, for the report. One source of truth for `filter_records` (a list) and `run_filter` (a file)."""

    def __init__(self, cfg: FilterConfig, criteria: bool = False):
        self.cfg = cfg
        self.rows: list[Row] = []
        self.reasons: list[str | None] = []
        self._best: dict[str, tuple[tuple, int]] = {}  # question id -> (rank, position) of its best passing sample
        self._others = {c: cfg.model_copy(update={"criterion": c}) for c in get_args(Criterion)} if criteria else {}
        self._passing: dict[str, set[str] | list[str]] = {c: set() if cfg.best_per_question else []
                                                          for c in self._others}

    def add(self, rec: dict, line: int = 0) -> None:
        position = len(self.rows)
        reason = first_failure(rec, self.cfg)
        self.rows.append(_row(rec, line))
        self.reasons.append(reason)
        if reason is None and self.cfg.best_per_question:
            held, score = self._best.get(rec["id"]), rank(rec)
            if held is None or score < held[0]:
                self._best[rec["id"]] = (score, position)
        for criterion, cfg in self._others.items():
            if (reason if criterion == self.cfg.criterion else first_failure(rec, cfg)) is None:
                passing = self._passing[criterion]
                passing.add(rec["id"]) if isinstance(passing, set) else passing.append(rec["id"])

    def outcome(self) -> tuple[list[int], list[tuple[int, str]]]:
        """Positions of the kept records, in order, and (position, reason) of the dropped: failures in order,
        then the passing samples that were not their question's best."""
        passing = [i for i, reason in enumerate(self.reasons) if reason is None]
        dropped = [(i, reason) for i, reason in enumerate(self.reasons) if reason is not None]
        if not self.cfg.best_per_question:
            return passing, dropped
        winners = {position for _, position in self._best.values()}
        dropped += [(i, "not_best_sample") for i in passing if i not in winners]
        return [i for i in passing if i in winners], dropped

    def report(self, kept: list[int], dropped: list[tuple[int, str]]) -> dict:
        outcomes = [(self.rows[i], "kept") for i in kept] + [(self.rows[i], reason) for i, reason in dropped]
        by_criterion = {c: len(ids) for c, ids in self._passing.items()} if self._others else None
        return _report(self.rows, outcomes, by_criterion)


def filter_records(records: list[dict], cfg: FilterConfig) -> tuple[list[dict], list[tuple[dict, str]]]:
    selection = Selection(cfg)
    for rec in records:
        selection.add(rec)
    kept, dropped = selection.outcome()
    return [records[i] for i in kept], [(records[i], reason) for i, reason in dropped]


def recall_summary(records: list[dict]) -> dict[str, dict]:
    """Mean evidence recall and the share with every gold page, per dataset, over records that have gold pages."""
    return _recall_summary(_row(r) for r in records)


def _recall_summary(rows: Iterable[Row]) -> dict[str, dict]:
    by: dict[Any, list[tuple[Any, bool]]] = defaultdict(list)
    for row in rows:
        if row.recall is not None:
            by[row.dataset].append(row.recall)
    return {k: {"n": len(v), "recall": fmean(x for x, _ in v), "all": fmean(a for _, a in v)}
            for k, v in sorted(by.items())}


def build_report(records: list[dict], kept: list[dict], dropped: list[tuple[dict, str]],
                 cfg: FilterConfig | None = None) -> dict:
    by_criterion = None if cfg is None else {
        c: len(filter_records(records, cfg.model_copy(update={"criterion": c}))[0]) for c in get_args(Criterion)
    }
    outcomes = [(_row(r), "kept") for r in kept] + [(_row(r), reason) for r, reason in dropped]
    return _report([_row(r) for r in records], outcomes, by_criterion)


def _report(rows: list[Row], outcomes: list[tuple[Row, str]], kept_by_criterion: dict | None) -> dict:
    """The report over every input record (`rows`) and what became of each (`outcomes`, kept first)."""
    by_reason: Counter = Counter()
    table: dict[str, dict[str, Counter]] = {"dataset": defaultdict(Counter), "steps": defaultdict(Counter)}
    kept = []
    for row, outcome in outcomes:
        if outcome == "kept":
            kept.append(row)
        else:
            by_reason[outcome] += 1
        table["dataset"][row.dataset][outcome] += 1
        table["steps"][str(row.steps)][outcome] += 1
    return {
        "input_records": len(rows),
        "questions": len({r.id for r in rows}),
        "kept": len(kept),
        "dropped": {reason: by_reason.get(reason, 0) for reason in REASONS},
        "by_dataset": {k: dict(v) for k, v in sorted(table["dataset"].items())},
        "by_steps": {k: dict(v) for k, v in sorted(table["steps"].items(), key=lambda kv: int(kv[0]))},
        "accounted": len(outcomes) == len(rows),
        "evidence_recall": {"input": _recall_summary(rows), "kept": _recall_summary(kept)},
        "kept_by_criterion": kept_by_criterion,
    }


def format_report(report: dict) -> str:
    cols = ("kept",) + REASONS
    lines = [f"{report['input_records']} records over {report['questions']} questions: {report['kept']} kept"]
    if skipped := {k: n for k, n in (report.get("skipped") or {}).items() if n}:
        lines.append("skipped lines: " + ", ".join(f"{k} {n}" for k, n in skipped.items()))
    for title, key in (("dataset", "by_dataset"), ("steps", "by_steps")):
        header = f"{title:<12}" + "".join(f"{c:>16}" for c in cols) + f"{'total':>8}"
        lines += ["", header, "-" * len(header)]
        for name, counts in report[key].items():
            lines.append(
                f"{name:<12}" + "".join(f"{counts.get(c, 0):>16}" for c in cols) + f"{sum(counts.values()):>8}"
            )
    if report.get("kept_by_criterion"):
        lines += ["", "kept by criterion: " + ", ".join(f"{c} {n}" for c, n in report["kept_by_criterion"].items())]
    for name, r in (report.get("evidence_recall") or {}).get("input", {}).items():
        lines.append(f"evidence recall {name}: {r['recall']:.3f} (all gold pages {r['all']:.3f}, n={r['n']})")
    return "\n".join(lines)


def run_filter(inp: str | Path, out: str | Path, cfg: FilterConfig) -> dict:
    """Two passes over `inp`, so memory does not grow with the file: the first checks every line (nothing is
    written when one is bad) and keeps a `Row` per record to choose by; the second writes the chosen lines."""
    selection = Selection(cfg, criteria=True)
    # Two files joined by hand can hold a (question, sample) twice: the first is judged, the copies are counted.
    first = FirstPerKey(lambda r: (r["id"], r["sample"]), str(inp))
    unsolved, first_unsolved = 0, 0
    for line, rec in iter_jsonl(inp, FilterInput):
        if (cfg.criterion != "evidence" and rec.get("answers") and rec.get("prediction") is None
                and "em" not in (rec.get("scores") or {})):
            unsolved, first_unsolved = unsolved + 1, first_unsolved or line
        if first(rec):
            selection.add(rec, line)
    if unsolved:  # generate's solve: false; the evidence criterion never reads an answer
        raise DistillError(f"{inp}:{first_unsolved}: no Solver answer (generated with solve: false; {unsolved} such "
                           f"record(s)), and criterion {cfg.criterion} judges answers: use criterion evidence, or "
                           "generate with solve: true")
    kept, dropped = selection.outcome()
    report = selection.report(kept, dropped) | {"skipped": {"duplicate": first.dropped}}
    chosen = {selection.rows[i].line: selection.rows[i].id for i in kept}
    del selection

    def kept_records():
        written = 0
        for line, rec in iter_jsonl(inp, FilterInput, only=chosen):
            if rec["id"] != chosen[line]:
                raise DistillError(f"{inp}:{line}: the file changed while it was filtered; run the filter again")
            KeptRecord.model_validate(rec)  # what sft-data will check each line against
            written += 1
            yield rec
        if written != len(chosen):
            raise DistillError(f"{inp}: the file changed while it was filtered; run the filter again")

    write_jsonl(out, kept_records())  # atomic: a failure on the way leaves no kept file
    write_json(Path(out).with_suffix(".report.json"), report | {"config": cfg.model_dump()})
    return report


# ------------------------------------------------------------------------------------------ in the pipeline

def _resolve(p, url: str | None) -> FilterConfig:
    return validate(FilterConfig, p.cfg.filter, "filter")


def _show(p, c) -> None:
    show_config("filter: resolved config", _resolve(p, None).model_dump(mode="json"))


def _unit(p) -> stage.Unit:
    trajectories = layout.trajectories(p.run)
    return stage.Unit(layout.FILTER, layout.stage_dir(p.run, layout.FILTER),
                      settings_of(_resolve(p, None).model_dump(mode="json")),
                      {layout.in_run(p.run, trajectories): content_digest(trajectories)})


def _work(p) -> dict:
    report = p.entry("filter")(layout.trajectories(p.run), layout.kept(p.run), _resolve(p, None))
    print(format_report(report))
    if report["kept"] == 0:
        raise DistillError("the filter kept no trajectory: more samples_per_question or more questions")
    return {"kept": report["kept"], "input_records": report["input_records"]}


STAGE = stage.Stage(layout.FILTER, FilterConfig, resolve=_resolve, show=_show, unit=_unit, work=_work,
                    after=(layout.GENERATE,))


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trajectories", help="trajectory JSONL written by `distill generate`")
    parser.add_argument("--out", required=True, help="kept records (JSONL); the report goes beside it")
    add_config_args(parser)


def main(args: argparse.Namespace) -> int:
    cfg = load_config(FilterConfig, args.config, args.set)
    report = run_filter(args.trajectories, args.out, cfg)
    if not report["kept"]:
        # nothing to train on: sft-data would refuse the empty file anyway, later and less clearly
        why = ", ".join(f"{k} {n}" for k, n in report["dropped"].items() if n) or "no records"
        raise DistillError(f"filter kept 0 of {report['input_records']} records (dropped: {why}; criterion "
                           f"{cfg.criterion}); the report is {Path(args.out).with_suffix('.report.json')}")
    print(format_report(report))
    print(f"kept: {args.out}")
    return 0


if __name__ == "__main__":  # `python -m distill.filter` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
