"""distill ask "QUESTION" [--config configs/ask_smollm2_local.yaml] [--json]

Runs Planner, Worker and Solver on one question and prints the answer (or, with --json, the whole
trajectory record: planner messages and output, parsed plan, evidence with timings, solver call, tokens, cost).
"""

from __future__ import annotations

import argparse
import asyncio
import json

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="the question to answer")
    add_config_args(parser, default=None)
    parser.add_argument("--answer", action="append", default=[], help="gold answer(s), to score the prediction")
    parser.add_argument("--dataset", default="hotpotqa", help="scoring rules for --answer (hotpotqa|triviaqa)")
    parser.add_argument("--json", action="store_true", help="print the whole trajectory record as JSON")


def main(args: argparse.Namespace) -> int:
    from distill.config import AgentConfig, load_config
    from distill.errors import DistillError
    from distill.rewoo.agent import Question, build_agent

    if not args.question.strip():
        raise DistillError("the question is empty")
    cfg = load_config(AgentConfig, args.config, args.set)
    agent = build_agent(cfg)
    example = Question(args.question, dataset=args.dataset, answers=args.answer)
    record = asyncio.run(agent.run(example))
    if args.json:
        print(json.dumps(record, indent=2, ensure_ascii=False))
        return 0
    for step, ev in zip(record["plan"]["steps"], record["evidence"]):
        print(f"{step['id']} = {step['tool']}[{ev['input']}]  ({ev['status']}, {ev['end_s'] - ev['start_s']:.2f}s)")
    for err in record["plan"]["errors"]:
        print(f"plan error {err['code']} {err['step'] or ''}: {err['message']}")
    print(f"Answer: {record['prediction']}")
    extra = f", EM {record['scores']['em']} F1 {record['scores']['f1']:.2f}" if record["scores"] else ""
    print(f"({record['tokens']['total']} tokens, ${record['cost_usd']:.4f}, {record['wall_s']:.1f}s{extra})")
    return 0
