"""The served agent's traces folder: every request it answered, as trajectory records, and the feedback on them.

A folder of `traces-000001.jsonl`, `traces-000002.jsonl`, ... (each one the project's trajectory record per line,
appended durably before the reply is sent; a new file once the current one passes `max_bytes`, so no file grows
without bound) and `feedback.jsonl` (`{id, correct}` or `{id, answer}` per line, the latest per id counting).
Nothing is ever rewritten: a folder can be copied or read while the server writes it.

Lines are appended through the one JSONL store: each written whole and fsynced, a write that fails (a full disk)
cut back off, so a record the client was told is missing never turns up later, and a crash leaves at most one
torn line at a file's end. A served request cannot be redone the way a generation record can, so the next start
does not cut a torn line away as the store would: it first moves it to `<file>.torn` beside the file (kept for a
person to read) and says so in one line.

The same folder is a dataset source (`distill.core.data.load_examples` reads a folder holding trace files): a question
whose answer was marked correct, or given a reference answer, is a training question with that answer, so the
traffic a student serves becomes the next round's questions (`distill improve`, whose leak guard still holds).
This module imports no model code: reading a folder is cheap, and `distill.core.data` reads it through here.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Iterator

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from distill.core.errors import DistillError
from distill.core.run import folder_lock
from distill.core.secrets import mask
from distill.core.store import JsonlStore, _fsync_dir, iter_jsonl, parse_line
from distill.rewoo.record import TrajectoryRecord

log = logging.getLogger(__name__)

TRACE_FILE = re.compile(r"^traces-(\d{6,})\.jsonl$")
FEEDBACK_FILE = "feedback.jsonl"
MAX_ANSWER_CHARS = 2000  # a reference answer is a short span, as the datasets' are
MAX_ID_CHARS = 200


class Feedback(BaseModel):
    """`POST /v1/feedback`'s body and a line of feedback.jsonl: a verdict on a served answer, or the answer it
    should have been (which also says the served one was wrong, unless it is the same)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
    correct: StrictBool | None = None
    answer: Annotated[str, Field(min_length=1, max_length=MAX_ANSWER_CHARS)] | None = None
    at: str | None = None  # when it was received; set by the server

    @model_validator(mode="after")
    def _one(self) -> "Feedback":
        if (self.correct is None) == (self.answer is None):
            raise ValueError("give exactly one of `correct` (true/false) or `answer` (the right answer)")
        if self.answer is not None and not self.answer.strip():
            raise ValueError("answer: blank")
        return self


def trace_files(folder: str | Path) -> list[Path]:
    """The folder's trace files, oldest first (by their number, not their names' text order)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := TRACE_FILE.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def is_traces_folder(path: str | Path) -> bool:
    return bool(trace_files(path))


def masked(value: Any) -> Any:
    """Every string in a record with the secrets this process knows replaced by ***: a client may paste a key
    into a question, and a server may echo one in an error, but no trace file holds one."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


class NotWritten(DistillError):
    """A trace or feedback line could not be stored (a full disk, a folder gone): `reason` is the system's
    words, fit for a client; the message also names the file, for the log."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"cannot write {path}: {reason}")
        self.reason = reason


def _last_line(path: Path) -> tuple[int, bytes]:
    """(offset, bytes to the end) of a file's last line holding more than whitespace; (size, b"") if none.
    Read backwards, so a 64 MiB trace file costs one block."""
    with path.open("rb") as handle:
        pos = end = handle.seek(0, os.SEEK_END)
        buf = b""
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            handle.seek(pos)
            buf = handle.read(step) + buf
            content_end = len(buf.rstrip())
            if content_end and (newline := buf.rfind(b"\n", 0, content_end)) >= 0:
                return pos + newline + 1, buf[newline + 1:]
        return (0, buf) if buf.strip() else (end, b"")


def set_aside_torn(path: Path) -> Path | None:
    """Move a torn last line (no newline after it, or not JSON: a write a crash cut short) out of `path` into
    `<name>.torn` (or `.torn-2`, ...) beside it and return that file; None when the file ends cleanly. The
    line is copied and fsynced before the file is cut, so a crash in between duplicates it, never loses it."""
    offset, tail = _last_line(path)
    content = tail.rstrip()
    if not content:
        return None
    try:
        parse_line(content, str(path))
        if b"\n" in tail[len(content):]:
            return None  # a whole line: whether it fits the schema is checked where it is read
    except DistillError:
        pass
    aside, n = path.with_name(f"{path.name}.torn"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.torn-{n}")
    try:
        with aside.open("xb") as handle:
            handle.write(tail)
            handle.flush()
            os.fsync(handle.fileno())
        os.truncate(path, offset)
        _fsync_dir(path.parent)
    except OSError as exc:
        raise DistillError(f"{path} ends in a torn line from an earlier crash and it could not be set aside in "
                           f"{aside} ({exc.strerror or exc})") from None
    log.warning("%s ended in a torn line from an earlier crash (%d bytes at byte %d); set aside in %s, serving on",
                path, len(tail), offset, aside.name)
    return aside


class TraceLog:
    """The writer of a traces folder, for one server process (two processes get two folders: rotation and the
    id index are per process). Thread-safe: the server appends from worker threads so that an fsync never
    stalls its event loop."""

    def __init__(self, folder: str | Path, max_bytes: int):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DistillError(f"traces_dir {self.folder}: cannot create it ({exc.strerror or exc})") from None

        self._folder_lock = folder_lock(self.folder)  # one writer per folder, or two would append to one file
        self._folder_lock.__enter__()
        try:
            self._lock = threading.Lock()
            files = trace_files(self.folder)
            feedback = self.folder / FEEDBACK_FILE
            # before the store opens them, which would cut a torn line away
            self.set_aside = [aside for path in files + ([feedback] if feedback.exists() else [])
                              if (aside := set_aside_torn(path)) is not None]
            # ids served before a restart still take feedback
            self.ids: set[str] = {rec["id"] for path in files for _, rec in iter_jsonl(path) if "id" in rec}
            self._number = int(TRACE_FILE.match(files[-1].name).group(1)) if files else 1
            self._store = self._open(self._number)
            self._feedback = JsonlStore(feedback, schema=Feedback)
        except BaseException:
            self._folder_lock.__exit__(None, None, None)
            raise
        self.written = 0

    def _open(self, number: int) -> JsonlStore:
        return JsonlStore(self.folder / f"traces-{number:06d}.jsonl", schema=TrajectoryRecord)

    @property
    def current(self) -> Path:
        return self._store.path

    @staticmethod
    def _stored(path: Path, append) -> None:
        """`append()`, its failure to write as NotWritten (the store's one line ends in the system's reason)."""
        try:
            append()
        except OSError as exc:
            raise NotWritten(path, exc.strerror or str(exc)) from None
        except DistillError as exc:
            if not str(exc).startswith("cannot write "):
                raise
            raise NotWritten(path, str(exc).rpartition(": ")[2]) from None

    def write(self, record: dict) -> None:
        """Append one record durably (returns once it is on disk), starting a new file first when the current
        one has reached `max_bytes`; NotWritten when it could not be (nothing of it is then in the folder)."""
        record = masked(record)
        with self._lock:
            if self._store.path.stat().st_size >= self.max_bytes:
                nxt: list[JsonlStore] = []
                self._stored(self.folder / f"traces-{self._number + 1:06d}.jsonl",
                             lambda: nxt.append(self._open(self._number + 1)))
                self._store.close()
                self._number += 1
                self._store = nxt[0]
            self._stored(self._store.path, lambda: self._store.append(record))
            self.ids.add(record["id"])
            self.written += 1

    def feedback(self, item: Feedback) -> bool:
        """Store feedback on a served id; False (nothing written) for an id this folder never served;
        NotWritten when it could not be stored."""
        if item.id not in self.ids:
            return False
        line = masked(item.model_dump(exclude_none=True) | {"at": now()})
        with self._lock:
            self._stored(self._feedback.path, lambda: self._feedback.append(line))
        return True

    def close(self) -> None:
        with self._lock:
            self._store.close()
            self._feedback.close()
            self._folder_lock.__exit__(None, None, None)


def read_feedback(folder: str | Path) -> dict[str, dict]:
    """{id: its latest feedback} of a traces folder."""
    path = Path(folder) / FEEDBACK_FILE
    if not path.exists():
        return {}
    return {item["id"]: item for _, item in iter_jsonl(path, Feedback)}


def training_rows(folder: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, generic row) for each served question with feedback that gives it a right answer: `correct:
    true` makes the served answer the gold one, `answer: ...` makes that text the gold one; `correct: false`
    alone gives no answer to learn from and is left out, as is a request that failed. A question served twice
    is read once per served id; `distill.core.data` keeps the first of repeated questions."""
    feedback = read_feedback(folder)
    if not feedback:
        return
    for path in trace_files(folder):
        for line, rec in iter_jsonl(path, TrajectoryRecord):
            item = feedback.get(rec["id"])
            if item is None:
                continue
            if item.get("answer") is not None:
                answer = item["answer"]
            elif item.get("correct") and (rec.get("prediction") or "").strip():
                answer = rec["prediction"]
            else:
                continue
            yield f"{path}:{line}", {"id": rec["id"], "question": rec["question"], "answer": answer}
