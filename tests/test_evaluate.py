"""`distill eval`: config checks, question selection, injected tool failures, endpoints, and the whole command."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from distill import cli
from distill.core.config import load_config, validate
from distill.core.errors import DistillError
from distill.evaluate import (
    EvalConfig,
    EvalRecord,
    FailingTool,
    InjectedToolFailure,
    build_method,
    evaluate,
    gold_hops,
    load_eval_examples,
    methods_of,
    tool_fails,
    with_tool_failures,
)
from distill.core.metrics import score
from distill.rewoo.plan import parse_plan
from distill.rewoo.worker import NO_EVIDENCE, run_plan
from distill.core.store import read_jsonl
from distill.tools.calculator import Calculator
from distill.tools.llm_tool import LLMTool
from distill.tools.wikipedia import ScopedWikipedia
from fakes import chat_api

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl"
TRIVIA = ROOT / "tests" / "fixtures" / "data" / "trivia.jsonl"

PLANNER = {"backend": "transformers", "model": "smollm2-135m-instruct", "max_tokens": 16}
BASE = {"datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 2}], "baselines": ["direct"]}
TWO = {"planners": [{"name": "teacher", "prompt": "fewshot", "spec": PLANNER},
                    {"name": "student", "prompt": "compact", "spec": PLANNER}]}


# ------------------------------------------------------------------------------------------------ config


# The rest of a valid evaluation record, for tests about the fields resuming compares.
RECORD_REST = {"dataset": "hotpotqa", "question": "q?", "answers": ["a"], "plan": {"valid": None, "steps": []},
               "tokens": {"planner": 0, "solver": 1, "tools": 0, "total": 1}, "llm_calls": 1, "wall_s": 0.1}


def test_config_accepts_a_list_or_a_mapping_of_planners():
    listed = validate(EvalConfig, BASE | {"planners": [{"name": "teacher", "prompt": "fewshot", "spec": PLANNER}]})
    mapped = validate(EvalConfig, BASE | {"planners": {"teacher": {"prompt": "fewshot", "spec": PLANNER}}})
    assert listed == mapped
    assert [(m.name, m.kind, m.prompt) for m in methods_of(listed)] == [
        ("teacher", "rewoo", "fewshot"), ("direct", "direct", None)
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"planners": [{"name": "a", "prompt": "fewshot", "spec": PLANNER}] * 2}, "unique; repeated: a"),
        ({"planners": [{"name": "react", "prompt": "zeroshot", "spec": PLANNER}]}, "reserved"),
        ({"planners": [{"name": "a/b", "prompt": "zeroshot", "spec": PLANNER}]}, "names a file"),
        ({"planners": [{"name": "a", "prompt": "oneshot", "spec": PLANNER}]}, "planners.0.prompt"),
        ({"baselines": ["cot"]}, "baselines.0"),
        ({"baselines": []}, "nothing to evaluate"),
        ({"planner": PLANNER}, "planner is not used by eval"),
        ({"replan": True}, "replan is not used by eval"),
        ({"tool_failure_rate": 1.5}, "tool_failure_rate"),
        ({"react_max_steps": 0}, "react_max_steps"),
        ({"robustness": {"rates": [0.3], "methods": ["teacher"]}}, "'teacher' is not a planner or baseline"),
        ({"robustness": {"rates": [0.3], "methods": ["direct"]}}, "direct calls no tools"),
        ({"robustness": {"rates": [0.0], "methods": ["react"]}}, r"0 is not in \(0, 1\] \(rate 0 is the main run\)"),
        ({"robustness": {"rates": [1.5], "methods": ["react"]}}, r"1.5 is not in \(0, 1\]"),
        ({"robustness": {"rates": [0.3, 0.3], "methods": ["react"]}}, "robustness.rates repeats"),
        ({"robustness": {"rates": [], "methods": ["react"]}}, "needs both"),
        ({"robustness": {"rates": [0.3]}}, "robustness.methods: Field required"),
        ({"robustness": {"rates": [0.3], "methods": ["react"], "n": 0}}, "robustness.n"),
        ({"robustness": {"rates": [0.3], "methods": ["react"], "every": 2}}, "robustness.every"),
        ({"tool_failure_rate": 1.0, "robustness": {"rates": [0.3, 1.0], "methods": ["react"]}},
         "1 is the main run's tool_failure_rate"),
        (TWO | {"prompt_budget": {"reference": "teacher", "methods": ["react"], "max_prompt_fraction": 0.2}},
         "'react' is not a planner of this config"),
        (TWO | {"prompt_budget": {"reference": "gone", "methods": ["student"], "max_prompt_fraction": 0.2}},
         "'gone' is not a planner"),
        (TWO | {"prompt_budget": {"reference": "teacher", "methods": [], "max_prompt_fraction": 0.2}},
         "name at least one planner"),
        (TWO | {"prompt_budget": {"reference": "teacher", "methods": ["student"] * 2, "max_prompt_fraction": 0.2}},
         "prompt_budget.methods repeats"),
        (TWO | {"prompt_budget": {"reference": "teacher", "methods": ["teacher"], "max_prompt_fraction": 0.2}},
         "'teacher' is the reference"),
        (TWO | {"prompt_budget": {"reference": "teacher", "methods": ["student"], "max_prompt_fraction": 0}},
         "prompt_budget.max_prompt_fraction"),
        (TWO | {"prompt_budget": {"reference": "teacher", "methods": ["student"]}}, "max_prompt_fraction: Field"),
    ],
)
def test_config_errors_are_one_line_distill_errors(extra, message):
    with pytest.raises(DistillError, match=message) as info:
        validate(EvalConfig, BASE | {"baselines": ["react", "direct"]} | extra)
    assert "\n" not in str(info.value)


def test_shipped_configs_load_with_openai_planners():
    demo = load_config(EvalConfig, ROOT / "configs" / "eval_smollm2_cpu.yaml")
    assert [m.name for m in methods_of(demo)] == [
        "teacher", "teacher+replan", "student", "base", "react", "direct", "teacher@fail0.3", "teacher@fail1",
        "teacher+replan@fail0.3", "teacher+replan@fail1", "student@fail0.3", "student@fail1", "react@fail0.3",
        "react@fail1",
    ]
    student = next(p for p in demo.planners if p.name == "student")
    assert student.spec.backend == "openai" and student.spec.model == "planner" and student.prompt == "compact"
    real = load_config(EvalConfig, ROOT / "configs" / "eval_hotpot_trivia_7b.yaml")
    assert [d.n for d in real.datasets] == [500, 500] and real.solver.api_key_env == "OPENAI_API_KEY"
    assert next(p for p in real.planners if p.name == "student").spec.base_urls == ["http://127.0.0.1:8000/v1"]
    first = (ROOT / "configs" / "eval_hotpot_trivia_7b.yaml").read_text().splitlines()[0]
    assert first.startswith("# ") and "distill eval --config configs/eval_hotpot_trivia_7b.yaml" in first


def test_the_sweep_adds_each_method_at_each_rate_on_its_first_n_questions_per_dataset():
    from distill.evaluate import examples_for

    cfg = validate(EvalConfig, BASE | {
        "planners": [{"name": "teacher", "prompt": "fewshot", "spec": PLANNER},
                     {"name": "teacher+replan", "prompt": "fewshot", "spec": PLANNER, "replan": True}],
        "baselines": ["react", "direct"],
        "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 3},
                     {"name": "triviaqa", "source": str(TRIVIA), "split": "dev", "n": 2}],
        "robustness": {"rates": [0.3, 1.0], "methods": ["teacher+replan", "react"], "n": 2},
    })
    methods = methods_of(cfg)
    assert [(m.name, m.tool_failure_rate, m.robustness_of) for m in methods] == [
        ("teacher", 0.0, None), ("teacher+replan", 0.0, None), ("react", 0.0, None), ("direct", 0.0, None),
        ("teacher+replan@fail0.3", 0.3, "teacher+replan"), ("teacher+replan@fail1", 1.0, "teacher+replan"),
        ("react@fail0.3", 0.3, "react"), ("react@fail1", 1.0, "react"),
    ]
    swept = methods[5]  # the same row as its main run but for name and rate
    assert (swept.kind, swept.prompt, swept.spec, swept.replan) == ("rewoo", "fewshot", cfg.planners[1].spec, True)
    examples = load_eval_examples(cfg)
    assert examples_for(cfg, methods[0], examples) == examples
    assert [(e.dataset, e.id) for e in examples_for(cfg, swept, examples)] == [
        (e.dataset, e.id) for e in examples[:2] + examples[3:5]
    ]
    everything = cfg.model_copy(update={"robustness": cfg.robustness.model_copy(update={"n": None})})
    assert examples_for(everything, swept, examples) == examples


def test_an_openai_planner_is_wired_to_its_server_and_says_when_it_is_unreachable():
    from distill.llm.openai_backend import OpenAIChat
    from distill.serving.serve import free_port

    port = free_port()
    spec = {"backend": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "model": "planner", "max_retries": 0,
            "timeout_s": 5}
    cfg = validate(EvalConfig, BASE | {"planners": [{"name": "student", "prompt": "zeroshot", "spec": spec}],
                                       "solver": spec | {"model": "smollm2-135m-instruct"}, "tools": ["Calculator"]})
    agent = build_method(cfg, methods_of(cfg)[0])
    assert isinstance(agent.planner, OpenAIChat) and agent.planner.name == "planner" and agent.planner_prompt == "full"
    assert agent.planner._urls == [f"http://127.0.0.1:{port}/v1"]
    assert agent.method == "student"
    example = load_eval_examples(cfg)[0]
    with pytest.raises(DistillError, match="cannot reach"):
        asyncio.run(agent.run(example))


def test_every_method_comes_from_the_one_agent_factory_with_the_same_tools():
    """ReWOO rows and both baselines are built by `build_agent`: tool names canonical, the same per-question
    tools, eval's injected failures wrapped around them; a bad kind is refused."""
    from distill.agent.factory import build_agent
    from distill.agent.baselines import DirectAgent, ReActAgent
    from distill.rewoo.agent import ReWOOAgent
    from distill.tools.registry import TOOL_DESCRIPTIONS

    spec = {"backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m", "max_retries": 0}
    cfg = validate(EvalConfig, BASE | {
        "planners": [{"name": "student", "prompt": "zeroshot", "spec": spec}], "baselines": ["react", "direct"],
        "solver": spec, "tools": ["calculator"], "tool_failure_rate": 1.0, "react_max_steps": 3,
    })
    student, react, direct = (build_method(cfg, m) for m in methods_of(cfg))
    assert isinstance(student, ReWOOAgent) and isinstance(react, ReActAgent) and isinstance(direct, DirectAgent)
    assert student.tool_descriptions == react.tool_descriptions == {"Calculator": TOOL_DESCRIPTIONS["Calculator"]}
    assert react.max_steps == 3 and (react.method, direct.method) == ("react", "direct")
    example = load_eval_examples(cfg)[0]
    for agent in (student, react):
        tools = agent.tools_for(example)
        assert list(tools) == ["Calculator"] and isinstance(tools["Calculator"], FailingTool)
    with pytest.raises(DistillError, match="unknown agent kind"):
        build_agent(cfg, kind="cot")


# --------------------------------------------------------------------------------------------- questions


def test_first_n_questions_in_file_order_and_gold_hops():
    cfg = validate(EvalConfig, BASE | {"datasets": [
        {"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 3},
        {"name": "triviaqa", "source": str(TRIVIA), "split": "dev", "n": 1},
    ]})
    examples = load_eval_examples(cfg)
    file_ids = [json.loads(line)["_id"] for line in MINI.read_text().splitlines()[:3]]
    assert [e.id for e in examples[:3]] == file_ids
    assert [gold_hops(e) for e in examples] == [2, 2, 2, None]
    assert examples[3].dataset == "triviaqa"


def test_asking_for_more_questions_than_a_file_has_is_an_error():
    cfg = validate(EvalConfig, BASE | {"datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 99}]})
    with pytest.raises(DistillError, match="n=99"):
        load_eval_examples(cfg)


def test_the_same_file_twice_is_refused_because_ids_key_the_records():
    ds = {"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 1}
    with pytest.raises(DistillError, match="occurs twice"):
        load_eval_examples(validate(EvalConfig, BASE | {"datasets": [ds, ds]}))


def test_the_prompt_budget_is_off_by_default_and_the_manifest_carries_it_to_the_report(tmp_path, monkeypatch):
    import distill.evaluate as ev
    from distill.report import recompute

    assert validate(EvalConfig, BASE | TWO).prompt_budget is None
    budget = {"reference": "teacher", "methods": ["student"], "max_prompt_fraction": 0.25}
    cfg = validate(EvalConfig, BASE | TWO | {"output_dir": str(tmp_path / "eval"), "prompt_budget": budget})
    monkeypatch.setattr(ev, "run_method", lambda *args: None)  # the manifest, not the models, is under test
    assert ev.evaluate(cfg)["prompt_budget"] == budget
    manifest = json.loads((tmp_path / "eval" / "manifest.json").read_text())
    assert manifest["prompt_budget"] == budget

    from test_report import planner_rows
    from distill.core.store import write_jsonl

    write_jsonl(tmp_path / "eval" / "records" / "teacher.jsonl", planner_rows("teacher", "fewshot", 400, ("Alpha",)))
    write_jsonl(tmp_path / "eval" / "records" / "student.jsonl", planner_rows("student", "compact", 100, ("Alpha",)))
    manifest["examples"] = [["hotpotqa", f"q{i}"] for i in range(4)]
    (tmp_path / "eval" / "manifest.json").write_text(json.dumps(manifest))
    got = recompute(tmp_path / "eval")["prompt_budget"]
    assert got["max_prompt_fraction"] == 0.25 and got["rows"]["student"]["met"] is True


def made_by(cfg: EvalConfig, monkeypatch) -> None:
    """The folder a finished run with `cfg` leaves: its manifest, and a record per method carrying that run's
    fingerprint. The records' content is not under test, so no model runs."""
    import distill.evaluate as ev
    from distill.core.store import write_jsonl

    def one_record(cfg, method, examples, out, errors, runs, fp=None, tracker=None, cap=None):
        planner = {"model": "m"} if method.kind == "rewoo" else None  # a record the schema accepts
        record = {"method": method.name, "id": "mini-1", "kind": method.kind, "planner": planner,
                  "tool_failure_rate": method.tool_failure_rate, "fingerprint": fp} | RECORD_REST
        write_jsonl(ev.records_path(out, method), [record])

    with monkeypatch.context() as m:
        m.setattr(ev, "run_method", one_record)
        ev.evaluate(cfg)


@pytest.mark.parametrize("change, differs", [
    ({"seed": 1}, "seed 0 -> 1"),
    ({"tools": ["Wikipedia", "Calculator"]}, 'tools ["Wikipedia", "LLM", "Calculator"] -> ["Wikipedia", "Calculator"]'),
    ({"max_plan_steps": 3}, "max_plan_steps 6 -> 3"),
    ({"wikipedia_scope": "question"}, "wikipedia_scope corpus -> question"),
    ({"wikipedia_corpus": str(MINI)}, "wikipedia_corpus data/demo/corpus.jsonl -> "),
    ({"judge": PLANNER}, "judge.backend unset -> transformers"),
    ({"tool_failure_rate": 1.0}, "method.tool_failure_rate 0.0 -> 1.0"),
    ({"planners": [TWO["planners"][0] | {"prompt": "full"}, TWO["planners"][1]]}, "method.prompt fewshot -> full"),
])
def test_resuming_into_a_run_made_with_other_settings_is_refused_before_any_model_loads(tmp_path, monkeypatch,
                                                                                         change, differs):
    from distill.evaluate import evaluate

    monkeypatch.chdir(ROOT)
    out = tmp_path / "eval"
    made_by(validate(EvalConfig, BASE | TWO | {"output_dir": str(out)}), monkeypatch)
    manifest = (out / "manifest.json").read_text()
    cfg = validate(EvalConfig, BASE | TWO | {"output_dir": str(out)} | change)
    with pytest.raises(DistillError, match=r"teacher.jsonl holds teacher records made with other settings \(") as err:
        evaluate(cfg)
    assert differs in str(err.value) and "--fresh" in str(err.value)
    assert (out / "manifest.json").read_text() == manifest  # refused before anything was touched


def test_more_questions_resume_and_fresh_sets_aside_only_the_methods_made_otherwise(tmp_path, monkeypatch):
    import distill.evaluate as ev

    monkeypatch.chdir(ROOT)
    out = tmp_path / "eval"
    first = validate(EvalConfig, BASE | TWO | {"output_dir": str(out)})
    made_by(first, monkeypatch)
    more = validate(EvalConfig, BASE | TWO | {"output_dir": str(out), "datasets": [BASE["datasets"][0] | {"n": 3}]})
    methods = ev.methods_of(more)
    ev.preflight(more, methods, out, ev.run_fingerprints(more, methods), fresh=False)  # more questions only add

    other = BASE | {"planners": [TWO["planners"][0] | {"spec": PLANNER | {"max_tokens": 8}}, TWO["planners"][1]]}
    cfg = validate(EvalConfig, other | {"output_dir": str(out)})
    kept = (out / "records" / "teacher.jsonl").read_text()
    ev.preflight(cfg, methods := ev.methods_of(cfg), out, ev.run_fingerprints(cfg, methods), fresh=True)
    assert not (out / "records" / "teacher.jsonl").exists()
    assert [p.read_text() for p in (out / "records").glob("teacher.jsonl.before-*")] == [kept]
    assert (out / "records" / "student.jsonl").exists() and (out / "records" / "direct.jsonl").exists()


def test_each_rewoo_record_carries_its_plans_duplicate_steps_and_the_report_shows_their_mean(tmp_path, monkeypatch):
    """A whole `evaluate` with a stand-in OpenAI server whose planner asks the Calculator the same sum twice (in
    other spacing and tool case) and another once: each ReWOO record stores 1 duplicate step, the schema reads it
    back, Direct's records have none to store, and the report's Planner table shows 1.00 for the row."""
    from distill.report import write_report

    monkeypatch.chdir(ROOT)
    plan = ("Plan: add.\n#E1 = Calculator[2 + 2]\nPlan: add again.\n#E2 = calculator[ 2  +  2 ]\n"
            "Plan: multiply.\n#E3 = Calculator[3 * 3]\n")
    with chat_api(reply=plan) as api:
        spec = {"backend": "openai", "base_url": api.url, "model": "base", "max_retries": 0}
        out = tmp_path / "eval"
        cfg = validate(EvalConfig, BASE | {"output_dir": str(out), "tools": ["Calculator"], "solver": spec,
                                           "planners": [{"name": "student", "prompt": "compact", "spec": spec}]})
        evaluate(cfg)
    student = read_jsonl(out / "records" / "student.jsonl", EvalRecord)
    direct = read_jsonl(out / "records" / "direct.jsonl", EvalRecord)
    assert len(student) == 2 and [r["duplicate_steps"] for r in student] == [1, 1]
    assert [e["status"] for e in student[0]["evidence"]] == ["ok", "ok", "ok"]  # the Worker ran the repeat too
    assert all(r.get("duplicate_steps") is None for r in direct)
    results = write_report(out)
    assert results["per_method"]["student"]["duplicate_steps_mean"] == 1.0
    assert results["per_method"]["direct"]["duplicate_steps_mean"] is None
    assert "| 1.00 |" in (out / "report.md").read_text().split("## The Planner apart from the Solver")[1]


def test_an_eval_record_written_before_duplicate_steps_existed_still_reads():
    record = {"method": "student", "id": "mini-1", "kind": "rewoo", "planner": {"model": "m"}} | RECORD_REST
    assert EvalRecord.model_validate(record).duplicate_steps is None
    with pytest.raises(ValueError, match="duplicate_steps"):
        EvalRecord.model_validate(record | {"duplicate_steps": -1})


@contextlib.contextmanager
def served_planner(root: Path):
    """A stand-in for vLLM's /v1/models serving the LoRA module `planner` from `root` (as vLLM reports where its
    weights are); yields the endpoint spec a planner row uses."""
    with chat_api(adapter=str(root)) as api:
        yield {"backend": "openai", "base_url": api.url, "model": "planner", "max_retries": 0}


def test_eval_refuses_a_folder_whose_served_adapter_was_retrained(tmp_path, monkeypatch, capsys):
    """The weights behind a served LoRA name are part of what a record was made from (a stand-in for vLLM's
    /v1/models tells where they are, as vLLM does). On the command line: one line, exit 2."""
    from test_openai_backend import _save_adapter

    monkeypatch.chdir(ROOT)
    with served_planner(tmp_path / "adapter") as served:
        out = tmp_path / "eval"
        cfg = BASE | {"output_dir": str(out), "baselines": [],
                      "planners": [{"name": "student", "prompt": "full", "spec": served}]}
        _save_adapter(tmp_path / "adapter", seed=0)
        made_by(validate(EvalConfig, cfg), monkeypatch)
        _save_adapter(tmp_path / "adapter", seed=1)  # retrained, served again as `planner`
        path = tmp_path / "eval.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert cli.main(["eval", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "student.jsonl holds student records made with other settings" in err, err
    assert "method.planner.serves.servers" in err


def test_eval_refuses_a_prompt_the_served_adapter_was_not_trained_on(tmp_path, monkeypatch, capsys):
    """The served LoRA module's folder (vLLM's /v1/models root) holds the adapter's own record: a row asking it
    with another prompt kind or tool list is one line naming both, exit 2, before any record is made."""
    from distill.tools.registry import tool_descriptions
    from test_openai_backend import _save_adapter

    monkeypatch.chdir(ROOT)
    _save_adapter(tmp_path / "adapter", seed=0)
    (tmp_path / "adapter" / "distill_adapter.json").write_text(json.dumps({
        "format_version": 2, "student_prompt": "compact", "tools": tool_descriptions(["Wikipedia", "LLM"])}))
    with served_planner(tmp_path / "adapter") as served:
        out = tmp_path / "eval"
        cfg = BASE | {"output_dir": str(out), "baselines": [], "tools": ["Wikipedia", "LLM"],
                      "planners": [{"name": "student", "prompt": "full", "spec": served}]}
        path = tmp_path / "eval.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert cli.main(["eval", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert "eval planner student asks adapter" in err and "planner prompt full and tools Wikipedia, LLM" in err
        assert "trained on prompt compact with tools Wikipedia, LLM" in err
        assert not list(out.glob("records/*.jsonl"))

        path.write_text(yaml.safe_dump(cfg | {"tools": ["Wikipedia", "LLM", "Calculator"],
                                              "planners": [cfg["planners"][0] | {"prompt": "compact"}]}))
        assert cli.main(["eval", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert "planner prompt compact and tools Wikipedia, LLM, Calculator" in err, err


# ----------------------------------------------------------------------------------------- tool failures


def real_tools() -> dict:
    """Calculator, a scoped Wikipedia, and an LLM tool with no model: if it were ever called it would fail
    with an AttributeError, so an injected failure must be what stops it."""
    wiki = ScopedWikipedia([("Carmen", "Carmen is an opera by Georges Bizet."), ("Aida", "Aida is by Verdi.")])
    return {"Calculator": Calculator(), "Wikipedia": wiki, "LLM": LLMTool(None)}


PLAN = parse_plan(
    "Plan: a\n#E1 = Wikipedia[Carmen]\nPlan: b\n#E2 = Calculator[2 + 3]\nPlan: c\n#E3 = LLM[Who wrote #E1?]\n"
    "Plan: d\n#E4 = Calculator[#E2 * 2]"
)


def test_rate_one_makes_every_evidence_no_evidence_found():
    tools = with_tool_failures(real_tools(), 1.0, 0, "q1")
    evidence = asyncio.run(run_plan(PLAN, tools))
    assert len(evidence) == 4
    assert all(e.output == NO_EVIDENCE and e.status == "error" for e in evidence)
    assert all(e.injected and e.to_dict()["injected"] is True for e in evidence)  # the record's field
    assert tools["LLM"].calls == []  # delegated attribute; the model was never called
    assert sum(t.injected for t in tools.values()) == 4


def test_rate_zero_leaves_the_tools_alone():
    tools = real_tools()
    wrapped = with_tool_failures(tools, 0.0, 0, "q1")
    assert all(wrapped[name] is tools[name] for name in tools)
    plan = parse_plan("Plan: x\n#E1 = Calculator[6 * 7]\nPlan: y\n#E2 = Calculator[1 / 0]")
    out = asyncio.run(run_plan(plan, wrapped))
    assert out[0].output == "42" and out[0].status == "ok" and not out[0].injected
    assert out[1].status == "error" and not out[1].injected  # the tool's own failure is not an injected one


def test_rate_point_three_is_deterministic_and_about_right():
    queries = [f"{i} + 1" for i in range(400)]

    async def outcomes(seed: int, example_id: str) -> list[str]:
        tool = FailingTool(Calculator(), 0.3, seed, example_id)
        results = []
        for q in queries:
            try:
                results.append(await tool.run(q))
            except InjectedToolFailure:
                results.append(NO_EVIDENCE)
        return results

    first = asyncio.run(outcomes(0, "q1"))
    assert first == asyncio.run(outcomes(0, "q1"))  # reproducible
    failed = first.count(NO_EVIDENCE)
    assert 0.22 < failed / len(queries) < 0.38
    assert all(out == str(i + 1) for i, out in enumerate(first) if out != NO_EVIDENCE)
    assert asyncio.run(outcomes(1, "q1")) != first  # the seed matters
    assert asyncio.run(outcomes(0, "q2")) != first  # and so does the example
    decisions = Counter(tool_fails(0.3, 0, "q1", "Calculator", q) for q in queries)
    assert decisions[True] == failed


def test_the_same_call_fails_for_every_method():
    """Two tool sets built for the same question (two methods) fail the same calls."""
    a = with_tool_failures(real_tools(), 0.5, 9, "q7")
    b = with_tool_failures(real_tools(), 0.5, 9, "q7")
    plan = parse_plan("\n".join(f"Plan: p\n#E{i} = Calculator[{i} * 3]" for i in range(1, 41)))
    out_a = [e.output for e in asyncio.run(run_plan(plan, a))]
    out_b = [e.output for e in asyncio.run(run_plan(plan, b))]
    assert out_a == out_b and NO_EVIDENCE in out_a and any(o != NO_EVIDENCE for o in out_a)


# --------------------------------------------------------------------------------------- end to end


RECORD_FIELDS = {
    "format_version", "id", "dataset", "question", "answers", "method", "sample", "planner", "plan", "evidence",
    "solver", "prediction", "scores", "tokens", "cost_usd", "wall_s", "llm_calls", "tool_calls", "kind",
    "gold_hops", "tool_failure_rate",
}
METHOD_FIELDS = {
    "kind", "n", "em", "f1", "judge", "plan_valid_rate", "steps_mean", "tool_calls_mean", "llm_calls_mean",
    "tokens_mean", "planner_prompt_tokens_mean", "cost_per_question_usd", "cost_per_correct_usd", "latency_s",
    "by_dataset", "hops_mean",
}


def write_eval_config(tmp_path: Path, base_url: str) -> Path:
    spec = {"backend": "openai", "base_url": base_url, "model": "smollm2-135m-instruct", "max_tokens": 32}
    cfg = {
        "planners": [{"name": "teacher", "prompt": "fewshot", "spec": spec},
                     {"name": "base", "prompt": "zeroshot", "spec": spec}],
        "baselines": ["react", "direct"],
        "solver": spec | {"max_tokens": 8},
        "tools": ["Wikipedia", "LLM"],
        "wikipedia_scope": "question",
        "wikipedia_corpus": None,
        "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "dev", "n": 2}],
        "output_dir": str(tmp_path / "eval"),
        "concurrency": 4,
        "react_max_steps": 2,
        "react_max_tokens": 24,
        "tool_failure_rate": 0.3,
        "bootstrap_samples": 200,
        "prompt_budget": {"reference": "teacher", "methods": ["base"], "max_prompt_fraction": 0.9},
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_distill_eval_end_to_end_recomputes_and_resumes(tmp_path, capsys, vllm_server):
    from distill.report import recompute

    config = write_eval_config(tmp_path, vllm_server.base_url)
    assert cli.main(["eval", "--config", str(config)]) == 0
    out = tmp_path / "eval"
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == [f"records: {out / 'records'}", f"next: distill report {out}"]
    assert not (out / "results.json").exists()  # evaluation writes records; the report is its own stage
    assert cli.main(["report", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == f"report: {out / 'report.md'}" and lines[-1] == f"results: {out / 'results.json'}"

    methods = ["teacher", "base", "react", "direct"]
    records = {m: read_jsonl(out / "records" / f"{m}.jsonl") for m in methods}
    for m, recs in records.items():
        assert sorted(r["id"] for r in recs) == ["mini-1", "mini-2"] and {r["method"] for r in recs} == {m}
        for r in recs:
            assert RECORD_FIELDS <= set(r), RECORD_FIELDS - set(r)
            expected = score(r["dataset"], r["prediction"], r["answers"])
            assert (r["scores"]["em"], r["scores"]["f1"]) == (expected["em"], expected["f1"])
            assert r["tokens"]["total"] == r["tokens"]["planner"] + r["tokens"]["solver"] + r["tokens"]["tools"]
            assert r["tool_failure_rate"] == 0.3 and r["gold_hops"] == 2
    assert all(r["planner"] is None and r["plan"]["steps"] == [] for r in records["direct"])
    assert all(r["llm_calls"] == 1 for r in records["direct"])
    assert all(1 <= len(r["react"]["steps"]) <= 2 for r in records["react"])
    prompt_tokens = {m: [r["planner"]["usage"]["prompt_tokens"] for r in records[m]] for m in ("teacher", "base")}
    assert min(prompt_tokens["teacher"]) > max(prompt_tokens["base"])  # the few-shot prompt is longer

    results = json.loads((out / "results.json").read_text())
    assert results == recompute(out)
    assert results["methods"] == methods and results["reference"] == "teacher"
    for m in methods:
        assert METHOD_FIELDS <= set(results["per_method"][m])
        assert results["per_method"][m]["n"] == 2
    assert set(results["paired"]) == {"base", "react", "direct"}
    assert all({"em", "f1", "n"} <= set(p) for p in results["paired"].values())
    assert results["per_method"]["teacher"]["planner_prompt_tokens_mean"] == sum(prompt_tokens["teacher"]) / 2
    assert list(results["prompt_budget"]["rows"]) == ["base"]  # eval's setting, through the manifest
    assert set(results["tokens_by_hops"]) == set(methods) and results["tokens_by_gold_hops"]["react"]["2"]["n"] == 2
    for name in results["plots"].values():
        assert (out / name).stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert all(f"]({name})" in report for name in results["plots"].values())

    sizes = {m: (out / "records" / f"{m}.jsonl").stat().st_size for m in methods}
    assert cli.main(["eval", "--config", str(config)]) == 0  # resumes: every record is already there
    assert {m: (out / "records" / f"{m}.jsonl").stat().st_size for m in methods} == sizes
    assert cli.main(["report", str(out)]) == 0
    assert json.loads((out / "results.json").read_text()) == results
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"

