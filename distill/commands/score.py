"""`distill score`: official EM/F1 for a JSONL of predictions, so numbers from any source are comparable.

    distill score --dataset hotpotqa predictions.jsonl --out scored.jsonl

Each line needs `prediction` (null counts as no answer) and `answers` (a list, or one string).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from distill.errors import DistillError


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE.jsonl", help="lines with `prediction` and `answers`")
    parser.add_argument("--dataset", required=True, choices=["hotpotqa", "triviaqa"], help="which official rules")
    parser.add_argument("--out", type=Path, help="write each input line plus `em` and `f1` here")


def score_lines(lines: list[str], dataset: str, origin: str) -> list[dict[str, Any]]:
    """Score every non-blank line; the first bad one stops the run with its line number."""
    from distill.metrics import score

    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record, prediction, answers = _parse_line(line, number, origin)
        result = score(dataset, prediction, answers)
        records.append({**record, "em": int(result["em"]), "f1": float(result["f1"])})
    return records


def _parse_line(line: str, number: int, origin: str) -> tuple[dict[str, Any], str | None, list[str]]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DistillError(f"{origin}:{number}: invalid JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise DistillError(f"{origin}:{number}: expected a JSON object")
    for field in ("prediction", "answers"):
        if field not in record:
            raise DistillError(f"{origin}:{number}: missing field `{field}`")
    prediction, answers = record["prediction"], record["answers"]
    if prediction is not None and not isinstance(prediction, str):
        raise DistillError(f"{origin}:{number}: `prediction` must be a string or null")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise DistillError(f"{origin}:{number}: `answers` must be a string or a non-empty list of strings")
    return record, prediction, answers


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Write beside the target and rename, so --out may be the input file and a crash leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main(args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.is_file():
        raise DistillError(f"predictions file not found: {path}")
    records = score_lines(path.read_text(encoding="utf-8").splitlines(), args.dataset, str(path))
    if not records:
        raise DistillError(f"{path}: no predictions to score")
    if args.out:
        _write_jsonl(args.out, records)
    n = len(records)
    em = sum(r["em"] for r in records) / n
    f1 = sum(r["f1"] for r in records) / n
    print(f"dataset={args.dataset} n={n} em={em:.4f} f1={f1:.4f}")
    return 0
