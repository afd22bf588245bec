#!/usr/bin/env python
"""python scripts/bench_scale.py [--sizes 1000,4000,16000] [--data DATA] [--corpus FILE] [--concurrency 64]

The pipeline's own cost at the mission's scale: `distill generate` -> `distill filter` -> `distill sft-data` on
1k, 4k and 16k questions (half HotpotQA, half TriviaQA), each stage run as its own process through the real
`distill` command, against an instant teacher: a real HTTP server on 127.0.0.1 that speaks the OpenAI chat API
and answers every planner call with a valid ReWOO plan (a Wikipedia step, then an LLM step) and every Solver call
with the gold answer (a wrong one for a quarter of the questions, so the filter has something to drop). With a
teacher that takes no time, all the time measured is the pipeline's: reading questions, the prompts, the local
BM25 Wikipedia, the call cache, fsynced records, the filter, tokenizing the SFT examples.

Per stage and size it prints the wall seconds and CPU seconds per 1k questions, the stage process's peak RSS
(`os.wait4`'s rusage of that child), and the size of what the stage wrote; then the ratios between consecutive
sizes (flat cost per question means a seconds-per-1k ratio near 1, memory that does not grow with the count a
peak-RSS ratio near 1; output size grows with the count, ~4x), and the overhead in ms per question.

Questions come from DATA (`--data`, else the `DISTILL_SHARED_DATA` variable, else `../shared/data` beside the
checkout): `hotpotqa/train_pool.jsonl` and `triviaqa/train_pool.jsonl`, and the dev files as the leak guard's
eval sets; a size above what the pools hold repeats their questions with a suffix (" (variant 2)"), so every
question stays distinct. Without DATA the script writes questions of its own. The Wikipedia tool is the local
BM25 one, over `wiki/hotpotqa_paragraphs.jsonl` of DATA when present, else the demo corpus (`--corpus` picks).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("generate", "filter", "sft-data")


# ------------------------------------------------------------------------------------------ the instant teacher

class Teacher:
    """What the fake teacher knows: the gold answer of every question, to answer the Solver."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.calls = {"planner": 0, "solver": 0, "llm_tool": 0}
        self.lock = threading.Lock()

    def reply(self, messages: list[dict]) -> tuple[str, str]:
        from distill.rewoo.prompts import PLANNER_INSTRUCTIONS, SOLVER_INSTRUCTIONS

        first = str(messages[0].get("content") or "")
        last = str(messages[-1].get("content") or "")
        if messages[0].get("role") == "system" and first.startswith(PLANNER_INSTRUCTIONS):
            question = last.removeprefix("Question: ").strip()
            query = " ".join(re.sub(r"[\[\]#=\n]", " ", question).split()[:8]) or "Wikipedia"
            plan = (f"Plan: Search Wikipedia for the subject of the question.\n#E1 = Wikipedia[{query}]\n"
                    f"Plan: Answer the question from what was found.\n"
                    f"#E2 = LLM[{re.sub(r'[#]', ' ', query)}? Given context: #E1]")
            return "planner", plan
        if first.startswith(SOLVER_INSTRUCTIONS):
            question = re.sub(r" \(variant \d+\)$", "", first.rsplit("Question: ", 1)[-1].strip())
            answer = self.answers.get(question, "unknown")
            wrong = int(hashlib.sha256(question.encode()).hexdigest(), 16) % 4 == 0
            return "solver", ("not " + answer) if wrong else answer
        return "llm_tool", "The context names it."


def teacher_handler(teacher: Teacher) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client's connection pool is used as with a real server

        def do_POST(self):  # noqa: N802 (http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            kind, text = teacher.reply(body.get("messages") or [{}])
            with teacher.lock:
                teacher.calls[kind] += 1
            self._send({
                "id": "x", "object": "chat.completion", "created": 0, "model": body.get("model", "teacher"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 400, "completion_tokens": len(text.split()) + 1,
                          "total_tokens": 401 + len(text.split())},
            })

        def do_GET(self):  # noqa: N802
            self._send({"object": "list", "data": [{"id": "teacher", "object": "model", "root": "fake-teacher",
                                                     "parent": None}]})

        def _send(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler


@contextlib.contextmanager
def serve_teacher(teacher: Teacher):
    server = ThreadingHTTPServer(("127.0.0.1", 0), teacher_handler(teacher))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------ questions

def shared_data(flag: str | None) -> Path | None:
    folder = Path(flag or os.environ.get("DISTILL_SHARED_DATA") or ROOT.parent / "shared" / "data")
    pools = [folder / "hotpotqa" / "train_pool.jsonl", folder / "triviaqa" / "train_pool.jsonl"]
    if flag and not all(p.exists() for p in pools):
        sys.exit(f"--data {flag}: needs hotpotqa/train_pool.jsonl and triviaqa/train_pool.jsonl")
    return folder if all(p.exists() for p in pools) else None


def read_pool(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def generated_pools(n: int) -> tuple[list[dict], list[dict]]:
    """Questions of the script's own, in the two official row layouts, when no real pool is at hand."""
    rng = random.Random(0)
    words = ["river", "castle", "painter", "album", "treaty", "island", "novel", "bridge", "league", "opera"]
    hotpot = [{"_id": f"gen-h{i}", "question": f"Which {rng.choice(words)} named in record {i} is older, "
               f"the {rng.choice(words)} or the {rng.choice(words)}?", "answer": f"answer {i}",
               "type": "comparison", "level": "medium"} for i in range(n)]
    trivia = [{"id": f"gen-t{i}", "question": f"What {rng.choice(words)} is known as number {i}?",
               "answer": f"answer {i}", "aliases": [f"answer {i}", f"the answer {i}"]} for i in range(n)]
    return hotpot, trivia


def take(pool: list[dict], n: int, id_key: str) -> list[dict]:
    """`n` distinct questions from `pool`, repeating it with a suffix past its end."""
    out = []
    for i in range(n):
        row = dict(pool[i % len(pool)])
        if (r := i // len(pool)) > 0:
            row["question"] = f"{row['question'].rstrip()} (variant {r + 1})"
            if row.get(id_key) is not None:
                row[id_key] = f"{row[id_key]}-v{r + 1}"
        out.append(row)
    return out


def distinct(pool: list[dict], seed: int) -> list[dict]:
    from distill.core.data import normalize_question

    seen, out = set(), []
    for row in pool:
        if isinstance(row.get("question"), str) and (key := normalize_question(row["question"])) and key not in seen:
            seen.add(key)
            out.append(row)
    random.Random(seed).shuffle(out)
    return out


# ------------------------------------------------------------------------------------------ stages

def run_stage(argv: list[str], log: Path, cwd: Path) -> dict:
    """One stage as a child process; its wall time, CPU time and peak RSS (this child's own rusage)."""
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env=os.environ | {"PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "5"})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        sys.exit(f"{' '.join(argv[:2])} exited {proc.returncode}; the end of {log}:\n" + "\n".join(tail))
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024}


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def lines_of(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def bench_size(n: int, hotpot: list[dict], trivia: list[dict], data: Path | None, corpus: Path, url: str,
               work: Path, args) -> list[dict]:
    import yaml

    folder = work / str(n)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "questions").mkdir(parents=True)
    files = {"hotpotqa": (folder / "questions" / "hotpotqa.jsonl", take(hotpot, n // 2, "_id")),
             "triviaqa": (folder / "questions" / "triviaqa.jsonl", take(trivia, n - n // 2, "id"))}
    for path, rows in files.values():
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    spec = {"backend": "openai", "model": "teacher", "base_url": url, "max_concurrency": args.concurrency,
            "timeout_s": 60}
    evals = [] if data is None else [
        {"name": "hotpotqa", "source": str(data / "hotpotqa" / "dev_distractor_sample.jsonl"), "split": "dev"},
        {"name": "triviaqa", "source": str(data / "triviaqa" / "dev_sample.jsonl"), "split": "dev"}]
    config = {  # configs/generate_teacher.yaml's settings, the teacher on this machine and a local Wikipedia
        "planner": spec | {"temperature": 0.7, "max_tokens": 512},
        "solver": spec | {"max_tokens": 64},
        "llm_tool": spec | {"max_tokens": 64},
        "planner_prompt": "fewshot",
        "tools": ["Wikipedia", "LLM", "Calculator"],
        "wikipedia_backend": "local",
        "wikipedia_corpus": str(corpus),
        "datasets": [{"name": name, "source": str(path), "split": "train", "n": len(rows)}
                     for name, (path, rows) in files.items()],
        "eval_sets": [e for e in evals if Path(e["source"]).exists()],
        "output_dir": str(folder / "generate"),
        "seed": 0,
        "samples_per_question": 1,
        "concurrency": args.concurrency,
        "cache": "auto",
    }
    (folder / "generate.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    distill = [str(Path(sys.executable).parent / "distill")]
    if not Path(distill[0]).exists():
        distill = [sys.executable, "-c", "import sys; from distill.cli import main; sys.exit(main())"]
    traj, kept, sft = folder / "generate" / "trajectories.jsonl", folder / "kept.jsonl", folder / "sft"
    commands = {
        "generate": (distill + ["generate", "--config", str(folder / "generate.yaml")], traj),
        "filter": (distill + ["filter", str(traj), "--out", str(kept)], kept),
        "sft-data": (distill + ["sft-data", str(kept), "--out", str(sft), "--tokenizer", args.tokenizer], sft),
    }
    rows = []
    for stage, (argv, output) in commands.items():
        result = run_stage(argv, folder / f"{stage}.log", ROOT)
        records = lines_of(output) if output.is_file() else json.loads((output / "summary.json").read_text())[
            "splits"]["train"]["examples"] + json.loads((output / "summary.json").read_text())["splits"][
            "validation"]["examples"]
        rows.append({"stage": stage, "questions": n, "records": records, "output_mib": size_of(output) / 2**20,
                     **result})
        print(f"  {stage:<9} {n:>6} questions: {result['wall_s']:7.1f} s wall, {result['cpu_s']:7.1f} s CPU, "
              f"peak RSS {result['peak_rss_mib']:7.1f} MiB, {records} records", flush=True)
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------------------ report

def per_1k(row: dict, key: str) -> float:
    return row[key] / row["questions"] * 1000


def report(rows: list[dict], sizes: list[int]) -> str:
    lines = ["| stage | questions | records | wall s | s / 1k q | CPU s / 1k q | peak RSS MiB | output MiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for stage in STAGES:
        for r in (r for r in rows if r["stage"] == stage):
            lines.append(f"| {stage} | {r['questions']} | {r['records']} | {r['wall_s']:.1f} | "
                         f"{per_1k(r, 'wall_s'):.2f} | {per_1k(r, 'cpu_s'):.2f} | {r['peak_rss_mib']:.0f} | "
                         f"{r['output_mib']:.1f} |")
    if len(sizes) > 1:
        lines += ["", "| stage | sizes | s / 1k q ratio | CPU / 1k q ratio | peak RSS ratio | output ratio |",
                  "|---|---|---:|---:|---:|---:|"]
        for stage in STAGES:
            by = {r["questions"]: r for r in rows if r["stage"] == stage}
            for a, b in zip(sizes, sizes[1:]):
                ra, rb = by[a], by[b]
                lines.append(f"| {stage} | {b}/{a} | {per_1k(rb, 'wall_s') / per_1k(ra, 'wall_s'):.2f} | "
                             f"{per_1k(rb, 'cpu_s') / max(per_1k(ra, 'cpu_s'), 1e-9):.2f} | "
                             f"{rb['peak_rss_mib'] / ra['peak_rss_mib']:.2f} | "
                             f"{rb['output_mib'] / max(ra['output_mib'], 1e-9):.2f} |")
    lines += ["", "| questions | overhead ms / question (wall, all stages) | of which generate | "
              "marginal ms / question (wall, all stages) |", "|---:|---:|---:|---:|"]
    totals = {n: sum(r["wall_s"] for r in rows if r["questions"] == n) for n in sizes}
    gen = {r["questions"]: r["wall_s"] for r in rows if r["stage"] == "generate"}
    for i, n in enumerate(sizes):
        marginal = "–" if i == 0 else f"{(totals[n] - totals[sizes[i - 1]]) / (n - sizes[i - 1]) * 1000:.1f}"
        lines.append(f"| {n} | {totals[n] / n * 1000:.1f} | {gen[n] / n * 1000:.1f} | {marginal} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,4000,16000", help="question counts, comma-separated")
    p.add_argument("--data", help="folder with hotpotqa/train_pool.jsonl and triviaqa/train_pool.jsonl "
                                  "(default: $DISTILL_SHARED_DATA, else ../shared/data; none: generated questions)")
    p.add_argument("--corpus", help="JSONL {title, text} for the local Wikipedia (default: DATA's "
                                    "wiki/hotpotqa_paragraphs.jsonl, else data/demo/corpus.jsonl)")
    p.add_argument("--concurrency", type=int, default=64, help="questions in flight in generate")
    p.add_argument("--tokenizer", default="smollm2-135m-instruct", help="sft-data's tokenizer ('none' skips it)")
    p.add_argument("--work", help="folder for the runs (default: a temporary one, removed after)")
    p.add_argument("--keep", action="store_true", help="keep each size's run folder")
    p.add_argument("--json", help="also write the measurements to this file")
    args = p.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if not sizes or sizes[0] < 2:
        sys.exit("--sizes: question counts of at least 2")

    data = shared_data(args.data)
    if data is not None:
        hotpot = distinct(read_pool(data / "hotpotqa" / "train_pool.jsonl"), 0)
        trivia = distinct(read_pool(data / "triviaqa" / "train_pool.jsonl"), 1)
    else:
        hotpot, trivia = generated_pools(sizes[-1])
    wiki = data / "wiki" / "hotpotqa_paragraphs.jsonl" if data is not None else None
    corpus = Path(args.corpus) if args.corpus else wiki if wiki is not None and wiki.exists() else \
        ROOT / "data" / "demo" / "corpus.jsonl"
    answers = {r["question"].strip(): str(r["answer"]) for r in hotpot + trivia}
    print(f"questions: {'generated' if data is None else data} ({len(hotpot)} HotpotQA, {len(trivia)} TriviaQA "
          f"distinct); Wikipedia corpus: {corpus}; concurrency {args.concurrency}", flush=True)
    teacher = Teacher(answers)
    rows = []
    with contextlib.ExitStack() as stack:
        work = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        url = stack.enter_context(serve_teacher(teacher))
        for n in sizes:
            rows += bench_size(n, hotpot, trivia, data, corpus, url, work, args)
    print()
    print(report(rows, sizes))
    print(f"\nteacher calls: {teacher.calls}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": sizes, "rows": rows, "teacher_calls": teacher.calls},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
