"""The shipped demo data (data/demo) read with the package's own loaders: every fact a question needs is in the
corpus, every supporting fact lands inside its paragraph, dev never leaks into train, and the README's counts hold."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from distill.core.data import check_no_leak, load_examples
from distill.core.metrics import hotpot_normalize
from distill.core.store import read_jsonl

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
SPLITS = ("train", "dev")


@pytest.fixture(scope="module")
def corpus() -> dict[str, str]:
    rows = read_jsonl(DEMO / "corpus.jsonl")
    assert len({r["id"] for r in rows}) == len(rows) >= 300  # unique ids
    titles = {r["title"]: r["text"] for r in rows}
    assert len(titles) == len(rows)  # unique titles: Wikipedia[title] finds one paragraph
    return titles


@pytest.fixture(scope="module")
def splits() -> dict[str, list]:
    loaded = {split: load_examples(DEMO / f"{split}.jsonl", "hotpotqa", split) for split in SPLITS}
    for split, examples in loaded.items():  # the loader drops repeated questions: there must be none
        assert len(examples) == len(read_jsonl(DEMO / f"{split}.jsonl")), split
    return loaded


def test_questions_are_distinct_and_dev_does_not_leak_into_train(splits):
    # enough for the demo to keep 50+ plans from its train questions and evaluate 64 dev questions
    assert len(splits["train"]) >= 200 and len(splits["dev"]) >= 64
    ids = Counter(ex.id for examples in splits.values() for ex in examples)
    assert max(ids.values()) == 1
    check_no_leak(splits["train"], splits["dev"])  # the leak guard's own question fold


def test_no_dev_question_is_answered_by_the_gold_pages_of_a_train_question(splits):
    """A reworded question over the same gold pages is a leak the question fold cannot see: a student taught to
    fetch exactly those pages together would be scored on a plan it was trained on."""
    def pages(ex):
        return frozenset(title for title, _ in ex.supporting_facts)
    taught = {pages(ex) for ex in splits["train"]}
    shared = [ex.id for ex in splits["dev"] if pages(ex) in taught]
    assert not shared, shared


def test_contexts_are_corpus_paragraphs_and_supporting_facts_land_in_them(splits, corpus):
    for ex in splits["train"] + splits["dev"]:
        context = dict(ex.context)
        assert len(context) == len(ex.context), ex.id  # no title twice
        for title, sentences in context.items():
            assert " ".join(sentences) == corpus[title], (ex.id, title)
            assert all(re.search(r"[.!?][)\"']?$", s) for s in sentences), (ex.id, title)
        support = {title for title, _ in ex.supporting_facts}
        assert len(support) >= 2, ex.id  # multi-hop
        assert 2 <= len(context) - len(support) <= 4, ex.id  # distractors
        assert all(0 <= i < len(context[t]) for t, i in ex.supporting_facts), ex.id
        (answer,) = ex.answers
        if answer in ("yes", "no"):
            assert ex.type == "comparison", ex.id
        else:  # written word for word in a supporting paragraph, as the scorer normalises it
            texts = [f" {hotpot_normalize(corpus[t])} " for t in support]
            assert any(f" {hotpot_normalize(answer)} " in text for text in texts), (ex.id, answer)


def test_readme_counts_match_the_files(splits, corpus):
    """The README quotes counts; a data edit that changes them must update the README too."""
    readme = (DEMO / "README.md").read_text(encoding="utf-8")
    assert f"| `corpus.jsonl` | {len(corpus)} paragraphs |" in readme
    for split, examples in splits.items():
        types, levels = Counter(ex.type for ex in examples), Counter(ex.level for ex in examples)
        yes_no = sum(ex.answers[0] in ("yes", "no") for ex in examples)
        assert types["bridge"] and types["comparison"] and yes_no
        assert f"| `{split}.jsonl` | {len(examples)} questions |" in readme
        row = (
            f"| {split} | {types['bridge']} | {types['comparison']} | {levels['easy']} | {levels['medium']} | "
            f"{levels['hard']} | {yes_no} |"
        )
        assert row in readme
