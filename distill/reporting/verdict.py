"""The report's first answer: is each student better than the reference planner, on what, and at what cost.

Read from the report's own paired tests (`results["paired"]`, the bootstrap of distill.core.metrics), never
recomputed, so the verdict and the tables below it cannot disagree. A measure reads `better` or `worse` only
when its 95% paired CI excludes zero; otherwise `no detectable difference at n=<questions>`, which says how
little a small evaluation can tell rather than claiming the two are equal.
"""

from __future__ import annotations

from typing import Any, Mapping

# (label, key in results["paired"][method] or None for the top level, metric): all higher-is-better
MEASURES = (
    ("evidence recall", "evidence", "recall"),
    ("all gold pages", "evidence", "all"),
    ("plan valid", "plan_valid", "valid"),
    ("EM", None, "em"),
    ("F1", None, "f1"),
    ("judge accuracy", "judge", "accuracy"),  # only where a judge ran (eval's `judge`)
)
OPTIONAL = {"judge"}  # groups a comparison has only where they were measured
# Below this many training examples a LoRA adapter learns the plan format at best: whatever the evaluation
# shows says little about distilling the teacher's planning.
MIN_TRAIN_EXAMPLES = 100


def small_training_set(examples: int) -> str | None:
    """The loud line sft-data and train print below MIN_TRAIN_EXAMPLES (the verdict says the same of the
    result): hours of training on a handful of examples teach the format, not the teacher's planning."""
    if examples >= MIN_TRAIN_EXAMPLES:
        return None
    return (f"only {examples} training example{'s' if examples != 1 else ''} (fewer than {MIN_TRAIN_EXAMPLES}): "
            "the student can learn the plan format at best, and an evaluation will say little about distillation; "
            "generate more questions or samples")


def reading(diff: Mapping[str, float] | None, n: int) -> str | None:
    """`better` / `worse` when the paired CI excludes 0, else no detectable difference at this n; None unmeasured."""
    if diff is None:
        return None
    if diff["lo"] > 0:
        return "better"
    if diff["hi"] < 0:
        return "worse"
    return f"no detectable difference at n={n}"


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


def student_rows(results: Mapping[str, Any], students: Mapping[str, str | None]) -> list[str]:
    """The rows of `results` that are students: those `students` names (row -> trained student), else every
    ReWOO planner row other than the reference (a plain evaluation does not say which rows were trained)."""
    rows = [m for m in results["methods"] if m != results["reference"]]
    if students:
        return [m for m in rows if m in students]
    return [m for m in rows if results["per_method"][m]["kind"] == "rewoo"]


def question_outcomes(mine: Mapping[Any, Mapping[str, float | None]],
                      ref: Mapping[Any, Mapping[str, float | None]]) -> dict[str, list]:
    """The questions (keys both answered, sorted) where a method beats or trails the reference: on F1, and
    where F1 ties or is unmeasured, on evidence recall. `mine`, `ref`: key -> {"f1", "recall"} (None unmeasured)."""
    out: dict[str, list] = {"better": [], "worse": []}
    for key in sorted(mine.keys() & ref.keys()):
        for metric in ("f1", "recall"):
            a, b = mine[key].get(metric), ref[key].get(metric)
            if a is not None and b is not None and a != b:
                out["better" if a > b else "worse"].append(list(key) if isinstance(key, tuple) else key)
                break
    return out


def read_measures(paired: Mapping[str, Any]) -> dict[str, dict]:
    """{measure label: {n, diff, reading}} from one paired comparison (`paired_vs_reference`'s shape)."""
    measures = {}
    for label, group, metric in MEASURES:
        if group in OPTIONAL and group not in paired:
            continue
        source = paired if group is None else paired.get(group) or {}
        diff = source.get(metric) if "n" in source else None
        n = source.get("n", 0)
        measures[label] = {"n": n, "diff": diff, "reading": reading(diff, n)}
    return measures


def verdict(results: Mapping[str, Any], students: Mapping[str, str | None] | None = None,
            training: Mapping[str, Mapping[str, Any]] | None = None,
            outcomes: Mapping[str, Mapping[str, list]] | None = None,
            row_training: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """{reference, rows: {method: ...}}: each student's paired difference and reading per measure, its tokens
    and latency against the reference's, the questions it wins and loses (`outcomes`, from question_outcomes),
    and warnings (too few training examples, or none known). `students`: row -> the trained student it serves;
    `training`: student -> {train_examples, ...}; `row_training`: row -> the same, for a row trained beyond its
    student (an improved student: its SFT examples and the plans its rounds kept)."""
    students, training, outcomes = dict(students or {}), dict(training or {}), dict(outcomes or {})
    row_training = dict(row_training or {})
    reference, per_method = results["reference"], results["per_method"]
    ref = per_method[reference]
    rows = {}
    for m in student_rows(results, students):
        pm = per_method[m]
        measures = read_measures(results["paired"].get(m) or {})
        student = students.get(m)
        examples = (row_training.get(m) or training.get(student) or {}).get("train_examples") if student else None
        warnings = []
        if examples is None:
            warnings.append("training set size unknown (neither the served adapter's record nor an sft-data summary "
                            "beside this evaluation says it)")
        elif examples < MIN_TRAIN_EXAMPLES:
            warnings.append(f"trained on {examples} example{'s' if examples != 1 else ''} (fewer than "
                            f"{MIN_TRAIN_EXAMPLES}): too few for this comparison to say anything about distillation")
        rows[m] = {
            "student": student,
            "train_examples": examples,
            "measures": measures,
            "tokens_ratio": _ratio(pm["tokens_mean"]["total"], ref["tokens_mean"]["total"]),
            "latency_p50_ratio": _ratio(pm["latency_s"]["p50"], ref["latency_s"]["p50"]),
            "questions": outcomes.get(m) or {"better": [], "worse": []},
            "warnings": warnings,
        }
    return {"reference": reference, "min_train_examples": MIN_TRAIN_EXAMPLES, "rows": rows}


def headline(row_name: str, row: Mapping[str, Any], reference: str) -> str:
    """One sentence per student: where it is better, where worse, and what the rest reads."""
    by = {}
    for label, m in row["measures"].items():
        if m["reading"]:
            by.setdefault(m["reading"], []).append(label)
    order = {"better": 0, "worse": 1}
    ranked = sorted(by.items(), key=lambda kv: order.get(kv[0], 2))
    parts = [f"{word} on {', '.join(labels)}" for word, labels in ranked]
    said = "; ".join(parts) if parts else "nothing measured in common"
    return f"**{row_name}** against **{reference}**: {said}."
