"""`distill score`: official EM/F1 for a JSONL of predictions, so numbers from any source are comparable.

    distill score --dataset hotpotqa predictions.jsonl --out scored.jsonl

Each line needs `prediction` (null counts as no answer) and `answers` (a list, or one string).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Iterable

from distill.errors import DistillError


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE.jsonl", help="lines with `prediction` and `answers`")
    parser.add_argument("--dataset", required=True, choices=["hotpotqa", "triviaqa"], help="which official rules")
    parser.add_argument("--out", type=Path, help="write each input line plus `em` and `f1` here")


def score_records(numbered: Iterable[tuple[int, dict[str, Any]]], dataset: str, origin: str) -> list[dict[str, Any]]:
    """Score (line number, record) pairs from `store.iter_jsonl`; the first bad one stops the run with its line."""
    from distill.metrics import score

    records = []
    for number, record in numbered:
        prediction, answers = _fields(record, f"{origin}:{number}")
        result = score(dataset, prediction, answers)
        records.append({**record, "em": int(result["em"]), "f1": float(result["f1"])})
    return records


def _fields(record: dict[str, Any], where: str) -> tuple[str | None, list[str]]:
    for field in ("prediction", "answers"):
        if field not in record:
            raise DistillError(f"{where}: missing field `{field}`")
    prediction, answers = record["prediction"], record["answers"]
    if prediction is not None and not isinstance(prediction, str):
        raise DistillError(f"{where}: `prediction` must be a string or null")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise DistillError(f"{where}: `answers` must be a string or a non-empty list of strings")
    return prediction, answers


def main(args: argparse.Namespace) -> int:
    from distill.store import iter_jsonl, write_jsonl

    path: Path = args.file
    if not path.is_file():
        raise DistillError(f"predictions file not found: {path}")
    records = score_records(iter_jsonl(path), args.dataset, str(path))
    if not records:
        raise DistillError(f"{path}: no predictions to score")
    if args.out:
        write_jsonl(args.out, records)  # atomic and fsynced, so --out may be the input file itself
    n = len(records)
    em = sum(r["em"] for r in records) / n
    f1 = sum(r["f1"] for r in records) / n
    print(f"dataset={args.dataset} n={n} em={em:.4f} f1={f1:.4f}")
    return 0
