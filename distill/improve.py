"""After SFT: the student improves on its own plans, scored by the real Worker (expert iteration).

    distill improve --config configs/improve_smollm2_cpu.yaml [--set rounds=2] [--fresh]

Imitation of filtered teacher plans is the weakest way to train a planner (Search-R1, AgentFlow); a ReWOO
Planner writes its whole plan in one generation, so improving it is a single-turn problem the Worker can score
without a Solver call (`distill.agent.reward`). Each round serves the current adapter as the vLLM LoRA module
`policy`, samples `samples_per_question` plans per training question from the student's own prompt, scores each
with the planner reward, keeps the best plan of each question whose reward reaches `min_reward`, builds SFT
examples from them with the one prompt builder (`distill sft-data`'s own code) and continues training the same
adapter from its weights (`train.init_adapter`) for the few steps `train` says. Round i lives in `round_<i>/`:
`samples.jsonl` (every plan with its reward and the reward's parts), `kept.jsonl`, `sft-data/`, `adapter/`,
`summary.json` (mean reward, kept, reward by part) and `DONE.json`. The last round's adapter is the result.

Resumable like every stage: samples are appended as they are scored (a SIGKILLed run redoes only what was in
flight), training restarts from its last checkpoint, a finished round is skipped when its settings and its
starting adapter are unchanged. The leak guard holds: no question of `eval_sets` is ever sampled.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import statistics
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from distill import code_version
from distill.agent.factory import make_tools_for
from distill.agent.reward import REWARD_PARTS, RewardConfig, score_plan
from distill.core import layout, stage
from distill.core.check import gpu_count, show_config
from distill.core.config import AgentConfig, fill_server, read_json_model, validate
from distill.core.data import DatasetSource
from distill.core.errors import DistillError
from distill.core.run import (check_fingerprint, fingerprint, folder_lock, run_records, set_aside, settings_of,
                              source_digests)
from distill.core.store import CallCache, JsonlStore, read_jsonl, write_json, write_jsonl
from distill.generate import load_questions
from distill.llm import build_chat
from distill.llm.base import weights_fingerprint
from distill.rewoo.plan import parse_plan
from distill.rewoo.prompts import planner_messages
from distill.rewoo.record import TrajectoryRecord, call_record, sample_seed
from distill.rewoo.worker import WorkerConfig
from distill.serving.serve import ServeConfig, VLLMServer, read_adapter
from distill.sft_data import SftDataConfig, build_sft_data
from distill.tools.registry import tool_descriptions
from distill.train import GRPORun, is_main_process, parse_grpo_config, parse_train_section, train, world_size
from distill.training.launch import launch, launch_command
from distill.training.merge import ADAPTER_INFO, check_as_trained, training_record

POLICY = "policy"  # the LoRA module name the round's adapter is served under
SAMPLES, KEPT, DONE = "samples.jsonl", "kept.jsonl", "DONE.json"


class SampleRecord(TrajectoryRecord):
    """One sampled plan of one round, scored: a trajectory record (no Solver call) with its reward."""

    round: int = Field(ge=1)
    reward: float
    reward_parts: dict[str, float | None]
    fingerprint: str


class RoundMarker(BaseModel):
    """`round_<i>/DONE.json` (a finished round) and `settings.json` (what its samples are made from)."""

    model_config = ConfigDict(extra="forbid")
    fingerprint: str
    settings: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None


class ImproveConfig(AgentConfig):
    """The inherited planner is the policy's sampling settings (temperature, max_tokens; with `server` its
    address and model are the round's own); `planner_prompt` must be the prompt the student was trained on."""

    method: Literal["expert_iteration", "grpo"] = "expert_iteration"
    """expert_iteration: rounds of sampling plans, keeping each question's best and training on them (any machine);
    grpo: TRL's GRPOTrainer with the planner reward (GPUs)"""
    adapter: str
    """the SFT student's adapter folder: round 1 starts from it"""
    datasets: list[DatasetSource] = Field(default_factory=list)
    """the training questions (never eval questions)"""
    eval_sets: list[DatasetSource] = Field(default_factory=list)
    """leak guard: train questions also found in these sets are refused (or excluded)"""
    leak_policy: Literal["refuse", "exclude"] = "refuse"
    """refuse: stop when a train question is in eval_sets; exclude: draw around them"""
    output_dir: str = "runs/improve"
    """where each round's folder (round_<i>/) or grpo/ goes"""
    seed: int = Field(default=0, ge=0)
    """seed of question sampling and plan sampling"""
    rounds: int = Field(default=1, ge=1, le=20)
    """expert-iteration rounds (grpo: 1)"""
    samples_per_question: int = Field(default=4, ge=1, le=64)
    """plans sampled per question per round (grpo: num_generations unless grpo sets it)"""
    min_reward: float = Field(default=0.5, ge=0, le=20)
    """a question's best plan is kept from this reward up (the most a plan earns is valid_weight + ran_weight +
    recall_weight, 1.4 with the default weights)"""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """the planner reward's weights (see RewardConfig)"""
    server: dict[str, Any] | None = None
    """ServeConfig keys: a vLLM server per round serving the adapter as `policy`; null: the planner's own endpoint"""
    train: dict[str, Any] = Field(default_factory=dict)
    """TrainConfig keys of the continued training"""
    val_fraction: float = Field(default=0.0, ge=0, lt=1)
    """share of the kept questions held out for the round's eval loss"""
    concurrency: int = Field(default=4, ge=1)
    """questions sampled and scored at once"""
    grpo: dict[str, Any] = Field(default_factory=dict)
    """method grpo: TRL's GRPOConfig keys (max_steps, num_generations, max_completion_length, beta, use_vllm, ...)"""
    RENAMED = {"samples": "samples_per_question"}  # generate's name for the same setting, so both stages say one

    def endpoints(self) -> dict:
        """The models a run calls: the policy's endpoint (expert iteration without `server`; with it, each round's
        own server; GRPO samples in its own process) and the LLM tool's model when the tools have LLM."""
        out = {"planner": self.planner} if self.method == "expert_iteration" and self.server is None else {}
        if "LLM" in self.tools:
            out |= {"llm_tool": self.llm_tool} if self.llm_tool is not None else {"solver": self.solver}
        return out

    @model_validator(mode="after")
    def _check(self) -> "ImproveConfig":
        if self.method == "grpo" and self.rounds != 1:
            raise ValueError("method grpo is one TRL GRPO run (its length is grpo.max_steps): leave rounds at 1")
        if self.method == "expert_iteration" and self.grpo:
            raise ValueError("grpo: settings of method grpo, but method is expert_iteration")
        if self.rounds > 1 and self.server is None and self.method == "expert_iteration":
            raise ValueError("rounds > 1 needs `server` (each round serves the adapter the last one trained); "
                             "without it the planner endpoint would keep serving round 1's")
        return self


def final_adapter(cfg: ImproveConfig) -> Path:
    """Where the improved adapter will be: the last round's, or the GRPO run's."""
    out = Path(cfg.output_dir)
    return (out / layout.GRPO if cfg.method == "grpo" else layout.round_dir(out, cfg.rounds)) / layout.ADAPTER


def record_key(rec: dict) -> tuple[str, int]:
    return (rec["id"], rec["sample"])


# what to do about a missing `adapter`: improve continues one, it cannot start without
NO_ADAPTER = "improve continues the SFT student's adapter: train one with `distill train` and set adapter to its " \
             "output_dir"


def check_prompt_as_trained(cfg: ImproveConfig) -> None:
    """improve samples the student's plans: from the prompt kind and tool list it was trained on, as its own
    distill_adapter.json says, or every round learns from plans to a prompt it will never be served."""
    check_as_trained(cfg.adapter, cfg.planner_prompt, tool_descriptions(cfg.tools), "improve")


def inherit_record(cfg: ImproveConfig, adapter_in: str | Path, adapter_out: Path, how: str) -> None:
    """The improved adapter's distill_adapter.json: what its own training wrote (a round's plans were the
    student's, so its sft-data names the policy as teacher), with the SFT student's teacher, datasets and
    training size kept, and where it came from: the report and the card still say which teacher it was
    distilled from, and how many examples in all it learnt from."""
    before, own = training_record(adapter_in), training_record(adapter_out)
    round_examples = own.get("train_examples")
    keep = {k: before.get(k) for k in ("teacher", "datasets", "train_questions", "validation_examples")}
    total = before.get("train_examples")
    write_json(adapter_out / ADAPTER_INFO, own | {
        "format_version": 2, "base_model": own.get("base_model") or before.get("base_model"),
        "student_prompt": cfg.planner_prompt, "tools": tool_descriptions(cfg.tools), **keep,
        "train_examples": total + round_examples if isinstance(total, int) and isinstance(round_examples, int)
        else total,
        "improved": {"from": str(adapter_in), "how": how, "examples": round_examples},
        "code_version": code_version()})


def base_model_of(adapter: str) -> str:
    info = read_adapter(adapter, NO_ADAPTER)
    if not info.base_model:
        raise DistillError(f"adapter {adapter}: it does not say which base model it was trained on")
    return info.base_model


def round_settings(cfg: ImproveConfig, adapter_in: str) -> dict:
    """What a round is made from: the settings but the round count and folders, the starting adapter's
    weights, the input files."""
    data = settings_of(cfg.first_named_dump(exclude={"rounds", "eval_sets", "leak_policy", "adapter"}))
    return data | {"adapter_weights": weights_fingerprint(adapter_in),
                   "inputs": source_digests([ds.source for ds in cfg.datasets] + [cfg.wikipedia_corpus])}


def sample_round(cfg: ImproveConfig, i: int, spec, examples: list, out: Path, fp: str, cache) -> Any:
    """Sample and score every (question, k) missing from the round's samples file."""
    descriptions = tool_descriptions(cfg.tools)
    policy = build_chat(spec, cfg.prices, cache)
    llm_tool = build_chat(cfg.llm_tool or cfg.solver, cfg.prices, cache)
    tools_for = make_tools_for(cfg, llm_tool, cache)
    worker = WorkerConfig(cfg.worker_max_concurrency, cfg.tool_timeout_s, cfg.evidence_max_chars)
    reward_cfg = cfg.reward.model_copy(update={"max_plan_steps": min(cfg.reward.max_plan_steps, cfg.max_plan_steps)})

    async def work(item) -> dict:
        example, k = item
        messages = planner_messages(example.question, descriptions, cfg.planner_prompt)
        out_ = await policy.chat(messages, temperature=spec.temperature, max_tokens=spec.max_tokens, stop=spec.stop,
                                 seed=sample_seed(example.id, k, cfg.seed + i))
        reward = await score_plan(out_.text, example, tools_for(example), reward_cfg, worker)
        plan = parse_plan(out_.text, tools=list(descriptions), max_plan_chars=cfg.max_plan_chars,
                          max_plan_steps=reward_cfg.max_plan_steps)
        return {
            "id": example.id, "dataset": example.dataset, "question": example.question, "answers": example.answers,
            "method": f"improve-round-{i}", "sample": k, "planner": call_record(messages, out_),
            "plan": plan.to_dict(), "evidence": reward.evidence, "round": i, "reward": round(reward.total, 6),
            "reward_parts": reward.parts, "fingerprint": fp,
        }

    items = [((ex.id, k), (ex, k)) for ex in examples for k in range(cfg.samples_per_question)]
    with JsonlStore(out / "errors.jsonl") as errors:
        return run_records(out / SAMPLES, items, work, record_key, errors, concurrency=cfg.concurrency,
                           desc=f"improve round {i}", keep=lambda r: None, schema=SampleRecord)


def best_plans(records: list[dict], min_reward: float) -> list[dict]:
    """Each question's best-rewarded valid plan, when it reaches `min_reward` (ties: the lowest sample)."""
    best: dict[str, dict] = {}
    for rec in sorted(records, key=lambda r: (r["id"], -r["reward"], r["sample"])):
        if rec["id"] not in best and rec["plan"].get("valid") and rec["plan"].get("steps"):
            best[rec["id"]] = rec
    return [rec for rec in best.values() if rec["reward"] >= min_reward]


def round_summary(records: list[dict], kept: list[dict], questions: int) -> dict:
    parts = sorted({p for r in records for p in r["reward_parts"]})

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 4) if values else None

    return {
        "samples": len(records), "questions": questions, "kept": len(kept),
        "mean_reward": mean([r["reward"] for r in records]),
        "mean_best_reward": mean([max(r["reward"] for r in records if r["id"] == q)
                                  for q in {r["id"] for r in records}]),
        "valid_plan_rate": mean([float(bool(r["plan"].get("valid"))) for r in records]),
        "reward_parts": {p: mean([r["reward_parts"][p] for r in records if r["reward_parts"].get(p) is not None])
                         for p in parts},
    }


def serving(cfg: ImproveConfig, adapter_in: str, out: Path):
    """The round's policy endpoint: a vLLM server with the adapter as `policy` (and the base, which the LLM
    tool and Solver may use through `@server`), or the configured planner's own endpoint."""
    if cfg.server is None:
        return nullcontext(None)
    print(f"[improve] starting vLLM with {adapter_in} as {POLICY!r} (log: {out / 'vllm.log'})", flush=True)
    return round_server(cfg, {POLICY: adapter_in}, out / "vllm.log")


def round_server(cfg: ImproveConfig, adapters: Mapping[str, str], log_path: Path, later: int = 0):
    """A vLLM server from `server:` with each adapter as its module, on the first adapter's base; `later`: modules
    it will be given at runtime (vLLM's runtime LoRA loading on, and room for them in a batch)."""

    runtime = {"env": dict(cfg.server.get("env") or {}) | {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
               "max_loras": len(adapters) + later} if later else {}
    serve = validate(ServeConfig, {"port": 0, "base_model": base_model_of(next(iter(adapters.values())))}
                     | cfg.server | {"adapter": None, "adapters": dict(adapters)} | runtime, "server")
    return VLLMServer(serve, log_path=log_path)


def with_server(cfg: ImproveConfig, url: str | None, module: str = POLICY) -> ImproveConfig:
    """`@server` in any model entry is the round's server; the planner is its LoRA module `module`."""
    if url is None:
        return cfg
    data = fill_server(cfg.model_dump(mode="json", exclude_unset=False), url)
    data["planner"] |= {"backend": "openai", "base_url": url, "model": module}
    return validate(ImproveConfig, data, "improve")


def round_train_config(cfg: ImproveConfig, adapter_in: str, out: Path, base_model: str | None = None):
    """The round's TrainConfig, parsed once by TRL's parser and handed to its check or its launch: the adapter's
    base (`base_model` where the adapter is not trained yet), `train`, the round's folders and the adapter it
    continues."""
    return parse_train_section({"model_name_or_path": base_model or base_model_of(adapter_in)} | cfg.train | {
        "dataset_dir": str(out / layout.SFT_DATA), "output_dir": str(out / layout.ADAPTER), "init_adapter": adapter_in},
        "train (improve)")


def check_run(cfg: ImproveConfig, check, prefix: str = "", started=(), base_model: str | None = None,
              gpus: int | None = None) -> None:
    """`--check` of improvement (the pipeline's): its config, what it would launch, its endpoints and prices.
    `base_model`: the adapter's base where the adapter is not trained yet."""
    where = prefix.rstrip(".") or "improve"
    show_config(f"{where}: resolved config", cfg.model_dump(mode="json"))
    try:
        check_prompt_as_trained(cfg)
    except DistillError as exc:
        check.problem(str(exc))
    if cfg.method == "grpo":
        print(f"{where} would run: TRL's GRPOTrainer in this process from {cfg.adapter} "
              f"({cfg.grpo.get('max_steps', 'TRL default')} steps, {cfg.samples_per_question} completions per "
              "question)")
    else:
        first = layout.round_dir(Path(cfg.output_dir), 1)
        served = "each round's vLLM server" if cfg.server is not None else "the planner endpoint"
        try:
            train = round_train_config(cfg, cfg.adapter, first, base_model)
            cmd = shlex.join(launch_command(first / layout.ADAPTER / "stage_config.yaml", train, gpus or 0))
            print(f"{where} would run: {cfg.rounds} round(s), each sampling {cfg.samples_per_question} plans per "
                  f"question from {served} (LoRA module {POLICY!r}), then training: {cmd}")
        except DistillError as exc:
            check.problem(f"{where}.train: {exc}")
    key = "grpo" if cfg.method == "grpo" else "train"  # the section of its trainer's settings
    trainer = getattr(cfg, key)
    named = trainer.get("report_to") or []
    check.report_to([named] if isinstance(named, str) else named, f"{where}.{key}")
    if gpus is not None:
        wants = next((f"{where}.{key}.{k}: true" for k in ("bf16", "fp16") if trainer.get(k)), None)
        check.gpus(where, wants, gpus, "its training")
    check.endpoints(cfg.endpoints(), prefix, started)
    check.unpriced(cfg.endpoints(), cfg.prices, prefix)
    if hub := sorted({f"{ds.source} ({ds.split})" for ds in [*cfg.datasets, *cfg.eval_sets]
                      if ds.source.startswith("hub:")}):
        print(f"{where}: hub datasets are not read by a check: {', '.join(hub)}")


def run_round(cfg: ImproveConfig, i: int, adapter_in: str, examples: list, fresh: bool,
              server=None, module: str = POLICY) -> dict:
    """Round i: sample, keep each question's best, train. `server`: a running VLLMServer that serves adapter_in as
    `module` and outlives the round (the flywheel's, which then evaluates on it); else the round starts its own
    and stops it before training."""
    out = layout.round_dir(Path(cfg.output_dir), i)
    settings = round_settings(cfg, adapter_in)
    fp = fingerprint(settings)
    done = read_json_model(out / DONE, RoundMarker, "round marker", "delete it to redo the round")
    trained = (out / layout.ADAPTER / "adapter_model.safetensors").is_file()
    if done and done.fingerprint == fp and done.summary and trained:
        print(f"[improve] round {i}: done, skipped (same settings and starting adapter)", flush=True)
        return done.summary
    out.mkdir(parents=True, exist_ok=True)
    made = read_json_model(out / "settings.json", RoundMarker, "round settings file", "delete it")
    if (out / SAMPLES).exists():
        with JsonlStore(out / SAMPLES, key=record_key) as store:
            old = store.records()
        check_fingerprint(out / SAMPLES, old, fp, settings, made and made.model_dump(), fresh, "samples")
    if (out / layout.ADAPTER).exists() and (made is None or made.fingerprint != fp):
        # its checkpoints continue other samples or another starting adapter: training must start anew
        moved = set_aside(out / layout.ADAPTER)
        print(f"[improve] round {i}: its adapter was trained with other settings; set aside as {moved.name}",
              flush=True)
    write_json(out / "settings.json", {"fingerprint": fp, "settings": settings})
    own = serving(cfg, adapter_in, out) if server is None else nullcontext(server)
    with own as server, CallCache.open("auto", layout.call_cache(out.parent)) as cache:
        round_cfg = with_server(cfg, server.base_url if server else None, module)
        sample_round(round_cfg, i, round_cfg.planner, examples, out, fp, cache)
        binding = getattr(server, "binding", None)
    records = [r for r in read_jsonl(out / SAMPLES) if r.get("fingerprint") == fp]
    kept = best_plans(records, cfg.min_reward)
    summary = round_summary(records, kept, len(examples))
    if binding:  # how the round's CPU server shared the machine while it sampled
        summary["server_cpu_binding"] = binding
    if not kept:
        write_json(out / layout.SUMMARY, summary)
        raise DistillError(f"improve round {i}: no question's best plan reached min_reward {cfg.min_reward:g} "
                           f"(mean best reward {summary['mean_best_reward']}); lower min_reward or raise "
                           "samples_per_question")
    write_jsonl(out / KEPT, kept)
    build_sft_data(SftDataConfig(kept=str(out / KEPT), out=str(out / layout.SFT_DATA), tools=cfg.tools,
                                 student_prompt=cfg.planner_prompt, val_fraction=cfg.val_fraction, seed=cfg.seed,
                                 tokenizer=None))

    info = launch(round_train_config(cfg, adapter_in, out))
    inherit_record(cfg, adapter_in, out / layout.ADAPTER, f"expert_iteration round {i}")
    summary |= {"adapter_in": adapter_in, "adapter": str(out / layout.ADAPTER),
                "train": {k: info.get(k) for k in ("global_step", "final_train_loss", "wall_s")}}
    write_json(out / layout.SUMMARY, summary)
    write_json(out / DONE, {"fingerprint": fp, "summary": summary})
    print(f"[improve] round {i}: mean reward {summary['mean_reward']}, best per question "
          f"{summary['mean_best_reward']}, kept {len(kept)} of {len(examples)}", flush=True)
    return summary


def improve(cfg: ImproveConfig, config_path: str | None = None, fresh: bool = False) -> dict:
    """Every round in turn, each from the adapter the last one trained; returns the rounds' summaries."""
    if cfg.method == "expert_iteration" and world_size() > 1:
        raise DistillError(f"improve: method expert_iteration starts its own training processes, but this is one of "
                           f"{world_size()} launched ones: run it as `distill improve` (only method grpo trains "
                           "under accelerate launch)")
    base_model_of(cfg.adapter)  # before anything is read or made: without its adapter there is nothing to improve
    check_prompt_as_trained(cfg)
    examples = load_questions(cfg)
    out = Path(cfg.output_dir)
    if cfg.method == "grpo":
        out.mkdir(parents=True, exist_ok=True)
        main = is_main_process()  # under accelerate launch, rank 0 holds the folder and writes its files
        with folder_lock(out) if main else nullcontext():
            summary = run_grpo(cfg, examples)
            result = {"method": cfg.method, "rounds": [summary], "adapter": summary["adapter"], "config": config_path}
            if main:
                write_json(out / layout.SUMMARY, result)
        return result
    round_train_config(cfg, cfg.adapter, layout.round_dir(out, 1))  # a typo should not wait for a round
    out.mkdir(parents=True, exist_ok=True)
    rounds, adapter = [], cfg.adapter
    with folder_lock(out):
        for i in range(1, cfg.rounds + 1):
            rounds.append(run_round(cfg, i, adapter, examples, fresh))
            adapter = rounds[-1]["adapter"]
        result = {"method": cfg.method, "rounds": rounds, "adapter": adapter, "config": config_path}
        write_json(out / layout.SUMMARY, result)
    return result


# ------------------------------------------------------------------------------------------ GRPO

class PlannerReward:
    """TRL's `reward_funcs` entry: every completion of a group run through the real Worker and scored by the
    planner reward, the group at once (TRL awaits an async reward), each part logged beside the total
    (`log_metric`: `reward/recall`, ...). `calls` keeps how many completions each call scored."""

    __name__ = "planner_reward"

    def __init__(self, cfg: ImproveConfig, examples: list, cache=None):
        self.by_id = {ex.id: ex for ex in examples}
        llm_tool = build_chat(cfg.llm_tool or cfg.solver, cfg.prices, cache) if "LLM" in cfg.tools else None
        self.tools_for = make_tools_for(cfg, llm_tool, cache)
        self.worker = WorkerConfig(cfg.worker_max_concurrency, cfg.tool_timeout_s, cfg.evidence_max_chars)
        self.reward_cfg = cfg.reward.model_copy(
            update={"max_plan_steps": min(cfg.reward.max_plan_steps, cfg.max_plan_steps)})
        self.calls: list[int] = []

    async def __call__(self, prompts, completions, id,  # noqa: A002 (TRL's column)
                       log_metric=None, **_) -> list[float]:

        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        examples = [self.by_id[i] for i in id]
        rewards = await asyncio.gather(*(score_plan(t, ex, self.tools_for(ex), self.reward_cfg, self.worker)
                                         for t, ex in zip(texts, examples)))
        self.calls.append(len(texts))
        if log_metric is not None:
            for part in REWARD_PARTS:
                values = [r.parts[part] for r in rewards if r.parts.get(part) is not None]
                if values:
                    log_metric(f"reward/{part}", sum(values) / len(values))
        return [r.total for r in rewards]


def grpo_args(cfg: ImproveConfig, out: Path):
    """TRL's GRPOConfig with distill's recipe (distill.training.recipe.GRPO) from `grpo` over what the improve config
    already says (samples per question, the planner's sampling), with the run's folder; parsed as train parses
    SFT's, so a bad key is one line naming it."""
    keys = {"num_generations": cfg.samples_per_question, "temperature": cfg.planner.temperature or 1.0,
            "max_completion_length": cfg.planner.max_tokens, "seed": cfg.seed,
            "use_cpu": not _cuda(), "bf16": _cuda()} | cfg.grpo | {"output_dir": str(out)}
    return parse_grpo_config(keys)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_grpo(cfg: ImproveConfig, examples: list) -> dict:
    """One GRPO run continuing the SFT adapter (`grpo/`), trained by distill.train as SFT is (resumed from its
    last checkpoint); what is the planner's stays here: the reward, the prompts, the records."""
    from datasets import Dataset

    out = Path(cfg.output_dir) / layout.GRPO
    args = grpo_args(cfg, out)
    base = base_model_of(cfg.adapter)
    descriptions = tool_descriptions(cfg.tools)
    dataset = Dataset.from_list([{"prompt": planner_messages(ex.question, descriptions, cfg.planner_prompt),
                                  "id": ex.id} for ex in examples])
    with CallCache.open("auto", layout.call_cache(Path(cfg.output_dir))) as cache:
        reward = PlannerReward(cfg, examples, cache)
        info = train(GRPORun(args, base, cfg.adapter, [reward], dataset))
    if info["main_process"]:
        inherit_record(cfg, cfg.adapter, out / layout.ADAPTER, "grpo")
    keys = ("step", "reward", "reward_std", "kl", "loss", "rewards/planner_reward/mean",
            *(f"reward/{p}" for p in REWARD_PARTS))
    history = [{k: e[k] for k in keys if k in e} for e in info["log_history"] if "reward" in e]
    last = history[-1] if history else {}
    # each process scores its own equal share of a step's completions
    summary = {"round": 1, "steps": info["global_step"], "samples": sum(reward.calls) * world_size(),
               "mean_reward": last.get("reward"), "kl": last.get("kl"),
               "adapter": str(out / layout.ADAPTER),
               "adapter_in": cfg.adapter,
               "reward_parts": {k[7:]: v for k, v in last.items() if k.startswith("reward/")}}
    if info["main_process"]:
        write_json(out / "reward_history.json", history)
        write_json(out / layout.SUMMARY, summary)
        print(f"[improve] grpo: {summary['steps']} steps, last reward {summary['mean_reward']}", flush=True)
    return summary


# ------------------------------------------------------------------------------------------ command line

def _check(cfg: ImproveConfig, check) -> None:
    check_run(cfg, check, gpus=gpu_count())  # prints what it would launch; no token estimate of its own


def _report(cfg: ImproveConfig, result: dict) -> None:
    if not is_main_process():  # one report per launch, not one per process
        return
    print(json.dumps([{k: r.get(k) for k in ("mean_reward", "mean_best_reward", "kept", "valid_plan_rate")}
                      for r in result["rounds"]]))
    print(f"adapter: {result['adapter']}")


# ------------------------------------------------------------------------------------------ in the pipeline

def in_pipeline(p, url: str | None = None) -> ImproveConfig:
    """The improve section over the run's own questions, leak guard, student prompt and tools; with `url`,
    `@server` (each round's own server) made that address, as a check sees the round's endpoints."""
    name = p.improved_student()
    gen, sft = p.cfg.generate, p.config(layout.SFT_DATA, name)
    defaults = {"datasets": gen.get("datasets", []), "eval_sets": gen.get("eval_sets", []),
                "planner_prompt": sft.student_prompt, "tools": sft.tools}
    defaults |= {k: gen[k] for k in ("wikipedia_backend", "wikipedia_corpus", "wikipedia_scope") if k in gen}
    defaults["server"] = {k: v for k, v in p.cfg.student_server.items() if k not in ("adapter", "adapters")}
    section = {k: v for k, v in p.cfg.improve.items() if k != "student"}
    paths = {"adapter": str(layout.adapter(p.run, name)), "output_dir": str(layout.improved(p.run, name))}
    cfg = validate(ImproveConfig, defaults | section | paths, "improve")
    return cfg if url is None else validate(ImproveConfig, fill_server(cfg.model_dump(mode="json"), url), "improve")


def _show(p, c) -> None:
    """The improve section as `check_run` sees it: its resolved config, what it would launch (its rounds train
    on the student's base model), its endpoints' keys, servers and prices; `@server`, the round's own server, is
    not called."""
    base = p.config(layout.TRAIN, p.improved_student()).model.model_name_or_path
    check_run(in_pipeline(p, c.url), c.world, "improve.", {c.url}, base, c.gpus)


def _unit(p) -> stage.Unit:
    name = p.improved_student()
    settings = settings_of(in_pipeline(p).first_named_dump(exclude={"adapter", "output_dir"}))
    adapter = layout.adapter(p.run, name)
    return stage.Unit(layout.IMPROVE, layout.stage_dir(p.run, layout.IMPROVE), settings,
                      {layout.in_run(p.run, adapter): weights_fingerprint(str(adapter))})


def _work(p) -> dict:
    """Rounds made with other settings (or from another adapter) are redone; finished ones are skipped."""
    result = p.entry("improve")(in_pipeline(p), p.config_path, fresh=True)
    return {"rounds": [{k: r.get(k) for k in ("mean_reward", "mean_best_reward", "kept", "valid_plan_rate")}
                       for r in result["rounds"]], "adapter": result["adapter"]}


STAGE = stage.Stage(layout.IMPROVE, ImproveConfig, "configs/improve_smollm2_cpu.yaml", run=improve, check=_check,
                    report=_report, resolve=lambda p, url: in_pipeline(p), show=_show, unit=_unit, work=_work,
                    after=(layout.TRAIN,), students=lambda p: [p.improved_student()])


if __name__ == "__main__":  # `python -m distill.improve` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
