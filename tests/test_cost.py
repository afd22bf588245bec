"""Money: `max_cost_usd` stops generation where its records have cost the cap and a higher cap resumes it, and a
paid endpoint without a price is refused before any call. The paid API is a stand-in OpenAI-compatible server on
127.0.0.1 (a hosted API cannot be reached from the tests) whose every reply reports the same usage, so with a
price set each call costs a known amount."""

from __future__ import annotations

import json

import pytest

from distill import cli
from distill.core.store import read_jsonl
from fakes import chat_api
from test_generate import MINI, write_config

# The stand-in reports 2 completion tokens per call: at $500k per million completion tokens a call costs $1, and
# a question (planner + solver: the plan "Paris" has no steps, so no tool runs) $2.
PRICED = {"prompt_per_mtok": 0, "completion_per_mtok": 500_000}


@pytest.fixture
def paid_api(tmp_path):
    with chat_api(adapter=str(tmp_path / "weights")) as api:
        yield api


def test_the_cost_cap_stops_generation_and_a_higher_cap_resumes_it(tmp_path, paid_api, capsys):
    spec = {"backend": "openai", "base_url": paid_api.url, "model": "planner", "max_retries": 0} | PRICED
    path = write_config(tmp_path, n=5, samples=1, planner=spec, solver=spec, tools=["Calculator"], concurrency=1,
                        max_cost_usd=3)
    out = tmp_path / "run"

    assert cli.main(["generate", "--config", str(path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar, one line
    assert last.startswith("error: run stopped: cost cap reached: the records cost $4.0000 of max_cost_usd $3"), last
    first = read_jsonl(out / "trajectories.jsonl")
    assert [r["cost_usd"] for r in first] == [2.0, 2.0]  # the record that crossed the cap is kept
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "capped" and "max_cost_usd $3" in manifest["reason"]
    assert manifest["counts"] == {"planned": 5, "done": 2, "errors": 0, "not_run": 3}
    assert paid_api.calls == 4

    assert cli.main(["generate", "--config", str(path)]) == 2  # the same cap: spent already, nothing is called
    assert paid_api.calls == 4 and len(read_jsonl(out / "trajectories.jsonl")) == 2

    capsys.readouterr()
    assert cli.main(["generate", "--config", str(path), "--set", "max_cost_usd=100"]) == 0  # not a new fingerprint
    records = read_jsonl(out / "trajectories.jsonl")
    assert records[:2] == first and sorted(r["id"] for r in records) == sorted({r["id"] for r in records})
    assert len(records) == 5 and paid_api.calls == 10  # 5 questions x 2 calls: none repeated
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_a_paid_model_without_a_price_is_refused_naming_the_setting(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DISTILL_TEST_KEY", "sk-test")
    hosted = {"backend": "openai", "base_url": "https://api.example.com/v1", "model": "some-new-model",
              "api_key_env": "DISTILL_TEST_KEY"}
    local = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "unpriced-local"}
    path = write_config(tmp_path, n=1, samples=1, planner=hosted, solver=local, tools=["Calculator"])

    assert cli.main(["generate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "planner: model 'some-new-model' at https://api.example.com/v1 has no price" in err
    assert "planner.prompt_per_mtok" in err and "solver" not in err  # a local server costs nothing
    assert not (tmp_path / "run").exists()

    # a price for it, or 0 for a free one, on the endpoint or in `prices:`, lets it through the check
    from distill.core.config import load_config
    from distill.generate import GenerateConfig
    from distill.llm import unpriced_endpoints

    for sets in (["planner.prompt_per_mtok=0"], ["prices={some-new-model: {prompt_per_mtok: 1, completion_per_mtok: 2}}"]):
        cfg = load_config(GenerateConfig, path, sets)
        assert unpriced_endpoints(cfg.endpoints(), cfg.prices) == [], sets
    # a known hosted model keeps its built-in price
    cfg = load_config(GenerateConfig, path, ["planner.model=gpt-4o-mini", "planner.base_url=null"])
    assert unpriced_endpoints(cfg.endpoints(), cfg.prices) == []


def test_the_pipeline_refuses_a_price_less_paid_planner_before_any_stage(tmp_path, monkeypatch):
    from distill.core.config import validate
    from distill.core.errors import DistillError
    from distill.pipeline import Pipeline, PipelineConfig
    from test_pipeline import ROOT, wiring_config

    monkeypatch.chdir(ROOT)
    cfg = wiring_config(tmp_path)
    cfg["eval"]["planners"]["hosted"] = {"prompt": "fewshot", "spec": {
        "backend": "openai", "base_url": "https://api.invalid/v1", "model": "new-model", "api_key_env": "X"}}
    with pytest.raises(DistillError, match=r"^eval\.planners\.hosted\.spec: model 'new-model' at https://api.invalid"
                                           r"/v1 has no price: set eval\.planners\.hosted\.spec\.prompt_per_mtok"):
        Pipeline(validate(PipelineConfig, cfg)).check()
    assert not (tmp_path / "run").exists()


def test_the_cost_cap_covers_every_method_of_an_evaluation(tmp_path, paid_api, capsys):
    import yaml

    solver = {"backend": "openai", "base_url": paid_api.url, "model": "planner", "max_retries": 0} | PRICED
    cfg = {"baselines": ["direct"], "solver": solver, "tools": ["Calculator"], "concurrency": 1,
           "datasets": [{"name": "hotpotqa", "source": str(MINI), "n": 4}], "output_dir": str(tmp_path / "eval"),
           "max_cost_usd": 2}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["eval", "--config", str(path)]) == 2  # Direct: one $1 call a question
    assert "max_cost_usd $2" in capsys.readouterr().err.strip().splitlines()[-1]
    records = tmp_path / "eval" / "records" / "direct.jsonl"
    assert len(read_jsonl(records)) == 2 and paid_api.calls == 2
    assert json.loads((tmp_path / "eval" / "manifest.json").read_text())["status"] == "capped"
    assert cli.main(["eval", "--config", str(path), "--set", "max_cost_usd=null"]) == 0
    assert len(read_jsonl(records)) == 4 and paid_api.calls == 4
