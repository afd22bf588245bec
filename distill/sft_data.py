"""Kept trajectories -> the SFT dataset of the student Planner (TRL conversational prompt/completion form).

The prompt comes from `planner_messages` over `registry.tool_descriptions(tools)` in the `student_prompt` kind
(`compact` lists only the tool names, leaving the rest to training), the very functions eval and ask call, so
the student is trained on exactly the prompt it will be served. The completion is the teacher's plan parsed and
re-rendered canonically: the student learns one spelling of the format, not every teacher quirk. The split is
by `normalize_question`, the leak guard's key, so samples of one question never sit on both sides and
validation loss measures planning for unseen questions rather than recall of a sibling sample.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from distill import code_version
from distill.core import layout, stage
from distill.core.check import show_config
from distill.core.config import PlannerPrompt, Strict, add_config_args, parse_overrides, read_yaml, validate
from distill.core.data import normalize_question
from distill.core.errors import DistillError
from distill.core.run import settings_of
from distill.core.store import content_digest, describe, iter_jsonl, replace_folder, write_json, write_jsonl
from distill.filter import KeptRecord
from distill.llm.embedded import resolve_model_path
from distill.reporting.verdict import small_training_set
from distill.rewoo.plan import parse_plan, render_plan
from distill.rewoo.prompts import PromptKind, planner_messages, prompt_kind_of
from distill.tools.registry import DEFAULT_TOOLS, tool_descriptions

PREVIEW_ROWS = 20


class SftDataConfig(Strict):
    """`distill sft-data` and the pipeline's sft-data stage. `tools` and `student_prompt` make the student's prompt,
    so they must be what it will be served with (eval's student row `prompt`, `distill ask`'s `planner_prompt`)."""

    kept: str | None = None
    """kept trajectory records (JSONL); the pipeline fills it in"""
    out: str | None = None
    """dataset folder to write; the pipeline fills it in"""
    tools: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLS))
    """the tools of the student's prompt (the same list the student is served with)"""
    student_prompt: PlannerPrompt = "full"
    """the prompt the student is trained on and served with: full or compact"""
    val_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    """share of questions held out for validation"""
    seed: int = Field(default=0, ge=0)
    """seed of the train/validation split by question"""
    tokenizer: str | None = "smollm2-135m-instruct"
    """tokenizer of the token-length summary; null or "none" skips it"""

    @field_validator("tools", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`--tools Wikipedia,LLM` and `--set tools=Wikipedia,LLM` give a string."""
        return [t.strip() for t in value.split(",") if t.strip()] if isinstance(value, str) else value

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, value: list[str]) -> list[str]:
        try:
            return list(tool_descriptions(value))
        except DistillError as exc:
            raise ValueError(str(exc)) from None


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class SftExample(BaseModel):
    """One row of the SFT dataset, as `record_to_example` builds it and training reads it: a prompt ending in
    the user's question and one non-empty assistant completion (an empty one would train the student to say
    nothing)."""

    model_config = ConfigDict(strict=True, extra="allow")

    prompt: list[Message] = Field(min_length=1)
    completion: list[Message] = Field(min_length=1, max_length=1)
    id: str = ""  # sft-data always writes these three; a dataset made elsewhere may not have them
    dataset: str = ""
    sample: int = Field(default=0, ge=0)

    @field_validator("prompt")
    @classmethod
    def _ends_with_question(cls, value: list[Message]) -> list[Message]:
        if value[-1].role != "user" or not value[-1].content.strip():
            raise ValueError("the prompt must end with the user's question")
        return value

    @field_validator("completion")
    @classmethod
    def _one_plan(cls, value: list[Message]) -> list[Message]:
        if value[0].role != "assistant" or not value[0].content.strip():
            raise ValueError("the completion must be one non-empty assistant message")
        return value


def check_rows(rows: Iterable[Mapping[str, Any]], origin: str) -> None:
    """Every row of a split is an `SftExample`, checked before a model is loaded to train on them: one bad row
    is one line naming the split, the row and the field."""
    for number, row in enumerate(rows, 1):
        try:
            SftExample.model_validate(dict(row))
        except ValidationError as exc:
            raise DistillError(f"{origin}: row {number}: {describe(exc.errors(include_url=False))}") from None


def record_to_example(record: Mapping[str, Any], tools: Mapping[str, str],
                      kind: PromptKind = "full") -> tuple[dict | None, str]:
    """One SFT example from one kept record, or (None, reason) when the plan is unusable for training. A plan
    calling a tool the student's prompt does not list would teach it to invent tools: it is skipped too."""
    try:
        question, output = record["question"], record["planner"]["output"]
    except (KeyError, TypeError):
        return None, "missing_fields"
    if not isinstance(question, str) or not question.strip() or not isinstance(output, str):
        return None, "missing_fields"
    plan = parse_plan(output, tools=list(tools))
    if not plan.steps:
        return None, "no_steps"
    if not plan.valid:
        return None, "invalid_plan"
    example = {
        "prompt": planner_messages(question, tools, kind),
        "completion": [{"role": "assistant", "content": render_plan(plan)}],
        "id": str(record.get("id", "")),
        "dataset": str(record.get("dataset", "")),
        "sample": int(record.get("sample") or 0),
    }
    SftExample.model_validate(example)  # the row training will read
    return example, "ok"


def iter_examples(records: Iterable[Mapping[str, Any]], tools: Mapping[str, str], kind: PromptKind,
                  counts: Counter) -> Iterator[dict]:
    """Examples one at a time, counting in `counts` what was skipped and why; exact (prompt, completion) repeats
    are dropped so that k identical samples of one question do not weigh k times. Only a digest per example
    stays in memory, so the same pass can run again over a file of any size and drop the same repeats."""
    seen: set[bytes] = set()
    for record in records:
        example, reason = record_to_example(record, tools, kind)
        counts[reason] += 1
        if example is None:
            continue
        key = hashlib.blake2b(f"{normalize_question(record['question'])}\0{example['completion'][0]['content']}"
                              .encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if key in seen:
            counts["ok"] -= 1
            counts["duplicate"] += 1
            continue
        seen.add(key)
        yield example


def build_examples(records: Iterable[Mapping[str, Any]], tools: Mapping[str, str],
                   kind: PromptKind = "full") -> tuple[list[dict], Counter]:
    """`iter_examples` held in a list, for callers with a few records in hand."""
    counts: Counter = Counter()
    return list(iter_examples(records, tools, kind, counts)), counts


def validation_question_count(n_questions: int, val_fraction: float) -> int:
    """At least one validation question as soon as there are two (so eval loss exists), never all of them."""
    if val_fraction <= 0 or n_questions < 2:
        return 0
    return min(n_questions - 1, max(1, round(n_questions * val_fraction)))


def validation_questions(questions: Iterable[str], val_fraction: float, seed: int) -> set[str]:
    """The held-out share of the normalised questions, seeded; sorting first makes it independent of order."""
    if not 0 <= val_fraction < 1:
        raise DistillError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    ordered = sorted(set(questions))
    random.Random(seed).shuffle(ordered)
    return set(ordered[: validation_question_count(len(ordered), val_fraction)])


def question_of(example: Mapping[str, Any]) -> str:
    return normalize_question(example["prompt"][-1]["content"])


def split_by_question(examples: Sequence[dict], val_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, validation) by `validation_questions`, each in the examples' order."""
    val_questions = validation_questions(map(question_of, examples), val_fraction, seed)
    train = [e for e in examples if question_of(e) not in val_questions]
    val = [e for e in examples if question_of(e) in val_questions]
    return train, val


def _features():
    """Explicit features, so an empty validation split still has the same columns as train."""
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features({"prompt": List(message), "completion": List(message), "id": Value("string"),
                     "dataset": Value("string"), "sample": Value("int64")})


def to_dataset_dict(train: Sequence[dict], val: Sequence[dict]):
    """The two splits from rows in hand."""
    from datasets import Dataset, DatasetDict

    features = _features()
    return DatasetDict({  # from_dict, since from_list fails on no rows
        split: Dataset.from_dict({name: [row[name] for row in rows] for name in features}, features=features)
        for split, rows in (("train", train), ("validation", val))
    })


def split_rows(kept: str, tools: dict[str, str], kind: PromptKind, held_out: set[str],
               validation: bool) -> Iterator[dict]:
    """One split's examples, read again from the kept file: `Dataset.from_generator` writes them to Arrow in
    batches, so no split is ever held in memory whole (module level, so `datasets` can fingerprint it)."""
    records = (record for _, record in iter_jsonl(kept, KeptRecord))
    for example in iter_examples(records, tools, kind, Counter()):
        if (question_of(example) in held_out) == validation:
            yield example


def stream_dataset_dict(kept: str, tools: dict[str, str], kind: PromptKind, held_out: set[str], cache: Path):
    """Both splits, streamed from the kept file into Arrow files under `cache` (`datasets` cannot generate a
    split with no rows: an empty validation split is made from nothing)."""
    import datasets

    splits = {}
    for split, validation in (("train", False), ("validation", True)):
        if validation and not held_out:
            splits[split] = to_dataset_dict([], [])[split]
            continue
        try:
            splits[split] = datasets.Dataset.from_generator(
                split_rows, features=_features(), cache_dir=str(cache), split=split,
                gen_kwargs={"kept": kept, "tools": tools, "kind": kind, "held_out": held_out,
                            "validation": validation})
        except datasets.exceptions.DatasetGenerationError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, (OSError, DistillError)):  # a full disk; the kept file changed under this read
                raise cause from None
            raise DistillError(f"{kept}: {str(cause or exc).splitlines()[0]}") from None
    return datasets.DatasetDict(splits)


def prompt_tokens(messages: Sequence[Mapping[str, str]], tokenizer) -> int:
    """Prompt tokens as a server and TRL count them: the chat template with the generation prompt appended."""
    return len(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, return_dict=False))


def token_lengths(example: Mapping[str, Any], tokenizer) -> tuple[int, int]:
    """(prompt, completion) token counts as TRL counts them: the completion is what it adds to the prompt."""
    prompt = prompt_tokens(example["prompt"], tokenizer)
    full = tokenizer.apply_chat_template(list(example["prompt"]) + list(example["completion"]), return_dict=False)
    return prompt, len(full) - prompt


class _Lengths:
    """min, mean and max of token counts, kept as running totals rather than one number per example."""

    def __init__(self) -> None:
        self.n, self.total, self.low, self.high = 0, 0, 0, 0

    def add(self, value: int) -> None:
        self.low = value if not self.n else min(self.low, value)
        self.high = max(self.high, value)
        self.n, self.total = self.n + 1, self.total + value

    def stats(self) -> dict:
        return {"min": self.low, "mean": round(self.total / self.n, 1) if self.n else 0.0, "max": self.high}


def summarize(dataset_dict, counts: Counter, tokenizer, tokenizer_name: str) -> dict:
    """Counts per split and dataset, skip reasons, and token lengths per split (what max_length must cover), read
    row by row from the written splits."""
    summary: dict[str, Any] = {"records": dict(sorted(counts.items())), "tokenizer": tokenizer_name, "splits": {}}
    for split, ds in dataset_dict.items():
        lengths = {key: _Lengths() for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
        questions, per_dataset = set(), Counter()
        for example in ds:
            questions.add(question_of(example))
            per_dataset[example["dataset"]] += 1
            if tokenizer is not None:
                prompt, completion = token_lengths(example, tokenizer)
                for key, value in zip(lengths, (prompt, completion, prompt + completion)):
                    lengths[key].add(value)
        summary["splits"][split] = {"examples": len(ds), "questions": len(questions),
                                    "per_dataset": dict(sorted(per_dataset.items()))}
        summary["splits"][split] |= {key: tally.stats() for key, tally in lengths.items()}
    return summary


def format_summary(summary: dict) -> str:
    lines = ["records: " + ", ".join(f"{k} {v}" for k, v in summary["records"].items())]
    for split, s in summary["splits"].items():
        per = ", ".join(f"{k} {v}" for k, v in s["per_dataset"].items()) or "-"
        lines.append(f"{split}: {s['examples']} examples, {s['questions']} questions ({per})")
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            st = s[key]
            lines.append(f"  {key:<17} min {st['min']:>5}  mean {st['mean']:>7}  max {st['max']:>5}")
    return "\n".join(lines)


def load_tokenizer(name: str | None):
    if not name or name.lower() == "none":
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolve_model_path(name))
    except OSError as exc:
        raise DistillError(f"cannot load tokenizer {name!r}: {str(exc).splitlines()[0]}") from None


def teacher_of(planners: Mapping[tuple[str, str], int]) -> dict:
    """Who wrote the plans and from which prompt, as the records themselves say (each keeps its planner call's
    model and messages), from a count per (model, prompt kind): the adapter trained on this data copies it, so
    its card and the report name the teacher wherever the adapter goes."""
    return {"models": sorted({model for model, _ in planners}),
            "prompt": "/".join(sorted({kind for _, kind in planners})) if planners else None}


def planner_of(record: Mapping[str, Any]) -> tuple[str, str]:
    call = record.get("planner") or {}
    return str(call.get("model") or "unknown"), prompt_kind_of(call.get("messages") or []) or "unknown"


def datasets_of(splits: Mapping[str, Mapping[str, Any]]) -> dict:
    """{dataset: {split: examples}}: which source questions the student saw, and which were held out."""
    out: dict[str, dict[str, int]] = {}
    for split in ("train", "validation"):
        for name, n in splits[split]["per_dataset"].items():
            out.setdefault(str(name or "unknown"), {"train": 0, "validation": 0})[split] += n
    return dict(sorted(out.items()))


def build_sft_data(cfg: SftDataConfig) -> dict:
    """Read kept records, write `save_to_disk(out)`, `preview.jsonl` and `summary.json`; return the summary.
    The kept file is read three times (check and count, then each split), never held whole: the dataset of
    16k questions costs no more memory than that of 1k."""
    if not cfg.kept or not cfg.out:
        raise DistillError("sft-data needs both `kept` (the kept records) and `out` (the dataset folder)")
    tools = tool_descriptions(cfg.tools)
    counts: Counter = Counter()
    planners: Counter = Counter()
    questions: set[str] = set()

    def checked() -> Iterator[dict]:  # every line checked before any work
        for _, record in iter_jsonl(cfg.kept, KeptRecord):
            planners[planner_of(record)] += 1
            yield record

    for example in iter_examples(checked(), tools, cfg.student_prompt, counts):
        questions.add(question_of(example))
    if not planners:
        raise DistillError(f"{cfg.kept}: no records")
    if not questions:
        raise DistillError(f"{cfg.kept}: no record has a usable plan ({dict(counts)})")
    held_out = validation_questions(questions, cfg.val_fraction, cfg.seed)
    # Written beside `out` and renamed into place: a full disk keeps the old dataset whole.
    with replace_folder(cfg.out, marker="dataset_dict.json") as tmp:
        cache = tmp / ".generate"
        dataset_dict = stream_dataset_dict(cfg.kept, tools, cfg.student_prompt, held_out, cache)
        summary = summarize(dataset_dict, counts, load_tokenizer(cfg.tokenizer), cfg.tokenizer or "none")
        summary |= {"source": cfg.kept, "tools": list(tools), "tool_descriptions": tools,
                    "teacher": teacher_of(planners), "datasets": datasets_of(summary["splits"]),
                    "code_version": code_version()}
        summary |= cfg.model_dump(include={"student_prompt", "val_fraction", "seed"})
        # One shard each: `datasets` writes an empty split as zero shards, which it then cannot load back.
        dataset_dict.save_to_disk(str(tmp), num_shards={split: 1 for split in dataset_dict})
        write_jsonl(tmp / "preview.jsonl",
                    itertools.islice(itertools.chain(dataset_dict["train"], dataset_dict["validation"]),
                                     PREVIEW_ROWS))
        del dataset_dict  # its Arrow files are memory-mapped from the cache
        shutil.rmtree(cache, ignore_errors=True)
        write_json(tmp / layout.SUMMARY, summary)
    return summary


# ------------------------------------------------------------------------------------------ in the pipeline

def _resolve(p, url: str | None, name: str) -> SftDataConfig:
    """A student's section: its own keys (`students.<name>`, less `train`) over the shared `sft_data`."""
    paths = {"kept": str(layout.kept(p.run)), "out": str(layout.sft_data(p.run, name))}
    where = "sft_data" if p.cfg.students is None else f"students.{name}"
    own = {k: v for k, v in p.students()[name].items() if k != "train"}
    return validate(SftDataConfig, p.cfg.sft_data | own | paths, f"{where} (pipeline)")


def _show(p, c, name: str) -> None:
    show_config(f"sft-data {name}: resolved config", _resolve(p, None, name).model_dump(mode="json"))


def _unit(p, name: str) -> stage.Unit:
    settings = settings_of(_resolve(p, None, name).model_dump(mode="json", exclude={"kept", "out"}))
    kept = layout.kept(p.run)
    return stage.Unit(layout.SFT_DATA, layout.sft_data(p.run, name), settings,
                      {layout.in_run(p.run, kept): content_digest(kept)}, name)


def _work(p, name: str) -> dict:
    summary = p.entry("sft-data")(_resolve(p, None, name))
    print(format_summary(summary))
    return {"student_prompt": summary["student_prompt"],
            "examples": {split: s["examples"] for split, s in summary["splits"].items()}}


STAGE = stage.Stage(layout.SFT_DATA, SftDataConfig, resolve=_resolve, show=_show, unit=_unit, work=_work,
                    after=(layout.FILTER,), per_student=True)


# ------------------------------------------------------------------------------------------ command line

def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kept", metavar="KEPT.jsonl", help="kept trajectory records (output of `distill filter`)")
    parser.add_argument("--out", required=True, help="dataset folder to write")
    parser.add_argument("--tools",
                        help=f"comma-separated tools of the student prompt (default {','.join(DEFAULT_TOOLS)})")
    parser.add_argument("--student-prompt",
                        help="planner prompt kind the student is trained on and served: full (default) or compact")
    parser.add_argument("--val-fraction", type=float, help="share of questions held out for validation (default 0.1)")
    parser.add_argument("--seed", type=int, help="seed of the question split (default 0)")
    parser.add_argument("--tokenizer", help="tokenizer for the length summary ('none' to skip)")
    add_config_args(parser)


def main(args: argparse.Namespace) -> int:
    flags = {k: v for k, v in vars(args).items() if k in SftDataConfig.model_fields and v is not None}
    data = (read_yaml(args.config) if args.config else {}) | flags
    cfg = validate(SftDataConfig, data | parse_overrides(args.set), args.config or "sft-data")
    summary = build_sft_data(cfg)
    print(format_summary(summary))
    if warning := small_training_set(summary["splits"]["train"]["examples"]):
        print(f"WARNING: {warning}", file=sys.stderr)
    print(f"wrote {cfg.out} (save_to_disk), {cfg.out}/preview.jsonl, {cfg.out}/summary.json")
    return 0


if __name__ == "__main__":  # `python -m distill.sft_data` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
