"""The flywheel without a model: how a round's questions are built from traces (dedup, earlier rounds, the leak
guard, sides that never move), the gate's decisions on synthetic eval records, the promotions log and the adapter in
service it implies, a round's orchestration with its training and evaluation stood in for, refusals of bad
settings and bad log lines, and `distill promote` against a local fake of the vLLM server and the agent."""

from __future__ import annotations

import json
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from distill import flywheel as fw
from distill.cli import main
from distill.core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DEV = [json.loads(line) for line in (ROOT / "data/demo/dev.jsonl").read_text().splitlines() if line.strip()]
TOKEN = "fake-agent-token-0123456789abcdef"  # what the fake agent requires; never in any output or file


# ------------------------------------------------------------------------------------------ helpers

def write_traces(folder: Path, served: list[dict], number: int = 1) -> None:
    """A traces folder as serve-agent writes it: one record per served request, and feedback on some.
    Each item: {id, question, prediction, feedback} with feedback {answer: ...} / {correct: ...} / None."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"traces-{number:06d}.jsonl").open("a") as traces, (folder / "feedback.jsonl").open("a") as fb:
        for item in served:
            traces.write(json.dumps({"id": item["id"], "dataset": "served", "question": item["question"],
                                     "answers": [], "plan": {"valid": True, "steps": []},
                                     "prediction": item.get("prediction", "")}) + "\n")
            if item.get("feedback") is not None:
                fb.write(json.dumps({"id": item["id"], **item["feedback"]}) + "\n")


def served(prefix: str, n: int) -> list[dict]:
    return [{"id": f"{prefix}-{i}", "question": f"What is the {prefix} number {i} in the flywheel test?",
             "feedback": {"answer": f"answer {prefix} {i}"}} for i in range(n)]


def config(tmp_path: Path, **extra) -> Path:
    cfg = {
        "adapter": str(tmp_path / "adapter0"),
        "output_dir": str(tmp_path / "fw"),
        "planner_prompt": "compact",
        "planner": {"backend": "openai", "base_url": "@server", "model": "policy", "temperature": 1.0,
                    "max_tokens": 64},
        "solver": {"backend": "openai", "base_url": "@server", "model": "smollm2-135m-instruct", "max_tokens": 16},
        "tools": ["Wikipedia", "LLM"],
        "wikipedia_corpus": str(ROOT / "data/demo/corpus.jsonl"),
        "datasets": [{"name": "served", "source": str(tmp_path / "traces"), "metric": "em_f1"}],
        "eval_sets": [{"name": "hotpotqa", "source": str(ROOT / "data/demo/dev.jsonl"), "split": "dev"}],
        "server": {"base_model": "smollm2-135m-instruct"},
        "min_train_questions": 1, "min_holdout_questions": 2,
        "gate": {"bootstrap_samples": 200},
    } | extra
    path = tmp_path / "flywheel.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def rec(qid: str, prediction: str, answer: str = "Paris", *, valid: bool = True, tokens: int = 100,
        steps: list[tuple[str, str]] = (("Wikipedia", "Paris"),), method: str = "round_0") -> dict:
    """An eval record of one ReWOO planner on one question, as distill.evaluate writes it."""
    return {"id": qid, "dataset": "served", "question": f"question {qid}?", "answers": [answer], "metric": "em_f1",
            "method": method, "kind": "rewoo", "planner": {"model": method, "messages": [], "output": ""},
            "plan": {"valid": valid, "steps": [{"id": f"#E{i + 1}", "tool": t, "input": x, "deps": []}
                                               for i, (t, x) in enumerate(steps)], "errors": []},
            "evidence": [], "prediction": prediction,
            "tokens": {"planner": tokens // 2, "solver": tokens - tokens // 2, "tools": 0, "total": tokens},
            "llm_calls": 2, "wall_s": 0.1}


def one_line_error(capsys, seen: list[str] | None = None) -> str:
    """The one line a refusal printed (`seen` collects everything printed, for a test that reads it all)."""
    got = capsys.readouterr()
    if seen is not None:
        seen.append(got.out + got.err)
    err = got.err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ------------------------------------------------------------------------------------------ questions

def test_a_rounds_questions_are_deduplicated_leak_guarded_and_exclude_earlier_rounds(tmp_path):
    eval_q = DEV[0]["question"]
    write_traces(tmp_path / "traces", [
        {"id": "a", "question": "Who wrote Hamlet?", "feedback": {"answer": "Shakespeare"}},
        {"id": "a2", "question": "who wrote  HAMLET", "feedback": {"answer": "W. Shakespeare"}},  # the same question
        {"id": "b", "question": "What is the capital of France?", "prediction": "Paris", "feedback": {"correct": True}},
        {"id": "c", "question": "What is 2 + 2?", "prediction": "5", "feedback": {"correct": False}},  # nothing to learn
        {"id": "d", "question": "How tall is Mount Everest?"},  # no feedback
        {"id": "e", "question": eval_q.upper(), "feedback": {"answer": DEV[0]["answer"]}},  # an eval question
        *served("x", 10)])
    cfg = load_config(fw.FlywheelConfig, config(tmp_path))
    qs = fw.plan_questions(cfg, 1)
    by_id = {r["id"]: r for r in qs.rows}
    assert set(by_id) == {"a", "b"} | {f"x-{i}" for i in range(10)}
    assert by_id["a"]["answers"] == ["Shakespeare"] and by_id["b"]["answers"] == ["Paris"]  # the first kept
    assert by_id["a"]["source"].endswith("traces-000001.jsonl:1")
    assert (qs.with_feedback, qs.new, qs.left_out_eval) == (13, 13, 1)
    assert {r["split"] for r in qs.rows} == {"train", "heldout"}

    out = Path(cfg.output_dir)
    start = fw.start_round(cfg, out, 1, qs)
    assert start.from_round == 0 and start.adapter_in == cfg.adapter and start.questions.train + \
        start.questions.heldout == 12
    rows = [json.loads(line) for line in (out / "round_1" / fw.QUESTIONS).read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in qs.rows]
    assert set(rows[0]) == {"id", "question", "answers", "split", "source"}
    heldout = [json.loads(line) for line in (out / "round_1" / fw.HELDOUT).read_text().splitlines()]
    assert [h["id"] for h in heldout] == [r["id"] for r in rows if r["split"] == "heldout"]

    # more traffic: repeats of round 1's questions (either side) are not new; only the new ones make round 2
    write_traces(tmp_path / "traces", [{"id": "a3", "question": "Who wrote Hamlet ?", "feedback": {"answer": "S"}},
                                       *served("y", 6)], number=2)
    again = fw.plan_questions(cfg, 2)
    assert {r["id"] for r in again.rows} == {f"y-{i}" for i in range(6)}
    # new: not used by an earlier round; the eval question is new each time, and left out each time
    assert again.with_feedback == 19 and again.new == 7 and again.left_out_eval == 1
    # and round 1, rebuilt as if it had not been written, would not exclude itself
    assert {r["id"] for r in fw.plan_questions(cfg, 1).rows} >= {"a", "b"}


def test_leak_policy_refuse_stops_on_an_eval_question(tmp_path):
    write_traces(tmp_path / "traces", [{"id": "e", "question": DEV[1]["question"], "feedback": {"answer": "1885"}},
                                       *served("x", 3)])
    cfg = load_config(fw.FlywheelConfig, config(tmp_path, leak_policy="refuse"))
    with pytest.raises(fw.DistillError, match="also appear in eval_sets"):
        fw.plan_questions(cfg, 1)


def test_adding_traffic_never_moves_a_question_between_sides():
    from distill.core.data import Example

    def examples(prefix: str, n: int) -> list:
        return [(f"t:{i}", Example(id=f"{prefix}{i}", dataset="served", split="train",
                                   question=f"Question {prefix} {i}: where is it?", answers=["here"]))
                for i in range(n)]

    first = fw.build_questions(examples("a", 60), set(), set(), seed=3, holdout_fraction=0.3)
    more = fw.build_questions(examples("b", 200) + examples("a", 60), set(), set(), seed=3, holdout_fraction=0.3)
    side = {r["question"]: r["split"] for r in more.rows}
    assert all(side[r["question"]] == r["split"] for r in first.rows)
    held = sum(r["split"] == "heldout" for r in more.rows)
    assert 0.15 < held / len(more.rows) < 0.45  # about the fraction asked for
    # the side is the question's, not the id's or the wording's: a reworded copy lands on the same side
    assert fw.split_of("Where is it?", 3, 0.3) == fw.split_of("  where IS it ", 3, 0.3)
    other = fw.build_questions(examples("a", 60), set(), set(), seed=4, holdout_fraction=0.3)
    assert [r["split"] for r in other.rows] != [r["split"] for r in first.rows]  # the seed decides


# ------------------------------------------------------------------------------------------ the gate

GATE = fw.GateConfig(bootstrap_samples=500)


def pairs(n: int, inc_right: set[int], cand_right: set[int], **cand) -> tuple[list[dict], list[dict]]:
    inc = [rec(f"q{i}", "Paris" if i in inc_right else "Lyon") for i in range(n)]
    cnd = [rec(f"q{i}", "Paris" if i in cand_right else "Lyon", method="round_1", **cand) for i in range(n)]
    return inc, cnd


def test_the_gate_promotes_when_the_interval_is_above_0_and_guards_hold():
    inc, cand = pairs(20, set(range(4)), set(range(16)))
    made = fw.decide(inc, cand, GATE, from_round=0)
    assert made.decision == "promote"
    assert made.verdict.n == 20 and made.verdict.diff == pytest.approx(0.6) and made.verdict.lo > 0
    assert made.reason.startswith("f1 +0.6 [") and made.reason.endswith("over round_0, guards ok")
    assert set(made.guards) == {"plan_valid", "tokens", "duplicate_steps"} and all(g.ok for g in made.guards.values())


def test_the_gate_keeps_when_the_interval_includes_0():
    inc, cand = pairs(20, set(range(10)), set(range(1, 11)))  # one better, one worse
    made = fw.decide(inc, cand, GATE, from_round=2)
    assert made.decision == "keep" and made.verdict.lo < 0 < made.verdict.hi
    assert made.reason.startswith("keep round_2: f1 +0 [") and made.reason.endswith("includes 0")
    worse = fw.decide(*pairs(20, set(range(16)), set(range(2))), GATE, from_round=0)
    assert worse.decision == "keep" and worse.reason.endswith("is below 0")


@pytest.mark.parametrize("guard,cand,words", [
    ("tokens", {"tokens": 150}, "tokens per question rose 100 -> 150 (+50%, at most +10%)"),
    ("plan_valid", {"valid": False}, "plan_valid fell 1 -> 0"),
    ("duplicate_steps", {"steps": [("Wikipedia", "Paris"), ("wikipedia", " paris ")]},
     "duplicate_steps per plan rose 0 -> 1"),
])
def test_the_gate_keeps_a_better_candidate_that_is_worse_past_a_guard(guard, cand, words):
    inc, candidate = pairs(20, set(range(4)), set(range(16)), **cand)
    made = fw.decide(inc, candidate, GATE, from_round=0)
    assert made.decision == "keep" and made.verdict.lo > 0 and not made.guards[guard].ok
    assert made.reason.startswith("keep round_0: f1 +0.6") and words in made.reason
    off = GATE.model_copy(update={"max_worse": fw.MaxWorse(**{guard: None})})
    unguarded = fw.decide(inc, candidate, off, from_round=0)
    assert unguarded.decision == "promote" and guard not in unguarded.guards


def test_the_gate_pairs_by_question_and_keeps_when_too_few_were_answered_by_both():
    inc, cand = pairs(20, set(), set(range(20)))
    made = fw.decide(inc[:1], cand, GATE, from_round=0)  # the incumbent's eval failed on 19 questions
    assert made.decision == "keep" and made.verdict.n == 1 and "too few to compare" in made.reason


def test_other_measures_and_diversity():
    from distill.agent.reward import RewardConfig

    inc = [rec(f"q{i}", "x") for i in range(6)]
    cand = [dict(rec(f"q{i}", "x"), evidence=[{"id": "#E1", "tool": "Wikipedia", "input": "Paris", "status": "ok",
                                                "output": "Paris: the capital of France."}]) for i in range(6)]
    gate = GATE.model_copy(update={"measure": "answer_in_evidence"})
    assert fw.decide(inc, cand, gate, 0).verdict.diff == pytest.approx(1.0)
    reward = fw.decide(inc, cand, GATE.model_copy(update={"measure": "reward"}), 0).verdict
    assert reward.candidate > reward.incumbent  # the answer is in its evidence, which the reward counts
    assert fw.record_reward(rec("q", "x", valid=False), RewardConfig()) == 0
    plans = {"q1": [[{"tool": "Wikipedia", "input": "A"}], [{"tool": "wikipedia", "input": " a"}], []],
             "q2": [[{"tool": "LLM", "input": "x"}]] * 3}
    assert fw.distinct_plans(plans) == pytest.approx((2 + 1) / 2)


# ------------------------------------------------------------------------------------------ the log

def test_the_log_says_which_adapter_serves_after_promote_keep_and_rollback(tmp_path):
    log = tmp_path / fw.PROMOTIONS

    def line(action: str, round_: int, from_round: int) -> fw.Promotion:
        return fw.Promotion(at=fw.now(), action=action, round=round_, from_round=from_round,
                            model=f"round_{round_}", adapter=f"a{round_}", reason=f"{action} {round_}")

    assert fw.in_service("a0", fw.read_promotions(log)) == (0, "a0")
    for item in [line("promote", 1, 0), line("keep", 2, 1), line("promote", 3, 1)]:
        fw.append_promotion(log, item)
    lines = fw.read_promotions(log)
    assert [(p.action, p.round) for p in lines] == [("promote", 1), ("keep", 2), ("promote", 3)]
    assert lines[0] == line("promote", 1, 0).model_copy(update={"at": lines[0].at})  # read back as written
    assert fw.in_service("a0", lines) == (3, "a3")
    assert fw.service_stack("a0", lines)[-2] == (1, "a1")  # where a rollback goes
    fw.append_promotion(log, line("rollback", 1, 3))
    assert fw.in_service("a0", fw.read_promotions(log)) == (1, "a1")
    assert fw.service_stack("a0", fw.read_promotions(log))[-2] == (0, "a0")
    with pytest.raises(ValueError, match="one line"):
        fw.Promotion.model_validate({**line("keep", 4, 1).model_dump(), "reason": "a\nb"})


def test_a_bad_promotions_line_is_one_line_naming_it_and_exit_2(tmp_path, capsys):
    path = config(tmp_path)
    log = tmp_path / "fw" / fw.PROMOTIONS
    log.parent.mkdir()
    good = {"at": "2026-01-01T00:00:00+00:00", "action": "promote", "round": 1, "from_round": 0, "model": "round_1",
            "adapter": "x", "reason": "ok", "agents": []}
    log.write_text(json.dumps(good) + "\n" + json.dumps(good | {"action": "promoted"}) + "\n")
    assert main(["promote", "--config", str(path), "--rollback"]) == 2
    err = one_line_error(capsys)
    assert f"{log}:2" in err and "action" in err


@pytest.mark.parametrize("setting,value,named", [
    ("holdout_fraction", "0.95", "holdout_fraction"),
    ("holdout_fraction", "0.01", "holdout_fraction"),
    ("min_holdout_questions", "1", "min_holdout_questions"),
    ("gate.confidence", "1.0", "gate.confidence"),
    ("gate.bootstrap_samples", "10", "gate.bootstrap_samples"),
    ("gate.measure", "recall", "gate.measure"),
    ("gate.max_worse.tokens", "2", "gate.max_worse.tokens"),
    ("diversity_samples", "17", "diversity_samples"),
    ("rounds", "2", "rounds"),
    ("method", "grpo", "method"),
    ("server", "null", "server"),
    ("service", "{vllm_url: 'http://u:p@h:8000/v1', agents: ['http://h:8080']}", "service.vllm_url"),
    ("service", "{vllm_url: 'http://h:8000/v1', agents: []}", "service.agents"),
    ("service", "{vllm_url: 'http://h:8000/v1', agents: ['http://h:1'], token_env: 'not a name'}",
     "service.token_env"),
    ("service", "{vllm_url: 'http://h:8000/v1', agents: ['http://h:1'], timeout_s: 0}", "service.timeout_s"),
])
def test_a_setting_out_of_bounds_is_one_line_naming_it_and_exit_2(tmp_path, capsys, setting, value, named):
    assert main(["flywheel", "--config", str(config(tmp_path)), "--set", f"{setting}={value}"]) == 2
    err = one_line_error(capsys)
    assert named in err and "p@h" not in err
    assert not (tmp_path / "fw").exists()


def test_too_few_new_questions_is_one_line_exit_0_and_writes_nothing(tmp_path, capsys):
    write_traces(tmp_path / "traces", served("x", 3))
    path = config(tmp_path, min_train_questions=5, min_holdout_questions=5)
    assert main(["flywheel", "--config", str(path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not enough new questions" in out[0] and "needs 5 train and 5 held-out" in out[0]
    assert not (tmp_path / "fw").exists()


def test_check_counts_the_rounds_questions_and_writes_nothing(tmp_path, capsys):
    write_traces(tmp_path / "traces", served("x", 12) + [{"id": "e", "question": DEV[2]["question"],
                                                         "feedback": {"answer": "TZS"}}])
    assert main(["flywheel", "--config", str(config(tmp_path)), "--check", "--offline"]) == 2
    got = capsys.readouterr()
    out = got.out
    problems = [line for line in (got.out + got.err).splitlines() if line.startswith("problem: ")]
    # the adapter is not made here; nothing else is wrong (the round's own server is local and free: no price asked)
    assert problems and all("adapter not found" in p for p in problems), problems
    assert "flywheel: round 1 would train from round_0" in out
    assert "13 served question(s) with usable feedback, 13 new, 1 left out (in eval_sets)" in out
    assert not (tmp_path / "fw").exists()


# ------------------------------------------------------------------------------------------ a round, stood in for

@pytest.mark.parametrize("outlives", [True, False], ids=["cpu-one-server", "gpu-server-per-side"])
def test_a_round_trains_from_the_adapter_in_service_evaluates_both_and_logs_the_decision(tmp_path, monkeypatch,
                                                                                          capsys, outlives):
    """run_round, the vLLM server, evaluate and the diversity samples are stood in for (each is tested on its own,
    and the lead's end-to-end test runs them for real): what is checked is what the flywheel hands them and does
    with what they return. On a CPU one server samples, waits out training and is given the new round at runtime;
    on a GPU training needs the server's memory, so a second server evaluates."""
    import distill.evaluate
    import distill.improve

    calls: dict[str, list] = {"train": [], "eval": [], "servers": []}

    def run_round(icfg, i, adapter_in, examples, fresh, server=None, module="policy"):
        adapter = Path(icfg.output_dir) / f"round_{i}" / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "adapter_model.safetensors").write_bytes(b"stand-in")
        assert server is None or dict(server.served) == {module: adapter_in}  # it samples the adapter in service
        calls["train"].append((i, adapter_in, sorted(ex.id for ex in examples), icfg.datasets[0].source,
                               module if server else None))
        return {"samples": 2 * len(examples), "kept": len(examples), "mean_reward": 0.5,
                "train": {"global_step": 1}, "adapter": str(adapter)}

    def evaluate(ecfg, config_path, fresh):
        names = [p.name for p in ecfg.planners]
        calls["eval"].append((names, ecfg.datasets[0].source, ecfg.planners[0].spec.temperature))
        out = Path(ecfg.output_dir) / "records"
        out.mkdir(parents=True)
        rows = [json.loads(line) for line in Path(ecfg.datasets[0].source).read_text().splitlines()]
        for name in names:  # the new round answers every held-out question right, the one in service none
            right = name == names[1]
            (out / f"{name}.jsonl").write_text("".join(
                json.dumps(rec(r["id"], r["answers"][0] if right else "no idea", r["answers"][0], method=name)) + "\n"
                for r in rows))

    class Server:
        base_url = "http://127.0.0.1:1/v1"

        def __init__(self, adapters, later):
            self.served, self.later = dict(adapters), later
            calls["servers"].append(self.served)

        def load_adapter(self, name, path):
            assert self.later and name not in self.served
            self.served[name], self.later = str(path), self.later - 1

    @contextmanager
    def server(cfg, adapters, log_path, later=0):
        yield Server(adapters, later)

    monkeypatch.setattr(distill.improve, "run_round", run_round)
    monkeypatch.setattr(distill.evaluate, "evaluate", evaluate)
    monkeypatch.setattr(fw, "round_server", server)
    monkeypatch.setattr(fw, "server_outlives_training", lambda cfg: outlives)
    monkeypatch.setattr(fw, "check_adapter", lambda cfg, adapter: None)
    monkeypatch.setattr(fw, "sample_diversity", lambda cfg, url, names, ex: {names[0]: 1.0, names[1]: 2.5,
                                                                             "tokens": 10, "cost_usd": 0.0})
    write_traces(tmp_path / "traces", served("x", 30))
    path = config(tmp_path)
    assert main(["flywheel", "--config", str(path)]) == 0
    out = tmp_path / "fw"
    report = fw.read_round_report(out / "round_1" / fw.REPORT)
    rows = [json.loads(line) for line in (out / "round_1" / fw.QUESTIONS).read_text().splitlines()]
    train = sorted(r["id"] for r in rows if r["split"] == "train")
    assert calls["train"] == [(1, str(tmp_path / "adapter0"), train, str(out / "round_1" / fw.QUESTIONS),
                               "round_0" if outlives else None)]
    assert calls["eval"] == [(["round_0", "round_1"], str(out / "round_1" / fw.HELDOUT), 0.0)]
    # one server in all (sampling, then both modules) on a CPU; on a GPU run_round's own, then one for both
    assert calls["servers"] == [{"round_0": str(tmp_path / "adapter0"), "round_1": str(out / "round_1" / "adapter")}]
    assert report.decision == "promote" and report.promoted_to == [] and report.verdict.diff == 1.0
    assert report.questions.train == len(train) and report.questions.heldout == 30 - len(train)
    assert report.diversity.incumbent == 1.0 and report.diversity.candidate == 2.5
    assert report.train.kept == len(train) and report.cost.tokens > 0
    assert f"[flywheel] round 1: promote: {report.reason}" in capsys.readouterr().out
    (line,) = fw.read_promotions(out / fw.PROMOTIONS)
    assert (line.action, line.round, line.from_round, line.agents) == ("promote", 1, 0, [])

    # round 2, on the traffic since: from round 1's adapter (in service now); not better, so kept
    write_traces(tmp_path / "traces", served("y", 30), number=2)
    monkeypatch.setattr(fw, "sample_diversity", lambda cfg, url, names, ex: {})

    def same(ecfg, config_path, fresh):  # both answer alike: no gain
        evaluate(ecfg, config_path, fresh)
        records = Path(ecfg.output_dir) / "records"
        (records / "round_2.jsonl").write_text((records / "round_1.jsonl").read_text())

    monkeypatch.setattr(distill.evaluate, "evaluate", same)
    assert main(["flywheel", "--config", str(path)]) == 0
    assert calls["train"][1][1] == str(out / "round_1" / "adapter")
    assert all(i.startswith("y-") for i in calls["train"][1][2])
    keep = fw.read_round_report(out / "round_2" / fw.REPORT)
    assert keep.decision == "keep" and keep.reason.startswith("keep round_1: f1 +0 [")
    assert [p.action for p in fw.read_promotions(out / fw.PROMOTIONS)] == ["promote", "keep"]
    assert fw.in_service(str(tmp_path / "adapter0"), fw.read_promotions(out / fw.PROMOTIONS))[0] == 1


def test_the_rounds_eval_and_training_configs():
    cfg = fw.FlywheelConfig.model_validate(yaml.safe_load((ROOT / "configs/flywheel_smollm2_cpu.yaml").read_text()))
    icfg = fw.improve_config(cfg, Path("r/questions.jsonl"))
    assert type(icfg) is fw.ImproveConfig and icfg.samples_per_question == cfg.samples_per_question
    assert icfg.datasets[0].source == "r/questions.jsonl"
    ecfg = fw.eval_config(cfg, "http://127.0.0.1:9/v1", Path("r/heldout.jsonl"), Path("r/eval"),
                          ["round_0", "round_1"])
    assert [p.name for p in ecfg.planners] == ["round_0", "round_1"]  # the one in service is the reference
    assert all(p.spec.model == p.name and p.spec.temperature == 0.0 and p.prompt == "compact" for p in ecfg.planners)
    assert ecfg.solver.base_url == "http://127.0.0.1:9/v1" and ecfg.tools == cfg.tools
    assert ecfg.datasets[0].metric == "em_f1" and ecfg.output_dir == "r/eval"


# ------------------------------------------------------------------------------------------ promote, for real HTTP

class FakeServers:
    """A fake of the planner's vLLM server and of the agents' admin endpoint, on one local port. Fake because a
    real vLLM start takes minutes and a real agent needs one: what `distill promote` must get right is the HTTP it
    sends (which calls, which bodies, the bearer token to the agents only) and what it makes of the answers, and a
    real HTTP server on 127.0.0.1 takes the same requests httpx sends to the real ones."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict | None, str | None]] = []
        self.loaded: dict[str, str] = {}
        servers = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code: int, body) -> None:
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                servers.calls.append(("GET", self.path, None, self.headers.get("Authorization")))
                if self.path == "/v1/models":
                    return self.reply(200, {"object": "list", "data": [
                        {"id": n, "root": p, "parent": "smollm2"} for n, p in servers.loaded.items()]})
                self.reply(404, {"error": {"message": "no", "code": "not_found"}})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization")
                servers.calls.append(("POST", self.path, body, auth))
                if self.path == "/v1/load_lora_adapter":
                    servers.loaded[body["lora_name"]] = body["lora_path"]
                    return self.reply(200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.")
                if self.path == "/agent/v1/admin/planner":
                    if auth != f"Bearer {TOKEN}":
                        return self.reply(401, {"error": {"message": "bad token", "code": "invalid_api_key"}})
                    if body["model"] not in servers.loaded:
                        return self.reply(404, {"error": {"message": "not listed", "code": "model_not_found"}})
                    return self.reply(200, {"object": "planner", **body, "since": "now"})
                self.reply(404, {"error": {"message": f"{body.get('model')} is not listed",
                                           "code": "model_not_found"}})

        self.handler = Handler


def test_promote_loads_the_adapter_switches_the_agents_and_rolls_back(tmp_path, monkeypatch, capsys):
    from fakes import serving

    fake, seen = FakeServers(), []
    monkeypatch.setenv("FLYWHEEL_AGENT_CREDENTIAL", TOKEN)
    adapter1 = tmp_path / "fw" / "round_1" / "adapter"
    adapter1.mkdir(parents=True)
    (adapter1 / "adapter_model.safetensors").write_bytes(b"stand-in")
    with serving(fake.handler) as base:
        service = {"vllm_url": f"{base}/v1", "agents": [f"{base}/agent"], "token_env": "FLYWHEEL_AGENT_CREDENTIAL",
                   "max_retries": 0, "timeout_s": 10}
        path = config(tmp_path, service=service)
        assert main(["promote", "--config", str(path), "--round", "1"]) == 0
        seen.append(capsys.readouterr().out)
        assert fake.calls == [
            ("GET", "/v1/models", None, None),
            ("POST", "/v1/load_lora_adapter", {"lora_name": "round_1", "lora_path": str(adapter1.resolve())}, None),
            ("POST", "/agent/v1/admin/planner", {"model": "round_1", "adapter": str(adapter1.resolve()), "round": 1},
             f"Bearer {TOKEN}")]
        fake.calls.clear()
        assert main(["promote", "--config", str(path), "--rollback"]) == 0  # back to round 0, the config's adapter
        seen.append(capsys.readouterr().out)
        assert [c[1] for c in fake.calls] == ["/v1/models", "/v1/load_lora_adapter", "/agent/v1/admin/planner"]
        assert fake.calls[-1][2]["round"] == 0 and fake.loaded["round_0"] == str((tmp_path / "adapter0").resolve())
        fake.calls.clear()
        assert main(["promote", "--config", str(path), "--round", "1"]) == 0  # loaded already: not loaded again
        seen.append(capsys.readouterr().out)
        assert [c[1] for c in fake.calls] == ["/v1/models", "/agent/v1/admin/planner"]

        # an agent that refuses: one line naming its URL and why; the one switched is logged
        fake.calls.clear()
        bad = config(tmp_path, service=service | {"agents": [f"{base}/agent", f"{base}/broken"]})
        assert main(["promote", "--config", str(bad), "--round", "0"]) == 2
        err = one_line_error(capsys, seen)
        assert f"{base}/broken/v1/admin/planner" in err and "HTTP 404" in err and "model_not_found" in err
        assert "1 switched, logged" in err
        # the token missing from the environment: one line naming the variable, nothing sent
        monkeypatch.delenv("FLYWHEEL_AGENT_CREDENTIAL")
        fake.calls.clear()
        assert main(["promote", "--config", str(path), "--round", "1"]) == 2
        assert "FLYWHEEL_AGENT_CREDENTIAL" in one_line_error(capsys, seen) and fake.calls == []

    log = tmp_path / "fw" / fw.PROMOTIONS
    lines = fw.read_promotions(log)
    assert [(p.action, p.round, p.from_round, len(p.agents)) for p in lines] == [
        ("promote", 1, 0, 1), ("rollback", 0, 1, 1), ("promote", 1, 0, 1), ("promote", 0, 1, 1)]
    assert fw.in_service(str(tmp_path / "adapter0"), lines) == (0, str(tmp_path / "adapter0"))
    assert "now serves" in seen[0] and TOKEN not in log.read_text() and not any(TOKEN in text for text in seen)


def test_promote_refusals(tmp_path, capsys):
    path = config(tmp_path)
    assert main(["promote", "--config", str(path), "--round", "3"]) == 2
    assert "round 3 has no trained adapter" in one_line_error(capsys)
    assert main(["promote", "--config", str(path), "--round", "0"]) == 2
    assert "`service` is not set" in one_line_error(capsys)
    assert main(["promote", "--config", str(path)]) == 2
    assert "--round R" in one_line_error(capsys)
    assert main(["promote", "--config", str(path), "--rollback"]) == 2
    assert "nothing to roll back" in one_line_error(capsys)


def test_an_unreachable_vllm_is_one_line_after_bounded_retries(tmp_path, capsys, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = config(tmp_path, service={"vllm_url": f"http://127.0.0.1:{port}/v1", "agents": ["http://127.0.0.1:1"],
                                     "max_retries": 1, "timeout_s": 5})
    monkeypatch.setattr("distill.core.retry.backoff_s", lambda *a: 0.0)
    assert main(["promote", "--config", str(path), "--round", "0"]) == 2
    err = one_line_error(capsys)
    assert f"GET http://127.0.0.1:{port}/v1/models: cannot connect" in err and "after 2 attempts" in err
    assert not (tmp_path / "fw" / fw.PROMOTIONS).exists()


def test_diversity_samples_each_module_through_the_openai_client(tmp_path):
    """The diversity samples go through the real client against a local fake OpenAI server (one fixed reply, so
    every module writes one distinct plan per question): the calls, their count and the tokens are what is checked."""
    from fakes import chat_api

    from distill.core.data import Example

    cfg = load_config(fw.FlywheelConfig, config(tmp_path, diversity_samples=3))
    questions = [Example(id=f"q{i}", dataset="served", split="heldout", question=f"Where is {i}?", answers=["x"])
                 for i in range(4)]
    with chat_api(reply="Plan: look it up.\n#E1 = Wikipedia[Paris]") as api:
        got = fw.sample_diversity(cfg, api.url, ["round_0", "round_1"], questions)
        assert api.calls == 2 * 4 * 3
    assert got == {"round_0": 1.0, "round_1": 1.0, "tokens": 2 * 4 * 3 * 13, "cost_usd": 0.0}


class FakeOpenAIAndAgent(FakeServers):
    """FakeServers plus chat completions, so the round's real evaluation and diversity samples run against it: the
    planner module round_1 plans `Plan: the GOOD way. #E1 = Wikipedia[GOOD]`, any other the BAD way, and the Solver
    (any other model) answers a question right only from a GOOD plan. A fake for the reasons FakeServers gives; what runs for real is
    distill.evaluate with the flywheel's eval config, the gate on its records and the promotion."""

    def __init__(self):
        super().__init__()
        post = self.handler.do_POST

        def do_POST(handler):  # noqa: N802
            if handler.path != "/v1/chat/completions":
                return post(handler)
            body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
            model, text = body["model"], json.dumps(body["messages"])
            if model.startswith("round_"):
                way = "GOOD" if model == "round_1" else "BAD"
                reply = f"Plan: the {way} way.\n#E1 = Wikipedia[{way}]"
            else:
                number = __import__("re").search(r"number (\d+)", text)
                reply = f"answer x {number.group(1)}" if "GOOD" in text and number else "no idea"
            handler.reply(200, {"id": "x", "object": "chat.completion", "created": 0, "model": model,
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                             "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}})

        self.handler.do_POST = do_POST
        self.loaded = {"round_0": "", "smollm2-135m-instruct": ""}


def test_a_better_round_is_evaluated_for_real_gated_and_promoted_to_the_agents(tmp_path, monkeypatch, capsys):
    """Training is stood in for (run_round is tested in test_improve) and so is the vLLM start; the evaluation
    (distill.evaluate with the flywheel's EvalConfig), the diversity samples, the gate and the promotion run."""
    import distill.improve

    from fakes import serving

    def run_round(icfg, i, adapter_in, examples, fresh, server=None, module="policy"):
        adapter = Path(icfg.output_dir) / f"round_{i}" / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "adapter_model.safetensors").write_bytes(b"stand-in")
        return {"samples": len(examples), "kept": len(examples), "mean_reward": 0.5, "train": {"global_step": 1},
                "adapter": str(adapter)}

    monkeypatch.setattr(distill.improve, "run_round", run_round)
    monkeypatch.setattr(fw, "check_adapter", lambda cfg, adapter: None)
    monkeypatch.setenv("FLYWHEEL_AGENT_CREDENTIAL", TOKEN)
    fake = FakeOpenAIAndAgent()
    write_traces(tmp_path / "traces", served("x", 30))
    with serving(fake.handler) as base:
        @contextmanager
        def server(cfg, adapters, log_path, later=0):
            assert list(adapters) == ["round_0", "round_1"] and not later
            yield type("Server", (), {"base_url": f"{base}/v1"})()

        monkeypatch.setattr(fw, "round_server", server)
        monkeypatch.setattr(fw, "server_outlives_training", lambda cfg: False)
        service = {"vllm_url": f"{base}/v1", "agents": [f"{base}/agent"], "token_env": "FLYWHEEL_AGENT_CREDENTIAL",
                   "max_retries": 0}
        assert main(["flywheel", "--config", str(config(tmp_path, diversity_samples=2, service=service))]) == 0
    out = tmp_path / "fw"
    report = fw.read_round_report(out / "round_1" / fw.REPORT)
    held = report.questions.heldout
    # (the Solver's reply "answer x 3" is read as "x 3": F1 0.8 against "answer x 3", the incumbent's 0)
    assert report.decision == "promote" and report.verdict.n == held and report.verdict.incumbent == 0.0
    assert report.verdict.lo == report.verdict.diff == report.verdict.candidate == pytest.approx(0.8)
    assert report.promoted_to == [f"{base}/agent"] and report.diversity.candidate == 1.0
    records = [json.loads(line) for line in (out / "round_1" / "eval" / "records" / "round_1.jsonl").read_text()
               .splitlines()]
    assert len(records) == held and all(r["plan"]["steps"][0]["input"] == "GOOD" for r in records)
    assert ("POST", "/v1/load_lora_adapter", {"lora_name": "round_1",
                                              "lora_path": str((out / "round_1" / "adapter").resolve())}, None) \
        in fake.calls
    (line,) = fw.read_promotions(out / fw.PROMOTIONS)
    assert (line.action, line.round, line.agents, line.measure) == ("promote", 1, [f"{base}/agent"], "f1")
    assert TOKEN not in capsys.readouterr().out and TOKEN not in (out / fw.PROMOTIONS).read_text()
