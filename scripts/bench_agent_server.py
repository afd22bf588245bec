"""Load on a running agent server (`distill serve-agent`): N chat requests, M in flight, on loopback.

    python scripts/bench_agent_server.py --url http://127.0.0.1:8080 --model distill-agent -n 40 -c 4 \
        [--token-env AGENT_TOKEN] [--stream] [--questions data/demo/dev.jsonl]

Prints p50/p99 latency, throughput and the count of each error; asserts nothing. The questions cycle through the
file's (JSONL with `question`) or a built-in few. Every request has a timeout, so a stuck server ends the run
with timeouts counted, not a hang. A 429 counts as an error (it is the server refusing load): run with
-c at or under the server's max_in_flight to measure latency, above it to see the refusals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter

QUESTIONS = [
    "Which country is the Eiffel Tower in?",
    "What is 17 * 23?",
    "Who wrote Pride and Prejudice?",
    "Which river flows through Paris?",
]
MAX_REQUESTS = 10_000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def one(client, url: str, headers: dict, body: dict, stream: bool, timeout_s: float) -> tuple[float, str | None]:
    import httpx

    t0 = time.perf_counter()
    try:
        if stream:
            async with client.stream("POST", url, json=body | {"stream": True}, headers=headers,
                                     timeout=timeout_s) as r:
                if r.status_code != 200:
                    await r.aread()
                    return time.perf_counter() - t0, str(r.status_code)
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and '"error"' in line[:20]:
                        return time.perf_counter() - t0, "stream error"
        else:
            r = await client.post(url, json=body, headers=headers, timeout=timeout_s)
            if r.status_code != 200:
                return time.perf_counter() - t0, str(r.status_code)
    except httpx.TimeoutException:
        return time.perf_counter() - t0, "timeout"
    except httpx.HTTPError as exc:
        return time.perf_counter() - t0, type(exc).__name__
    return time.perf_counter() - t0, None


async def bench(args) -> None:
    import httpx

    questions = QUESTIONS
    if args.questions:
        with open(args.questions, encoding="utf-8") as f:
            questions = [json.loads(line)["question"] for line in f if line.strip()] or QUESTIONS
    headers = {}
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            sys.exit(f"error: --token-env: {args.token_env} is not set")
        headers["Authorization"] = f"Bearer {token}"
    url = args.url.rstrip("/") + "/v1/chat/completions"
    slots = asyncio.Semaphore(args.concurrency)
    results: list[tuple[float, str | None]] = []

    async def run(i: int) -> None:
        async with slots:
            body = {"model": args.model, "messages": [{"role": "user", "content": questions[i % len(questions)]}]}
            results.append(await one(client, url, headers, body, args.stream, args.timeout_s))

    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(run(i) for i in range(args.n)))
        wall = time.perf_counter() - t0
    ok = [s for s, err in results if err is None]
    errors = Counter(err for _, err in results if err is not None)
    print(f"requests {args.n}, in flight {args.concurrency}, stream {args.stream}: {len(ok)} ok, "
          f"{sum(errors.values())} errors {dict(errors) or ''}".rstrip())
    if ok:
        print(f"latency p50 {percentile(ok, 0.5):.2f} s, p99 {percentile(ok, 0.99):.2f} s, "
              f"mean {statistics.mean(ok):.2f} s")
    print(f"throughput {len(ok) / wall:.2f} answers/s over {wall:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="distill-agent")
    parser.add_argument("-n", type=int, default=20, help="requests in all")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--token-env", help="name of the variable holding the bearer token")
    parser.add_argument("--questions", help="a JSONL file of {question}")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    args = parser.parse_args()
    if not 1 <= args.n <= MAX_REQUESTS or not 1 <= args.concurrency <= 1024:
        sys.exit(f"error: -n must be 1..{MAX_REQUESTS} and -c 1..1024")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
