"""Re-planning on surprise (method rewoo+replan): when a step finds nothing, fails or times out, the Planner
is asked once more with the evidence so far, and only its new steps run.

The point here is control flow, so in most tests the Planner and the Solver are scripted stand-ins (no real
model can be made to write a chosen plan on demand); the parser, the Worker and the tools (BM25 Wikipedia
over given paragraphs, the Calculator) are the real ones. The last test drives eval's factory with the real
SmolLM2 as Solver.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distill.core.config import AgentConfig, validate
from distill.core.errors import DistillError
from distill.evaluate import EvalConfig, build_method, methods_of
from distill.llm.base import Completion, Usage
from distill.rewoo.agent import Question, ReWOOAgent
from distill.rewoo.plan import parse_plan
from distill.rewoo.worker import NO_EVIDENCE, WorkerConfig, run_plan
from distill.tools.calculator import Calculator
from distill.tools.wikipedia import ScopedWikipedia

MINI = Path(__file__).resolve().parent / "fixtures" / "hotpot_mini.jsonl"
TOOLS = {"Wikipedia": "search", "Calculator": "arithmetic"}
PARAGRAPHS = [
    ("Danube", "The Danube is 2850 km long and flows into the Black Sea."),
    ("Rhine", "The Rhine is 1230 km long and flows into the North Sea."),
]


@dataclass
class Scripted:
    """A chat model that answers from a script and records every prompt: a stand-in for the Planner (and
    the Solver) because the tests choose what it writes."""

    replies: list[str]
    name: str = "scripted"
    prompts: list[list[dict]] = field(default_factory=list)

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        self.prompts.append(messages)
        if len(self.prompts) > len(self.replies):
            raise AssertionError(f"{self.name} called {len(self.prompts)} times; the script has {len(self.replies)}")
        return Completion(self.replies[len(self.prompts) - 1], Usage(100, 10), latency_s=0.01, cost_usd=0.001,
                          model=self.name)


class Recorded:
    """Delegates to a real tool and keeps each query, so a test can tell which steps actually ran."""

    def __init__(self, inner):
        self.inner, self.name, self.description = inner, inner.name, inner.description
        self.queries: list[str] = []

    async def run(self, query: str) -> str:
        self.queries.append(query)
        return await self.inner.run(query)


class Slow:
    """A tool that never answers: the Worker's timeout must end the step, however slow the machine."""

    name, description = "Calculator", "slow"

    async def run(self, query: str) -> str:
        await asyncio.Event().wait()
        return "late"


def plan_text(*steps: str) -> str:
    return "".join(f"Plan: step {i}.\n{s}\n" for i, s in enumerate(steps, 1))


def agent_with(planner_replies, *, calculator=None, solver_reply="2850", **kwargs):
    wiki = Recorded(ScopedWikipedia(PARAGRAPHS))
    calc = calculator or Recorded(Calculator())
    planner, solver = Scripted(planner_replies, "planner"), Scripted([solver_reply], "solver")
    agent = ReWOOAgent(
        planner, solver, lambda ex: {"Wikipedia": wiki, "Calculator": calc}, TOOLS, planner_prompt="full",
        worker=WorkerConfig(tool_timeout_s=0.2), **kwargs,
    )
    return agent, planner, solver, wiki, calc


def run(agent) -> dict:
    return asyncio.run(agent.run(Question("How long is the Danube, doubled?", answers=["5700"])))


FIRST = plan_text("#E1 = Wikipedia[Danube length]", "#E2 = Calculator[2850 * 2]")
EMPTY_FIRST = plan_text("#E1 = Wikipedia[Danube length]", "#E2 = Wikipedia[zzz qqq]")


def test_happy_path_costs_two_model_calls_and_keeps_the_record_shape() -> None:
    plain, *_ = agent_with([FIRST])
    replanning, planner, solver, wiki, calc = agent_with([FIRST], max_replans=1)
    base, rec = run(plain), run(replanning)
    assert len(planner.prompts) == 1 and len(solver.prompts) == 1
    assert rec["llm_calls"] == base["llm_calls"] == 2
    assert rec["replans"] == [] and "replans" not in base
    assert set(rec) - set(base) == {"replans"}
    assert rec["plan"] == base["plan"]
    assert [e["output"] for e in rec["evidence"]] == ["Danube: " + PARAGRAPHS[0][1], "5700"]
    assert rec["tokens"]["planner"] == base["tokens"]["planner"] == 110


def test_plain_rewoo_does_not_replan_on_a_surprise() -> None:
    agent, planner, *_ = agent_with([EMPTY_FIRST])
    rec = run(agent)
    assert len(planner.prompts) == 1 and "replans" not in rec
    assert [e["status"] for e in rec["evidence"]] == ["ok", "empty"]


def test_empty_evidence_replans_with_continued_ids_that_resolve_and_no_rerun() -> None:
    agent, planner, solver, wiki, calc = agent_with(
        [EMPTY_FIRST, plan_text("#E3 = Wikipedia[#E1]", "#E4 = Calculator[2850 * 2]")], max_replans=1
    )
    rec = run(agent)
    assert len(planner.prompts) == 2 and len(solver.prompts) == 1
    assert rec["llm_calls"] == 3
    assert rec["tokens"]["planner"] == 220 and rec["cost_usd"] == pytest.approx(0.003)
    # finished steps ran once; the new step's #E1 became the first plan's evidence
    assert wiki.queries == ["Danube length", "zzz qqq", "Danube: " + PARAGRAPHS[0][1]]
    assert calc.queries == ["2850 * 2"]
    assert [s["id"] for s in rec["plan"]["steps"]] == ["#E1", "#E2", "#E3", "#E4"]
    assert [e["id"] for e in rec["evidence"]] == ["#E1", "#E2", "#E3", "#E4"]
    assert [e["status"] for e in rec["evidence"]] == ["ok", "empty", "ok", "ok"]
    assert rec["plan"]["valid"] is True
    (replan,) = rec["replans"]
    assert replan["trigger"] == {"step": "#E2", "kind": "empty", "error": "tool returned no text"}
    assert replan["plan"]["valid"] is True and [s["id"] for s in replan["plan"]["steps"]] == ["#E3", "#E4"]
    # the replan continues the Planner's own prompt, shows the evidence so far, and asks for ids from #E3
    messages = planner.prompts[1]
    assert messages[: len(planner.prompts[0])] == planner.prompts[0]
    assert messages[-2]["role"] == "assistant" and "#E2 = Wikipedia[zzz qqq]" in messages[-2]["content"]
    request = messages[-1]["content"]
    assert "Evidence #E2 from Wikipedia[zzz qqq] (empty: tool returned no text)" in request
    assert "from #E3" in request and "#E1, #E2 by its id" in request
    assert parse_plan(request).steps == ()  # the evidence cannot be mistaken for steps if echoed back
    assert replan["planner"]["messages"] == messages
    # the Solver sees the whole plan and all evidence
    solver_prompt = solver.prompts[0][-1]["content"]
    assert solver_prompt.count("Plan: step") == 4 and "5700" in solver_prompt
    assert f"Evidence: {NO_EVIDENCE}" in solver_prompt
    # one clock for both plans' evidence
    assert rec["evidence"][2]["start_s"] >= rec["evidence"][1]["end_s"]


@pytest.mark.parametrize(
    ("surprise", "replan_on", "fires"),
    [
        ("empty", ["empty"], True),
        ("empty", ["error", "timeout"], False),
        ("error", ["error"], True),
        ("error", ["empty"], False),
        ("timeout", ["timeout"], True),
        ("timeout", ["empty", "error"], False),
    ],
)
def test_replan_fires_only_on_configured_surprises(surprise: str, replan_on: list[str], fires: bool) -> None:
    first = {
        "empty": EMPTY_FIRST,
        "error": plan_text("#E1 = Wikipedia[Danube length]", "#E2 = Calculator[the length of #E1]"),
        "timeout": FIRST,
    }[surprise]
    calc = Slow() if surprise == "timeout" else None
    agent, planner, *_ = agent_with(
        [first, plan_text("#E3 = Wikipedia[Rhine]")], calculator=calc, max_replans=1, replan_on=replan_on
    )
    rec = run(agent)
    assert rec["evidence"][1]["status"] == surprise and rec["evidence"][1]["output"] == NO_EVIDENCE
    assert len(planner.prompts) == (2 if fires else 1)
    assert len(rec["replans"]) == int(fires) and rec["llm_calls"] == 2 + int(fires)
    assert len(rec["evidence"]) == 2 + int(fires)
    if fires:
        assert rec["replans"][0]["trigger"]["kind"] == surprise and rec["evidence"][2]["output"].startswith("Rhine")


def test_replans_stop_at_their_bound() -> None:
    failing = [EMPTY_FIRST, *(plan_text(f"#E{i} = Wikipedia[{q}]") for i, q in ((3, "yyy"), (4, "xxx"), (5, "www")))]
    for bound in (1, 2, 3):
        agent, planner, *_ = agent_with(failing, max_replans=bound)
        rec = run(agent)
        assert len(planner.prompts) == 1 + bound and len(rec["replans"]) == bound
        assert rec["llm_calls"] == 2 + bound
        assert [r["trigger"]["step"] for r in rec["replans"]] == [f"#E{i}" for i in range(2, 2 + bound)]
        assert [e["id"] for e in rec["evidence"]] == [f"#E{i}" for i in range(1, 3 + bound)]


def test_an_old_surprise_does_not_trigger_again_once_the_new_steps_succeed() -> None:
    agent, planner, *_ = agent_with([EMPTY_FIRST, plan_text("#E3 = Wikipedia[Rhine]")], max_replans=3)
    rec = run(agent)
    assert len(planner.prompts) == 2 and len(rec["replans"]) == 1
    assert [e["status"] for e in rec["evidence"]] == ["ok", "empty", "ok"]


def test_a_replan_that_redefines_finished_evidence_does_not_rerun_it() -> None:
    second = plan_text("#E1 = Wikipedia[Rhine]", "#E3 = Calculator[#E1]")
    agent, planner, solver, wiki, calc = agent_with([EMPTY_FIRST, second], max_replans=1)
    rec = run(agent)
    assert wiki.queries == ["Danube length", "zzz qqq"]
    # #E1 keeps meaning the finished evidence: the Calculator gets the Danube paragraph (and fails on it)
    assert calc.queries == ["Danube: " + PARAGRAPHS[0][1]]
    (replan,) = rec["replans"]
    assert [(e["code"], e["step"]) for e in replan["plan"]["errors"]] == [("duplicate_id", "#E1")]
    assert [s["id"] for s in rec["plan"]["steps"]] == ["#E1", "#E2", "#E3"] and rec["plan"]["valid"] is False


def test_parser_accepts_refs_to_known_ids_and_worker_substitutes_them() -> None:
    text = plan_text("#E3 = Calculator[#E1 + #E2]", "#E4 = Calculator[#E3 * 2]")
    assert [e.code for e in parse_plan(text, tools=["Calculator"]).errors] == ["undefined_ref", "undefined_ref"]
    plan = parse_plan(text, tools=["Calculator"], known_ids={"#E1", "#E2"})
    assert plan.valid and [s.id for s in plan.steps] == ["#E3", "#E4"]
    evidence = asyncio.run(run_plan(plan, {"Calculator": Calculator()}, known={"#E1": "2", "#E2": "5"}))
    assert [(e.input, e.output) for e in evidence] == [("2 + 5", "7"), ("7 * 2", "14")]


def test_unknown_surprise_is_one_clear_error() -> None:
    with pytest.raises(DistillError, match="replan_on: unknown surprise 'nothing'"):
        agent_with([FIRST], max_replans=1, replan_on=["nothing"])


def test_eval_runs_replan_as_a_method_counting_the_extra_planner_call(smollm2) -> None:
    """eval's own factory (real SmolLM2 Solver, real Calculator, injected failures at rate 1.0); only the
    Planner is scripted, so the plans are known."""
    planner = {"backend": "transformers", "model": "smollm2-135m-instruct", "max_tokens": 16}
    cfg = validate(EvalConfig, {
        "datasets": [{"name": "hotpotqa", "source": "unused.jsonl", "n": 1}], "tools": ["Calculator"],
        "wikipedia_corpus": None, "solver": {"max_tokens": 4}, "tool_failure_rate": 1.0,
        "planners": [
            {"name": "student", "prompt": "zeroshot", "spec": planner},
            {"name": "student+replan", "prompt": "zeroshot", "spec": planner, "replan": True},
        ],
    })
    assert [(m.name, m.replan) for m in methods_of(cfg)] == [("student", False), ("student+replan", True)]
    records = {}
    for method in methods_of(cfg):
        agent = build_method(cfg, method)
        agent.planner = Scripted([plan_text("#E1 = Calculator[2 + 3]"), plan_text("#E2 = Calculator[#E1 * 2]")])
        records[method.name] = asyncio.run(agent.run(Question("What is 2 + 3?", answers=["5"])))
    plain, replanned = records["student"], records["student+replan"]
    assert plain["llm_calls"] == 2 and "replans" not in plain
    assert replanned["llm_calls"] == 3 and len(replanned["replans"]) == 1  # bounded by max_replans=1
    assert replanned["replans"][0]["trigger"]["kind"] == "error"
    assert [e["input"] for e in replanned["evidence"]] == ["2 + 3", f"{NO_EVIDENCE} * 2"]
    assert replanned["solver"]["model"] == plain["solver"]["model"]
    assert AgentConfig().replan is False and AgentConfig().max_replans == 1


def test_eval_refuses_to_resume_records_made_with_the_other_replan_setting(tmp_path) -> None:
    from distill.evaluate import run_fingerprints
    from distill.core.run import check_fingerprint

    planner = {"backend": "transformers", "model": "smollm2-135m-instruct"}
    made = {}
    for replan in (True, False):
        cfg = validate(EvalConfig, {
            "datasets": [{"name": "hotpotqa", "source": "unused.jsonl", "n": 1}],
            "planners": [{"name": "student", "prompt": "zeroshot", "spec": planner, "replan": replan}],
        })
        made[replan] = run_fingerprints(cfg, methods_of(cfg))["student"]
    records = [{"fingerprint": made[True]["fingerprint"]}]
    check_fingerprint(tmp_path / "r.jsonl", records, made[True]["fingerprint"], made[True]["settings"], made[True],
                      False, "records")
    with pytest.raises(DistillError, match="method.replan true -> false"):
        check_fingerprint(tmp_path / "r.jsonl", records, made[False]["fingerprint"], made[False]["settings"],
                          made[True], False, "records")


class ContinuingPlanner:
    """A scripted Planner for eval's sweep (a real model cannot be made to write a chosen plan): two Calculator
    steps numbered from where a replan request says to continue. It answers under the name of the model it
    stands in for, as that model's records would."""

    def __init__(self, name: str):
        self.name, self.calls = name, 0

    async def chat(self, messages, *, temperature=0.0, max_tokens=512, stop=None, seed=None) -> Completion:
        self.calls += 1
        found = re.search(r"from #E(\d+) on", messages[-1]["content"])
        k = int(found.group(1)) if found else 1
        text = plan_text(f"#E{k} = Calculator[{k} + 3]", f"#E{k + 1} = Calculator[#E{k} * 2]")
        return Completion(text, Usage(100, 10), latency_s=0.01, cost_usd=0.0, model=self.name)


def test_the_robustness_sweep_runs_each_method_at_each_rate_bounds_replans_and_resumes(
    smollm2, tmp_path, monkeypatch
) -> None:
    """`evaluate` itself with a sweep over ReWOO and ReWOO+replan: the real SmolLM2 Solver in process, the
    real Calculator, records, caches and resume; only the Planner is scripted. (ReAct's sweep rows are the
    same code path, left out here because each in-process ReAct turn costs seconds.)"""
    import distill.evaluate as ev
    from distill.report import recompute
    from distill.core.store import read_jsonl

    planners: list[ContinuingPlanner] = []

    def build(cfg, method, cache=None):
        agent = real_build(cfg, method, cache)
        if method.kind == "rewoo":
            agent.planner = ContinuingPlanner(method.spec.model)
            planners.append(agent.planner)
        return agent

    real_build = ev.build_method
    monkeypatch.setattr(ev, "build_method", build)
    spec = {"backend": "transformers", "model": "smollm2-135m-instruct", "max_tokens": 16}
    out = tmp_path / "eval"
    cfg = validate(EvalConfig, {
        "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 2}], "tools": ["Calculator"],
        "wikipedia_corpus": None, "solver": {"max_tokens": 4}, "max_replans": 2, "concurrency": 1,
        "tool_failure_seed": 7,  # at 0.3 this seed fails mini-1's second step, 4 * 2, and not its first
        "planners": [{"name": "rewoo", "prompt": "full", "spec": spec},
                     {"name": "rewoo+replan", "prompt": "full", "spec": spec, "replan": True}],
        "output_dir": str(out), "bootstrap_samples": 50,
        "robustness": {"rates": [0.3, 1.0], "methods": ["rewoo", "rewoo+replan"], "n": 1},
    })
    manifest = ev.evaluate(cfg)
    sweep = {f"{m}@fail{r}": (m, float(r)) for m in ("rewoo", "rewoo+replan") for r in ("0.3", "1")}
    names = ["rewoo", "rewoo+replan", *sweep]
    assert [m["name"] for m in manifest["methods"]] == names and manifest["status"] == "complete"
    assert all((out / "cache" / f"{name}.sqlite").exists() for name in names)
    records = {name: read_jsonl(out / "records" / f"{name}.jsonl") for name in names}
    for name, recs in records.items():
        base, rate = sweep.get(name, (name, 0.0))
        assert sorted(r["id"] for r in recs) == (["mini-1", "mini-2"] if name == base else ["mini-1"])
        for r in recs:
            assert r["method"] == name and r["tool_failure_rate"] == rate and r.get("robustness_of") == (
                None if name == base else base)
            for e in r["evidence"]:  # exactly the calls the hash picks fail, and they never reach the tool
                injected = ev.tool_fails(rate, 7, r["id"], e["tool"], e["input"])
                assert e["injected"] == injected
            assert r["llm_calls"] == 2 + len(r.get("replans", [])) and len(r.get("replans", [])) <= 2
    # rate 0: the scripted plan succeeds, so no replan; rate 1.0: every plan fails, replans stop at the bound
    assert all(r["replans"] == [] for r in records["rewoo+replan"])
    (full,), (plain,) = records["rewoo+replan@fail1"], records["rewoo@fail1"]
    assert full["llm_calls"] == 4 and [x["trigger"]["step"] for x in full["replans"]] == ["#E1", "#E3"]
    assert [e["id"] for e in full["evidence"]] == ["#E1", "#E2", "#E3", "#E4", "#E5", "#E6"]
    assert plain["llm_calls"] == 2 and len(plain["evidence"]) == 2 and "replans" not in plain
    (some,), (plain,) = records["rewoo+replan@fail0.3"], records["rewoo@fail0.3"]
    assert [e["status"] for e in plain["evidence"]] == ["ok", "error"] and plain["llm_calls"] == 2
    assert some["replans"][0]["trigger"]["step"] == "#E2" and some["evidence"][2]["id"] == "#E3"

    sizes = {name: (out / "records" / f"{name}.jsonl").stat().st_size for name in names}
    planners.clear()
    ev.evaluate(cfg)  # resumes: every record is there, so no Planner is asked anything
    assert {name: (out / "records" / f"{name}.jsonl").stat().st_size for name in names} == sizes
    assert sum(p.calls for p in planners) == 0

    results = recompute(out)
    assert results["methods"] == ["rewoo", "rewoo+replan"]
    rows = [(r["method"], r["tool_failure_rate"], r["n"], r["llm_calls_mean"]) for r in results["robustness"]["rows"]]
    assert [row[:3] for row in rows] == [(m, rate, 1) for m in ("rewoo", "rewoo+replan") for rate in (0.0, 0.3, 1.0)]
    assert rows[2][3] == 2.0 and rows[5][3] == 4.0


def test_an_unsolved_trajectory_keeps_plan_and_evidence_and_calls_no_solver() -> None:
    """generate's `solve: false`: rejection sampling by evidence needs no answer, so the Solver is never asked
    and the record has no score to mistake for a wrong answer."""
    from distill.rewoo.record import TrajectoryRecord

    agent, planner, solver, wiki, _ = agent_with([FIRST], solve=False)
    rec = run(agent)
    assert solver.prompts == [] and len(planner.prompts) == 1
    assert rec["prediction"] is None and rec["scores"] == {} and rec["llm_calls"] == 1
    assert rec["tokens"]["solver"] == 0 and [e["status"] for e in rec["evidence"]] == ["ok", "ok"]
    TrajectoryRecord.model_validate(rec)
    solved = run(agent_with([FIRST])[0])
    assert solved["scores"]["em"] == 0 and solved["prediction"] == "2850"  # the same plan, solved and scored


def test_the_filter_refuses_to_judge_answers_of_unsolved_trajectories(tmp_path) -> None:
    from distill.core.errors import DistillError
    from distill.filter import FilterConfig, run_filter
    from distill.core.store import write_jsonl

    rec = run(agent_with([FIRST], solve=False)[0])
    write_jsonl(tmp_path / "t.jsonl", [rec])
    with pytest.raises(DistillError, match=r"t.jsonl:1: no Solver answer .*criterion answer judges"):
        run_filter(tmp_path / "t.jsonl", tmp_path / "kept.jsonl", FilterConfig(criterion="answer"))
    report = run_filter(tmp_path / "t.jsonl", tmp_path / "kept.jsonl", FilterConfig(criterion="evidence"))
    assert report["input_records"] == 1  # judged on evidence; this question has no gold pages to find


def test_without_unread_steps_an_llm_step_no_other_step_reads_is_not_run_and_the_filter_keeps_the_sample(tmp_path):
    """generate's `run_unread_steps: false`: #E2 (an LLM step on #E1) is read by no other step, so it is not run
    and the record names it; #E3 (an LLM step) feeds the search #E4, and #E5 (a Calculator step) always runs. The
    filter's `evidence` criterion keeps the sample, whose every run step found evidence. A question without gold
    pages runs whole, and so does every plan whose steps a Solver or a re-plan reads."""
    from distill.core.data import Example
    from distill.core.store import write_jsonl
    from distill.filter import FilterConfig, run_filter
    from distill.rewoo.record import TrajectoryRecord

    class Echo:
        name, description = "LLM", "echo"

        def __init__(self):
            self.queries: list[str] = []

        async def run(self, query: str) -> str:
            self.queries.append(query)
            return "Rhine"

    plan = plan_text("#E1 = Wikipedia[Danube length]", "#E2 = LLM[Summarise #E1]", "#E3 = LLM[the other river]",
                     "#E4 = Wikipedia[#E3 length]", "#E5 = Calculator[2850 * 2]")
    gold = Example("g1", "hotpotqa", "train", "Which is longer, the Danube or the Rhine?", ["Danube"],
                   supporting_facts=[("Danube", 0), ("Rhine", 0)])
    wiki, calc, llm = Recorded(ScopedWikipedia(PARAGRAPHS)), Recorded(Calculator()), Echo()

    def agent(solve: bool = False, **kwargs):
        return ReWOOAgent(Scripted([plan]), Scripted(["Danube"] if solve else []),
                          lambda _: {"Wikipedia": wiki, "Calculator": calc, "LLM": llm}, TOOLS | {"LLM": "ask"},
                          planner_prompt="full", solve=solve, **kwargs)

    rec = asyncio.run(agent(run_unread_steps=False).run(gold))
    assert llm.queries == ["the other river"] and calc.queries == ["2850 * 2"]
    assert wiki.queries == ["Danube length", "Rhine length"]
    assert rec["not_run"] == ["#E2"] and [e["id"] for e in rec["evidence"]] == ["#E1", "#E3", "#E4", "#E5"]
    assert rec["evidence_recall"]["all"] is True and rec["tool_calls"] == 4
    TrajectoryRecord.model_validate(rec)
    every = asyncio.run(agent().run(gold))
    assert "not_run" not in every and len(every["evidence"]) == 5
    assert every["evidence_recall"] == rec["evidence_recall"]
    write_jsonl(tmp_path / "t.jsonl", [rec, rec | {"not_run": [], "sample": 1}])
    report = run_filter(tmp_path / "t.jsonl", tmp_path / "kept.jsonl",
                        FilterConfig(criterion="evidence", best_per_question=False))
    assert report["kept"] == 1 and report["dropped"]["step_failed"] == 1  # unnamed, a missing step is a failed one
    llm.queries.clear()
    trivia = asyncio.run(agent(run_unread_steps=False).run(Question("Which river is longer?", answers=["Danube"])))
    assert sorted(llm.queries) == ["Summarise Danube: " + PARAGRAPHS[0][1], "the other river"]
    assert trivia["not_run"] == [] and len(trivia["evidence"]) == 5
    for reads_all in ({"max_replans": 1}, {"solve": True}):  # a re-plan and the Solver read every step: all run
        rec = asyncio.run(agent(run_unread_steps=False, **reads_all).run(gold))
        assert "not_run" not in rec and len(rec["evidence"]) == 5
