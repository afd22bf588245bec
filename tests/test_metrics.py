"""Scoring follows the official HotpotQA/TriviaQA scripts; expected values below were worked out by hand."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from distill import cli
from distill.core.errors import DistillError
from distill.core.metrics import (
    JUDGE_PROMPT,
    bootstrap_ci,
    hotpot_em_f1,
    hotpot_f1_prf,
    hotpot_normalize,
    judge,
    paired_bootstrap,
    parse_verdict,
    score,
    trivia_em_f1,
    trivia_normalize,
)

# (dataset, prediction, answers, em, f1): what hotpot_evaluate_v1.py / triviaqa_evaluation.py give, by hand.
HELD_OUT = [
    ("hotpotqa", "The Spree", ["Spree"], 1, 1.0),
    ("hotpotqa", "Spree River", ["the Spree"], 0, 2 / 3),  # P 1/2, R 1
    ("hotpotqa", "an apple a day", ["apple day"], 1, 1.0),  # articles dropped
    ("hotpotqa", "Anthem", ["anthem"], 1, 1.0),  # "an" inside a word stays
    ("hotpotqa", "O'Brien", ["OBrien"], 1, 1.0),  # punctuation deleted, not spaced
    ("hotpotqa", "1,000 metres", ["1000 metres"], 1, 1.0),
    ("hotpotqa", "Barack Obama Jr.", ["Barack Obama"], 0, 0.8),  # P 2/3, R 1
    ("hotpotqa", "New York City New York", ["New York"], 0, 4 / 7),  # clipped counts: P 2/5, R 1
    ("hotpotqa", "yes", ["no"], 0, 0.0),
    ("hotpotqa", "yes it is", ["yes"], 0, 0.0),  # gold is yes/no and differs -> F1 0
    ("hotpotqa", "Yes.", ["yes"], 1, 1.0),
    ("hotpotqa", "noanswer", ["no answer"], 0, 0.0),
    ("hotpotqa", "\u2018Taggart\u2019", ["Taggart"], 0, 0.0),  # curly quotes are not string.punctuation
    ("hotpotqa", "the", ["The"], 0, 0.0),  # both normalise to "": the official script's EM 1 is not kept
    ("hotpotqa", "Chicago", ["Windy City", "Chicago"], 1, 1.0),  # max over golds
    ("triviaqa", "Mercury_(planet)", ["Mercury (planet)"], 1, 1.0),  # "_" and brackets become spaces
    ("triviaqa", "O'Brien", ["OBrien"], 0, 0.0),  # "o brien" vs "obrien"
    ("triviaqa", "Sunset Blvd.", ["Sunset Boulevard", "Sunset Blvd"], 1, 1.0),
    ("triviaqa", "Herman Melville's Moby Dick", ["Herman Melville", "Melville"], 0, 4 / 7),  # best alias
    ("triviaqa", "\u2018Taggart\u2019", ["Taggart"], 1, 1.0),  # the script's extra unicode punctuation
    ("triviaqa", "yes it is", ["yes"], 0, 0.5),  # no yes/no rule in TriviaQA
    ("triviaqa", "", ["A", "A (letter)"], 0, 0.0),  # "A" normalises to "" and is not an alias
]


@pytest.mark.parametrize(("dataset", "prediction", "answers", "em", "f1"), HELD_OUT)
def test_official_semantics_held_out(dataset, prediction, answers, em, f1):
    result = score(dataset, prediction, answers)
    assert result["em"] == em and isinstance(result["em"], int)
    assert result["f1"] == pytest.approx(f1)


def test_normalisers_differ_on_punctuation_and_underscore():
    assert hotpot_normalize("The  Quick, brown_fox!") == "quick brownfox"
    assert trivia_normalize("The  Quick, brown_fox!") == "quick brown fox"
    assert hotpot_normalize("A cat and an owl at the zoo") == "cat and owl at zoo"
    assert trivia_normalize("Thé a-team") == "thé team"


def test_underscore_only_matters_for_triviaqa():
    assert trivia_em_f1("brown_fox", ["brown fox"])["em"] == 1
    assert hotpot_em_f1("brown_fox", ["brown fox"])["em"] == 0


def test_hotpot_precision_recall_and_special_answers():
    assert hotpot_f1_prf("Spree River", "Spree") == pytest.approx((2 / 3, 0.5, 1.0))
    assert hotpot_f1_prf("no", "yes") == (0.0, 0.0, 0.0)
    assert hotpot_f1_prf("no", "no.") == (1.0, 1.0, 1.0)


def test_em_and_f1_are_maximised_separately_over_golds():
    result = hotpot_em_f1("Paris France", ["Paris", "Paris France"])
    assert result == {"em": 1, "f1": 1.0}
    result = trivia_em_f1("river thames london", ["Thames", "River Thames"])
    assert result["em"] == 0 and result["f1"] == pytest.approx(0.8)  # P 2/3, R 1 against "river thames"


def test_plain_rules_are_squad_without_hotpotqa_yes_no_rule():
    assert score("em_f1", "yes it is", ["yes"]) == {"em": 0, "f1": pytest.approx(0.5)}  # HotpotQA's: F1 0
    assert score("em_f1", "Yes.", ["yes"]) == {"em": 1, "f1": 1.0}
    assert score("em_f1", "O'Brien", ["OBrien"])["em"] == 1  # punctuation deleted, as in SQuAD (TriviaQA: 0)
    assert score("em_f1", "Mercury_(planet)", ["Mercury (planet)"])["em"] == 0  # no underscore rule (TriviaQA: 1)
    assert score("em_f1", "Spree River", ["Elbe", "the Spree"]) == {"em": 0, "f1": pytest.approx(2 / 3)}
    assert score("em_f1", "the", ["The"]) == {"em": 0, "f1": 0.0}  # normalises to nothing: no match


def test_the_rules_are_named_never_guessed_and_string_answer_accepted():
    from distill.core.metrics import metric_for

    assert score("hotpotqa", "yes it is", "yes") == {"em": 0, "f1": 0.0}
    assert score("triviaqa", "yes it is", "yes")["f1"] == pytest.approx(0.5)
    with pytest.raises(DistillError, match="unknown metric 'musique'; expected one of hotpotqa, triviaqa, em_f1"):
        score("musique", "yes it is", "yes")
    assert metric_for("hotpotqa") == "hotpotqa" and metric_for("triviaqa") == "triviaqa"
    assert metric_for("musique", "em_f1") == "em_f1" and metric_for("hotpotqa", "em_f1") == "em_f1"
    with pytest.raises(DistillError, match=r"dataset 'musique' has no scoring rules of its own: set its `metric`"):
        metric_for("musique")


def test_missing_prediction_scores_zero_and_empty_golds_are_rejected():
    assert score("hotpotqa", None, ["Spree"]) == {"em": 0, "f1": 0.0}
    with pytest.raises(DistillError, match="without a non-blank gold answer"):
        score("triviaqa", "x", [])


@pytest.mark.parametrize("dataset", ["hotpotqa", "triviaqa", "em_f1"])
@pytest.mark.parametrize("prediction", ["", None, "  ", "the", "?"])
def test_an_empty_prediction_never_matches_a_blank_gold(dataset, prediction):
    for answers in ([""], ["  "], "", ["", " \t"]):
        with pytest.raises(DistillError, match="without a non-blank gold answer"):
            score(dataset, prediction, answers)
    # a blank alias beside a real one is ignored, not matched
    assert score(dataset, prediction, ["", "Spree"]) == {"em": 0, "f1": 0.0}
    assert score(dataset, prediction, ["The"]) == {"em": 0, "f1": 0.0}


# ---------------------------------------------------------------------------------------------------------
# judge


@dataclass
class _Reply:
    text: str


@dataclass
class ScriptedChat:
    """A ChatModel that answers from a script and records its calls, standing in for a remote judge."""

    replies: list[str]
    name: str = "scripted"
    calls: list[dict] = field(default_factory=list)

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None):
        self.calls.append({"messages": messages, "temperature": temperature, "max_tokens": max_tokens})
        return _Reply(self.replies[len(self.calls) - 1])


def test_judge_sends_the_rubric_at_temperature_zero_and_parses_the_verdict():
    model = ScriptedChat(["CORRECT", "incorrect.", "The answer is correct", ""])
    results = [
        asyncio.run(judge(model, "Who wrote Moby-Dick?", ["Herman Melville", "Melville"], "H. Melville"))
        for _ in range(4)
    ]
    assert [r["verdict"] for r in results] == [True, False, None, None]
    assert results[2]["raw"] == "The answer is correct"
    call = model.calls[0]
    assert call["temperature"] == 0
    prompt = call["messages"][-1]["content"]
    assert "Who wrote Moby-Dick?" in prompt and "Herman Melville | Melville" in prompt and "H. Melville" in prompt
    assert JUDGE_PROMPT.splitlines()[-1] in prompt


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("CORRECT", True),
        ("  correct\nIt names the same person.", True),
        ("INCORRECT", False),
        ("**Incorrect**", False),
        ("CORRECTLY", None),
        ("Not correct", None),
        ("", None),
    ],
)
def test_parse_verdict_is_strict(text, verdict):
    assert parse_verdict(text) is verdict


# ---------------------------------------------------------------------------------------------------------
# bootstrap


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    values = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1] * 10
    mean, lo, hi = bootstrap_ci(values, n=2000, seed=3)
    assert mean == pytest.approx(0.6)
    assert lo < mean < hi
    assert 0.45 < lo and hi < 0.75
    assert bootstrap_ci(values, n=2000, seed=3) == (mean, lo, hi)
    wider = bootstrap_ci(values, n=2000, seed=3, alpha=0.01)
    assert wider[1] <= lo and wider[2] >= hi


def test_paired_bootstrap_identical_methods_have_zero_diff():
    a = [0.0, 0.5, 1.0, 1.0, 0.25] * 20
    result = paired_bootstrap(a, list(a))
    assert result["diff"] == 0.0 and result["lo"] == 0.0 and result["hi"] == 0.0
    assert result["p_value"] == 1.0


def test_paired_bootstrap_detects_a_clearly_better_method():
    better = [1.0] * 80 + [0.0] * 20
    worse = [1.0] * 40 + [0.0] * 60
    result = paired_bootstrap(better, worse, n=1000, seed=1)
    assert result["diff"] == pytest.approx(0.4)
    assert 0 < result["lo"] < 0.4 < result["hi"]
    assert result["p_value"] < 0.01
    flipped = paired_bootstrap(worse, better, n=1000, seed=1)
    assert flipped["hi"] < 0


def test_paired_bootstrap_needs_matching_lengths():
    with pytest.raises(DistillError, match="same questions"):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(DistillError, match="non-empty"):
        bootstrap_ci([])


# ---------------------------------------------------------------------------------------------------------
# distill score


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_score_cli_writes_em_f1_and_prints_means(tmp_path, capsys):
    src = _write(
        tmp_path / "preds.jsonl",
        [
            json.dumps({"id": "q1", "prediction": "The Spree", "answers": ["Spree"]}),
            "",
            json.dumps({"id": "q2", "prediction": "Spree River", "answers": "Spree"}),
            json.dumps({"id": "q3", "prediction": None, "answers": ["yes"]}),
        ],
    )
    out = tmp_path / "scored" / "out.jsonl"
    assert cli.main(["score", "--dataset", "hotpotqa", str(src), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"]
    assert [r["em"] for r in rows] == [1, 0, 0]
    assert rows[1]["f1"] == pytest.approx(2 / 3) and rows[1]["answers"] == "Spree"
    assert all(isinstance(r["f1"], float) for r in rows)
    printed = capsys.readouterr().out
    assert "n=3" in printed and "em=0.3333" in printed and "f1=0.5556" in printed


def test_score_cli_triviaqa_rules(tmp_path, capsys):
    src = _write(tmp_path / "p.jsonl", [json.dumps({"prediction": "brown_fox", "answers": ["Brown fox"]})])
    assert cli.main(["score", "--dataset", "triviaqa", str(src)]) == 0
    assert "em=1.0000" in capsys.readouterr().out


def test_score_cli_plain_rules(tmp_path, capsys):
    src = _write(tmp_path / "p.jsonl", [json.dumps({"prediction": "yes it is", "answers": ["yes"]})])
    assert cli.main(["score", "--metric", "em_f1", str(src)]) == 0
    assert "metric=em_f1 n=1 em=0.0000 f1=0.5000" in capsys.readouterr().out
    assert cli.main(["score", "--dataset", "hotpotqa", str(src)]) == 0  # HotpotQA's yes/no rule
    assert "metric=hotpotqa n=1 em=0.0000 f1=0.0000" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "p.jsonl:2: invalid JSON"),
        (json.dumps({"prediction": "x"}), "p.jsonl:2: missing field `answers`"),
        (json.dumps({"answers": ["x"]}), "p.jsonl:2: missing field `prediction`"),
        (json.dumps({"prediction": "x", "answers": []}), "p.jsonl:2: `answers` must be"),
        (json.dumps(["x"]), "p.jsonl:2: expected a JSON object"),
    ],
)
def test_score_cli_bad_line_names_the_line(tmp_path, capsys, line, message):
    good = json.dumps({"prediction": "a", "answers": ["a"]})
    src = _write(tmp_path / "p.jsonl", [good, line])
    assert cli.main(["score", "--dataset", "hotpotqa", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_score_cli_missing_file(tmp_path, capsys):
    assert cli.main(["score", "--dataset", "hotpotqa", str(tmp_path / "nope.jsonl")]) == 2
    assert "predictions file not found" in capsys.readouterr().err
