"""The run machinery generation and evaluation share: the output folder's lifecycle and the resumable loop.

One writer per output folder: a `flock` on `run.lock`, which names its holder so a second run can say who is in
the way; the kernel drops it however its process dies, so a SIGKILLed run never blocks the rerun.
`manifest.json` says `running`, then `complete`, `interrupted` (Ctrl-C/SIGTERM), `capped` (the records cost
`max_cost_usd`) or `failed`, the last two with a one-line `reason`; finished records are on disk whatever the
ending, and rerunning the same command resumes.

The loop skips items the store holds, appends a finished record durably at once, and stops on Ctrl-C between
writes: a rerun redoes only what was in flight. Every planned item ends as a record (`done`), an error record in
`errors.jsonl` (its work raised: one odd question must not stop a 4k-question run, and a rerun tries it again)
or `not_run` when the whole run stopped, so `planned = done + errors + not_run`. A run stops (`interrupted`) on
Ctrl-C/SIGTERM, and (`failed`, with the last error as the one-line reason) when going on would only turn every
remaining item into an error: `ServerUnreachable`, `max_consecutive_errors` failures in a row, or a record that
could not be written. With a `CostCap` it stops (`capped`) once its records have cost the cap: no new item starts,
the items in flight finish and are kept (their calls are paid for already), and a rerun with a higher cap goes on.

Every record carries the `fingerprint` of what it was made from (the settings that shape a record, the models'
identities as their servers report them, the digests of the input files), and the manifest the settings
themselves: a run resumes only into records with its own fingerprint, and otherwise says what differs.
Settings that change only how fast, how patiently or how far a run goes (`RUNTIME_KEYS`, `max_cost_usd` among
them) are left out, so raising a timeout or the cost cap resumes rather than redoes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Hashable, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from distill import code_version  # noqa: F401 (manifests say which code made a run)
from distill.core import layout
from distill.core.config import read_json_model
from distill.core.errors import DistillError, ServerUnreachable, is_environment_failure, one_line
from distill.core.metrics import judge
from distill.core.secrets import mask, masked_argv, masked_mapping
from distill.core.store import JsonlStore, content_digest, overwrite_in_place, stable_hash, write_json
from distill.llm import build_chat, spec_identity


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def manifest_header(command: str, cfg, config_path: str | None) -> dict:
    """What every run manifest starts with: enough to tell later what produced the records beside it."""
    return {
        "command": command,
        "config_file": config_path,
        "config": masked_mapping(cfg.model_dump(mode="json")),
        "code_version": code_version(),
        "python": platform.python_version(),
        "started_at": now(),
    }


# Far above what a CI needs (1,000 gives two decimals); beyond it a report would resample for hours.
MAX_BOOTSTRAP_SAMPLES = 100_000


class ManifestMethod(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str


class Manifest(BaseModel):
    """`manifest.json`, as far as anything reads it back (the report, a resumed run): a file that does not fit
    is one line naming it, never a traceback further on."""

    model_config = ConfigDict(extra="allow")

    command: str | None = None
    status: Literal["running", "complete", "interrupted", "capped", "failed"] | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    fingerprint: str | None = None  # generate: its records' fingerprint, with the settings behind it
    run_settings: dict[str, Any] | None = None
    fingerprints: dict[str, dict[str, Any]] = Field(default_factory=dict)  # eval: per method, the same two
    methods: list[ManifestMethod] = Field(default_factory=list)
    reference: str | None = None
    bootstrap_samples: int = Field(default=1000, ge=1, le=MAX_BOOTSTRAP_SAMPLES)  # the report resamples this often
    seed: int = Field(default=0, ge=0)
    prompt_budget: dict[str, Any] | None = None
    examples: list[list[str]] = Field(default_factory=list)


def read_manifest(path: Path) -> Manifest | None:
    """The manifest at `path`, None when there is none."""
    return read_json_model(path, Manifest, "run manifest", "restore it, or move the folder aside and rerun")


# ------------------------------------------------------------------------------------------ fingerprints

RUNTIME_KEYS = frozenset({
    "output_dir", "cache", "concurrency", "worker_max_concurrency", "wikipedia_max_concurrency",
    "wikipedia_max_retries", "wikipedia_timeout_s", "wikipedia_max_wait_s", "wikipedia_contact", "tool_timeout_s",
    "max_concurrency", "timeout_s", "max_retries", "max_retry_after_s", "api_key_env", "host", "port",
    "health_timeout_s", "log_file", "report_to", "max_cost_usd", "cpu_reserved_cores",
})


def settings_of(value: Any) -> Any:
    """A config dump without its RUNTIME_KEYS, at any depth, in JSON's own types (so it compares equal to
    itself read back from a marker or a manifest)."""
    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in RUNTIME_KEYS}
        if isinstance(v, (list, tuple)):
            return [strip(x) for x in v]
        return v

    return json.loads(json.dumps(strip(value), sort_keys=True))


def fingerprint(settings: Any) -> str:
    return stable_hash(settings)[:16]


def source_digests(sources: Iterable[str | None]) -> dict[str, str | None]:
    """Digests of the input files among `sources` (dataset sources, a corpus); a hub id is known by its name."""
    return {src: content_digest(src) for src in sorted({s for s in sources if s and not s.startswith("hub:")})}


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return {k: v for key, sub in value.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value}


def describe_changes(old: Any, new: Any, limit: int = 3) -> str:
    """`min_f1 0.5 -> 0.9, criterion evidence -> answer`: the settings that differ, by dotted name."""
    def show(v: Any) -> str:
        text = "unset" if v is _UNSET else json.dumps(v) if not isinstance(v, str) else v
        return text if len(text) <= 40 else text[:37] + "..."

    a, b = _flat(old), _flat(new)
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _UNSET) != b.get(k, _UNSET)]
    parts = [f"{k} {show(a.get(k, _UNSET))} -> {show(b.get(k, _UNSET))}" for k in keys[:limit]]
    return ", ".join(parts) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


_UNSET = object()


def model_identities(specs: dict[str, Any]) -> dict[str, dict | None]:
    """{name: what that ModelSpec's endpoint serves} (see `llm.spec_identity`); None for an unset one. Each
    endpoint is asked once, however many roles share it."""
    async def ask() -> dict[str, dict | None]:
        seen: dict[str, dict] = {}
        out: dict[str, dict | None] = {}
        for name, spec in specs.items():
            if spec is None:
                out[name] = None
                continue
            key = spec.model_dump_json(include={"backend", "model", "base_url", "api_key_env"})
            if key not in seen:
                seen[key] = await spec_identity(spec)
            out[name] = seen[key]
        return out

    return asyncio.run(ask())


def with_identity(spec_settings: dict | None, identity: dict | None) -> dict | None:
    """A model's settings with where it listens replaced by what it serves."""
    if spec_settings is None:
        return None
    return {k: v for k, v in spec_settings.items() if k != "base_url"} | {"serves": identity}


def set_aside(path: Path) -> Path:
    """Rename `path` to `<name>.before-<time>` beside it (never over an earlier one): out of a rerun's way, kept."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target, n = path.with_name(f"{path.name}.before-{stamp}"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.before-{stamp}-{n}")
    path.rename(target)
    return target


def check_fingerprint(path: Path, records: list[dict], want: str, settings: dict, made: dict | None,
                      fresh: bool, what: str) -> None:
    """Refuse to resume into `path` when its records were made otherwise (`made`: the fingerprint and settings
    the folder's manifest recorded for them); with `fresh`, set the file aside and start it anew instead."""
    found = {r.get("fingerprint") for r in records}
    if found <= {want}:
        return
    if fresh:
        print(f"note: {path} was made with other settings; set aside as {set_aside(path).name}", file=sys.stderr)
        return
    if made and made.get("fingerprint") in found and isinstance(made.get("settings"), dict):
        differs = describe_changes(made["settings"], settings) or "the inputs"
    elif None in found:
        differs = "no fingerprint: made by an older version"
    else:
        differs = f"fingerprint {sorted(f for f in found if f)[0]}, now {want}"
    raise DistillError(f"{path} holds {what} made with other settings ({differs}): rerun with --fresh to set them "
                       "aside (nothing is deleted) and start over, or use another output_dir")


@contextmanager
def folder_lock(out: Path) -> Iterator[None]:
    """Hold `out`'s lock for the block, or raise a DistillError naming the process that holds it."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = " ".join(os.pread(fd, 4096, 0).decode("utf-8", "replace").split()) or "another process"
            raise DistillError(f"{out} is in use by {holder}; wait for it to finish or stop it") from None
        # the holder's line is written only once the lock is ours, so it never mixes two runs' words
        os.ftruncate(fd, 0)
        command = mask(" ".join(masked_argv(sys.argv)))[:300]  # the file outlives the run: no secret in it
        os.pwrite(fd, f"pid {os.getpid()} ({command})\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


class RunStopped(DistillError):
    """The run loop stopped the whole run: its message is the manifest's reason."""


class CostCapReached(RunStopped):
    """The run's records cost its `max_cost_usd`: the manifest says `capped`, not `failed`."""


@contextmanager
def run_lifecycle(out: Path, manifest: dict, check: Callable[[], None] | None = None) -> Iterator[dict]:
    """Lock the folder, mark the manifest `running`, and on leaving write how the run ended (the block fills
    `manifest` with what it wants kept). `check` runs first, so a refusal leaves the earlier manifest as it was
    (a server that cannot be reached there is no refusal: the manifest says `failed` and why).
    A failure of the user's world (I/O, a server) leaves as a one-line DistillError; a bug keeps its traceback.
    """
    def mark(status: str, **more: Any) -> None:
        manifest.update(status=status, **more)
        Manifest.model_validate(manifest)  # what is written is what the readers accept
        try:
            write_json(layout.manifest(out), manifest)
        except DistillError:
            if status == "running":
                raise
            # A full disk: the run's end is still told, over the old manifest's own bytes.
            overwrite_in_place(layout.manifest(out), manifest)

    def mark_end(exc: BaseException, status: str, **more: Any) -> None:
        """Mark how the run ended without letting a failed manifest write hide why it ended."""
        try:
            mark(status, **more)
        except DistillError as write_exc:
            raise DistillError(f"{one_line(exc)}; and {write_exc}") from exc

    with folder_lock(out):
        if check is not None:
            try:
                check()
            except ServerUnreachable as exc:  # not a refusal: the run was tried, and its manifest says why not
                mark("failed", reason=one_line(exc), finished_at=now())
                raise
        mark("running")
        try:
            yield manifest
        except KeyboardInterrupt as exc:
            mark_end(exc, "interrupted", finished_at=now())
            raise
        except CostCapReached as exc:
            mark_end(exc, "capped", reason=one_line(exc), finished_at=now())
            raise
        except Exception as exc:
            reason = one_line(exc)
            mark_end(exc, "failed", reason=reason, finished_at=now())
            if isinstance(exc, DistillError) or not is_environment_failure(exc):
                raise
            raise DistillError(f"{reason} (finished records are kept; rerun to resume)") from exc
        mark("complete", finished_at=now())


def build_judge(cfg, cache):
    """The optional LLM judge (the paper's "Acc") of a run's config, or None."""
    return None if cfg.judge is None else build_chat(cfg.judge, cfg.prices, cache)


async def add_judgement(judge_model, example, rec: dict) -> None:
    if judge_model is None or not example.answers:
        return

    verdict = await judge(judge_model, example.question, example.answers, rec["prediction"])
    rec["scores"]["judge"] = verdict["verdict"]
    rec["judge"] = verdict


@dataclass
class RunningStats:
    """Running sums for the progress bar and the summary. A mean is over the records that have its value (a
    TriviaQA record has no gold pages: it is not a recall of 0), except per dataset, where it is over all."""

    sums: Counter = field(default_factory=Counter)
    by_dataset: dict[str, Counter] = field(default_factory=dict)
    errors: int = 0  # error records made by this run

    def add(self, rec: dict) -> None:
        scores, recall = rec.get("scores") or {}, rec.get("evidence_recall")
        add = {"n": 1, "tokens": rec.get("tokens", {}).get("total", 0), "cost_usd": rec.get("cost_usd", 0.0),
               "valid_plans": int(bool(rec.get("plan", {}).get("valid", False)))}
        if recall:
            add |= {"recalled": 1, "recall": recall["recall"]}
        if "em" in scores:
            add |= {"scored": 1, "em": scores["em"], "f1": scores["f1"]}
        if isinstance(rec.get("reward"), (int, float)):  # improve's samples: scored by the planner reward, no Solver
            add |= {"rewarded": 1, "reward": rec["reward"]}
        self.sums.update(add)
        self.by_dataset.setdefault(rec.get("dataset", "?"), Counter()).update(add)

    def postfix(self) -> str:
        em, recall = _mean(self.sums, "em", "scored"), _mean(self.sums, "recall", "recalled")
        reward = _mean(self.sums, "reward", "rewarded")
        if reward is not None:  # a plan's reward says more than the EM its records never have
            acc = f"reward {reward:.3f} valid {self.sums['valid_plans'] / max(self.sums['n'], 1):.2f}"
        else:
            acc = "EM -" if em is None else f"EM {em:.3f}"
        recall = "" if recall is None else f" recall {recall:.2f}"
        errors = f" errors {self.errors}" if self.errors else ""
        return f"{acc}{recall} tok {self.sums['tokens'] / 1e3:.1f}k ${self.sums['cost_usd']:.4f}{errors}"

    def summary(self) -> dict:
        s = self.sums
        return {
            "records": s["n"],
            "em": _mean(s, "em", "scored"),
            "f1": _mean(s, "f1", "scored"),
            "valid_plan_rate": _mean(s, "valid_plans", "n"),
            "evidence_recall": _mean(s, "recall", "recalled"),
            "tokens": s["tokens"],
            "cost_usd": round(float(s["cost_usd"]), 6),
            "by_dataset": {k: {"n": d["n"], "em": _mean(d, "em", "n"), "f1": _mean(d, "f1", "n")}
                           for k, d in self.by_dataset.items()},
        }


def _mean(sums: Counter, total: str, count: str) -> float | None:
    return sums[total] / sums[count] if sums[count] else None


@dataclass
class CostCap:
    """`max_cost_usd` over a run's records, earlier runs' included (so a rerun under the same cap stops at once
    and a higher cap goes on), shared by every record file of the run (eval's methods). Reached only by money
    spent: a cap of 0 still lets free (local) models run."""

    limit: float | None
    spent: float = 0.0

    def add(self, rec: dict) -> None:
        self.spent += float(rec.get("cost_usd") or 0.0)

    @property
    def reached(self) -> bool:
        return self.limit is not None and self.spent > 0 and self.spent >= self.limit

    def reason(self) -> str:
        return (f"cost cap reached: the records cost ${self.spent:.4f} of max_cost_usd ${self.limit:g}; "
                "rerun with a higher max_cost_usd to go on")


@dataclass
class RunResult:
    """How one run of the loop ended, with counts that add up to the planned items."""

    stats: RunningStats
    planned: int
    done: int  # planned items with a record on disk (earlier runs included)
    errors: int  # items whose work raised in this run: an error record each
    status: str  # complete | interrupted | capped | failed
    reason: str | None = None  # why the run stopped, one line (capped and failed only)

    @property
    def not_run(self) -> int:
        return self.planned - self.done - self.errors

    def counts(self) -> dict:
        return {"planned": self.planned, "done": self.done, "errors": self.errors, "not_run": self.not_run}

    def summary(self) -> dict:
        return self.stats.summary() | {"counts": self.counts()}


def run_resumable(
    items: list[tuple[Hashable, Any]],
    work: Callable[[Any], Awaitable[dict]],
    store: JsonlStore,
    key: Callable[[dict], Hashable],
    *,
    errors: JsonlStore | None = None,
    concurrency: int = 4,
    max_consecutive_errors: int | None = None,
    desc: str = "run",
    tracker=None,
    cap: CostCap | None = None,
) -> RunResult:
    """Run every item whose key is not in the store yet (error records are retried); never raises for a
    question's failure or a stop: the result says how the run ended (see the module docstring)."""
    stats = RunningStats()
    done = store.keys(key)
    wanted = {k for k, _ in items}
    for rec in store.records():
        if key(rec) in wanted:
            stats.add(rec)
            if cap is not None:
                cap.add(rec)
    todo = [(k, p) for k, p in items if k not in done]
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=desc, unit="rec", dynamic_ncols=True)
    bar.set_postfix_str(stats.postfix())
    failed: set[Hashable] = set()
    ending: dict[str, str | None] = {}  # set once: status and reason of the stop
    # A dead server fails every question in flight at once, so at `concurrency` failures in a row the run has
    # seen no success from a whole wave; at least 3 so that a single worker does not stop on one odd question.
    limit = max_consecutive_errors or max(3, concurrency)

    def advance() -> None:
        bar.update(1)
        bar.set_postfix_str(stats.postfix())
        if tracker is not None:
            tracker.log(desc, stats.summary() | {"errors": stats.errors})

    async def run() -> None:
        pending = iter(todo)  # shared by the workers: no await between two `next`s
        in_a_row = 0

        def stop(status: str, reason: str | None = None, cancel: bool = True) -> None:
            """The first stop wins, except that one that cancels (Ctrl-C, a failure) overrides a cap's drain."""
            if ending and not (cancel and ending["status"] == "capped"):
                return
            ending.update(status=status, reason=reason)
            for w in workers if cancel else ():
                if w is not asyncio.current_task():
                    w.cancel()

        async def worker() -> None:
            nonlocal in_a_row
            for k, payload in pending:
                if ending:
                    return
                try:
                    record = await work(payload)
                except Exception as exc:  # the question's own failure; a cancel (BaseException) passes through
                    try:
                        if errors is not None:
                            errors.append({"key": list(k) if isinstance(k, tuple) else k, "error": one_line(exc),
                                           "type": type(exc).__name__, "at": now()})
                    except Exception as write_exc:  # both told: the question's error may be the cause (a full disk)
                        stop("failed", f"writing an error record failed: {one_line(write_exc, 300)} (the question's "
                                       f"error: {one_line(exc, 300)})")
                        return
                    failed.add(k)
                    stats.errors += 1
                    advance()
                    in_a_row += 1
                    if isinstance(exc, ServerUnreachable):
                        stop("failed", one_line(exc))
                    elif in_a_row >= limit:
                        stop("failed", f"{in_a_row} questions failed in a row, the last with: {one_line(exc)}")
                    continue
                in_a_row = 0
                try:  # no await below: a cancel cannot land between the write and its count
                    store.append(record)
                    stats.add(record)
                    advance()
                except Exception as exc:  # the store's own errors name the file
                    where = "" if isinstance(exc, DistillError) else f" to {store.path}"
                    stop("failed", f"writing a record{where} failed: {one_line(exc)}")
                    return
                if cap is not None:
                    cap.add(record)
                    if cap.reached:  # the questions in flight are paid for already: let them finish
                        stop("capped", cap.reason(), cancel=False)

        if cap is not None and cap.reached:  # an earlier run spent the cap already
            ending.update(status="capped", reason=cap.reason())
            return
        loop = asyncio.get_running_loop()
        workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread / platform without it
                loop.add_signal_handler(sig, stop, "interrupted")
        try:
            results = await asyncio.gather(*workers, return_exceptions=True)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        bugs = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
        if bugs:  # the loop's own code failed: not a question's fault
            raise bugs[0]

    try:
        asyncio.run(run())
    finally:
        bar.close()
    on_disk = store.keys(key) & wanted
    status = ending.get("status", "complete")
    return RunResult(stats, len(wanted), len(on_disk), len(failed - on_disk), status, ending.get("reason"))


def run_records(path: Path, items: list, work: Callable, key: Callable[[dict], Any], errors, *, concurrency: int,
                desc: str, keep: Callable[[Any], None], schema=None, tracker=None, cap: CostCap | None = None) -> Any:
    """One pass of the run loop over one record file; `keep(result)` puts its counts in the manifest before a
    stop is raised, so the manifest of a stopped run still says how far it got. `schema` is the record model
    every line on disk and every new record must fit."""
    with JsonlStore(path, key=key, schema=schema) as store:
        result = run_resumable(items, work, store, key, errors=errors, concurrency=concurrency, desc=desc,
                               tracker=tracker, cap=cap)
    keep(result)
    raise_if_stopped(result)
    if result.errors:
        print(f"note: {result.errors} of {result.planned} failed and were logged to {errors.path}; "
              "rerun the same command to retry them", file=sys.stderr)
    return result


def raise_if_stopped(result) -> None:
    """Turn a run loop's stop (a RunResult) into the exception `run_lifecycle` records."""
    if result.status == "interrupted":
        raise KeyboardInterrupt
    if result.status == "capped":
        raise CostCapReached(f"run stopped: {result.reason} ({result.not_run} of {result.planned} not run; "
                             "finished records are kept)")
    if result.status == "failed":
        raise RunStopped(f"run stopped: {result.reason} ({result.not_run} of {result.planned} not run; "
                         "finished records are kept; rerun to resume)")
