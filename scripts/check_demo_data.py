"""Validate the hand-written demo data in data/demo/ (corpus.jsonl, train.jsonl, dev.jsonl).

    python scripts/check_demo_data.py [--data-dir data/demo] [--json]

The demo questions are only useful if every fact they need is in the corpus and every supporting-fact pointer lands
on the sentence that holds it, so this checks what a reader cannot eyeball across 300 lines: ids are unique,
every context paragraph is the corpus paragraph split by `split_sentences`, supporting facts point inside the
context, the gold answer is written in a supporting paragraph, train and dev share no question, and the counts
the README promises still hold. It prints a summary and exits 1 when anything is wrong.

Standard library only, so it runs before the package is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "demo"

MIN_CORPUS = 160
MIN_QUESTIONS = 70
MIN_TRAIN = 50
MIN_DEV = 20
MIN_SENTENCES, MAX_SENTENCES = 2, 4
MIN_DISTRACTORS, MAX_DISTRACTORS = 2, 4

CORPUS_KEYS = {"id", "title", "text"}
QUESTION_KEYS = {"_id", "question", "answer", "type", "level", "supporting_facts", "context"}
TYPES = {"bridge", "comparison"}
LEVELS = {"easy", "medium", "hard"}
YES_NO = {"yes", "no"}
CORPUS_ID = re.compile(r"^demo-\d{4}$")
QUESTION_ID = re.compile(r"^demo-q\d{3}$")

_BOUNDARY = re.compile(r"([.!?])(\s+)")
_SENTENCE_END_OK = ")\"'"


class DemoDataError(ValueError):
    """A file that cannot be read as JSONL at all; reported as one problem instead of a traceback."""


@dataclass
class Report:
    """What `check_demo_data` found: the problems (empty means valid) and the counts it printed."""

    problems: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def split_sentences(text: str) -> list[str]:
    """The corpus splitting rule: a sentence ends at `.`, `!` or `?` followed by whitespace, when the character
    before the mark is a lowercase letter, a digit or a closing bracket/quote and the next sentence starts with an
    uppercase letter or a digit.

    Requiring a lowercase letter before the stop keeps initials and abbreviations such as "J. R. R. Tolkien",
    "E.T. the Extra-Terrestrial" or "Washington, D.C." inside one sentence, so the corpus text alone determines the
    sentence list that HotpotQA-style `supporting_facts` index into.
    """
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        mark = match.start(1)
        before = text[mark - 1] if mark > 0 else ""
        after = text[match.end()] if match.end() < len(text) else ""
        if not after:
            continue
        ends = before.islower() or before.isdigit() or before in _SENTENCE_END_OK
        if ends and (after.isupper() or after.isdigit()):
            sentences.append(text[start : match.end(1)])
            start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def normalize(text: str) -> str:
    """Lowercase, punctuation to spaces, single spaces: the form answers and questions are compared in, so
    "Berners-Lee" matches "berners lee" and "Paris," matches "paris" without caring about commas."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if ch in string.punctuation or ch in "–—‘’“”" else ch for ch in text)
    return " ".join(text.split())


def contains_answer(answer: str, text: str) -> bool:
    """Whole-word containment after `normalize`, so the answer "yen" is not found inside "Cayenne"."""
    needle = normalize(answer)
    return bool(needle) and f" {needle} " in f" {normalize(text)} "


def load_jsonl(path: Path) -> list[dict]:
    """Every non-empty line as a JSON object; a missing file or a bad line is a `DemoDataError` naming the line."""
    if not path.is_file():
        raise DemoDataError(f"{path}: file not found")
    records: list[dict] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DemoDataError(f"{path.name}:{lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise DemoDataError(f"{path.name}:{lineno}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def check_corpus(corpus: list[dict]) -> list[str]:
    """Keys, unique ids and titles, and 2-4 sentences per paragraph under `split_sentences`."""
    problems: list[str] = []
    ids: Counter[str] = Counter()
    titles: Counter[str] = Counter()
    for n, rec in enumerate(corpus, start=1):
        where = f"corpus.jsonl:{n}"
        if set(rec) != CORPUS_KEYS:
            problems.append(f"{where}: keys {sorted(rec)} != {sorted(CORPUS_KEYS)}")
            continue
        if not all(isinstance(rec[k], str) and rec[k].strip() for k in CORPUS_KEYS):
            problems.append(f"{where}: id, title and text must be non-empty strings")
            continue
        ids[rec["id"]] += 1
        titles[rec["title"]] += 1
        if not CORPUS_ID.match(rec["id"]):
            problems.append(f"{where}: id {rec['id']!r} does not look like demo-0001")
        if rec["text"] != rec["text"].strip() or "  " in rec["text"]:
            problems.append(f"{where}: text of {rec['title']!r} has stray whitespace")
        count = len(split_sentences(rec["text"]))
        if not MIN_SENTENCES <= count <= MAX_SENTENCES:
            problems.append(f"{where}: {rec['title']!r} has {count} sentences, want {MIN_SENTENCES}-{MAX_SENTENCES}")
    problems += [f"corpus.jsonl: duplicate id {i!r}" for i, c in ids.items() if c > 1]
    problems += [f"corpus.jsonl: duplicate title {t!r}" for t, c in titles.items() if c > 1]
    return problems


def _check_context(where: str, context: Any, corpus_text: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """Each context entry must be `[title, sentences]` equal to the corpus paragraph's own split."""
    problems: list[str] = []
    paragraphs: dict[str, list[str]] = {}
    if not isinstance(context, list) or not context:
        return [f"{where}: context must be a non-empty list"], paragraphs
    for entry in context:
        shaped = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
        if not shaped or not isinstance(entry[1], list) or not all(isinstance(s, str) for s in entry[1]):
            problems.append(f"{where}: context entry {str(entry)[:60]!r} is not [title, [sentences]]")
            continue
        title, sentences = entry
        if title in paragraphs:
            problems.append(f"{where}: context title {title!r} appears twice")
            continue
        paragraphs[title] = sentences
        if title not in corpus_text:
            problems.append(f"{where}: context title {title!r} is not in the corpus")
            continue
        text = corpus_text[title]
        if " ".join(sentences) != text:
            problems.append(f"{where}: context sentences of {title!r} joined with spaces differ from the corpus text")
        elif sentences != split_sentences(text):
            problems.append(f"{where}: context sentences of {title!r} are not split by the corpus rule")
    return problems, paragraphs


def _check_supporting(where: str, facts: Any, paragraphs: dict[str, list[str]]) -> tuple[list[str], set[str]]:
    """Each supporting fact is `[title, index]` with the title in the context and the index inside it."""
    problems: list[str] = []
    titles: set[str] = set()
    if not isinstance(facts, list) or not facts:
        return [f"{where}: supporting_facts must be a non-empty list"], titles
    seen: set[tuple[str, int]] = set()
    for fact in facts:
        ok_shape = isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str)
        if not ok_shape or not isinstance(fact[1], int) or isinstance(fact[1], bool):
            problems.append(f"{where}: supporting fact {fact!r} is not [title, int]")
            continue
        title, index = fact
        if (title, index) in seen:
            problems.append(f"{where}: supporting fact {fact!r} is listed twice")
        seen.add((title, index))
        titles.add(title)
        if title not in paragraphs:
            problems.append(f"{where}: supporting fact title {title!r} is not in the context")
        elif not 0 <= index < len(paragraphs[title]):
            problems.append(f"{where}: supporting fact {fact!r} is out of range ({len(paragraphs[title])} sentences)")
    if len(titles) < 2:
        problems.append(f"{where}: a multi-hop question needs supporting facts from at least 2 paragraphs")
    return problems, titles


def _check_answer(where: str, rec: dict, paragraphs: dict[str, list[str]], support: set[str]) -> list[str]:
    """Yes/no only for comparisons; any other answer must be written in a supporting paragraph."""
    answer = rec["answer"]
    if normalize(answer) in YES_NO:
        if rec["type"] != "comparison":
            return [f"{where}: a yes/no answer belongs to a comparison question, not {rec['type']!r}"]
        if answer != normalize(answer):
            return [f"{where}: write yes/no answers in lowercase, got {answer!r}"]
        return []
    texts = [" ".join(paragraphs[t]) for t in support if t in paragraphs]
    if not any(contains_answer(answer, text) for text in texts):
        return [f"{where}: answer {answer!r} does not appear in any supporting paragraph"]
    return []


def check_questions(questions: list[dict], corpus: list[dict], split: str) -> list[str]:
    """Field shapes, context against the corpus, supporting-fact ranges and answer support for one split."""
    corpus_text = {
        r["title"]: r["text"] for r in corpus if isinstance(r.get("title"), str) and isinstance(r.get("text"), str)
    }
    problems: list[str] = []
    for n, rec in enumerate(questions, start=1):
        where = f"{split}.jsonl:{n}"
        if set(rec) != QUESTION_KEYS:
            problems.append(f"{where}: keys {sorted(rec)} != {sorted(QUESTION_KEYS)}")
            continue
        where = f"{split}.jsonl:{n} ({rec['_id']})"
        if not all(isinstance(rec[k], str) and rec[k].strip() for k in ("_id", "question", "answer")):
            problems.append(f"{where}: _id, question and answer must be non-empty strings")
            continue
        if not QUESTION_ID.match(rec["_id"]):
            problems.append(f"{where}: _id does not look like demo-q001")
        if rec["type"] not in TYPES:
            problems.append(f"{where}: type {rec['type']!r} not in {sorted(TYPES)}")
        if rec["level"] not in LEVELS:
            problems.append(f"{where}: level {rec['level']!r} not in {sorted(LEVELS)}")
        ctx_problems, paragraphs = _check_context(where, rec["context"], corpus_text)
        sf_problems, support = _check_supporting(where, rec["supporting_facts"], paragraphs)
        problems += ctx_problems + sf_problems
        distractors = len(set(paragraphs) - support)
        if not MIN_DISTRACTORS <= distractors <= MAX_DISTRACTORS:
            problems.append(f"{where}: {distractors} distractor paragraphs, want {MIN_DISTRACTORS}-{MAX_DISTRACTORS}")
        if rec["type"] in TYPES:
            problems += _check_answer(where, rec, paragraphs, support)
    return problems


def _asked(records: list[dict]) -> set[str]:
    return {normalize(str(r.get("question", ""))) for r in records}


def check_splits(train: list[dict], dev: list[dict]) -> list[str]:
    """Ids unique across both files, no question asked twice, and dev sharing no normalised question with train."""
    problems: list[str] = []
    ids = Counter(str(r.get("_id")) for r in train + dev)
    problems += [f"train/dev: duplicate _id {i!r}" for i, c in ids.items() if c > 1]
    for split, records in (("train", train), ("dev", dev)):
        asked = Counter(normalize(str(r.get("question", ""))) for r in records)
        problems += [f"{split}.jsonl: question asked {c} times: {q!r}" for q, c in asked.items() if c > 1]
    overlap = _asked(train) & _asked(dev)
    problems += [f"train/dev: question in both splits: {q!r}" for q in sorted(overlap)]
    return problems


def summarize(corpus: list[dict], train: list[dict], dev: list[dict]) -> dict[str, Any]:
    """The counts the README quotes, by split, type, level and yes/no answers."""

    def counts(records: list[dict]) -> dict[str, Any]:
        return {
            "questions": len(records),
            "type": dict(sorted(Counter(str(r.get("type")) for r in records).items())),
            "level": dict(sorted(Counter(str(r.get("level")) for r in records).items())),
            "yes_no": sum(normalize(str(r.get("answer", ""))) in YES_NO for r in records),
        }

    return {"corpus_paragraphs": len(corpus), "train": counts(train), "dev": counts(dev)}


def check_counts(summary: dict[str, Any]) -> list[str]:
    """The minimum sizes the demo promises, and both question types present in each split."""
    problems: list[str] = []
    if summary["corpus_paragraphs"] < MIN_CORPUS:
        problems.append(f"corpus has {summary['corpus_paragraphs']} paragraphs, want at least {MIN_CORPUS}")
    total = summary["train"]["questions"] + summary["dev"]["questions"]
    if total < MIN_QUESTIONS:
        problems.append(f"{total} questions in all, want at least {MIN_QUESTIONS}")
    for split, minimum in (("train", MIN_TRAIN), ("dev", MIN_DEV)):
        if summary[split]["questions"] < minimum:
            problems.append(f"{split} has {summary[split]['questions']} questions, want at least {minimum}")
        missing = TYPES - set(summary[split]["type"])
        if missing:
            problems.append(f"{split} has no {sorted(missing)} questions")
    return problems


def check_demo_data(data_dir: Path = DEFAULT_DATA_DIR) -> Report:
    """Run every check on the three files in `data_dir`; an unreadable file stops the checks that need it."""
    data_dir = Path(data_dir)
    report = Report()
    loaded: dict[str, list[dict]] = {}
    for name in ("corpus", "train", "dev"):
        try:
            loaded[name] = load_jsonl(data_dir / f"{name}.jsonl")
        except DemoDataError as exc:
            report.problems.append(str(exc))
    if len(loaded) < 3:
        return report
    corpus, train, dev = loaded["corpus"], loaded["train"], loaded["dev"]
    report.problems += check_corpus(corpus)
    report.problems += check_questions(train, corpus, "train")
    report.problems += check_questions(dev, corpus, "dev")
    report.problems += check_splits(train, dev)
    report.summary = summarize(corpus, train, dev)
    report.problems += check_counts(report.summary)
    return report


def _print_summary(summary: dict[str, Any]) -> None:
    print(f"corpus: {summary['corpus_paragraphs']} paragraphs")
    for split in ("train", "dev"):
        s = summary[split]
        types = ", ".join(f"{k} {v}" for k, v in s["type"].items())
        levels = ", ".join(f"{k} {v}" for k, v in s["level"].items())
        print(f"{split}: {s['questions']} questions ({types}; {levels}; yes/no {s['yes_no']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="folder with corpus/train/dev.jsonl")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    report = check_demo_data(args.data_dir)
    if args.json:
        print(json.dumps({"ok": report.ok, "problems": report.problems, "summary": report.summary}, ensure_ascii=False))
    else:
        if report.summary:
            _print_summary(report.summary)
        for problem in report.problems:
            print(f"problem: {problem}", file=sys.stderr)
        print("ok" if report.ok else f"{len(report.problems)} problem(s)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
