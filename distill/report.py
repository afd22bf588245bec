"""The evaluation report, recomputed from the per-example records and nothing else.

The report stage (`distill report EVAL_DIR [--out DIR]`, the pipeline's `report`): evaluation only writes
records, so a report can be rebuilt, or written elsewhere, without any model, and deleting results.json loses
nothing (a test checks it). Every prediction is rescored; `manifest.json` only supplies bookkeeping (method
order, the reference, the questions covered, the bootstrap settings, eval's optional `prompt_budget`).

The Planner is also measured apart from the Solver, whose answers a small model gets wrong whatever the
plan (evidence recall, steps per plan, plans cut at `max_plan_steps`). Without gold pages (TriviaQA, Direct)
recall is "–", never 0: a missing measurement is not a miss. Tokens by hops show ReAct's cost growing with each
hop (every turn resends the history) while ReWOO's stays flat (the planner sees the question once).

Runs of eval's `robustness:` sweep (records with `robustness_of`) stay out of the main tables: they get their
own table and plot, each swept method at each failure rate beside its main run on the same questions.

`distill report` pointed at a flywheel's output folder (round_<r>/report.json, promotions.jsonl) shows its rounds
side by side instead (distill.reporting.flywheel_report): a round's gate has already read its evaluation, so nothing is
recomputed there.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import quote

import numpy as np
from pydantic import field_validator

from distill.agent.baselines import FINISH
from distill.core import layout, stage
from distill.core.config import Strict, validate
from distill.core.errors import DistillError
from distill.core.metrics import answer_in_text, bootstrap_ci, evidence_recall, metric_of, paired_bootstrap, score
from distill.core.run import read_manifest
from distill.core.store import content_digest, dedupe, read_json, read_jsonl, replace_files, write_json
from distill.evaluate import EvalRecord, PromptBudget, record_key
from distill.reporting import flywheel_report
from distill.reporting.provenance import collect as collect_provenance
from distill.reporting.verdict import headline, question_outcomes, read_measures, verdict
from distill.reporting.viewer import VIEWER, write_viewer
from distill.rewoo.plan import duplicate_steps

RESULTS_VERSION = 1
PLOT_CAPTIONS = {"accuracy_vs_tokens": "F1 against tokens per question",
                 "tokens_by_hops": "Tokens per question by hops", "latency": "Latency per question",
                 "recall_vs_prompt": "Evidence recall against planner prompt tokens"}
PLOTS = {key: f"{key}.png" for key in PLOT_CAPTIONS}
ROBUSTNESS_PLOT = "accuracy_vs_calls.png"
LOSS_PLOT = "loss.png"
REWARD_PLOT = "reward.png"
QUESTION_LINKS = 10  # per student and outcome in the verdict; the viewer filters for all of them
# What a run is and is not, by name, for a reader who opens its report without knowing the config behind it
# (the pipeline's `report: {intro: NAME}`). Markdown with `code` and **bold** only: report.html renders the same.
INTROS = {
    "demo": (
        "**What this demo is.** SmolLM2-135M distilling planning from its own few-shot self: as teacher it samples "
        "several plans per training question and the plans that retrieve every gold page are kept (rejection "
        "sampling); LoRA students are trained on them, and one student is trained further on its own best plans "
        "(expert iteration). Plans are scored on whether they retrieve the gold pages (evidence recall, all gold "
        "pages). The same 135M model is every method's Solver and answers few questions right, so EM and F1 are "
        "not the point here.\n\n"
        "**What it is not.** It does not test the paper's claim, a 7B student matching a large teacher: that needs "
        "the real recipe, a large teacher's plans for thousands of questions and a 7B student trained on GPUs "
        "(`configs/pipeline_hotpot_trivia_7b.yaml` in the distill repository)."
    ),
}


class ReportConfig(Strict):
    """The pipeline's `report:` section. No intro by default: a report of one's own run needs no explaining."""

    intro: str | None = None
    """a paragraph that opens report.md and report.html: `demo` says what the demo shows and what it does not"""

    @field_validator("intro")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in INTROS:
            raise ValueError(f"unknown intro {value!r}; known: {', '.join(INTROS)}")
        return value


ROBUSTNESS_FIELDS = ("n", "em", "f1", "judge", "n_evidence", "evidence_recall", "llm_calls_mean",
                     "tool_calls_mean", "tool_failures")


# ------------------------------------------------------------------------------------------- reading


def load_records(output_dir: str | Path) -> dict[str, list[dict]]:
    """Records grouped by their `method` field, in file order, the first per key kept (as the run's own store
    keeps it), so a question answered twice is counted once; the file name is not trusted."""
    folder = layout.records_dir(Path(output_dir))
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        # a pipeline's run folder holds its evaluation one level down: point there rather than at `distill eval`
        below = sorted({p.parent.parent for p in Path(output_dir).glob(f"*/{layout.RECORDS_DIR}/*.jsonl")})
        if below:
            where = " or ".join(f"`distill report {b}`" for b in below[:3])
            raise DistillError(f"no per-example records under {folder}; they are one folder down: {where}")
        raise DistillError(f"no per-example records under {folder}; run `distill eval` first")
    try:  # every line of every file checked before any number is computed
        records = [rec for path in files for rec in read_jsonl(path, EvalRecord)]
    except DistillError as exc:
        hint = " (not an evaluation record: `distill eval` writes them)"  # e.g. trajectories: no `kind`
        raise DistillError(f"{exc}{hint if 'field `kind`: Field required' in str(exc) else ''}") from None
    records, duplicates = dedupe(records, record_key, str(folder))
    if duplicates:
        print(f"note: {folder} holds {duplicates} duplicate record(s); the first of each is used")
    return _groups(records, lambda rec: rec["method"])


def hops_of(rec: dict) -> int:
    if rec["kind"] == "rewoo":
        return len((rec.get("plan") or {}).get("steps") or [])
    if rec["kind"] == "react":
        steps = (rec.get("react") or {}).get("steps") or []
        return sum(1 for s in steps if s["action"]["tool"] not in (None, FINISH))
    return 0


def steps_of(rec: dict) -> int:
    """Reasoning steps: plan steps for ReWOO, model turns (Finish included) for ReAct, none for Direct."""
    if rec["kind"] == "react":
        return len((rec.get("react") or {}).get("steps") or [])
    return hops_of(rec)


def rescore(rec: dict) -> dict | None:
    """EM/F1 recomputed from the stored prediction; None for a question without gold answers."""
    return score(metric_of(rec), rec.get("prediction"), rec["answers"]) if rec.get("answers") else None


def recall_of(rec: dict) -> dict | None:
    """{recall, all} recomputed from the record's gold pages and evidence, so a stale stored value never
    leaks into the report; None without gold pages (TriviaQA, or a method that records none)."""
    gold = (rec.get("evidence_recall") or {}).get("gold")
    if not gold:
        return None
    found = evidence_recall(gold, rec.get("evidence") or [])
    return {"recall": float(found["recall"]), "all": float(found["all"])}


def plan_steps_of(rec: dict) -> dict | None:
    """Steps of a ReWOO plan (those kept: a plan over `max_plan_steps` is cut there); None for other kinds."""
    return {"steps": float(hops_of(rec))} if rec["kind"] == "rewoo" else None


def plan_valid_of(rec: dict) -> dict | None:
    """Whether a ReWOO plan parsed and checked valid (1.0 or 0.0); None for other kinds."""
    return {"valid": float(bool((rec.get("plan") or {}).get("valid")))} if rec["kind"] == "rewoo" else None


def duplicate_steps_of(rec: dict) -> float | None:
    """Steps of a ReWOO plan that repeat an earlier step's tool and input, counted from the plan's steps (not
    the record's stored count, which records made before it lack); None for other kinds."""
    return float(duplicate_steps((rec.get("plan") or {}).get("steps") or [])) if rec["kind"] == "rewoo" else None


def judge_of(rec: dict) -> dict | None:
    """The judge's verdict on a record (1.0 right, 0.0 wrong); None where no judge ran or its reply did not parse."""
    verdict_ = (rec.get("scores") or {}).get("judge")
    return {"accuracy": float(verdict_)} if isinstance(verdict_, bool) else None


def answer_reach_of(rec: dict) -> dict | None:
    """Whether a gold answer is in the evidence, and the F1 made of it: "better evidence, worse answers" split
    into the Planner's part (it fetched the answer) and the Solver's (it read it out). A plan whose last step
    is an LLM call hands the Solver a short answer to copy; one ending on a retrieval hands it a paragraph.
    None without gold answers or evidence (Direct)."""
    if not rec.get("answers") or rec["kind"] not in ("rewoo", "react"):
        return None
    text = "\n".join(str(e.get("output") or "") for e in rec.get("evidence") or [])
    steps = (rec.get("plan") or {}).get("steps") or [] if rec["kind"] == "rewoo" else []
    return {"in_evidence": float(answer_in_text(metric_of(rec), rec["answers"], text)),
            "f1": float(rescore(rec)["f1"]),
            "ends_in_llm": float(bool(steps) and steps[-1].get("tool") == "LLM") if rec["kind"] == "rewoo" else None,
            "answer_words": float(len(str(rec.get("prediction") or "").split()))}


def _answer_reach(records: list[dict]) -> dict | None:
    reached = _present(answer_reach_of, records)
    if not reached:
        return None
    inside = [r["f1"] for r in reached if r["in_evidence"]]
    outside = [r["f1"] for r in reached if not r["in_evidence"]]
    ends = [r["ends_in_llm"] for r in reached if r["ends_in_llm"] is not None]
    return {"n": len(reached), "in_evidence_rate": _mean(r["in_evidence"] for r in reached),
            "n_in_evidence": len(inside), "f1_in_evidence": _mean(inside), "f1_not_in_evidence": _mean(outside),
            "ends_in_llm_rate": _mean(ends), "answer_words_mean": _mean(r["answer_words"] for r in reached)}


def too_many_steps(rec: dict) -> bool:
    return any(e.get("code") == "too_many_steps" for e in (rec.get("plan") or {}).get("errors") or [])


# ------------------------------------------------------------------------------------------- numbers


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return float(np.mean(values)) if values else None


def _ci(values: list[float], samples: int, seed: int) -> dict | None:
    if not values:
        return None
    mean, lo, hi = bootstrap_ci(values, n=samples, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi}


def _ci_mean(ci: dict | None) -> float | None:
    return ci["mean"] if ci else None


def _present(measure: Callable[[dict], dict | None], records: list[dict]) -> list[dict]:
    """`measure` of the records that have it: the scored questions, those with gold pages, the plans."""
    return [x for x in map(measure, records) if x is not None]


def _groups(records: Iterable[dict], key: Callable[[dict], Any]) -> dict[Any, list[dict]]:
    """Records by `key(rec)`, sorted by key (so the order does not depend on the files'); None left out."""
    groups: dict[Any, list[dict]] = defaultdict(list)
    for rec in records:
        if (k := key(rec)) is not None:
            groups[k].append(rec)
    return dict(sorted(groups.items()))


def _judge(records: list[dict]) -> dict | None:
    """None when nothing was judged; a verdict of None is a judge reply that did not parse."""
    verdicts = [r["scores"]["judge"] for r in records if "judge" in (r.get("scores") or {})]
    if not verdicts:
        return None
    parsed = [float(v) for v in verdicts if v is not None]
    return {"accuracy": _mean(parsed), "n_judged": len(parsed), "unparsed": len(verdicts) - len(parsed)}


def _tool_failures(records: list[dict]) -> dict | None:
    evidence = [e for r in records for e in r.get("evidence") or []]
    if not evidence:
        return None
    failed = [e for e in evidence if e.get("status") != "ok"]
    injected = sum(bool(e.get("injected")) for e in failed)  # absent in records made before the field: not counted
    return {"rate": len(failed) / len(evidence), "failed": len(failed), "injected": injected, "calls": len(evidence)}


def _by_dataset(records: list[dict]) -> dict:
    out = {}
    for name, recs in _groups(records, lambda r: r["dataset"]).items():
        s, r = _present(rescore, recs), _present(recall_of, recs)
        if s or r:
            out[name] = {
                "n": len(s), "em": _mean(x["em"] for x in s), "f1": _mean(x["f1"] for x in s),
                "n_evidence": len(r), "evidence_recall": _mean(x["recall"] for x in r),
                "evidence_all": _mean(x["all"] for x in r),
            }
    return out


def method_metrics(records: list[dict], samples: int = 1000, seed: int = 0) -> dict:
    """Every per-method number of the report, from that method's records."""
    kind = records[0]["kind"]
    scored, recalled = _present(rescore, records), _present(recall_of, records)
    em = [float(s["em"]) for s in scored]
    costs = [float(r.get("cost_usd", 0.0)) for r in records]
    steps = [p["steps"] for p in _present(plan_steps_of, records)]
    walls = [float(r.get("wall_s", 0.0)) for r in records]
    p50, p95 = np.percentile(walls, [50, 95])
    rewoo, react = kind == "rewoo", [r.get("react") or {} for r in records if kind == "react"]
    return {
        "kind": kind,
        "planner_prompt": records[0].get("planner_prompt"),
        "planner_model": (records[0].get("planner") or {}).get("model"),
        "solver_model": (records[0].get("solver") or {}).get("model"),
        "n": len(records),
        "n_scored": len(scored),
        "em": _ci(em, samples, seed),
        "f1": _ci([float(s["f1"]) for s in scored], samples, seed),
        "judge": _judge(records),
        "n_evidence": len(recalled),
        "evidence_recall": _ci([x["recall"] for x in recalled], samples, seed),
        "evidence_all": _ci([x["all"] for x in recalled], samples, seed),
        "plan_valid_rate": _mean(float(bool(r["plan"]["valid"])) for r in records) if rewoo else None,
        "plan_steps": {"mean": _mean(steps), "p50": float(np.percentile(steps, 50)), "max": max(steps)}
        if steps else None,
        "too_many_steps_rate": _mean(float(too_many_steps(r)) for r in records) if rewoo else None,
        "duplicate_steps_mean": _mean(map(duplicate_steps_of, records)) if rewoo else None,
        "steps_mean": _mean(steps_of(r) for r in records),
        "hops_mean": _mean(hops_of(r) for r in records),
        "tool_calls_mean": _mean(len(r.get("evidence") or []) for r in records),
        "llm_calls_mean": _mean(r["llm_calls"] for r in records),
        "tokens_mean": {k: _mean(r["tokens"][k] for r in records) for k in ("planner", "solver", "tools", "total")},
        "planner_prompt_tokens_mean": _mean(r["planner"]["usage"]["prompt_tokens"] for r in records) if rewoo else None,
        "cost_per_question_usd": _mean(costs),
        "cost_per_correct_usd": sum(costs) / sum(em) if sum(em) else None,
        "latency_s": {"p50": float(p50), "p95": float(p95), "mean": _mean(walls)},
        "tool_failures": _tool_failures(records),
        "react_finished_rate": _mean(float(bool(x.get("finished"))) for x in react) if react else None,
        "answers": _answer_reach(records),
        "by_dataset": _by_dataset(records),
    }


def _key(rec: dict) -> tuple[str, str]:
    return (rec["dataset"], rec["id"])


def _paired_on(records: list[dict], reference: list[dict], measure: Callable[[dict], dict | None],
               metrics: tuple[str, ...], samples: int, seed: int) -> dict | None:
    """method - reference in each of `measure(rec)`'s `metrics`, over the questions both have it for (sorted,
    so the pairing is fixed); None when they share none."""
    mine = {_key(r): measure(r) for r in records}
    ref = {_key(r): measure(r) for r in reference}
    common = sorted(k for k in mine.keys() & ref.keys() if mine[k] is not None and ref[k] is not None)
    if not common:
        return None
    out: dict[str, Any] = {"n": len(common)}
    for metric in metrics:
        a = [float(mine[k][metric]) for k in common]
        b = [float(ref[k][metric]) for k in common]
        out[metric] = paired_bootstrap(a, b, n=samples, seed=seed)
    return out


def paired_vs_reference(records: list[dict], reference: list[dict], samples: int = 1000, seed: int = 0) -> dict | None:
    """method - reference: EM and F1 (`n`, `em`, `f1`) over the questions both answered; evidence recall and
    the all-gold-pages rate (`evidence`) over those both have gold pages for; steps per plan (`plan_steps`)
    and the share of valid plans (`plan_valid`) when both are ReWOO planners; the judge's accuracy (`judge`)
    where a judge ran on both. None when they share no question with any of these."""
    out: dict[str, Any] = _paired_on(records, reference, rescore, ("em", "f1"), samples, seed) or {}
    for key, measure, metrics in (("evidence", recall_of, ("recall", "all")),
                                  ("plan_steps", plan_steps_of, ("steps",)),
                                  ("plan_valid", plan_valid_of, ("valid",)),
                                  ("judge", judge_of, ("accuracy",))):
        if found := _paired_on(records, reference, measure, metrics, samples, seed):
            out[key] = found
    return out or None


def tokens_by(records: list[dict], hops: Callable[[dict], Any]) -> dict[str, dict]:
    """Mean tokens per question (and n, EM) grouped by `hops(rec)`; None groups are left out.
    Keys are strings in numeric order, so the dict survives a JSON round trip unchanged."""
    return {str(h): {"n": len(recs), "tokens_mean": _mean(r["tokens"]["total"] for r in recs),
                     "llm_calls_mean": _mean(r["llm_calls"] for r in recs),
                     "em": _mean(s["em"] for s in _present(rescore, recs))}
            for h, recs in _groups(records, hops).items()}


def prompt_budget(budget: Mapping[str, Any] | None, per_method: dict[str, dict], by_method: dict[str, list[dict]],
                  samples: int = 1000, seed: int = 0) -> dict | None:
    """Eval's `prompt_budget` setting, measured: each named ReWOO planner against the reference planner, met when it
    keeps at least the reference's evidence recall with at most `max_prompt_fraction` of its planner prompt tokens.
    The recall difference is paired, so an unfinished row is not set against more questions than it answered;
    `met` judges its point estimate, and is None where a number is missing, never False. None when no budget is
    set or its reference has no ReWOO records here."""
    if not budget:
        return None
    reference, max_fraction = budget["reference"], float(budget["max_prompt_fraction"])
    if (per_method.get(reference) or {}).get("kind") != "rewoo":
        return None
    r_recall = _ci_mean(per_method[reference]["evidence_recall"])
    r_tokens = per_method[reference]["planner_prompt_tokens_mean"]
    rows = {}
    for m in budget["methods"]:
        pm = per_method.get(m)
        if pm is None or pm["kind"] != "rewoo" or m == reference:
            continue
        tokens = pm["planner_prompt_tokens_mean"]
        fraction = tokens / r_tokens if tokens is not None and r_tokens else None
        pair = _paired_on(by_method[m], by_method[reference], recall_of, ("recall",), samples, seed)
        diff = pair["recall"] if pair else None
        measured = diff is not None and fraction is not None
        met = (round(diff["diff"], 9) >= 0 and fraction <= max_fraction) if measured else None
        rows[m] = {
            "prompt": pm["planner_prompt"], "planner_prompt_tokens": tokens, "prompt_fraction": fraction,
            "evidence_recall": _ci_mean(pm["evidence_recall"]), "n_paired": pair["n"] if pair else 0,
            "recall_diff": diff and diff["diff"], "recall_diff_ci": diff, "plan_valid_rate": pm["plan_valid_rate"],
            "em": _ci_mean(pm["em"]), "f1": _ci_mean(pm["f1"]), "met": met,
        }
    if not rows:
        return None
    return {"reference": reference, "reference_evidence_recall": r_recall, "reference_planner_prompt_tokens": r_tokens,
            "max_prompt_fraction": max_fraction, "rows": rows}


def robustness(main: dict[str, list[dict]], sweep: dict[str, list[dict]], samples: int = 1000, seed: int = 0) -> dict:
    """One row per swept method and tool failure rate, its main run being one more rate, in order of rate; a
    method's rows cover only the questions all of them answered, lest a sweep on the first n questions (or
    one cut short) be set against a main run over more, easier or harder, questions."""
    bases = list(dict.fromkeys(recs[0]["robustness_of"] for recs in sweep.values()))
    rows = []
    for base in bases:
        runs = ({base: main[base]} if base in main else {}) | {
            m: recs for m, recs in sweep.items() if recs[0]["robustness_of"] == base}
        common = set.intersection(*({_key(r) for r in recs} for recs in runs.values()))
        mine = []
        for name, recs in runs.items():
            if kept := [r for r in recs if _key(r) in common]:
                metrics = method_metrics(kept, samples, seed)
                rate = float(kept[0].get("tool_failure_rate", 0.0))
                mine.append({"method": base, "run": name, "tool_failure_rate": rate,
                             **{k: metrics[k] for k in ROBUSTNESS_FIELDS}})
        rows += sorted(mine, key=lambda row: row["tool_failure_rate"])
    return {"methods": bases, "rows": rows}


def _rounded(value: Any) -> Any:
    """Round floats for readability; NaN/inf become None so results.json stays valid JSON."""
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def compute(by_method: dict[str, list[dict]], *, methods: list[str] | None = None, reference: str | None = None,
            samples: int = 1000, seed: int = 0, budget: Mapping[str, Any] | None = None,
            pairs: Mapping[str, str] | None = None) -> dict:
    """The results dict from records grouped by method (the pure core of `recompute`); `budget` is eval's
    `prompt_budget` setting, or None for no such comparison; `pairs` its rows' `compare_to` (row -> the planner
    row it is also set against, e.g. an improved student against its SFT self)."""
    sweep = {m: recs for m, recs in by_method.items() if recs and recs[0].get("robustness_of")}
    by_method = {m: recs for m, recs in by_method.items() if m not in sweep}
    if not by_method:
        raise DistillError("only robustness-sweep records: the main run's records are missing")
    methods = [m for m in methods or sorted(by_method) if m in by_method]
    reference = reference if reference in by_method else methods[0]
    per_method = {m: method_metrics(by_method[m], samples, seed) for m in methods}
    ref = by_method[reference]
    paired = {m: {"reference": reference, **(paired_vs_reference(by_method[m], ref, samples, seed) or {})}
              for m in methods if m != reference}
    rates = sorted({float(r.get("tool_failure_rate", 0.0)) for recs in by_method.values() for r in recs})
    paired_to = {}
    for m, other in (pairs or {}).items():
        if m in by_method and other in by_method:
            found = paired_vs_reference(by_method[m], by_method[other], samples, seed) or {}
            paired_to[m] = {"against": other, **found, "measures": read_measures(found)}
    results = {
        "format_version": RESULTS_VERSION,
        "methods": methods,
        "reference": reference,
        "bootstrap_samples": samples,
        "seed": seed,
        "questions": len({_key(r) for recs in by_method.values() for r in recs}),
        "datasets": sorted({r["dataset"] for recs in by_method.values() for r in recs}),
        "tool_failure_rate": rates[0] if len(rates) == 1 else rates,
        "per_method": per_method,
        "paired": paired,
        "paired_to": paired_to,
        "prompt_budget": prompt_budget(budget, per_method, by_method, samples, seed),
        "tokens_by_hops": {m: tokens_by(by_method[m], hops_of) for m in methods},
        "tokens_by_gold_hops": {m: tokens_by(by_method[m], lambda r: r.get("gold_hops")) for m in methods},
        "plots": dict(PLOTS),
    }
    if sweep:
        results["robustness"] = robustness(by_method, sweep, samples, seed)
        results["plots"]["accuracy_vs_calls"] = ROBUSTNESS_PLOT
    results["verdict"] = verdict(results, outcomes=_outcomes(by_method, reference))
    return _rounded(results)


def question_scores(rec: dict) -> dict:
    """EM, F1, evidence recall and all-gold of one record, as the tables count them (None where unmeasured)."""
    s, r = rescore(rec) or {}, recall_of(rec) or {}
    return {"em": s.get("em"), "f1": s.get("f1"), "recall": r.get("recall"), "all": r.get("all")}


def _outcomes(by_method: dict[str, list[dict]], reference: str) -> dict[str, dict[str, list]]:
    """Per method other than the reference: the questions it wins and loses against the reference. A question
    whose plan is invalid is never a win, whatever the Solver made of it: the student did not plan it."""
    ref = {_key(r): question_scores(r) for r in by_method[reference]}
    out = {}
    for m, recs in by_method.items():
        if m == reference:
            continue
        found = question_outcomes({_key(r): question_scores(r) for r in recs}, ref)
        invalid = {_key(r) for r in recs if (r.get("plan") or {}).get("valid") is False}
        out[m] = found | {"better": [k for k in found["better"] if tuple(k) not in invalid]}
    return out


def _load(output_dir: str | Path) -> tuple[dict, dict[str, list[dict]]]:
    """The results and the records they come from: methods in manifest order (others after, alphabetically),
    restricted to the manifest's questions."""
    found = read_manifest(layout.manifest(Path(output_dir)))
    manifest = found.model_dump(exclude_unset=True) if found else {}
    by_method = load_records(output_dir)
    order = [m["name"] for m in manifest.get("methods", []) if m["name"] in by_method]
    order += sorted(m for m in by_method if m not in order)
    wanted = {tuple(k) for k in manifest.get("examples", [])}
    selected = {m: [r for r in by_method[m] if not wanted or _key(r) in wanted] for m in order}
    selected = {m: recs for m, recs in selected.items() if recs}
    if not selected:
        raise DistillError("no records match the questions listed in manifest.json")
    budget = manifest.get("prompt_budget")
    if budget is not None:  # eval's own setting, read back: the same class checks it
        where = f"{layout.manifest(Path(output_dir))} prompt_budget"
        budget = validate(PromptBudget, budget, where).model_dump()
    pairs = {m["name"]: m["compare_to"] for m in manifest.get("methods", []) if m.get("compare_to")}
    results = compute(selected, methods=list(selected), reference=manifest.get("reference"),
                      samples=int(manifest.get("bootstrap_samples", 1000)), seed=int(manifest.get("seed", 0)),
                      budget=budget, pairs=pairs)
    # The verdict names the trained students where the run folder says which rows serve them.
    provenance = collect_provenance(output_dir, manifest, results)
    # a row set against a student row (`compare_to`: an improved student) is that student's too, trained on more
    rows, improved = provenance["student_rows"], {}
    for m, other in pairs.items():
        if other in rows and m in results["per_method"]:
            rows[m] = rows[other]
            improved[m] = improved_training(provenance["students"].get(rows[other]),
                                            (provenance.get("improve") or {}).get(rows[other]))
    if provenance["student_rows"]:
        results["verdict"] = _rounded(verdict(results, rows, provenance["students"],
                                              _outcomes(selected, results["reference"]), improved))
    if any(s["loss_history"] for s in provenance["students"].values()):
        results["plots"]["loss"] = LOSS_PLOT
    if provenance.get("improve"):
        results["plots"]["reward"] = REWARD_PLOT
    results = {"format_version": results["format_version"], "verdict": results.pop("verdict"),
               "provenance": _rounded(provenance), **results}
    # A report of a run that stopped must say so: its methods may cover fewer questions than the others.
    unfinished = [m["name"] for m in manifest.get("methods", []) if m["name"] not in selected]
    if manifest.get("status", "complete") != "complete" or unfinished:
        results["incomplete"] = {"status": manifest.get("status"), "methods_without_records": unfinished}
    return results, selected


def recompute(output_dir: str | Path) -> dict:
    """results.json, rebuilt from `<output_dir>/records/*.jsonl` (and the manifest's bookkeeping)."""
    return _load(output_dir)[0]


# --------------------------------------------------------------------------------------------- plots


@contextmanager
def _figure(path: Path, size: tuple[float, float] = (6.4, 4.4), panels: int = 1, grid: str = "both"):
    """A row of axes; on leaving, each gets a light grid and, where something is labelled, a legend, and the
    figure is saved to `path`. A bare Figure, not pyplot: no global backend to set, no figure to close."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    yield fig, axes
    for ax in axes:
        ax.grid(axis=grid, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _plot_ci_points(points: list[tuple[str, float, dict | None]], path: Path, **labels: str) -> None:
    """One labelled point per method at (x, mean) with its bootstrap CI; methods without the metric are left out."""
    shown = [(m, x, ci) for m, x, ci in points if ci is not None]
    xs, ys = [x for _, x, _ in shown], [ci["mean"] for _, _, ci in shown]
    span_x, span_y = (max(xs) - min(xs) or 1.0, max(ys) - min(ys) or 1.0) if shown else (1.0, 1.0)
    placed: list[tuple[float, float, float]] = []  # each label's left, right and baseline, in points (about)
    with _figure(path) as (_, (ax,)):
        for m, x, ci in shown:
            err = [[ci["mean"] - ci["lo"]], [ci["hi"] - ci["mean"]]]
            ax.errorbar([x], [ci["mean"]], yerr=err, fmt="o", capsize=4, label=m)
            # a label that would print over an earlier one goes a line higher (axes ~330 x 250 points, 8 pt text)
            left, base = (x - min(xs)) / span_x * 330 + 6, (ci["mean"] - min(ys)) / span_y * 250 + 6
            right = left + 4.8 * len(m)
            while any(lo < right and left < hi and abs(base - b) < 10 for lo, hi, b in placed):
                base += 10
            placed.append((left, right, base))
            up = base - ((ci["mean"] - min(ys)) / span_y * 250)
            ax.annotate(m, (x, ci["mean"]), textcoords="offset points", xytext=(6, up), fontsize=8)
        ax.set(**labels)


def make_plots(results: dict, by_method: dict[str, list[dict]], output_dir: str | Path) -> None:
    """Write the PNGs beside report.md."""
    from matplotlib.ticker import MaxNLocator

    out, methods, pm = Path(output_dir), results["methods"], results["per_method"]
    _plot_ci_points([(m, pm[m]["tokens_mean"]["total"] or 0.0, pm[m]["f1"]) for m in methods],
                    out / PLOTS["accuracy_vs_tokens"], xlabel="tokens per question (mean)",
                    ylabel="F1 (95% bootstrap CI)", title="F1 against tokens per question")
    # The Planner's own trade-off: what its evidence holds against what its prompt costs (ReWOO planners).
    _plot_ci_points([(m, pm[m]["planner_prompt_tokens_mean"], pm[m]["evidence_recall"]) for m in methods
                     if pm[m]["planner_prompt_tokens_mean"] is not None],
                    out / PLOTS["recall_vs_prompt"], xlabel="planner prompt tokens (mean)",
                    ylabel="evidence recall (95% bootstrap CI)", title="Evidence recall against planner prompt size")
    with _figure(out / PLOTS["tokens_by_hops"], (11, 4.2), panels=2) as (fig, axes):
        panels = (("tokens_by_hops", "hops taken (plan steps; ReAct tool actions)"),
                  ("tokens_by_gold_hops", "gold hops (from the dataset)"))
        for ax, (key, label) in zip(axes, panels):
            xs = sorted({int(h) for groups in results[key].values() for h in groups})
            if len(xs) == 1:  # one value: a bar per method, not lines over an axis with a single point
                bars = [(m, results[key][m][str(xs[0])]["tokens_mean"]) for m in methods if results[key][m]]
                ax.bar(range(len(bars)), [b[1] for b in bars])
                ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=20, fontsize=8)
                ax.set(xlabel=f"method (every question: {label}, {xs[0]})", ylabel="tokens per question (mean)")
                continue
            if not xs:
                ax.text(0.5, 0.5, f"no question has {label}", ha="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            for m in methods:
                if groups := results[key][m]:
                    ax.plot([int(h) for h in groups], [g["tokens_mean"] for g in groups.values()], marker="o", label=m)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set(xlabel=label, ylabel="tokens per question (mean)")
        fig.suptitle("Tokens per question by number of hops")
    with _figure(out / PLOTS["latency"], (max(5.0, 1.3 * len(methods) + 2), 4.2), grid="y") as (_, (ax,)):
        ax.boxplot([[float(r.get("wall_s", 0.0)) for r in by_method[m]] for m in methods], showmeans=True)
        ax.set_xticks(range(1, len(methods) + 1), methods, rotation=20)
        ax.set(ylabel="seconds per question (wall)", title="Latency per question (wall seconds)")
    if rob := results.get("robustness"):  # accuracy against model calls, a line per method through its rates
        with _figure(out / ROBUSTNESS_PLOT) as (_, (ax,)):
            for base in rob["methods"]:
                points = [(r["llm_calls_mean"], r["f1"]["mean"], r["tool_failure_rate"])
                          for r in rob["rows"] if r["method"] == base and r["f1"] is not None]
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=base)
                for x, y, rate in points:
                    ax.annotate(f"{rate:g}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
            ax.set(xlabel="model calls per question (mean)", ylabel="F1 (mean)",
                   title="F1 against model calls under tool failures\n(point labels: tool failure rate)")
    if loss := results["plots"].get("loss"):
        _plot_losses(results["provenance"]["students"], out / loss)
    if reward := results["plots"].get("reward"):
        _plot_rewards(results["provenance"]["improve"], out / reward)


def _plot_rewards(improve: dict, path: Path) -> None:
    """Per improvement round: the mean reward of every sampled plan, of each question's best, and the share of
    valid plans, as bars (one round is a bar, not a point on an axis of one value)."""
    with _figure(path, (7.5, 4.4), grid="y") as (_, (ax,)):
        shown = [("mean_reward", "mean reward (all samples)"), ("mean_best_reward", "mean best reward per question"),
                 ("valid_plan_rate", "valid plans")]
        rounds = [(student, r) for student, info in improve.items() for r in info["rounds"]]
        width = 0.8 / len(shown)
        for j, (key, label) in enumerate(shown):
            ax.bar([i + j * width for i in range(len(rounds))], [r.get(key) or 0.0 for _, r in rounds], width,
                   label=label)
        ax.set_xticks([i + width for i in range(len(rounds))],
                      [f"{student} round {r['round']}" for student, r in rounds], rotation=15, fontsize=8)
        ax.set(ylabel="reward / rate", title="Expert iteration: the planner reward of the student's own plans")


def _plot_losses(students: dict, path: Path) -> None:
    """Training (solid) and validation (dashed) loss against optimiser step, a colour per student."""
    with _figure(path, (7.5, 4.4)) as (_, (ax,)):
        for i, (name, s) in enumerate(students.items()):
            history = read_json(Path(s["loss_history"]), optional=True) if s.get("loss_history") else None
            for part, key, style in (("train", "loss", "-"), ("eval", "eval_loss", "--")):
                points = [(e["step"], e[key]) for e in (history or {}).get(part) or [] if key in e and "step" in e]
                if points:
                    ax.plot(*zip(*points), style, color=f"C{i}", marker="o" if len(points) < 3 else None,
                            label=f"{name} {'train' if part == 'train' else 'validation'}")
        ax.set(xlabel="optimiser step", ylabel="loss", title="Training and validation loss per student")


# ------------------------------------------------------------------------------------------ markdown


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ci_text(ci: dict | None, digits: int = 3) -> str:
    """`mean [lo, hi]`; a paired difference (`diff` in place of `mean`) is signed."""
    if ci is None:
        return "–"
    fmt = f"{'+' if 'diff' in ci else ''}.{digits}f"
    return f"{ci['diff'] if 'diff' in ci else ci['mean']:{fmt}} [{ci['lo']:{fmt}}, {ci['hi']:{fmt}}]"


def _money(value: float | None) -> str:
    return "–" if value is None else f"${value:.5f}"


def _table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    """Cells other than text go through `_f`, so a missing number reads "–"."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(map(_f, row)) + " |" for row in rows] + [""]


def _without_empty(header: list[str], rows: list[list[Any]], empty: Mapping[str, str]) -> tuple[list[str], list]:
    """`header` and `rows` less the columns named in `empty` whose every cell is that zero or "–": a column of
    $0.00000 on every local row says nothing."""
    drop = {i for i, name in enumerate(header) if name in empty and all(r[i] in (empty[name], "–") for r in rows)}
    keep = [i for i in range(len(header)) if i not in drop]
    return [header[i] for i in keep], [[r[i] for i in keep] for r in rows]


def _answers_lines(per_method: dict) -> list[str]:
    rows = [[m, a["n"], a["in_evidence_rate"], a["n_in_evidence"], a["f1_in_evidence"], a["f1_not_in_evidence"],
             a["ends_in_llm_rate"], _f(a["answer_words_mean"], 1)]
            for m, pm in per_method.items() for a in [pm.get("answers")] if a]
    if not rows:
        return []
    return [
        "## Answers: what the evidence held, what the Solver made of it",
        "",
        "Answer in evidence: the share of questions where a gold answer (normalised by the dataset's rules) "
        "appears in the evidence, the Planner's part. F1 where it does: the Solver's reading of that evidence. "
        "Ends in LLM: plans whose last step is an LLM call, which hands the Solver a short answer to copy; a plan "
        "ending on a retrieval hands it a paragraph. Answer words: the mean length of the predictions.",
        "",
        *_table(["method", "n", "answer in evidence", "n in evidence", "F1 where in evidence",
                 "F1 where not", "ends in LLM", "answer words"], rows),
    ]


def _hops_table(results: dict, key: str) -> list[str]:
    columns = sorted({int(h) for groups in results[key].values() for h in groups})
    if not columns:
        return ["(no question has this information)", ""]
    rows = [[m] + [f"{g['tokens_mean']:.0f} (n={g['n']})" if (g := groups.get(str(h))) else "–" for h in columns]
            for m, groups in results[key].items()]
    return _table(["method"] + [f"{h} hop" + ("" if h == 1 else "s") for h in columns], rows)


def _prompt_budget_lines(budget: dict | None) -> list[str]:
    """Eval's `prompt_budget`: each named planner's recall and prompt size against the reference's."""
    if not budget:
        return []
    ref = budget["reference"]
    return [
        f"## Prompt budget: evidence recall against {ref} at a fraction of its prompt",
        "",
        f"Met: at least the evidence recall of **{ref}** ({_f(budget['reference_evidence_recall'])}) with at most "
        f"{budget['max_prompt_fraction']:g} of its planner prompt tokens "
        f"({_f(budget['reference_planner_prompt_tokens'], 0)}), for each planner eval's `prompt_budget` names. "
        "Δ recall is paired (the questions both have gold pages for, n) with its 95% bootstrap CI; \"met\" judges "
        "its point estimate, so read it with the CI. \"–\" where a number is missing.",
        "",
        *_table(
            ["planner", "prompt", "planner prompt tok", f"× {ref}'s", "evidence recall", "n",
             f"Δ recall vs {ref} [95% CI]", "plan valid", "EM", "F1", "met"],
            [[m, r["prompt"] or "–", _f(r["planner_prompt_tokens"], 0), _f(r["prompt_fraction"], 2),
              r["evidence_recall"], r["n_paired"], _ci_text(r["recall_diff_ci"]), r["plan_valid_rate"], r["em"],
              r["f1"], r["met"]] for m, r in budget["rows"].items()],
        ),
    ]


def prompt_budget_summary(results: dict) -> list[str]:
    """One terminal line per planner the prompt budget names: its two numbers and whether it is met."""
    budget = results.get("prompt_budget")
    if not budget:
        return []
    return [
        f"prompt budget vs {budget['reference']}: {m:<16} recall {_f(r['evidence_recall'])} vs "
        f"{_f(budget['reference_evidence_recall'])} (paired Δ {_ci_text(r['recall_diff_ci'])}), prompt tokens "
        f"x{_f(r['prompt_fraction'], 2)} of the reference's (met: >= and <= {budget['max_prompt_fraction']:g}): "
        f"{_f(r['met'])}"
        for m, r in budget["rows"].items()
    ]


def _robustness_lines(results: dict) -> list[str]:
    rob = results.get("robustness")
    if not rob:
        return []
    main_rate = results["tool_failure_rate"]
    main_rate = f"{main_rate:g}" if isinstance(main_rate, (int, float)) else "mixed"
    return [
        "## Robustness: tool failures",
        "",
        "Each method again with a share of its tool calls failing (`No evidence found`); the main run is the row "
        f"at its own rate ({main_rate}). "
        "A method's rows cover the same questions (n). Model calls: Planner (re-plans included), Solver and "
        "LLM-tool calls; tool calls: the steps or actions run; failed: the share of them that failed, whether "
        "injected or not (a search that finds nothing fails too). A method with no tool calls was not tested by "
        "the failures.",
        "",
        *_table(
            ["method", "failure rate", "n", "EM [95% CI]", "F1 [95% CI]", "judge acc", "evidence recall [95% CI]",
             "model calls/q", "tool calls/q", "failed"],
            [[r["method"], f"{r['tool_failure_rate']:g}", r["n"], _ci_text(r["em"]), _ci_text(r["f1"]),
              (r["judge"] or {}).get("accuracy"), _ci_text(r["evidence_recall"]), _f(r["llm_calls_mean"], 2),
              _f(r["tool_calls_mean"], 2), _f((r["tool_failures"] or {}).get("rate"), 2)] for r in rob["rows"]],
        ),
        f"![F1 against model calls per question under tool failures]({results['plots']['accuracy_vs_calls']})",
        "",
    ]


def _incomplete_lines(incomplete: dict | None) -> list[str]:
    if not incomplete:
        return []
    missing = incomplete["methods_without_records"]
    return ["", f"**This evaluation is not complete (run status: {incomplete['status'] or 'unknown'}"
                + (f"; no records yet for {', '.join(missing)}" if missing else "")
                + "): a method's n may be below the question count. Rerun `distill eval` to finish it.**"]


def _ratio_text(value: float | None) -> str:
    return "–" if value is None else f"×{value:.2f}"


def _verdict_lines(results: dict) -> list[str]:
    """The answer first: each student against the reference, per measure, in words and numbers."""
    v = results.get("verdict") or {}
    ref, rows = v.get("reference", results["reference"]), (v.get("rows") or {})
    lines = ["## Verdict", ""]
    if not rows:
        return lines + [f"No student row to set against **{ref}**.", ""]
    lines += [f"Each student − **{ref}** on the same questions, with its 95% paired bootstrap CI: *better* or "
              "*worse* only where the CI excludes 0. Tokens and latency are each method's own means and medians "
              "against the reference's. Per question: [report.html](report.html).", ""]
    for m, row in rows.items():
        lines += [headline(m, row, ref), ""]
        lines += _table(["measure", "n", f"Δ ({m} − {ref}) [95% CI]", "reading"],
                        [[label, x["n"], _ci_text(x["diff"]), x["reading"]] for label, x in row["measures"].items()])
        trained = f"trained on {row['train_examples']} examples" if row["train_examples"] is not None else ""
        lines += ["; ".join(p for p in (f"tokens per question {_ratio_text(row['tokens_ratio'])} {ref}'s",
                                        f"latency p50 {_ratio_text(row['latency_p50_ratio'])} {ref}'s", trained) if p)
                  + f" ([questions](report.html#method={m})).", ""]
        for word in ("better", "worse"):
            if keys := row["questions"][word]:
                shown = ", ".join(f"[{k[1]}](report.html#q={quote(k[1])})" for k in keys[:QUESTION_LINKS])
                more = f" and {len(keys) - QUESTION_LINKS} more" if len(keys) > QUESTION_LINKS else ""
                lines += [f"Questions where {m} is {word} (F1, then evidence recall): {shown}{more}.", ""]
        lines += [f"> **Warning:** {w}" for w in row["warnings"]] + ([""] if row["warnings"] else [])
    return lines


def _paired_to_lines(results: dict) -> list[str]:
    """Each row with `compare_to` against that row (an improved student against the SFT student it started
    from), and the improvement rounds' rewards."""
    pairs, improve = results.get("paired_to") or {}, (results.get("provenance") or {}).get("improve") or {}
    if not pairs and not improve:
        return []
    lines = ["## Against the row each improves on", ""]
    for m, p in pairs.items():
        other = p["against"]
        lines += _table(["measure", "n", f"Δ ({m} − {other}) [95% CI]", "reading"],
                        [[label, x["n"], _ci_text(x["diff"]), x["reading"]] for label, x in p["measures"].items()]
                        + [["steps/plan", (p.get("plan_steps") or {}).get("n", 0),
                            _ci_text((p.get("plan_steps") or {}).get("steps"), 2), "–"]])
    for student, info in improve.items():
        lines += [f"Expert iteration of **{student}** (`{info['folder']}`):", ""]
        lines += _table(*_without_empty(
            ["round", "samples", "kept", "mean reward", "mean best reward", "valid plans", "KL", "reward parts"],
            [[r["round"], *(_f(r.get(k)) for k in ("samples", "kept", "mean_reward", "mean_best_reward",
                                                   "valid_plan_rate", "kl")),
              ", ".join(f"{k} {_f(v)}" for k, v in (r.get("reward_parts") or {}).items())] for r in info["rounds"]],
            {"KL": "–", "kept": "–", "mean best reward": "–", "valid plans": "–"}))
    if reward := results["plots"].get("reward"):
        lines += [f"![The planner reward per improvement round]({reward})", ""]
    return lines


def _unknown(value: Any) -> str:
    return "unknown" if value is None or value == "" else f"{value:.4g}" if isinstance(value, float) else str(value)


def _provenance_lines(results: dict) -> list[str]:
    """Where the numbers come from; what the run folder does not say reads "unknown"."""
    p = results.get("provenance") or {}
    teacher, ref, solver = p.get("teacher") or {}, p.get("reference") or {}, p.get("solver") or {}
    datasets = (p.get("datasets") or {})
    ds = lambda items: ", ".join(f"{d['name']} ({_unknown(d.get('split'))}, n={_unknown(d.get('n'))})"  # noqa: E731
                                 for d in items) if items else "unknown"
    lines = [
        "## Where these numbers come from",
        "",
        f"- distill {_unknown(p.get('distill_version'))}, commit {_unknown(p.get('commit'))}; config "
        f"{_unknown(p.get('config_file'))}",
        f"- teacher (generation): {_unknown(teacher.get('model'))}, prompt {_unknown(teacher.get('prompt'))}, "
        f"temperature {_unknown(teacher.get('temperature'))}",
        f"- reference planner: {_unknown(ref.get('method'))} ({_unknown(ref.get('model'))}, prompt "
        f"{_unknown(ref.get('prompt'))})",
        f"- Solver: {_unknown(solver.get('model'))} ({_unknown(solver.get('backend'))})",
        f"- datasets: eval {ds(datasets.get('eval'))}; generation {ds(datasets.get('generate'))}",
    ]
    if fingerprints := p.get("fingerprints"):
        lines.append("- stage fingerprints: " + "; ".join(f"{stage} {', '.join(map(str, f.values()))}"
                                                        for stage, f in fingerprints.items()))
    lines.append("")
    students = p.get("students") or {}
    if not students:
        return lines + ["Students: unknown (no pipeline run folder with sft-data/ and train/ around this "
                        "evaluation, and no served adapter folder with distill's record).", ""]
    loss = results["plots"].get("loss")
    return lines + _table(
        ["student", "base model", "LoRA r", "alpha", "steps", "train examples", "validation examples", "prompt",
         "final train loss", "final validation loss"],
        [[n, _unknown(s["base_model"]), _unknown(s["lora_r"]), _unknown(s["lora_alpha"]), _unknown(s["steps"]),
          _unknown(s["train_examples"]), _unknown(s["validation_examples"]), _unknown(s["student_prompt"]),
          _unknown(s["final_train_loss"]), _unknown(s["final_validation_loss"])] for n, s in students.items()]
    ) + ([f"![Training and validation loss per student]({loss})", ""] if loss else [])


def render_markdown(results: dict, intro: str | None = None) -> str:
    """report.md: the tables of results.json and the plots, linked; `intro` (a name in INTROS) opens it."""
    per_method, paired, reference = results["per_method"], results["paired"], results["reference"]
    lines = [
        "# Evaluation report",
        "",
        *([INTROS[intro], ""] if intro else []),
        f"{results['questions']} questions ({', '.join(results['datasets'])}); methods: "
        f"{', '.join(results['methods'])}; reference for the paired tests: **{reference}**; "
        f"tool failure rate: {results['tool_failure_rate']}; {results['bootstrap_samples']} bootstrap samples "
        f"(seed {results['seed']}).",
        "Every number here is recomputed from `records/<method>.jsonl` (`distill.report.recompute`).",
        *_incomplete_lines(results.get("incomplete")),
        "",
        *_verdict_lines(results),
        *_provenance_lines(results),
        "## Accuracy",
        "",
        *_table(
            ["method", "kind", "planner prompt", "n", "EM [95% CI]", "F1 [95% CI]", "evidence recall [95% CI]",
             "judge acc", "plan valid"],
            [[m, pm["kind"], pm["planner_prompt"] or "–", pm["n"], _ci_text(pm["em"]), _ci_text(pm["f1"]),
              _ci_text(pm["evidence_recall"]), (pm["judge"] or {}).get("accuracy"), pm["plan_valid_rate"]]
             for m, pm in per_method.items()],
        ),
        "## The Planner apart from the Solver",
        "",
        "Evidence recall: the mean share of a question's gold supporting pages that the evidence holds; all gold "
        "pages: the share of questions with every one. Over the questions with gold pages (n gold); \"–\" where "
        "there are none (TriviaQA, Direct). Steps per plan count the steps kept (ReWOO); too many steps: the "
        "share of plans cut at `max_plan_steps`; duplicate steps/plan: the mean count of steps repeating an "
        "earlier step's tool and input (case and whitespace aside), Worker calls and Solver tokens spent on "
        "nothing new.",
        "",
        *_table(
            ["method", "kind", "planner prompt", "n gold", "evidence recall [95% CI]", "all gold pages [95% CI]",
             "plan valid", "steps/plan", "p50", "max", "too many steps", "duplicate steps/plan", "planner prompt tok"],
            [[m, pm["kind"], pm["planner_prompt"] or "–", pm["n_evidence"], _ci_text(pm["evidence_recall"]),
              _ci_text(pm["evidence_all"]), pm["plan_valid_rate"], _f(steps.get("mean"), 2), _f(steps.get("p50"), 1),
              _f(steps.get("max"), 0), pm["too_many_steps_rate"], _f(pm.get("duplicate_steps_mean"), 2),
              _f(pm["planner_prompt_tokens_mean"], 0)]
             for m, pm in per_method.items() for steps in [pm["plan_steps"] or {}]],
        ),
        f"Paired against {reference} (method − reference, same questions):",
        "",
        *_table(
            ["method", "n gold", "Δrecall [95% CI]", "p", "Δall gold pages [95% CI]", "p", "Δsteps/plan [95% CI]"],
            [[m, ev["n"] if ev else 0, _ci_text(ev and ev["recall"]), ev and ev["recall"]["p_value"],
              _ci_text(ev and ev["all"]), ev and ev["all"]["p_value"], _ci_text(steps and steps["steps"], 2)]
             for m, p in paired.items() for ev, steps in [(p.get("evidence"), p.get("plan_steps"))]],
        ),
        *_answers_lines(per_method),
        "## Cost and efficiency (means per question)",
        "",
        *_table(*_without_empty(
            ["method", "steps", "tool calls", "LLM calls", "planner tok", "solver tok", "tool tok", "total tok",
             "$ / question", "$ / correct (EM)", "latency p50 s", "latency p95 s", "tool failures"],
            [[m, _f(pm["steps_mean"], 2), _f(pm["tool_calls_mean"], 2), _f(pm["llm_calls_mean"], 2),
              *(_f(pm["tokens_mean"][k], 0) for k in ("planner", "solver", "tools", "total")),
              _money(pm["cost_per_question_usd"]), _money(pm["cost_per_correct_usd"]),
              _f(pm["latency_s"]["p50"], 2), _f(pm["latency_s"]["p95"], 2),
              _f((pm["tool_failures"] or {}).get("rate"), 2)]
             for m, pm in per_method.items()],
            {"tool tok": "0", "$ / question": _money(0.0), "$ / correct (EM)": _money(0.0)},
        )),
        *(["Costs are $0 for every method (local models, no prices set): their columns are left out.", ""]
          if all(not pm["cost_per_question_usd"] for pm in per_method.values()) else []),
        f"## Paired difference against {reference} (method − reference, same questions)",
        "",
        *_table(
            ["method", "n", "ΔEM [95% CI]", "p", "ΔF1 [95% CI]", "p"],
            [[m, p["n"], _ci_text(p["em"]), p["em"]["p_value"], _ci_text(p["f1"]), p["f1"]["p_value"]]
             if "em" in p else [m, 0, None, None, None, None] for m, p in paired.items()],
        ),
        "## Tokens per question by hops taken",
        "",
        "Hops: plan steps for ReWOO, tool actions for ReAct, 0 for Direct. Cells: mean total tokens (questions).",
        "",
        *_hops_table(results, "tokens_by_hops"),
        "## Tokens per question by gold hops",
        "",
        *_hops_table(results, "tokens_by_gold_hops"),
        "## Planner prompt size (ReWOO)",
        "",
        *_table(
            ["method", "prompt", "planner model", "planner prompt tokens (mean)", "planner tokens (mean)"],
            [[m, pm["planner_prompt"] or "–", str(pm["planner_model"]), _f(pm["planner_prompt_tokens_mean"], 0),
              _f(pm["tokens_mean"]["planner"], 0)] for m, pm in per_method.items() if pm["kind"] == "rewoo"],
        ),
        *_prompt_budget_lines(results.get("prompt_budget")),
        "## By dataset",
        "",
        *_table(
            ["method", "dataset", "n", "EM", "F1", "n gold", "evidence recall", "all gold pages"],
            [[m, ds, v["n"], v["em"], v["f1"], v["n_evidence"], v["evidence_recall"], v["evidence_all"]]
             for m, pm in per_method.items() for ds, v in pm["by_dataset"].items()],
        ),
        *_paired_to_lines(results),
        *_robustness_lines(results),
        "## Plots",
        "",
    ]
    lines += [f"![{caption}]({results['plots'][key]})\n" for key, caption in PLOT_CAPTIONS.items()]
    return "\n".join(lines)


def improved_training(student: Mapping[str, Any] | None, improve: Mapping[str, Any] | None) -> dict:
    """What an improved row was trained on: its student's SFT examples plus the plans each expert-iteration round
    kept (a GRPO run keeps none: its count is the SFT one)."""
    info = dict(student or {})
    kept = [r.get("kept") for r in (improve or {}).get("rounds", [])]
    if info.get("train_examples") is not None and kept and all(isinstance(k, int) for k in kept):
        info["train_examples"] += sum(kept)
    return info


def write_report(eval_dir: str | Path, out_dir: str | Path | None = None, intro: str | None = None) -> dict:
    """Recompute results from `<eval_dir>`'s records; write results.json, report.md, the plots and report.html
    (report.md's text, then the per-question viewer) to `out_dir` (default: `eval_dir`), both opening with
    `intro` (a name in INTROS) when given. Returns the results; the intro is not one of them, so `recompute` still
    equals them."""
    out = Path(out_dir if out_dir is not None else eval_dir)
    if intro is not None:
        validate(ReportConfig, {"intro": intro}, "report")
    results, by_method = _load(eval_dir)
    markdown = render_markdown(results, intro)
    with replace_files(out) as tmp:  # all files or none: a failure keeps the last report as it was
        make_plots(results, by_method, tmp)
        write_json(tmp / layout.RESULTS, results)
        (tmp / layout.REPORT_MD).write_text(markdown, encoding="utf-8")
        write_viewer(tmp / VIEWER, results, by_method, question_scores, markdown,  # the same text, as HTML
                     INTROS[intro] if intro else None)
    return results


def summary_lines(results: dict) -> list[str]:
    """One line per method: the headline numbers, so a terminal run shows the outcome at a glance."""
    lines = []
    for name, pm in results["per_method"].items():
        em = pm["em"]["mean"] if pm["em"] else float("nan")
        f1 = pm["f1"]["mean"] if pm["f1"] else float("nan")
        recall = _f(_ci_mean(pm["evidence_recall"]))
        lines.append(
            f"{name:<16} {pm['kind']:<7} n={pm['n']:<5} EM {em:.3f}  F1 {f1:.3f}  recall {recall:<5}  "
            f"tokens/q {pm['tokens_mean']['total']:.0f}  LLM calls/q {pm['llm_calls_mean']:.2f}  "
            f"${pm['cost_per_question_usd']:.5f}/q  p50 {pm['latency_s']['p50']:.2f}s"
        )
    return lines


# ------------------------------------------------------------------------------------------ in the pipeline

def _unit(p) -> stage.Unit:
    records = layout.records_dir(layout.stage_dir(p.run, layout.EVAL))
    return stage.Unit(layout.REPORT, layout.stage_dir(p.run, layout.REPORT), dict(p.cfg.report),
                      {layout.in_run(p.run, records): content_digest(records)})


def _work(p) -> dict:
    """The report from the evaluation's records, at the run folder's root, with the stage timings: written
    first, since they are also the order of the stages the report's provenance lists."""
    timings = {s.name: stage.read_marker(layout.marker(layout.stage_dir(p.run, s.name))).seconds
               for s in p.stages()[:-1]}
    write_json(layout.pipeline_info(p.run), {"stage_seconds": timings, "config_file": p.config_path})
    results = p.entry("report")(layout.stage_dir(p.run, layout.EVAL), p.run, **p.cfg.report)
    print("\n".join(summary_lines(results) + prompt_budget_summary(results)))
    return {"stage_seconds": timings}


def _nothing(*_: Any) -> None:
    return None


STAGE = stage.Stage(layout.REPORT, ReportConfig, resolve=_nothing, show=_nothing, unit=_unit, work=_work,
                    after=(layout.EVAL,))


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("eval_dir", metavar="EVAL_DIR", help="an evaluation's output_dir (holds records/), or a "
                        "flywheel's (holds round_<r>/ and promotions.jsonl: its rounds side by side)")
    parser.add_argument("--out", help="folder for report.md, results.json, report.html and the plots "
                        "(default: EVAL_DIR)")
    parser.add_argument("--intro", choices=list(INTROS),
                        help="open the report with what the run is and is not (a pipeline's `report: {intro: ...}`)")


def main(args: argparse.Namespace) -> int:
    if flywheel_report.is_flywheel_dir(args.eval_dir):  # a flywheel's rounds: no records to recompute
        if args.intro is not None:
            raise DistillError("--intro opens an evaluation's report; a flywheel folder's report has none")
        return flywheel_report.main(args.eval_dir, args.out)
    results = write_report(args.eval_dir, args.out, args.intro)
    out = Path(args.out or args.eval_dir)
    print("\n".join(summary_lines(results) + prompt_budget_summary(results)))
    print(f"viewer: {out / VIEWER}")
    print(f"report: {out / layout.REPORT_MD}")
    print(f"results: {out / layout.RESULTS}")
    return 0


if __name__ == "__main__":  # `python -m distill.report` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
