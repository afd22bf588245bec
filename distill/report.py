"""The evaluation report, recomputed from the per-example records and nothing else.

This is the report stage (`distill report EVAL_DIR [--out DIR]`, and the pipeline's `report`): evaluation
only writes records, so a report can be rebuilt, or written elsewhere, without any model.
`recompute(eval_dir)` reads `<eval_dir>/records/*.jsonl`, rescoring every prediction with
`distill.metrics.score`, and returns the dict written to `results.json`; `write_report` also renders
`report.md` and the plots. Only bookkeeping comes from `manifest.json` (method order, which method is the
reference, which questions the run covers, the bootstrap settings), so anyone can delete results.json and
get the same numbers back from the records, and a test checks that they do.

The Planner is also measured apart from the Solver, whose answers a small model gets wrong whatever the
plan: evidence recall (the share of a question's gold supporting pages the evidence holds, and whether it
holds all of them), recomputed from each record's gold pages and evidence as EM/F1 are from its prediction;
steps per plan and the share of plans cut at `max_plan_steps`. A method or dataset without gold pages
(TriviaQA, Direct) has no recall, shown "–", never 0, because a missing measurement is not a miss.

What "hops" means per method: the number of plan steps for a ReWOO planner, the number of tool actions for
ReAct, and 0 for Direct. Gold hops come from the dataset (HotpotQA: 2; TriviaQA: unknown). Grouping tokens
by hops is what shows ReAct's cost growing with each hop (every turn resends the history) while ReWOO's
stays flat (the planner sees the question once).

Robustness: the runs of eval's `robustness:` sweep (records with `robustness_of`) are not methods of the
main tables; they form their own table, each swept method at each tool failure rate with its main run as
one more rate, all over the same questions, and `accuracy_vs_calls.png`.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from distill.baselines import FINISH
from distill.errors import DistillError

RESULTS_VERSION = 1
# The compact student's goal (issue 14): at least the few-shot teacher's evidence recall at a fifth or less of its
# planner prompt tokens.
PROMPT_GOAL_FRACTION = 0.2
RECORDS_DIR = "records"
PLOTS = {
    "accuracy_vs_tokens": "accuracy_vs_tokens.png",
    "tokens_by_hops": "tokens_by_hops.png",
    "latency": "latency.png",
    "recall_vs_prompt": "recall_vs_prompt.png",
}


# ------------------------------------------------------------------------------------------- reading


def load_records(output_dir: str | Path) -> dict[str, list[dict]]:
    """Records grouped by their `method` field, in file order, the first per key kept (as the run's own store
    keeps it), so a question answered twice is counted once; the file name is not trusted."""
    from distill.evaluate import record_key
    from distill.store import dedupe, read_jsonl

    folder = Path(output_dir) / RECORDS_DIR
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        raise DistillError(f"no per-example records under {folder}; run `distill eval` first")
    records, duplicates = dedupe((rec for path in files for rec in read_jsonl(path)), record_key, str(folder))
    if duplicates:
        print(f"note: {folder} holds {duplicates} duplicate record(s); the first of each is used")
    by_method: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        by_method[rec["method"]].append(rec)
    return dict(by_method)


def read_manifest(output_dir: str | Path) -> dict:
    path = Path(output_dir) / "manifest.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def hops_of(rec: dict) -> int:
    kind = rec["kind"]
    if kind == "rewoo":
        return len((rec.get("plan") or {}).get("steps") or [])
    if kind == "react":
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
    from distill.metrics import score

    if not rec.get("answers"):
        return None
    return dict(score(rec["dataset"], rec.get("prediction"), rec["answers"]))


def recall_of(rec: dict) -> dict | None:
    """{recall, all} recomputed from the record's gold pages and evidence, so a stale stored value never
    leaks into the report; None without gold pages (TriviaQA, or a method that records none)."""
    from distill.metrics import evidence_recall

    gold = (rec.get("evidence_recall") or {}).get("gold")
    if not gold:
        return None
    found = evidence_recall(gold, rec.get("evidence") or [])
    return {"recall": float(found["recall"]), "all": float(found["all"])}


def plan_steps_of(rec: dict) -> dict | None:
    """Steps of a ReWOO plan (those kept: a plan over `max_plan_steps` is cut there); None for other kinds."""
    if rec["kind"] != "rewoo":
        return None
    return {"steps": float(len((rec.get("plan") or {}).get("steps") or []))}


def too_many_steps(rec: dict) -> bool:
    return any(e.get("code") == "too_many_steps" for e in (rec.get("plan") or {}).get("errors") or [])


# ------------------------------------------------------------------------------------------- numbers


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return float(np.mean(values)) if values else None


def _ci(values: list[float], samples: int, seed: int) -> dict | None:
    from distill.metrics import bootstrap_ci

    if not values:
        return None
    mean, lo, hi = bootstrap_ci(values, n=samples, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi}


def _judge(records: list[dict]) -> dict | None:
    verdicts = [(r.get("scores") or {}).get("judge", "absent") for r in records]
    present = [v for v in verdicts if v != "absent"]
    if not present:
        return None
    parsed = [v for v in present if v is not None]
    return {
        "accuracy": _mean(float(v) for v in parsed),
        "n_judged": len(parsed),
        "unparsed": len(present) - len(parsed),
    }


def _latency(records: list[dict]) -> dict:
    walls = [float(r.get("wall_s", 0.0)) for r in records]
    p50, p95 = np.percentile(walls, [50, 95])
    return {"p50": float(p50), "p95": float(p95), "mean": float(np.mean(walls))}


def _tool_failures(records: list[dict]) -> dict | None:
    evidence = [e for r in records for e in r.get("evidence") or []]
    if not evidence:
        return None
    failed = [e for e in evidence if e.get("status") != "ok"]
    injected = [e for e in failed if str(e.get("error") or "").startswith("InjectedToolFailure")]
    return {
        "rate": len(failed) / len(evidence), "failed": len(failed), "injected": len(injected), "calls": len(evidence)
    }


def _by_dataset(records: list[dict], scores: list[dict | None], recalls: list[dict | None]) -> dict:
    groups: dict[str, tuple[list[dict], list[dict]]] = defaultdict(lambda: ([], []))
    for rec, sc, rc in zip(records, scores, recalls):
        scored, recalled = groups[rec["dataset"]]
        if sc is not None:
            scored.append(sc)
        if rc is not None:
            recalled.append(rc)
    return {
        name: {
            "n": len(s), "em": _mean(x["em"] for x in s), "f1": _mean(x["f1"] for x in s),
            "n_evidence": len(r), "evidence_recall": _mean(x["recall"] for x in r),
            "evidence_all": _mean(x["all"] for x in r),
        }
        for name, (s, r) in sorted(groups.items())
        if s or r
    }


def _plan_steps(records: list[dict]) -> dict | None:
    counts = [p["steps"] for p in map(plan_steps_of, records) if p is not None]
    if not counts:
        return None
    return {"mean": float(np.mean(counts)), "p50": float(np.percentile(counts, 50)), "max": float(max(counts))}


def method_metrics(records: list[dict], samples: int = 1000, seed: int = 0) -> dict:
    """Every per-method number of the report, from that method's records."""
    if not records:
        raise DistillError("method_metrics needs at least one record")
    kind = records[0]["kind"]
    scores = [rescore(r) for r in records]
    scored = [s for s in scores if s is not None]
    recalls = [recall_of(r) for r in records]
    recalled = [x for x in recalls if x is not None]
    em = [float(s["em"]) for s in scored]
    f1 = [float(s["f1"]) for s in scored]
    costs = [float(r.get("cost_usd", 0.0)) for r in records]
    correct = sum(em)
    tokens = {k: _mean(r["tokens"][k] for r in records) for k in ("planner", "solver", "tools", "total")}
    planner_prompt = None
    if kind == "rewoo":
        planner_prompt = _mean(r["planner"]["usage"]["prompt_tokens"] for r in records)
    react = [r.get("react") or {} for r in records] if kind == "react" else []
    return {
        "kind": kind,
        "planner_prompt": records[0].get("planner_prompt"),
        "planner_model": (records[0].get("planner") or {}).get("model"),
        "solver_model": (records[0].get("solver") or {}).get("model"),
        "n": len(records),
        "n_scored": len(scored),
        "em": _ci(em, samples, seed),
        "f1": _ci(f1, samples, seed),
        "judge": _judge(records),
        "n_evidence": len(recalled),
        "evidence_recall": _ci([x["recall"] for x in recalled], samples, seed),
        "evidence_all": _ci([x["all"] for x in recalled], samples, seed),
        "plan_valid_rate": _mean(float(bool(r["plan"]["valid"])) for r in records) if kind == "rewoo" else None,
        "plan_steps": _plan_steps(records),
        "too_many_steps_rate": _mean(float(too_many_steps(r)) for r in records) if kind == "rewoo" else None,
        "steps_mean": _mean(steps_of(r) for r in records),
        "hops_mean": _mean(hops_of(r) for r in records),
        "tool_calls_mean": _mean(len(r.get("evidence") or []) for r in records),
        "llm_calls_mean": _mean(r["llm_calls"] for r in records),
        "tokens_mean": tokens,
        "planner_prompt_tokens_mean": planner_prompt,
        "cost_per_question_usd": _mean(costs),
        "cost_per_correct_usd": sum(costs) / correct if correct else None,
        "latency_s": _latency(records),
        "tool_failures": _tool_failures(records),
        "react_finished_rate": _mean(float(bool(x.get("finished"))) for x in react) if react else None,
        "by_dataset": _by_dataset(records, scores, recalls),
    }


def _key(rec: dict) -> tuple[str, str]:
    return (rec["dataset"], rec["id"])


def _paired_on(
    records: list[dict], reference: list[dict], measure: Any, metrics: tuple[str, ...], samples: int, seed: int
) -> dict | None:
    """method - reference in each of `measure(rec)`'s `metrics`, over the questions both have it for (sorted,
    so the pairing is fixed); None when they share none."""
    from distill.metrics import paired_bootstrap

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


def paired_vs_reference(
    records: list[dict], reference: list[dict], samples: int = 1000, seed: int = 0
) -> dict | None:
    """method - reference: EM and F1 (`n`, `em`, `f1`) over the questions both answered; evidence recall and
    the all-gold-pages rate (`evidence`) over those both have gold pages for; steps per plan (`plan_steps`)
    when both are ReWOO planners. None when they share no question with any of these."""
    out: dict[str, Any] = _paired_on(records, reference, rescore, ("em", "f1"), samples, seed) or {}
    evidence = _paired_on(records, reference, recall_of, ("recall", "all"), samples, seed)
    if evidence:
        out["evidence"] = evidence
    steps = _paired_on(records, reference, plan_steps_of, ("steps",), samples, seed)
    if steps:
        out["plan_steps"] = steps
    return out or None


def tokens_by(records: list[dict], hops: Any) -> dict[str, dict]:
    """Mean tokens per question (and n, EM) grouped by `hops(rec)`; None groups are left out.
    Keys are strings in numeric order, so the dict survives a JSON round trip unchanged."""
    groups: dict[int, list[dict]] = defaultdict(list)
    for rec in records:
        h = hops(rec)
        if h is not None:
            groups[int(h)].append(rec)
    out = {}
    for h in sorted(groups):
        recs = groups[h]
        scores = [s for s in (rescore(r) for r in recs) if s is not None]
        out[str(h)] = {
            "n": len(recs),
            "tokens_mean": _mean(r["tokens"]["total"] for r in recs),
            "llm_calls_mean": _mean(r["llm_calls"] for r in recs),
            "em": _mean(s["em"] for s in scores),
        }
    return out


def _ci_mean(ci: dict | None) -> float | None:
    return ci["mean"] if ci else None


def goal_teacher(per_method: dict[str, dict], methods: list[str], reference: str) -> str | None:
    """The row the prompt goal is measured against: the first few-shot ReWOO planner, else the reference."""
    fewshot = [m for m in methods if per_method[m]["kind"] == "rewoo" and per_method[m]["planner_prompt"] == "fewshot"]
    teacher = fewshot[0] if fewshot else reference
    return teacher if per_method[teacher]["kind"] == "rewoo" else None


def prompt_goal(per_method: dict[str, dict], methods: list[str], reference: str) -> dict | None:
    """Every zero-shot (student-style) ReWOO planner against the teacher's evidence recall and planner prompt
    tokens: the compact prompt earns its place only if it keeps the recall at a fraction of the prompt. None
    without a ReWOO teacher row or another ReWOO row to set against it. `goal_met` is None where a number is
    missing (no gold pages, no prompt tokens), never False: a missing measurement is not a miss."""
    teacher = goal_teacher(per_method, methods, reference)
    if teacher is None:
        return None
    t_recall = _ci_mean(per_method[teacher]["evidence_recall"])
    t_tokens = per_method[teacher]["planner_prompt_tokens_mean"]
    rows = {}
    for m in methods:
        pm = per_method[m]
        if m == teacher or pm["kind"] != "rewoo" or pm["planner_prompt"] == "fewshot":
            continue
        recall, tokens = _ci_mean(pm["evidence_recall"]), pm["planner_prompt_tokens_mean"]
        fraction = tokens / t_tokens if tokens is not None and t_tokens else None
        diff = recall - t_recall if recall is not None and t_recall is not None else None
        met = None
        if diff is not None and fraction is not None:
            met = bool(round(diff, 9) >= 0 and fraction <= PROMPT_GOAL_FRACTION)
        rows[m] = {
            "prompt": pm["planner_prompt"], "planner_prompt_tokens": tokens, "prompt_fraction": fraction,
            "evidence_recall": recall, "recall_diff": diff, "plan_valid_rate": pm["plan_valid_rate"],
            "em": _ci_mean(pm["em"]), "f1": _ci_mean(pm["f1"]), "goal_met": met,
        }
    if not rows:
        return None
    return {"teacher": teacher, "teacher_evidence_recall": t_recall, "teacher_planner_prompt_tokens": t_tokens,
            "max_prompt_fraction": PROMPT_GOAL_FRACTION, "rows": rows}


def _rounded(value: Any, digits: int = 6) -> Any:
    """Round floats for readability; NaN/inf become None so results.json stays valid JSON."""
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v, digits) for v in value]
    return value


def _select(by_method: dict[str, list[dict]], manifest: dict) -> tuple[list[str], dict[str, list[dict]]]:
    """Methods in manifest order (others after, alphabetically), restricted to the manifest's questions."""
    order = [m["name"] for m in manifest.get("methods", []) if m["name"] in by_method]
    order += sorted(m for m in by_method if m not in order)
    wanted = {tuple(k) for k in manifest.get("examples", [])}
    selected = {}
    for name in order:
        recs = by_method[name]
        if wanted:
            recs = [r for r in recs if _key(r) in wanted]
        if recs:
            selected[name] = recs
    if not selected:
        raise DistillError("no records match the questions listed in manifest.json")
    return [m for m in order if m in selected], selected


def compute(
    by_method: dict[str, list[dict]], *, methods: list[str] | None = None, reference: str | None = None,
    samples: int = 1000, seed: int = 0,
) -> dict:
    """The results dict from records grouped by method (the pure core of `recompute`)."""
    sweep = {m: recs for m, recs in by_method.items() if recs and recs[0].get("robustness_of")}
    by_method = {m: recs for m, recs in by_method.items() if m not in sweep}
    if not by_method:
        raise DistillError("only robustness-sweep records: the main run's records are missing")
    methods = [m for m in methods or sorted(by_method) if m in by_method]
    reference = reference if reference in by_method else methods[0]
    per_method = {m: method_metrics(by_method[m], samples, seed) for m in methods}
    paired = {
        m: {"reference": reference, **(paired_vs_reference(by_method[m], by_method[reference], samples, seed) or {})}
        for m in methods
        if m != reference
    }
    rates = sorted({float(r.get("tool_failure_rate", 0.0)) for recs in by_method.values() for r in recs})
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
        "prompt_goal": prompt_goal(per_method, methods, reference),
        "tokens_by_hops": {m: tokens_by(by_method[m], hops_of) for m in methods},
        "tokens_by_gold_hops": {m: tokens_by(by_method[m], lambda r: r.get("gold_hops")) for m in methods},
        "plots": dict(PLOTS),
    }
    if sweep:
        results["robustness"] = robustness(by_method, sweep, samples, seed)
        results["plots"]["accuracy_vs_calls"] = ROBUSTNESS_PLOT
    return _rounded(results)


# ---------------------------------------------------------------------------------------- robustness

ROBUSTNESS_PLOT = "accuracy_vs_calls.png"
ROBUSTNESS_FIELDS = ("n", "em", "f1", "judge", "n_evidence", "evidence_recall", "llm_calls_mean",
                     "tool_calls_mean", "tool_failures")


def robustness(
    main: dict[str, list[dict]], sweep: dict[str, list[dict]], samples: int = 1000, seed: int = 0
) -> dict:
    """One row per swept method and tool failure rate, its main run being one more rate, in order of rate.

    A method's rows are restricted to the questions all of them answered: a sweep on the first n questions
    (or one cut short) must not be set against a main run over more, easier or harder, questions."""
    bases = list(dict.fromkeys(recs[0]["robustness_of"] for recs in sweep.values()))
    rows = []
    for base in bases:
        runs = {m: recs for m, recs in sweep.items() if recs[0]["robustness_of"] == base}
        if base in main:
            runs = {base: main[base], **runs}
        common = set.intersection(*({_key(r) for r in recs} for recs in runs.values()))
        mine = []
        for name, recs in runs.items():
            kept = [r for r in recs if _key(r) in common]
            if not kept:
                continue
            metrics = method_metrics(kept, samples, seed)
            mine.append({"method": base, "run": name, "tool_failure_rate": float(kept[0].get("tool_failure_rate", 0.0)),
                         **{k: metrics[k] for k in ROBUSTNESS_FIELDS}})
        rows += sorted(mine, key=lambda row: row["tool_failure_rate"])
    return {"methods": bases, "rows": rows}


def _plot_robustness(plt, results: dict, path: Path) -> None:
    """Accuracy against model calls, one line per method through its failure rates (each point labelled)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for base in results["robustness"]["methods"]:
        points = [(r["llm_calls_mean"], r["f1"]["mean"], r["tool_failure_rate"])
                  for r in results["robustness"]["rows"] if r["method"] == base and r["f1"] is not None]
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=base)
        for x, y, rate in points:
            ax.annotate(f"{rate:g}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("model calls per question (mean)")
    ax.set_ylabel("accuracy: F1 (mean)")
    ax.set_title("Accuracy against model calls under tool failures\n(point labels: tool failure rate)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _robustness_block(results: dict) -> list[str]:
    rob = results.get("robustness")
    if not rob:
        return []
    rows = [
        [r["method"], f"{r['tool_failure_rate']:g}", str(r["n"]), _ci_text(r["em"]), _ci_text(r["f1"]),
         _f((r["judge"] or {}).get("accuracy")), _ci_text(r["evidence_recall"]), _f(r["llm_calls_mean"], 2),
         _f(r["tool_calls_mean"], 2), _f((r["tool_failures"] or {}).get("rate"), 2)]
        for r in rob["rows"]
    ]
    return [
        "## Robustness: tool failures",
        "",
        "Each method again with a share of its tool calls failing (`No evidence found`); rate 0 is the main "
        "run. A method's rows cover the same questions (n). Model calls: Planner (re-plans included), Solver "
        "and LLM-tool calls; tool calls: the steps or actions run; failed: the share of them that failed.",
        "",
        *_table(
            ["method", "failure rate", "n", "EM [95% CI]", "F1 [95% CI]", "judge acc", "evidence recall [95% CI]",
             "model calls/q", "tool calls/q", "failed"],
            rows,
        ),
        "",
        f"![F1 against model calls per question under tool failures]({results['plots']['accuracy_vs_calls']})",
        "",
    ]


def _load(output_dir: str | Path) -> tuple[dict, list[str], dict[str, list[dict]]]:
    manifest = read_manifest(output_dir)
    by_method = load_records(output_dir)
    for name, records in by_method.items():
        missing = sorted({k for r in records for k in ("kind", "dataset", "id") if k not in r})
        if missing:  # e.g. generation's trajectories: no `kind`, so no way to tell how to count hops
            raise DistillError(f"records of {name} lack {', '.join(missing)}: not evaluation records")
    methods, by_method = _select(by_method, manifest)
    return manifest, methods, by_method


def _compute_from(manifest: dict, methods: list[str], by_method: dict[str, list[dict]]) -> dict:
    return compute(
        by_method,
        methods=methods,
        reference=manifest.get("reference"),
        samples=int(manifest.get("bootstrap_samples", 1000)),
        seed=int(manifest.get("seed", 0)),
    )


def recompute(output_dir: str | Path) -> dict:
    """results.json, rebuilt from `<output_dir>/records/*.jsonl` (and the manifest's bookkeeping)."""
    return _compute_from(*_load(output_dir))


# --------------------------------------------------------------------------------------------- plots


def make_plots(results: dict, by_method: dict[str, list[dict]], output_dir: str | Path) -> dict[str, str]:
    """Write the PNGs beside report.md; returns {plot: file name}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    methods = results["methods"]
    _plot_accuracy(plt, results, methods, out / PLOTS["accuracy_vs_tokens"])
    _plot_hops(plt, results, methods, out / PLOTS["tokens_by_hops"])
    _plot_latency(plt, by_method, methods, out / PLOTS["latency"])
    _plot_recall(plt, results, methods, out / PLOTS["recall_vs_prompt"])
    if results.get("robustness"):
        _plot_robustness(plt, results, out / results["plots"]["accuracy_vs_calls"])
    return dict(PLOTS)


def _plot_recall(plt, results: dict, methods: list[str], path: Path) -> None:
    """The Planner's own trade-off: what its evidence holds against what its prompt costs (ReWOO planners)."""
    points = [(m, pm["planner_prompt_tokens_mean"], pm["evidence_recall"])
              for m in methods for pm in [results["per_method"][m]]]
    _plot_ci_points(plt, [p for p in points if p[1] is not None], path, xlabel="planner prompt tokens (mean)",
                    ylabel="evidence recall (95% bootstrap CI)", title="Evidence recall against planner prompt size")


def _plot_accuracy(plt, results: dict, methods: list[str], path: Path) -> None:
    points = [(m, pm["tokens_mean"]["total"] or 0.0, pm["f1"]) for m in methods for pm in [results["per_method"][m]]]
    _plot_ci_points(plt, points, path, xlabel="tokens per question (mean)", ylabel="F1 (95% bootstrap CI)",
                    title="Accuracy against cost")


def _plot_ci_points(plt, points: list[tuple[str, float, dict | None]], path: Path, *, xlabel: str, ylabel: str,
                    title: str) -> None:
    """One labelled point per method at (x, mean) with its bootstrap CI; methods without the metric are left out."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for m, x, ci in points:
        if ci is None:
            continue
        err = [[ci["mean"] - ci["lo"]], [ci["hi"] - ci["mean"]]]
        ax.errorbar([x], [ci["mean"]], yerr=err, fmt="o", capsize=4, label=m)
        ax.annotate(m, (x, ci["mean"]), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_hops(plt, results: dict, methods: list[str], path: Path) -> None:
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (
        ("tokens_by_hops", "hops taken (plan steps; ReAct tool actions)"),
        ("tokens_by_gold_hops", "gold hops (from the dataset)"),
    )
    for ax, (key, label) in zip(axes, panels):
        for m in methods:
            groups = results[key][m]
            if not groups:
                continue
            xs = [int(h) for h in groups]
            ax.plot(xs, [groups[h]["tokens_mean"] for h in groups], marker="o", label=m)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(label)
        ax.set_ylabel("tokens per question (mean)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("Tokens per question by number of hops")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_latency(plt, by_method: dict[str, list[dict]], methods: list[str], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(methods) + 2), 4.2))
    data = [[float(r.get("wall_s", 0.0)) for r in by_method[m]] for m in methods]
    ax.boxplot(data, showmeans=True)
    ax.set_xticks(range(1, len(methods) + 1), methods, rotation=20)
    ax.set_ylabel("seconds per question (wall)")
    ax.set_title("Latency")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ markdown


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ci_text(ci: dict | None, digits: int = 3) -> str:
    if ci is None:
        return "–"
    return f"{ci['mean']:.{digits}f} [{ci['lo']:.{digits}f}, {ci['hi']:.{digits}f}]"


def _money(value: float | None) -> str:
    return "–" if value is None else f"${value:.5f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _accuracy_rows(results: dict) -> list[list[str]]:
    rows = []
    for m in results["methods"]:
        pm = results["per_method"][m]
        judge = pm["judge"]
        rows.append([
            m, pm["kind"], pm["planner_prompt"] or "–", str(pm["n"]), _ci_text(pm["em"]), _ci_text(pm["f1"]),
            _ci_text(pm["evidence_recall"]), _f(judge["accuracy"]) if judge else "–", _f(pm["plan_valid_rate"]),
        ])
    return rows


def _cost_rows(results: dict) -> list[list[str]]:
    rows = []
    for m in results["methods"]:
        pm = results["per_method"][m]
        tok = pm["tokens_mean"]
        rows.append([
            m, _f(pm["steps_mean"], 2), _f(pm["tool_calls_mean"], 2), _f(pm["llm_calls_mean"], 2),
            _f(tok["planner"], 0), _f(tok["solver"], 0), _f(tok["tools"], 0), _f(tok["total"], 0),
            _money(pm["cost_per_question_usd"]), _money(pm["cost_per_correct_usd"]),
            _f(pm["latency_s"]["p50"], 2), _f(pm["latency_s"]["p95"], 2),
            _f((pm["tool_failures"] or {}).get("rate"), 2),
        ])
    return rows


def _diff_text(d: dict | None, digits: int = 3) -> str:
    if d is None:
        return "–"
    return f"{d['diff']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]"


def _paired_rows(results: dict) -> list[list[str]]:
    rows = []
    for m, p in results["paired"].items():
        if "em" not in p:
            rows.append([m, "0", "–", "–", "–", "–"])
            continue
        em, f1 = p["em"], p["f1"]
        rows.append([m, str(p["n"]), _diff_text(em), _f(em["p_value"]), _diff_text(f1), _f(f1["p_value"])])
    return rows


def _planner_rows(results: dict) -> list[list[str]]:
    rows = []
    for m in results["methods"]:
        pm = results["per_method"][m]
        steps = pm["plan_steps"] or {}
        rows.append([
            m, pm["kind"], pm["planner_prompt"] or "–", str(pm["n_evidence"]), _ci_text(pm["evidence_recall"]),
            _ci_text(pm["evidence_all"]), _f(pm["plan_valid_rate"]), _f(steps.get("mean"), 2),
            _f(steps.get("p50"), 1), _f(steps.get("max"), 0), _f(pm["too_many_steps_rate"]),
            _f(pm["planner_prompt_tokens_mean"], 0),
        ])
    return rows


def _paired_planner_rows(results: dict) -> list[list[str]]:
    rows = []
    for m, p in results["paired"].items():
        ev, steps = p.get("evidence"), p.get("plan_steps")
        rows.append([
            m, str(ev["n"]) if ev else "0",
            _diff_text(ev and ev["recall"]), _f(ev and ev["recall"]["p_value"]),
            _diff_text(ev and ev["all"]), _f(ev and ev["all"]["p_value"]),
            _diff_text(steps and steps["steps"], 2),
        ])
    return rows


def _hops_table(results: dict, key: str) -> list[str]:
    columns = sorted({int(h) for groups in results[key].values() for h in groups})
    if not columns:
        return ["(no question has this information)"]
    rows = []
    for m in results["methods"]:
        groups = results[key][m]
        rows.append([m] + [
            f"{groups[str(h)]['tokens_mean']:.0f} (n={groups[str(h)]['n']})" if str(h) in groups else "–"
            for h in columns
        ])
    return _table(["method"] + [f"{h} hop" + ("" if h == 1 else "s") for h in columns], rows)


def _goal_text(met: bool | None) -> str:
    return "–" if met is None else ("yes" if met else "no")


def _prompt_goal_lines(goal: dict | None) -> list[str]:
    """The compact-vs-full comparison: each student-style planner's recall and prompt size against the teacher's."""
    if not goal:
        return []
    share = f"{goal['max_prompt_fraction']:g}"
    return [
        "## Compact vs full student: the prompt goal",
        "",
        f"Goal: at least the evidence recall of **{goal['teacher']}** ({_f(goal['teacher_evidence_recall'])}) with at "
        f"most {share} of its planner prompt tokens ({_f(goal['teacher_planner_prompt_tokens'], 0)}). Every ReWOO "
        "planner with a zero-shot prompt (`full` or `compact`) is set against it; \"–\" where a number is missing.",
        "",
        *_table(
            ["planner", "prompt", "planner prompt tok", "× teacher's", "evidence recall", "Δ vs teacher",
             "plan valid", "EM", "F1", "goal met"],
            [
                [m, r["prompt"] or "–", _f(r["planner_prompt_tokens"], 0), _f(r["prompt_fraction"], 2),
                 _f(r["evidence_recall"]), "–" if r["recall_diff"] is None else f"{r['recall_diff']:+.3f}",
                 _f(r["plan_valid_rate"]), _f(r["em"]), _f(r["f1"]), _goal_text(r["goal_met"])]
                for m, r in goal["rows"].items()
            ],
        ),
        "",
    ]


def prompt_goal_summary(results: dict) -> list[str]:
    """One terminal line per student-style planner: the goal's two numbers and whether it is met."""
    goal = results.get("prompt_goal")
    if not goal:
        return []
    return [
        f"prompt goal vs {goal['teacher']}: {m:<16} recall {_f(r['evidence_recall'])} vs "
        f"{_f(goal['teacher_evidence_recall'])}, prompt tokens x{_f(r['prompt_fraction'], 2)} of the teacher's "
        f"(goal: >= and <= {goal['max_prompt_fraction']:g}): {_goal_text(r['goal_met'])}"
        for m, r in goal["rows"].items()
    ]


def render_markdown(results: dict) -> str:
    """report.md: the tables of results.json and the plots, linked."""
    rate = results["tool_failure_rate"]
    lines = [
        "# Evaluation report",
        "",
        f"{results['questions']} questions ({', '.join(results['datasets'])}); methods: "
        f"{', '.join(results['methods'])}; reference for the paired tests: **{results['reference']}**; "
        f"tool failure rate: {rate}; {results['bootstrap_samples']} bootstrap samples (seed {results['seed']}).",
        "Every number here is recomputed from `records/<method>.jsonl` (`distill.report.recompute`).",
        "",
        "## Accuracy",
        "",
        *_table(
            ["method", "kind", "planner prompt", "n", "EM [95% CI]", "F1 [95% CI]", "evidence recall [95% CI]",
             "judge acc", "plan valid"],
            _accuracy_rows(results),
        ),
        "",
        "## The Planner apart from the Solver",
        "",
        "Evidence recall: the mean share of a question's gold supporting pages that the evidence holds; all gold "
        "pages: the share of questions with every one. Over the questions with gold pages (n gold); \"–\" where "
        "there are none (TriviaQA, Direct). Steps per plan count the steps kept (ReWOO); too many steps: the "
        "share of plans cut at `max_plan_steps`.",
        "",
        *_table(
            ["method", "kind", "planner prompt", "n gold", "evidence recall [95% CI]", "all gold pages [95% CI]",
             "plan valid", "steps/plan", "p50", "max", "too many steps", "planner prompt tok"],
            _planner_rows(results),
        ),
        "",
        f"Paired against {results['reference']} (method − reference, same questions):",
        "",
        *_table(
            ["method", "n gold", "Δrecall [95% CI]", "p", "Δall gold pages [95% CI]", "p", "Δsteps/plan [95% CI]"],
            _paired_planner_rows(results),
        ),
        "",
        "## Cost and efficiency (means per question)",
        "",
        *_table(
            ["method", "steps", "tool calls", "LLM calls", "planner tok", "solver tok", "tool tok", "total tok",
             "$ / question", "$ / correct (EM)", "latency p50 s", "latency p95 s", "tool failures"],
            _cost_rows(results),
        ),
        "",
        f"## Paired difference against {results['reference']} (method − reference, same questions)",
        "",
        *_table(["method", "n", "ΔEM [95% CI]", "p", "ΔF1 [95% CI]", "p"], _paired_rows(results)),
        "",
        "## Tokens per question by hops taken",
        "",
        "Hops: plan steps for ReWOO, tool actions for ReAct, 0 for Direct. Cells: mean total tokens (questions).",
        "",
        *_hops_table(results, "tokens_by_hops"),
        "",
        "## Tokens per question by gold hops",
        "",
        *_hops_table(results, "tokens_by_gold_hops"),
        "",
        "## Planner prompt size (ReWOO)",
        "",
        *_table(
            ["method", "prompt", "planner model", "planner prompt tokens (mean)", "planner tokens (mean)"],
            [
                [m, pm["planner_prompt"] or "–", str(pm["planner_model"]), _f(pm["planner_prompt_tokens_mean"], 0),
                 _f(pm["tokens_mean"]["planner"], 0)]
                for m, pm in results["per_method"].items()
                if pm["kind"] == "rewoo"
            ],
        ),
        "",
        *_prompt_goal_lines(results.get("prompt_goal")),
        "## By dataset",
        "",
        *_table(
            ["method", "dataset", "n", "EM", "F1", "n gold", "evidence recall", "all gold pages"],
            [
                [m, ds, str(v["n"]), _f(v["em"]), _f(v["f1"]), str(v["n_evidence"]), _f(v["evidence_recall"]),
                 _f(v["evidence_all"])]
                for m, pm in results["per_method"].items()
                for ds, v in pm["by_dataset"].items()
            ],
        ),
        "",
        *_robustness_block(results),
        "## Plots",
        "",
        f"![F1 against tokens per question]({results['plots']['accuracy_vs_tokens']})",
        "",
        f"![Tokens per question by hops]({results['plots']['tokens_by_hops']})",
        "",
        f"![Latency per question]({results['plots']['latency']})",
        "",
        f"![Evidence recall against planner prompt tokens]({results['plots']['recall_vs_prompt']})",
        "",
    ]
    return "\n".join(lines)


def write_report(eval_dir: str | Path, out_dir: str | Path | None = None) -> dict:
    """Recompute results from `<eval_dir>`'s records; write results.json, report.md and the plots to `out_dir`
    (default: `eval_dir`). Returns the results."""
    from distill.store import write_json

    out = Path(out_dir if out_dir is not None else eval_dir)
    manifest, methods, by_method = _load(eval_dir)
    results = _compute_from(manifest, methods, by_method)
    out.mkdir(parents=True, exist_ok=True)
    make_plots(results, by_method, out)
    write_json(out / "results.json", results)
    (out / "report.md").write_text(render_markdown(results))
    return results


def summary_lines(results: dict) -> list[str]:
    """One line per method: the headline numbers, so a terminal run shows the outcome at a glance."""
    lines = []
    for name in results["methods"]:
        pm = results["per_method"][name]
        em = pm["em"]["mean"] if pm["em"] else float("nan")
        f1 = pm["f1"]["mean"] if pm["f1"] else float("nan")
        recall = _f(pm["evidence_recall"]["mean"]) if pm["evidence_recall"] else "–"
        lines.append(
            f"{name:<16} {pm['kind']:<7} n={pm['n']:<5} EM {em:.3f}  F1 {f1:.3f}  recall {recall:<5}  "
            f"tokens/q {pm['tokens_mean']['total']:.0f}  LLM calls/q {pm['llm_calls_mean']:.2f}  "
            f"${pm['cost_per_question_usd']:.5f}/q  p50 {pm['latency_s']['p50']:.2f}s"
        )
    return lines


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("eval_dir", metavar="EVAL_DIR", help="an evaluation's output_dir (holds records/)")
    parser.add_argument("--out", help="folder for report.md, results.json and the plots (default: EVAL_DIR)")


def main(args: argparse.Namespace) -> int:
    results = write_report(args.eval_dir, args.out)
    out = Path(args.out or args.eval_dir)
    print("\n".join(summary_lines(results)))
    print(f"report: {out / 'report.md'}")
    print(f"results: {out / 'results.json'}")
    return 0
