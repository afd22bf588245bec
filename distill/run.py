"""The lifecycle every resumable run shares (generation and evaluation).

One writer per output folder: a `flock` on `run.lock`, which names its holder so a second run can say who is in
the way; the kernel drops it however its process dies, so a SIGKILLed run never blocks the rerun.
`manifest.json` says `running`, then `complete`, `interrupted` (Ctrl-C/SIGTERM) or `failed` with a one-line
`reason`; finished records are on disk whatever the ending, and rerunning the same command resumes.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from distill.errors import DistillError, is_environment_failure, one_line

LOCK_FILE = "run.lock"
MANIFEST = "manifest.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def code_version() -> str:
    from distill import __version__

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__


def manifest_header(command: str, cfg, config_path: str | None) -> dict:
    """What every run manifest starts with: enough to tell later what produced the records beside it."""
    return {
        "command": command,
        "config_file": config_path,
        "config": cfg.model_dump(mode="json"),
        "code_version": code_version(),
        "python": platform.python_version(),
        "started_at": now(),
    }


@contextmanager
def folder_lock(out: Path) -> Iterator[None]:
    """Hold `out`'s lock for the block, or raise a DistillError naming the process that holds it."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = " ".join(os.pread(fd, 4096, 0).decode("utf-8", "replace").split()) or "another process"
            raise DistillError(f"{out} is in use by {holder}; wait for it to finish or stop it") from None
        # the holder's line is written only once the lock is ours, so it never mixes two runs' words
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({' '.join(sys.argv)[:300]})\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


class RunStopped(DistillError):
    """The run loop stopped the whole run (see distill.runner): its message is the manifest's reason."""


@contextmanager
def run_lifecycle(out: Path, manifest: dict, check: Callable[[], None] | None = None) -> Iterator[dict]:
    """Lock the folder, mark the manifest `running`, and on leaving write how the run ended (the block fills
    `manifest` with what it wants kept). `check` runs first, so a refusal leaves the earlier manifest as it was.
    A failure of the user's world (I/O, a server) leaves as a one-line DistillError; a bug keeps its traceback.
    """
    from distill.store import write_json

    def mark(status: str, **more: Any) -> None:
        manifest.update(status=status, **more)
        write_json(out / MANIFEST, manifest)

    with folder_lock(out):
        if check is not None:
            check()
        mark("running")
        try:
            yield manifest
        except KeyboardInterrupt:
            mark("interrupted", finished_at=now())
            raise
        except Exception as exc:
            reason = one_line(exc)
            mark("failed", reason=reason, finished_at=now())
            if isinstance(exc, DistillError) or not is_environment_failure(exc):
                raise
            raise DistillError(f"{reason} (finished records are kept; rerun to resume)") from exc
        mark("complete", finished_at=now())


def build_judge(cfg, cache):
    """The optional LLM judge (the paper's "Acc") of a run's config, or None."""
    from distill.llm import build_chat

    return None if cfg.judge is None else build_chat(cfg.judge, cfg.prices, cache)


async def add_judgement(judge_model, example, rec: dict) -> None:
    if judge_model is None or not example.answers:
        return
    from distill.metrics import judge

    verdict = await judge(judge_model, example.question, example.answers, rec["prediction"])
    rec["scores"]["judge"] = verdict["verdict"]
    rec["judge"] = verdict


def run_records(path: Path, items: list, work: Callable, key: Callable[[dict], Any], errors, *, concurrency: int,
                desc: str, keep: Callable[[Any], None]) -> Any:
    """One pass of the run loop (distill.runner) over one record file; `keep(result)` puts its counts in the
    manifest before a stop is raised, so the manifest of a stopped run still says how far it got."""
    from distill.runner import run_resumable
    from distill.store import JsonlStore

    with JsonlStore(path, key=key) as store:
        result = run_resumable(items, work, store, key, errors=errors, concurrency=concurrency, desc=desc)
    keep(result)
    raise_if_stopped(result)
    if result.errors:
        print(f"note: {result.errors} of {result.planned} failed and were logged to {errors.path}; "
              "rerun the same command to retry them", file=sys.stderr)
    return result


def raise_if_stopped(result) -> None:
    """Turn a run loop's stop (distill.runner.RunResult) into the exception `run_lifecycle` records."""
    if result.status == "interrupted":
        raise KeyboardInterrupt
    if result.status == "failed":
        raise RunStopped(f"run stopped: {result.reason} ({result.not_run} of {result.planned} not run; "
                         "finished records are kept; rerun to resume)")
