"""Answer scoring with the official HotpotQA and TriviaQA semantics, an optional LLM judge, and bootstrap CIs.

Which rules score a question is its dataset's `metric` (`hotpotqa`, `triviaqa`, or `em_f1`: plain SQuAD-style
EM/F1 for a dataset of one's own), settled once when the dataset is configured (`metric_for`) and written into
every record, so that generation, the filter, evaluation and the report score alike (`metric_of`, `score`).

The normalisers follow hotpot_evaluate_v1.py and triviaqa_evaluation.py step for step, because published
numbers are only comparable when every quirk matches (e.g. HotpotQA deletes punctuation while TriviaQA
replaces it with a space, so "o'brien" is one token in one and two in the other). One departure: a prediction
that normalises to nothing scores 0, where the official scripts give EM 1 when the gold normalises to nothing
too, since two empty strings are not a correct answer.
"""

from __future__ import annotations

import argparse
import re
import string
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any, Literal, get_args

import numpy as np

from distill.core.errors import DistillError
from distill.core.store import iter_jsonl, write_jsonl
from distill.core.text import title_key

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_HOTPOT_PUNCT = frozenset(string.punctuation)
_TRIVIA_PUNCT = frozenset(string.punctuation + "‘’´`")
_HOTPOT_SPECIAL = ("yes", "no", "noanswer")


def hotpot_normalize(text: str) -> str:
    """lower -> delete punctuation -> drop articles -> collapse whitespace (hotpot_evaluate_v1.normalize_answer)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _HOTPOT_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def trivia_normalize(text: str) -> str:
    """'_' -> ' ', lower, punctuation -> ' ', drop articles, collapse whitespace (triviaqa_evaluation)."""
    text = text.replace("_", " ").lower()
    text = "".join(" " if ch in _TRIVIA_PUNCT else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _token_prf(pred_tokens: list[str], gold_tokens: list[str]) -> tuple[float, float, float]:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def hotpot_f1_prf(prediction: str, gold: str) -> tuple[float, float, float]:
    """(f1, precision, recall) for one gold; a yes/no/noanswer mismatch scores 0, as in the official script."""
    pred, ref = hotpot_normalize(prediction), hotpot_normalize(gold)
    if (pred in _HOTPOT_SPECIAL or ref in _HOTPOT_SPECIAL) and pred != ref:
        return 0.0, 0.0, 0.0
    return _token_prf(pred.split(), ref.split())


def _gold_list(answers: str | Sequence[str]) -> list[str]:
    """The gold answers that say something: a blank one is no answer, and matching it would give an empty
    prediction EM 1.0. None left is an error, not a score."""
    golds = [answers] if isinstance(answers, str) else [str(a) for a in answers]
    golds = [g for g in golds if g.strip()]
    if not golds:
        raise DistillError("cannot score a prediction without a non-blank gold answer")
    return golds


_NO_MATCH = {"em": 0, "f1": 0.0}


def hotpot_em_f1(prediction: str | None, answers: str | Sequence[str]) -> dict[str, Any]:
    """HotpotQA EM/F1, each maximised over the gold answers (the official script has one gold per question).
    A prediction that normalises to nothing ("", "the", "?") matches nothing: two empty strings are not a
    correct answer."""
    pred = prediction or ""
    golds = _gold_list(answers)
    if not hotpot_normalize(pred):
        return dict(_NO_MATCH)
    return {"em": max(int(hotpot_normalize(pred) == hotpot_normalize(g)) for g in golds),
            "f1": max(hotpot_f1_prf(pred, g)[0] for g in golds)}


def trivia_em_f1(prediction: str | None, answers: str | Sequence[str]) -> dict[str, Any]:
    """TriviaQA EM/F1: maximum over the normalised aliases.

    The official NormalizedAliases omit aliases that normalise to nothing (the answer "A" becomes ""), so
    those are dropped here too, unless nothing else is left; otherwise an empty prediction would match.
    """
    pred = trivia_normalize(prediction or "")
    normalized = [trivia_normalize(g) for g in _gold_list(answers)]
    golds = [g for g in normalized if g] or normalized
    if not pred:  # an empty prediction matches nothing, even a gold alias that normalises to nothing
        return dict(_NO_MATCH)
    return {"em": max(int(pred == g) for g in golds),
            "f1": max(_token_prf(pred.split(), g.split())[0] for g in golds)}


def plain_em_f1(prediction: str | None, answers: str | Sequence[str]) -> dict[str, Any]:
    """SQuAD-style EM/F1, each maximised over the gold answers: HotpotQA's normaliser (SQuAD's own) without
    HotpotQA's yes/no/noanswer rule. A prediction that normalises to nothing matches nothing."""
    pred = hotpot_normalize(prediction or "")
    golds = [hotpot_normalize(g) for g in _gold_list(answers)]
    if not pred:
        return dict(_NO_MATCH)
    return {"em": max(int(pred == g) for g in golds),
            "f1": max(_token_prf(pred.split(), g.split())[0] for g in golds)}


# The scoring rules a dataset entry may name; a dataset named after one of DATASET_RULES gets its rules by name.
Metric = Literal["hotpotqa", "triviaqa", "em_f1"]
METRICS: tuple[str, ...] = get_args(Metric)
DATASET_RULES = ("hotpotqa", "triviaqa")
_SCORERS = {"hotpotqa": hotpot_em_f1, "triviaqa": trivia_em_f1, "em_f1": plain_em_f1}


def metric_for(dataset: str, metric: str | None = None) -> str:
    """The scoring rules of a dataset: its explicit `metric`, else the official rules its name is (hotpotqa,
    triviaqa). Any other name without a metric is refused: its rules would be a guess."""
    if metric is None and dataset in DATASET_RULES:
        return dataset
    if metric is None:
        raise DistillError(f"dataset {dataset!r} has no scoring rules of its own: set its `metric` "
                           f"({' | '.join(METRICS)})")
    _check_metric(metric)
    return metric


def metric_of(record: dict[str, Any]) -> str:
    """The scoring rules of a record: its `metric`. A record written before records carried one was scored by
    TriviaQA's rules when its dataset is triviaqa and by HotpotQA's otherwise, and is read back the same way."""
    return record.get("metric") or ("triviaqa" if record.get("dataset") == "triviaqa" else "hotpotqa")


def _check_metric(metric: str) -> None:
    if metric not in _SCORERS:
        raise DistillError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")


def score(metric: str, prediction: str | None, answers: str | Sequence[str]) -> dict[str, Any]:
    """EM (0/1) and F1 by the named rules (`METRICS`); a None prediction scores as ""."""
    _check_metric(metric)
    return _SCORERS[metric](prediction, answers)


_NORMALIZERS = {"hotpotqa": hotpot_normalize, "triviaqa": trivia_normalize, "em_f1": hotpot_normalize}


def answer_in_text(metric: str, answers: str | Sequence[str], text: str) -> bool:
    """Whether a gold answer, normalised by the metric's rules, appears in `text` as whole words: whether the
    evidence held what a Solver needed, apart from what it made of it."""
    _check_metric(metric)
    normalize = _NORMALIZERS[metric]
    haystack = f" {normalize(text)} "
    return any(gold and f" {gold} " in haystack for gold in (normalize(g) for g in _gold_list(answers)))


# ---------------------------------------------------------------------------------------------------------
# Evidence recall: a Planner metric that needs no Solver

RETRIEVAL_TOOLS = ("Wikipedia",)
_TITLE_HEAD = 300  # a paragraph's title sits before its first ": "-like colon, well within this many characters


def retrieved_titles(evidence: Sequence[dict]) -> set[str]:
    """Title keys of every paragraph a retrieval step returned (`Title: text` paragraphs, blank-line separated).

    A title may itself hold a colon ("Star Wars: A New Hope"), so every colon in a paragraph's head yields a
    candidate; a gold title matches when it is one of them. Linear in the evidence's length."""
    found: set[str] = set()
    for ev in evidence:
        if ev.get("tool") not in RETRIEVAL_TOOLS or ev.get("status") != "ok":
            continue
        for paragraph in (ev.get("output") or "").split("\n\n"):
            head = paragraph[:_TITLE_HEAD]
            found.update(title_key(head[:colon.start()]) for colon in re.finditer(":", head))
    return found


def gold_titles(supporting_facts: Sequence[Sequence[Any]] | None) -> list[str]:
    """The distinct supporting pages of a HotpotQA question, in first-mention order."""
    seen: dict[str, str] = {}
    for fact in supporting_facts or []:
        seen.setdefault(title_key(str(fact[0])), str(fact[0]))
    return list(seen.values())


def evidence_recall(golds: Sequence[str], evidence: Sequence[dict]) -> dict[str, Any] | None:
    """Share of the gold supporting pages whose paragraphs the plan's evidence holds, and whether it holds all.

    None when the question has no gold pages (TriviaQA), so a missing value never reads as zero."""
    if not golds:
        return None
    have = retrieved_titles(evidence)
    hits = [g for g in golds if title_key(g) in have]
    return {"recall": len(hits) / len(golds), "all": len(hits) == len(golds), "gold": list(golds), "found": hits}


# ---------------------------------------------------------------------------------------------------------
# LLM judge (the paper's "Acc")

JUDGE_PROMPT = """You are grading an answer to a trivia question against the accepted gold answers.

Question: {question}
Gold answers: {answers}
Predicted answer: {prediction}

Rubric:
- CORRECT if the predicted answer refers to the same entity, value or yes/no as any gold answer, allowing
  for paraphrase, abbreviation, extra harmless detail, different units that agree, or spelling variants.
- INCORRECT if it names something else, is vaguer than the gold answer, hedges between several answers,
  contradicts itself, or gives no answer.

Reply with exactly one word: CORRECT or INCORRECT."""


def parse_verdict(text: str) -> bool | None:
    """Strict: only a first word of CORRECT/INCORRECT (any case, surrounding punctuation ignored) counts.
    Anything else is None rather than a guess, so unparseable judgements are visible in the report."""
    word = (text.split() or [""])[0].strip(string.punctuation).upper()
    return {"CORRECT": True, "INCORRECT": False}.get(word)


JUDGE_MAX_TOKENS = 8  # one word


def judge_messages(question: str, answers: Sequence[str], prediction: str | None) -> list[dict]:
    prompt = JUDGE_PROMPT.format(question=question, answers=" | ".join(answers), prediction=prediction or "(no answer)")
    return [{"role": "user", "content": prompt}]


async def judge(model: Any, question: str, answers: Sequence[str], prediction: str | None) -> dict[str, Any]:
    """Ask a ChatModel whether the prediction is correct: {"verdict": True/False/None, "raw": reply text}."""
    completion = await model.chat(judge_messages(question, answers, prediction), temperature=0,
                                  max_tokens=JUDGE_MAX_TOKENS)
    return {"verdict": parse_verdict(completion.text), "raw": completion.text}


# ---------------------------------------------------------------------------------------------------------
# Bootstrap


def _as_array(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise DistillError(f"{name} must be a non-empty list of per-question scores")
    return array


def _bootstrap_means(values: np.ndarray, n: int, seed: int, alpha: float) -> tuple[np.ndarray, float, float]:
    """The n resampled means and their percentile interval at level 1 - alpha."""
    means = values[np.random.default_rng(seed).integers(0, values.size, size=(n, values.size))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return means, float(lo), float(hi)


def bootstrap_ci(values: Sequence[float], n: int = 1000, seed: int = 0, alpha: float = 0.05) -> tuple[float, ...]:
    """(mean, lo, hi): the sample mean with a percentile bootstrap interval at level 1 - alpha."""
    array = _as_array(values, "values")
    _, lo, hi = _bootstrap_means(array, n, seed, alpha)
    return float(array.mean()), lo, hi


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n: int = 1000, seed: int = 0, alpha: float = 0.05) -> dict:
    """Mean of a - b over the same questions, its percentile CI, and a two-sided bootstrap p-value.

    Resampling questions (not methods) keeps the pairing, which is what makes small differences between
    two planners on the same questions detectable. The p-value tests diff = 0 by centring the bootstrap
    distribution (how often a resampled diff strays from the observed one by at least |diff|), with +1
    smoothing so it is never exactly 0.
    """
    xa, xb = _as_array(a, "a"), _as_array(b, "b")
    if xa.size != xb.size:
        raise DistillError(f"paired bootstrap needs scores on the same questions, got {xa.size} and {xb.size}")
    diffs = xa - xb
    diff = float(diffs.mean())
    means, lo, hi = _bootstrap_means(diffs, n, seed, alpha)
    extreme = int(np.count_nonzero(np.abs(means - diff) >= abs(diff)))
    return {"diff": diff, "lo": lo, "hi": hi, "p_value": (extreme + 1) / (n + 1)}


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE.jsonl", help="lines with `prediction` and `answers`")
    parser.add_argument("--metric", "--dataset", dest="metric", required=True, choices=METRICS,
                        help="which scoring rules (hotpotqa, triviaqa: official; em_f1: plain SQuAD-style)")
    parser.add_argument("--out", type=Path, help="write each input line plus `em` and `f1` here")


def _fields(record: dict[str, Any], where: str) -> tuple[str | None, list[str]]:
    if missing := [field for field in ("prediction", "answers") if field not in record]:
        raise DistillError(f"{where}: missing field `{missing[0]}`")
    prediction, answers = record["prediction"], record["answers"]
    if prediction is not None and not isinstance(prediction, str):
        raise DistillError(f"{where}: `prediction` must be a string or null")
    golds = [answers] if isinstance(answers, str) else answers
    if not isinstance(golds, list) or not golds or not all(isinstance(a, str) and a.strip() for a in golds):
        raise DistillError(f"{where}: `answers` must be a non-blank string or a non-empty list of non-blank strings")
    return prediction, golds


def main(args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.is_file():
        raise DistillError(f"predictions file not found: {path}")
    # the first bad line stops the run, naming it
    records = [{**record, **score(args.metric, *_fields(record, f"{path}:{number}"))}
               for number, record in iter_jsonl(path)]
    if not records:
        raise DistillError(f"{path}: no predictions to score")
    if args.out:
        write_jsonl(args.out, records)  # atomic and fsynced, so --out may be the input file itself
    em, f1 = (fmean(r[k] for r in records) for k in ("em", "f1"))
    print(f"metric={args.metric} n={len(records)} em={em:.4f} f1={f1:.4f}")
    return 0


if __name__ == "__main__":  # `python -m distill.core.metrics` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
