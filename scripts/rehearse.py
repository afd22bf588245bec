"""`make rehearse`: every command the docs and the configs' headers give, run on this machine, in order, in one work
folder, with one table of substitutions (SUBSTITUTIONS below, and docs/rehearsal.md in words) and nothing else
changed. A documented command that no row of the table covers fails the rehearsal: a new command in the docs is
either rehearsed or listed with the reason it is not.

    python scripts/rehearse.py [--list] [--only PAGE] [--keep DIR]

--list prints each documented command and the table row that covers it, and runs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fakes of hosted APIs, as the tests use them

# Where commands are documented, in the order a reader meets them (README, the site's pages, the configs).
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").glob("*.yaml")),
         *sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "text"}
# A line of a shell block (or of a config's header) is a command when its first word, after VAR=value words, is one
# of these programs; anything else in such blocks is output, a formula or a listing.
PROGRAMS = {"distill", "make", "python", "python3", ".venv/bin/python", "accelerate", "vllm", "curl", "pip", "bash",
            "export"}
MODEL_7B = "Qwen/Qwen2.5-7B-Instruct"


@dataclass
class Block:
    where: str  # "README.md block 3", "configs/serve_planner.yaml header"
    commands: list[str]


def _is_command(line: str) -> bool:
    words = line.split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    # "make demo-full: two rounds ..." in a config header is prose about a command, not one
    return bool(words) and words[0] in PROGRAMS and not (len(words) > 1 and words[1].endswith(":"))


def _commands(lines: list[str]) -> list[str]:
    """Continuation lines joined, a heredoc kept with its command, comments after a command dropped."""
    out: list[str] = []
    joined = "\n".join(lines).replace("\\\n", " ")
    rows = joined.splitlines()
    i = 0
    while i < len(rows):
        line = rows[i].strip()
        i += 1
        if not _is_command(line):
            continue
        if m := re.search(r"<<'?(\w+)'?", line):
            body = []
            while i < len(rows) and rows[i].strip() != m.group(1):
                body.append(rows[i])
                i += 1
            i += 1
            out.append("\n".join([line, *body, m.group(1)]))
            continue
        line = re.sub(r"\s+#\s.*$", "", line)  # a comment after the command
        line = re.sub(r"\s{2,}\(.*$", "", line)  # a config header's "(after ...)" remark
        out.append(" ".join(line.split()))
    return out


def documented_blocks() -> list[Block]:
    """Every shell block of README.md and docs/*.md with a command in it, and every config header's commands."""
    blocks = []
    for page in PAGES:
        rel = page.relative_to(ROOT)
        if page.suffix == ".md":
            for n, (lang, body) in enumerate(re.findall(r"```(\w*)\n(.*?)```", page.read_text(), re.S)):
                if lang in SHELL_BLOCKS and (commands := _commands(body.splitlines())):
                    blocks.append(Block(f"{rel} block {n}", commands))
        else:
            header = []
            for line in page.read_text().splitlines():
                if not line.startswith("#"):
                    break
                header.append(line[1:].strip())
            if commands := _commands(header):
                blocks.append(Block(f"{rel} header", commands))
    return blocks


@dataclass
class Rule:
    """One row of the substitution table: the documented commands it covers (a regex searched in the command as
    written), what the rehearsal does with them and why. `subst` pairs are regex replacements applied in order."""
    covers: str
    action: str  # run | serve (in the background until its block ends or a later server takes its port) | stand-in | skip
    why: str
    subst: list[tuple[str, str]] = field(default_factory=list)
    expect: int = 0  # the exit status a rehearsed command must end with
    before: str = ""  # a server the page says to start first ("after: distill serve ..."), rehearsed by its own row
    port: int = 0  # serve: the port it listens on; ready once GET /health answers 200 there


# How far the GPU settings of the 7B training configs move to run on a CPU, and how far the data shrinks.
CPU_TRAIN = ("--set max_steps=1 --set bf16=false --set dtype=float32 --set gradient_checkpointing=false "
             "--set dataloader_num_workers=0 --set report_to=none --set eval_strategy=no --set save_strategy=no "
             "--set use_liger_kernel=false --set padding_free=false --set load_in_4bit=false")
TINY_DATA = ("--set 'datasets=[{name: hotpotqa, source: data/demo/train.jsonl, split: train, n: 6}]' "
             "--set 'eval_sets=[{name: hotpotqa, source: data/demo/dev.jsonl, split: dev}]' "
             "--set wikipedia_api_url={wiki}")
TINY_EVAL = ("--set 'datasets=[{name: hotpotqa, source: data/demo/dev.jsonl, split: dev, n: 4}]' "
             "--set wikipedia_api_url={wiki} "
             "--set robustness.n=2 --set bootstrap_samples=100")
# `make demo` at a small scale, its vLLM teacher and the improve round's server replaced by the fake API ({api})
DEMO_SMALL = ("--set \"teacher={backend: openai, base_url: '{api}', model: smollm2-135m-instruct}\" "
              "--set teacher_server=null --set generate.datasets.0.n=6 --set students.student.train.max_steps=1 "
              "--set students.student.train.eval_steps=1 --set students.student.train.save_steps=1 "
              "--set improve.datasets.0.n=4 --set improve.train.max_steps=1 --set improve.server=null "
              "--set improve.planner.base_url={api} --set improve.solver.base_url={api} "
              "--set eval.planners.1.spec.base_url={api} --set eval.planners.2.spec.base_url={api} "
              "--set eval.datasets.0.n=4 --set eval.bootstrap_samples=100")
MULTI_CPU = r"--config_file configs/accelerate/multi_cpu.yaml --num_processes 2"

SUBSTITUTIONS: list[Rule] = [
    # --- not run, each with its reason
    Rule(r"^make test", "skip", "tests/test_rehearse.py, part of `make test`, runs the rehearsal (with "
         "DISTILL_REHEARSE=1): it cannot run the suite it is part of"),
    Rule(r"^make rehearse", "skip", "the rehearsal itself"),
    Rule(r"^\.venv/bin/python -m pytest", "skip", "tests: `make test` runs them, the rehearsal among them"),
    Rule(r"^make demo TORCH_PIP_ARGS", "skip", "changes only where pip finds torch at install; the demo it runs is "
         "`make demo`'s"),
    Rule(r"^pip install|^python3 -m pip install", "skip", "an install (a package index, the `gpu` extra): `make "
         "install` is what the rehearsal runs under"),
    Rule(r"^export ", "skip", "sets a variable: the rehearsal's environment sets OPENAI_API_KEY (to a dummy key "
         "for the fake API) and the GPU kit's paths are the GPU check's"),
    Rule(r"gpu_check_train\.sh", "skip", "the GPU check: it needs a GPU and runs on the device machine "
         "(BENCHMARKS.md, the GPU check by date)"),
    Rule(r"--num_machines 2", "skip", "two machines of 8 GPUs: the rehearsal has one machine; the launcher configs "
         "(deepspeed_zero3.yaml, fsdp.yaml) are rehearsed on 1 machine in their own headers"),
    Rule(r"deepspeed_zero3\.yaml", "skip", "DeepSpeed is not installed here (`pip install deepspeed`, a GPU build); "
         "tests/test_docs.py loads the config and checks the process count and batch against it"),
    Rule(r"^vllm serve", "skip", "vLLM's own CLI with 4 GPUs (tensor parallel): `distill serve --set "
         "tensor_parallel_size=4` beside it is rehearsed as a dry run"),
    Rule(r"^distill flywheel --config configs/flywheel_smollm2_cpu\.yaml", "skip", "a flywheel round samples, "
         "trains and evaluates two planners with a vLLM server of its own, and this table has no stand-in settings "
         "for it (as the improve rows have for theirs): docs/flywheel.md's round is not rehearsed"),
    Rule(r"^distill promote --config configs/flywheel_smollm2_cpu\.yaml", "skip", "it promotes a round the "
         "flywheel row above would have written (loading it on the planner's vLLM server and switching the agents "
         "of `service.agents`); with no round there is nothing to promote or roll back"),
    Rule(r"^distill report runs/flywheel", "skip", "it reads the rounds the flywheel row above would have written; "
         "tests/test_report_flywheel.py writes round files and builds this report from them"),
    Rule(r"^make demo$", "run", "what `make demo` runs (the Makefile's `distill pipeline --config "
         "configs/demo_smollm2_cpu.yaml`, its install already done) on 6 train and 4 dev questions, 1 training step "
         "per student and per improve round; the demo's vLLM teacher and the improve round's own server are the fake "
         "API (the pipeline still starts its real vLLM student server: the one vLLM server of the rehearsal)",
         [(r"^make demo$", "distill pipeline --config configs/demo_smollm2_cpu.yaml " + DEMO_SMALL)]),
    Rule(r"^distill sft-data runs/demo/filter/kept\.jsonl", "run", "as written: the small demo's kept records"),
    Rule(r"^distill train --config configs/smollm2-135m_lora_cpu\.yaml( --set dataset_dir=runs/smoke/sft-data)?$", "run",
         "1 optimiser step instead of 12 (the embedded SmolLM2 on the small demo's dataset)",
         [(r"$", " --set max_steps=1 --set eval_steps=1 --set save_steps=1")]),
    Rule(r"^distill merge runs/demo/train/student --out runs/demo/merged", "run", "as written"),
    Rule(r"^distill serve --config configs/serve_planner(_merged)?\.yaml( --set adapter=(null|runs/(demo|agent)/\S+)"
         r"( --set 'adapters=.*')?( --set lora_name=\S+)?)?$", "stand-in", "the demo's vLLM CPU server -> `distill "
         "serve --dry-run` (config, adapters and the vLLM command checked) and the fake API on its port: a vLLM start "
         "costs a minute of both cores, and the small demo's eval already started one", [(r"$", " --dry-run")]),
    Rule(r"^distill serve-agent --config configs/agent_server\.yaml", "serve", "as written, in the background until "
         "its block ends (or the next serve-agent takes :8080): its planner and Solver are the stand-in on :8000 "
         "(the fake API), its Wikipedia BM25 over the demo corpus as configured; ready once /health answers 200",
         port=8080),
    Rule(r"^python - <<", "run", "as written: three questions to the served agent, each with its feedback (the fake "
         "API knows their answers and pages)"),
    Rule(r"^distill improve --config configs/improve_from_traces_smollm2_cpu\.yaml", "run",
         "the round's own vLLM server -> the fake API; 2 plans per question, 1 optimiser step",
         [(r"$", " --set server=null --set planner.base_url={api} --set solver.base_url={api} "
           "--set samples_per_question=2 --set train.max_steps=1")]),
    Rule(r"^curl .*load_lora_adapter", "run", "against the stand-in on :8000 (started with runtime LoRA loading on, "
         "as the page says), which lists the module afterwards",
         before="distill serve --config configs/serve_planner.yaml --set 'env={VLLM_ALLOW_RUNTIME_LORA_UPDATING: "
                "\"1\"}'"),
    Rule(r"^curl -sf http://127\.0\.0\.1:8080/v1/admin/planner$", "run", "as written, against the agent its block "
         "serves (its planner the stand-in on :8000): it answers which model, adapter and round plan now"),
    Rule(r"^distill serve --config configs/serve_planner\.yaml --set 'env=", "stand-in", "as the other "
         "serve_planner.yaml rows", [(r"$", " --dry-run")]),
    Rule(r"^distill improve --config configs/improve_smollm2_cpu\.yaml", "run",
         "each round's own vLLM server -> the fake API; 8 questions, 1 optimiser step",
         [(r"$", " --set server=null --set planner.base_url={api} --set solver.base_url={api} "
           "--set datasets.0.n=8 --set train.max_steps=1")]),
    Rule(r"^distill improve --config configs/improve_smollm2_grpo_cpu\.yaml", "run",
         "the embedded SmolLM2 in process, as written; 2 questions, 2 completions of 32 tokens, 1 step",
         [(r"$", " --set datasets.0.n=2 --set samples_per_question=2 --set grpo.per_device_train_batch_size=2 "
           "--set grpo.max_steps=1 --set planner.max_tokens=32")]),
    Rule(r"^accelerate launch --config_file configs/accelerate/multi_cpu\.yaml -m distill\.improve", "run",
         "as written on 2 CPU processes; 2 questions, completions of 32 tokens, 1 step",
         [(r"$", " --set datasets.0.n=2 --set grpo.max_steps=1 --set planner.max_tokens=32")]),
    Rule(r"qwen72", "skip", "no documented command writes runs/qwen72/adapter (the 72B training of the block "
         "above writes the config's output_dir, runs/qwen/adapter)"),
    Rule(r"scripts/generate_trajectories\.py --config configs/generate_smollm2_vllm\.yaml", "run",
         "as written; the SmolLM2 teacher its header serves on :8010 first is the stand-in (the fake API)",
         before="distill serve --config configs/serve_planner.yaml --set adapter=null --set served_model_name=teacher "
                "--set port=8010"),
    Rule(r"distill eval --config configs/eval_smollm2_cpu\.yaml", "run", "the server its header starts first is the "
         "stand-in on :8000 (the fake API); the robustness sweep on 2 questions, 100 bootstrap samples",
         [(r"$", " --set robustness.n=2 --set bootstrap_samples=100")],
         before="distill serve --config configs/serve_planner.yaml"),
    Rule(r"^(OPENAI_API_KEY=\.\.\. )?distill pipeline --config configs/pipeline_hotpot_trivia_7b\.yaml$", "skip",
         "its stages are rehearsed one by one in the README's block above (the same configs and substitutions) and "
         "its --check is rehearsed; the whole run would only add a second vLLM server"),
    Rule(r"^distill pipeline --config configs/demo_smollm2_cpu\.yaml --set 'agent\.tools", "skip",
         "an example with `...` for the user's own settings and tool module (mytools:Weather) that is not shipped"),
    Rule(r"\s\[--|\bKEPT\.jsonl|=DIR\b", "skip", "a synopsis: [optional flags] and placeholders (KEPT.jsonl, DIR); "
         "each command is rehearsed where a page gives it whole"),
    Rule(r"^distill score ", "run", "as written, on the predictions.jsonl the rehearsal writes (the demo dev "
         "answers, every other one wrong)"),
    Rule(r"configs/ask_openai\.yaml", "run", "the hosted Planner and Solver are the fake API; online Wikipedia is "
         "the fake MediaWiki API over the demo corpus",
         [(r"^OPENAI_API_KEY=\.\.\. ", ""), (r"$", " --set wikipedia_api_url={wiki}")]),
    Rule(r"^accelerate launch .*--num_processes 8 -m distill\.improve --config configs/improve_qwen2\.5-7b_grpo_gpu",
         "run", "GRPO of the tiny Qwen2 adapter the README's run trained: 8 GPUs -> 2 CPU processes (multi_cpu.yaml); "
         "the hosted LLM tool is the fake API; 4 demo questions, 2 completions of 32 tokens, 1 step, no colocated "
         "vLLM, bf16 and checkpointing off",
         [(r"--config_file configs/accelerate/multi_gpu\.yaml --num_processes 8", MULTI_CPU),
          (r"$", " " + TINY_DATA.replace("n: 6", "n: 4") + " --set samples_per_question=2 "
           "--set grpo.max_steps=1 --set grpo.per_device_train_batch_size=2 --set grpo.bf16=false "
           "--set grpo.gradient_checkpointing=false --set grpo.use_vllm=false --set grpo.report_to=none "
           "--set planner.max_tokens=32")]),
    Rule(r"^accelerate launch --config_file configs/accelerate/(cpu|multi_cpu)\.yaml -m distill\.train", "run",
         "as written, 1 optimiser step instead of 12 (SmolLM2 on the small demo's dataset)",
         [(r"$", " --set max_steps=1 --set eval_steps=1 --set save_steps=1")]),
    # --- run
    Rule(r"^distill generate --config configs/generate_teacher\.yaml --check", "run",
         "the hosted teacher is the fake API (OPENAI_BASE_URL); the Hub's HotpotQA and TriviaQA are 6 demo "
         "questions and online Wikipedia the fake MediaWiki API over the demo corpus", [(r"$", " --offline " + TINY_DATA)]),
    Rule(r"(^|\s)(distill generate|python scripts/generate_trajectories\.py) --config configs/generate_teacher\.yaml",
         "run", "as its --check above: the fake teacher, 6 demo questions, the fake MediaWiki API",
         [(r"^OPENAI_API_KEY=\.\.\. ", ""), (r"$", " " + TINY_DATA)]),
    Rule(r"^distill filter runs/teacher/", "run", "runs/teacher stands for any teacher run: it reads the "
         "generate_teacher.yaml run's records", [(r"runs/teacher/trajectories", "runs/teacher_gpt4o-mini/trajectories")]),
    Rule(r"^distill filter ", "run", "as written"),
    Rule(r"^distill sft-data ", "run", f"as written; {MODEL_7B} is the tiny Qwen2 in the Hub cache"),
    Rule(r"^accelerate launch --config_file configs/accelerate/fsdp\.yaml --num_processes 8 -m distill\.train", "run",
         "FSDP2 shards the base over GPUs: on CPU the same command runs as DDP over 2 CPU processes (multi_cpu.yaml) "
         "with the tiny Qwen2 and GPU settings off, 1 step; tests/test_docs.py loads fsdp.yaml and checks its "
         "process count and batch", [(r"--config_file configs/accelerate/fsdp\.yaml --num_processes 8", MULTI_CPU),
                                      (r"$", " " + CPU_TRAIN)]),
    Rule(r"^accelerate launch .*--num_processes 8 -m distill\.train", "run",
         "8 GPUs -> 2 CPU processes with the same launcher (multi_cpu.yaml: torch.distributed over gloo); the "
         "7B base -> the tiny Qwen2; GPU settings (bf16, checkpointing, Liger, 4-bit) off; 1 step",
         [(r"--config_file configs/accelerate/multi_gpu\.yaml --num_processes 8", MULTI_CPU),
          (r"$", " " + CPU_TRAIN)]),
    Rule(r"^accelerate launch --config_file configs/accelerate/single_gpu\.yaml -m distill\.train", "run",
         "one GPU -> one CPU process (--cpu, no mixed precision); the tiny Qwen2; GPU settings off; 1 step",
         [(r"--config_file configs/accelerate/single_gpu\.yaml", "--config_file configs/accelerate/single_gpu.yaml "
           "--cpu --mixed_precision no"), (r"$", " " + CPU_TRAIN)]),
    Rule(r"^distill serve ", "stand-in", "vLLM on a GPU -> `distill serve --dry-run` (the config, the adapter and "
         "the vLLM command checked), and the fake API stands in on its port, listing what it would serve",
         [(r"$", " --dry-run")]),
    Rule(r"^(OPENAI_API_KEY=\.\.\. )?distill eval --config configs/eval_hotpot_trivia_7b\.yaml", "run",
         "the hosted Solver, teacher and judge are the fake API; the served student and base its stand-in on "
         ":8000; 4 demo dev questions, the fake MediaWiki API over the demo corpus",
         [(r"^OPENAI_API_KEY=\.\.\. ", ""), (r"$", " " + TINY_EVAL)]),
    Rule(r"^distill report ", "run", "as written"),
    Rule(r"^(OPENAI_API_KEY=\.\.\. )?distill pipeline --config configs/pipeline_hotpot_trivia_7b\.yaml --check",
         "run", "every stage's check against the fake API; on a CPU it exits 2, naming the two settings that size the "
         "run for GPUs (train.bf16, student_server.gpu_memory_utilization), as it should",
         [(r"^OPENAI_API_KEY=\.\.\. ", "")], expect=2),
    Rule(r"^distill pipeline --config configs/demo_smollm2_cpu\.yaml .*--check --offline", "run", "as written"),
    Rule(r"^distill ask .*configs/ask_smollm2_local\.yaml", "run", "as written: the embedded model in process"),
]


def rule_for(command: str) -> Rule | None:
    return next((r for r in SUBSTITUTIONS if re.search(r.covers, command)), None)


def substituted(command: str, rule: Rule) -> str:
    for pattern, replacement in rule.subst:
        command = re.sub(pattern, lambda _m, r=replacement: r, command, count=1)
    return command


def uncovered() -> list[str]:
    """Documented commands no row of the table covers: each fails the rehearsal."""
    return [f"{b.where}: {c}" for b in documented_blocks() for c in b.commands if rule_for(c) is None]


# ---------------------------------------------------------------------------------------------------------------
# The world the commands run in


def tiny_qwen(hub_cache: Path) -> None:
    """A Qwen2 model of a few hundred thousand weights, randomly initialised, with the embedded SmolLM2's tokenizer
    (ChatML, as Qwen2.5's) and Qwen2.5's chat template, put in the Hub cache as Qwen/Qwen2.5-7B-Instruct: every
    command that names the 7B base loads it, offline, with the class and template of the real one."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from distill.llm.embedded import resolve_model_path

    snapshot = hub_cache / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / ("0" * 40)
    if (snapshot / "config.json").exists():
        return
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    tokenizer.chat_template = QWEN_TEMPLATE
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir(parents=True, exist_ok=True)
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)


QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message['role'] != 'system' or not loop.first %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# The questions docs/serving-agent.md asks the served agent: their answers and the demo corpus's pages that hold
# them, so the fake API plans and answers them as a good teacher would and their feedback can be learnt from.
AGENT_QUESTIONS = {
    "Which river flows through the city where Wolfgang Amadeus Mozart was born?":
        (["Salzach"], ["Wolfgang Amadeus Mozart", "Salzburg"]),
    "In which city was the person who co-founded Microsoft with Paul Allen born?": (["Seattle"], ["Bill Gates"]),
    "Who directed the 1972 film adaptation of Mario Puzo's crime novel?": (["Francis Ford Coppola"], ["The Godfather"]),
}


def known_questions() -> dict[str, tuple[list[str], list[str]]]:
    known = dict(AGENT_QUESTIONS)
    for name in ("train.jsonl", "dev.jsonl"):
        for line in (ROOT / "data" / "demo" / name).read_text().splitlines():
            row = json.loads(line)
            titles = list(dict.fromkeys(t for t, _ in row.get("supporting_facts", [])))
            known[row["question"]] = ([row["answer"]], titles)
    return known


def demo_pages() -> dict[str, str]:
    """The demo corpus as Wikipedia pages for the fake MediaWiki API: each title's paragraphs, in file order."""
    pages: dict[str, list[str]] = {}
    for line in (ROOT / "data" / "demo" / "corpus.jsonl").read_text().splitlines():
        row = json.loads(line)
        pages.setdefault(row["title"], []).append(row["text"])
    return {title: "\n".join(texts) for title, texts in pages.items()}


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@dataclass
class Outcome:
    where: str
    command: str
    action: str
    rc: int | None = None
    seconds: float = 0.0
    made: str = ""
    why: str = ""
    expect: int = 0


class Rehearsal:
    def __init__(self, work: Path, log=print):
        self.work, self.log = work, log
        self.outcomes: list[Outcome] = []
        self.ran: dict[str, str] = {}  # substituted command -> where it first ran
        self.stack = contextlib.ExitStack()
        self.block_stack: contextlib.ExitStack | None = None
        self.serving: dict[int, contextlib.ExitStack] = {}  # port -> what stops the server the rehearsal runs there

    def __enter__(self):
        from fakes import mediawiki, rewoo_chat

        for name in ("configs", "data", "scripts"):
            if not (self.work / name).exists():
                shutil.copytree(ROOT / name, self.work / name)
        hub_cache = self.work / "hub-cache"
        tiny_qwen(hub_cache)
        predictions = [json.loads(line) for line in (ROOT / "data" / "demo" / "dev.jsonl").read_text().splitlines()]
        (self.work / "predictions.jsonl").write_text("".join(
            json.dumps({"id": r["_id"], "prediction": r["answer"] if n % 2 == 0 else "no idea", "answers": [r["answer"]]})
            + "\n" for n, r in enumerate(predictions)))
        self.api = self.stack.enter_context(rewoo_chat(known=known_questions(), models={"gpt-4o-mini": None}))
        self.wiki = self.stack.enter_context(mediawiki(demo_pages()))
        bin_dir = Path(sys.executable).parent
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "OPENAI_BASE_URL": self.api.url, "OPENAI_API_KEY": "sk-rehearsal-not-a-key",
                    "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        return self

    def __exit__(self, *exc):
        self.stack.close()

    def stand_in(self, command: str) -> None:
        """The fake API on the port a `distill serve` config names, listing the names it would serve."""
        from distill.core.config import load_config
        from distill.serving.serve import ServeConfig, served_name
        from fakes import rewoo_chat

        argv = shlex.split(command)
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        cfg = load_config(ServeConfig, self.work / argv[argv.index("--config") + 1], sets)
        models = {served_name(cfg): None} | {n: str(a) for n, a in cfg.adapters.items()}
        if cfg.adapter:
            models[cfg.lora_name] = str(cfg.adapter)
        api = self.take_port(cfg.port).enter_context(rewoo_chat(port=cfg.port, known=known_questions(), models=models))
        self.log(f"    stand-in for the server: the fake API at {api.url} serving {', '.join(models)}")

    def take_port(self, port: int) -> contextlib.ExitStack:
        """What will stop the next server on `port` when its block ends: a server the rehearsal already runs there is
        stopped first, as a user stops one server before starting the next on its port."""
        if port in self.serving:
            self.serving.pop(port).close()
        if not free(port):
            raise RuntimeError(f"port {port} is taken: stop what listens there and rehearse again")
        stack = self.block_stack.enter_context(contextlib.ExitStack())
        self.serving[port] = stack
        stack.callback(self.serving.pop, port, None)
        return stack

    def serve(self, actual: str, port: int, out) -> int:
        """`actual` in the background, its own process group, until its block ends: 0 once GET /health on `port`
        answers 200, else its exit status (or 1: not ready within 300 s). Stopped with SIGTERM, as a user would."""
        import httpx

        stack = self.take_port(port)
        proc = subprocess.Popen(["bash", "-c", f"exec {actual}"], cwd=self.work, env=self.env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)

        def stop():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            self.log(f"    stopped {actual.split(' --')[0]} on :{port} (exit {rc})")

        stack.callback(stop)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return proc.returncode
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return 0
            time.sleep(0.5)
        return 1

    def run_block(self, block: Block) -> None:
        self.log(f"--- {block.where}")
        with contextlib.ExitStack() as self.block_stack:
            for command in block.commands:
                self.run_command(block.where, command)

    def run_command(self, where: str, command: str) -> None:
        rule = rule_for(command)
        if rule is None:
            self.outcomes.append(Outcome(where, command, "UNCOVERED", why="no row of the table covers it"))
            self.log(f"  UNCOVERED  {command}")
            return
        if rule.action == "skip":
            self.outcomes.append(Outcome(where, command, "not run", why=rule.why))
            self.log(f"  not run    {command}\n             ({rule.why})")
            return
        if rule.before:
            self.run_command(where, rule.before)
        actual = substituted(command, rule).replace("{api}", self.api.url).replace("{wiki}", self.wiki.url)
        if rule.action not in ("stand-in", "serve") and actual in self.ran:
            self.outcomes.append(Outcome(where, command, "ran above", why=f"the same command: {self.ran[actual]}"))
            self.log(f"  ran above  {command}")
            return
        before = self.snapshot()
        start = time.monotonic()
        self.log(f"  run        {actual}")
        with open(self.work / "rehearsal.log", "a") as out:
            out.write(f"\n$ {actual}\n")
            out.flush()
            if rule.action == "serve":
                rc = self.serve(actual, rule.port, out)
            else:
                proc = subprocess.Popen(["bash", "-c", actual], cwd=self.work, env=self.env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    rc = proc.wait(timeout=900)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    rc = proc.wait()
        seconds = time.monotonic() - start
        made = self.made(before)
        self.ran[actual] = where
        self.outcomes.append(Outcome(where, command, rule.action, rc, seconds, made, rule.why,
                                     rule.expect))
        self.log(f"             exit {rc} in {seconds:.1f} s; {made or 'wrote nothing'}")
        if rc == rule.expect and rule.action == "stand-in":
            self.stand_in(actual)

    def snapshot(self) -> dict[str, float]:
        runs = self.work / "runs"
        return {str(p.relative_to(self.work)): p.stat().st_mtime for p in runs.rglob("*") if p.is_file()} \
            if runs.exists() else {}

    def made(self, before: dict[str, float]) -> str:
        after = self.snapshot()
        new = sorted(p for p, t in after.items() if before.get(p) != t)
        if not new:
            return ""
        by_run: dict[str, list[str]] = {}
        for p in new:
            parts = Path(p).parts
            by_run.setdefault("/".join(parts[:2]), []).append("/".join(parts[2:]))
        key = ("trajectories.jsonl", "kept.jsonl", "report.md", "adapter_model.safetensors", "dataset_dict.json")
        shown = []
        for run, files in by_run.items():
            named = [f for f in files if f.endswith(key)][:3]
            shown.append(f"{run}: {len(files)} files" + (f" ({', '.join(named)})" if named else ""))
        return "; ".join(shown)


def rehearse(work: Path, only: str | None = None, log=print) -> list[Outcome]:
    blocks = [b for b in documented_blocks() if only is None or b.where.startswith(only)]
    with Rehearsal(work, log) as rehearsal:
        for block in blocks:
            rehearsal.run_block(block)
    return rehearsal.outcomes


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.action == "UNCOVERED" or (o.rc is not None and o.rc != o.expect)]


def table(outcomes: list[Outcome]) -> str:
    lines = []
    for o in outcomes:
        result = (f"exit {o.rc}, {o.seconds:.0f} s, {o.made or 'wrote nothing'}" if o.rc is not None
                  else f"{o.action}: {o.why}")
        lines.append(f"{o.where:45} {o.command[:90]:90} {result}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each documented command and its table row")
    parser.add_argument("--only", help="rehearse the blocks whose place starts with this (e.g. README.md)")
    parser.add_argument("--keep", type=Path, help="work folder to use and keep (default: a temporary one)")
    args = parser.parse_args()
    if args.list:
        for block in documented_blocks():
            for command in block.commands:
                rule = rule_for(command)
                print(f"{block.where:45} {rule.action if rule else 'UNCOVERED':9} {command}")
        return 1 if uncovered() else 0
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rehearsal-")))
        work.mkdir(parents=True, exist_ok=True)
        outcomes = rehearse(work, args.only)
        print("\n=== the rehearsal: command -> outcome")
        print(table(outcomes))
        bad = failures(outcomes)
        ran = sum(o.rc is not None for o in outcomes)
        print(f"\n{ran} commands run, {len(outcomes) - ran} not run (each with its reason), {len(bad)} failed, "
              f"in {time.monotonic() - start:.0f} s (log: {work / 'rehearsal.log'})")
        for o in bad:
            print(f"FAILED {o.where}: {o.command} ({o.why if o.rc is None else f'exit {o.rc}'})", file=sys.stderr)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
