"""The resumable run loop shared by generation and evaluation.

Work items are keyed; whatever the store already holds is skipped, each finished record is appended
(durably) the moment it exists, and Ctrl-C stops the loop between writes, so a record is never torn and
never lost. Only the items in flight at the interrupt are redone on the next run.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Hashable

from distill.store import JsonlStore


@dataclass
class RunningStats:
    """Running totals shown on the progress bar and written to the summary."""

    n: int = 0
    em: float = 0.0
    f1: float = 0.0
    scored: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    valid_plans: int = 0
    by_dataset: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, rec: dict) -> None:
        self.n += 1
        self.tokens += rec.get("tokens", {}).get("total", 0)
        self.cost_usd += rec.get("cost_usd", 0.0)
        self.valid_plans += bool(rec.get("plan", {}).get("valid", False))
        scores = rec.get("scores") or {}
        d = self.by_dataset.setdefault(rec.get("dataset", "?"), {"n": 0, "em": 0.0, "f1": 0.0})
        d["n"] += 1
        if "em" in scores:
            self.scored += 1
            self.em += scores["em"]
            self.f1 += scores["f1"]
            d["em"] += scores["em"]
            d["f1"] += scores["f1"]

    def postfix(self) -> str:
        acc = f"EM {self.em / self.scored:.3f}" if self.scored else "EM -"
        return f"{acc} tok {self.tokens / 1e3:.1f}k ${self.cost_usd:.4f}"

    def summary(self) -> dict:
        per = {
            k: {"n": v["n"], "em": v["em"] / v["n"] if v["n"] else None, "f1": v["f1"] / v["n"] if v["n"] else None}
            for k, v in self.by_dataset.items()
        }
        return {
            "records": self.n,
            "em": self.em / self.scored if self.scored else None,
            "f1": self.f1 / self.scored if self.scored else None,
            "valid_plan_rate": self.valid_plans / self.n if self.n else None,
            "tokens": self.tokens,
            "cost_usd": round(self.cost_usd, 6),
            "by_dataset": per,
        }


async def _run(
    todo: list[tuple[Hashable, Any]],
    work: Callable[[Any], Awaitable[dict]],
    store: JsonlStore,
    concurrency: int,
    on_record: Callable[[dict], None],
) -> bool:
    """Returns True when every item finished, False when interrupted."""
    queue: asyncio.Queue = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def worker() -> None:
        while not interrupted.is_set():
            try:
                _, payload = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            record = await work(payload)
            if interrupted.is_set():
                return
            store.append(record)
            on_record(record)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]

    def stop() -> None:
        interrupted.set()
        for w in workers:
            w.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError):  # not the main thread / platform without it
            pass
    try:
        results = await asyncio.gather(*workers, return_exceptions=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError):
                pass
    errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    if errors:
        raise errors[0]
    return not interrupted.is_set()


def run_resumable(
    items: list[tuple[Hashable, Any]],
    work: Callable[[Any], Awaitable[dict]],
    store: JsonlStore,
    key: Callable[[dict], Hashable],
    *,
    concurrency: int = 4,
    desc: str = "run",
    stats: RunningStats | None = None,
) -> RunningStats:
    """Run every item whose key is not in the store yet; raise KeyboardInterrupt after a clean stop."""
    from tqdm import tqdm

    stats = stats or RunningStats()
    done = store.keys(key)
    wanted = {k for k, _ in items}
    for rec in store.records():
        if key(rec) in wanted:
            stats.add(rec)
    todo = [(k, p) for k, p in items if k not in done]
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=desc, unit="rec", dynamic_ncols=True)
    bar.set_postfix_str(stats.postfix())

    def on_record(rec: dict) -> None:
        stats.add(rec)
        bar.update(1)
        bar.set_postfix_str(stats.postfix())

    try:
        finished = asyncio.run(_run(todo, work, store, concurrency, on_record))
    finally:
        bar.close()
    if not finished:
        raise KeyboardInterrupt
    return stats
