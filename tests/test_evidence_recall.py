"""Evidence recall scores a plan by the gold supporting pages its evidence holds, with no Solver involved."""

from __future__ import annotations

import pytest

from distill.core.metrics import evidence_recall, gold_titles, retrieved_titles, title_key


def ev(output, tool="Wikipedia", status="ok"):
    return {"id": "#E1", "tool": tool, "input": "q", "output": output, "status": status}


def test_exact_values_on_hand_made_evidence():
    golds = gold_titles([["Ed Wood", 0], ["Scott Derrickson", 1], ["Ed Wood", 2]])
    assert golds == ["Ed Wood", "Scott Derrickson"]
    evidence = [
        ev("Ed_Wood: Edward Davis Wood Jr. was an American filmmaker.\n\nDoctor Strange: a film."),
        ev("Scott Derrickson: He directed it.", tool="LLM"),  # an LLM's words are not retrieved evidence
        ev("Scott Derrickson: American director.", status="timeout"),  # nor is a failed step's output
    ]
    got = evidence_recall(golds, evidence)
    assert got == {"recall": 0.5, "all": False, "gold": golds, "found": ["Ed Wood"]}
    evidence.append(ev("scott  DERRICKSON: American director (born 1966)."))
    assert evidence_recall(golds, evidence)["recall"] == 1.0 and evidence_recall(golds, evidence)["all"] is True


def test_titles_with_colons_and_no_gold():
    out = "Star Wars: Episode IV – A New Hope: a 1977 film.\n\nAlien: a 1979 film."
    have = retrieved_titles([ev(out)])
    assert title_key("Star Wars: Episode IV – A New Hope") in have and title_key("Alien") in have
    assert evidence_recall(["Star Wars: Episode IV – A New Hope"], [ev(out)])["all"] is True
    assert evidence_recall([], [ev(out)]) is None  # TriviaQA: no gold pages, no number rather than a zero
    assert evidence_recall(["Alien 3"], [ev("")])["recall"] == 0.0


def test_linear_on_hostile_output():
    """Colons (title separators) and blank lines (paragraph breaks) are what a rescanning reader is slow on."""
    from functools import partial

    from scaling import assert_linear

    hostile = lambda c: ":" * (4 * c) + "\n\n" * c
    assert retrieved_titles([ev(hostile(50_000))]) is not None
    assert_linear(lambda c: partial(retrieved_titles, [ev(hostile(c))]), 6_250, "retrieved_titles")


@pytest.mark.parametrize("page, query", [
    ("Ed_Wood", "Ed Wood"),  # a dump title with underscores, a planner's query with spaces
    ("Ed Wood", "ed_wood"),
    ("Ｅｄ　Ｗｏｏｄ", "Ed Wood"),  # full-width letters and space: one page after NFKC
    ("Cafe\u0301 Society", "Café Society"),  # a combining accent against the precomposed letter
])
def test_a_page_recall_counts_as_found_is_the_one_an_exact_title_query_finds(tmp_path, page, query):
    """The Wikipedia tool's exact-title lookup and evidence recall share one title key: were they to differ, a
    query naming a gold page could get another page while recall counts the gold one as found."""
    import asyncio

    from distill.core.store import write_jsonl
    from distill.tools.wikipedia import LocalWikipedia

    corpus = tmp_path / "corpus.jsonl"
    # the decoy says the query's words more often, so BM25 alone would rank it first
    write_jsonl(corpus, [{"title": "Decoy", "text": f"{query} {query} {query}, and {query} again."},
                         {"title": page, "text": "An American filmmaker."}])
    out = asyncio.run(LocalWikipedia(corpus, top_k=1).run(query))
    assert out == f"{page}: An American filmmaker."
    assert evidence_recall([query], [ev(out)])["all"] is True
