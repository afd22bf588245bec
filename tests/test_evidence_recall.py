"""Evidence recall scores a plan by the gold supporting pages its evidence holds, with no Solver involved."""

from __future__ import annotations

from distill.metrics import evidence_recall, gold_titles, retrieved_titles, title_key


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
    import time

    out = ":" * 200_000 + "\n\n" * 50_000
    t0 = time.perf_counter()
    retrieved_titles([ev(out)])
    assert time.perf_counter() - t0 < 2.0
