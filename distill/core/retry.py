"""The pooled client and the one bounded retry loop the HTTP clients here (model servers, Wikipedia) share.

A paid run meets rate limits and overloaded servers as a matter of course, so both clients retry the same
way: exponential backoff with full jitter (callers refused together do not come back together), a server's
`Retry-After` waited in full up to the client's cap, and, once the retries are spent, the last fault for the
caller to say in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import random
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx


class Fault(Exception):
    """One failed attempt: `kind` counts it, `retry` says whether another attempt may help, `wait_s` is the
    server's `Retry-After`. Raised out of `with_retries` with `attempts` set, when it gives up."""

    def __init__(self, kind: str, detail: str, retry: bool, wait_s: float | None = None):
        super().__init__(detail)
        self.kind, self.detail, self.retry, self.wait_s = kind, detail, retry, wait_s
        self.attempts = 1

    def describe(self) -> str:
        return self.detail + (f" after {self.attempts} attempts" if self.attempts > 1 else "")


def retry_after_s(value: str | None) -> float | None:
    """`Retry-After` as seconds from now (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" dates: UTC (RFC 5322), not local time
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def backoff_s(attempt: int, fault: Fault, base_s: float, cap_s: float) -> float:
    """A server's `Retry-After` wins (never back sooner than it asked), but no wait goes past the cap."""
    if fault.wait_s is not None:
        return min(fault.wait_s, cap_s)
    return random.uniform(0, min(cap_s, base_s * 2**attempt))


async def with_retries(client: Any, attempt: Callable[[], Awaitable[Any]], deadline: float | None = None) -> Any:
    """`attempt()` until it returns, at most `client.max_retries` times more, sleeping `backoff_s` between.

    `client` holds the settings (`max_retries`, `backoff_s`, `max_wait_s`) and the counts a run summary reads
    (`retries`, `faults` by kind). A `deadline` (event-loop time, from the client's `budget_s`) bounds the call,
    waits included: a wait that would pass it gives up at once; an attempt it cuts off names the fault before it.
    """
    loop = asyncio.get_running_loop()
    last: Fault | None = None
    for n in range(client.max_retries + 1):
        try:
            async with asyncio.timeout_at(deadline):
                return await attempt()
        except TimeoutError:
            if deadline is None:
                raise
            before = f"{last.detail}, then " if last else ""
            raise Fault("budget", f"{before}no answer within the {client.budget_s:g}s budget", retry=False) from None
        except Fault as fault:
            last = fault
        client.faults[last.kind] += 1
        delay = backoff_s(n, last, client.backoff_s, client.max_wait_s)
        if not last.retry or n == client.max_retries or (deadline is not None and loop.time() + delay > deadline):
            last.attempts = n + 1
            raise last
        client.retries += 1
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


# How long an idle pooled connection is reused: well under the 5 s after which uvicorn (vLLM's server and the
# agent server) closes an idle connection. httpx's default is those same 5 s, so a request could go out on a
# connection the server was closing at that moment and be reset (ReadError): one failed attempt, and with
# `max_retries: 0` a stopped run.
KEEPALIVE_EXPIRY_S = 2.0


async def bind(client: Any, **options: Any) -> None:
    """One pooled httpx client and one semaphore (`client.max_concurrency` requests in flight) per event loop,
    kept as `client._client` and `client._sem`: both belong to the loop that made them, and `run_plan_sync`
    or an evaluation may start a new loop for each run, which then gets its own."""
    loop = asyncio.get_running_loop()
    if getattr(client, "_loop", None) is loop:
        return
    client._loop = loop
    # No pool limit: the semaphore is the cap, and it queues without the pool's timeout.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=client.max_concurrency,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    client._client = httpx.AsyncClient(limits=limits, **options)
    client._sem = asyncio.Semaphore(client.max_concurrency)
    client._closer = _close_when_loop_ends(client._client)
    await client._closer.asend(None)


async def _close_when_loop_ends(http: Any) -> AsyncIterator[None]:
    """Parked at its `yield` until the loop's end: `asyncio.run` closes every open async generator before it
    closes the loop, which closes the kept-alive connections while their loop can still do it."""
    try:
        yield
    finally:
        await http.aclose()
