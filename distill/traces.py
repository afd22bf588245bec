"""The served agent's traces folder: every request it answered, as trajectory records, and the feedback on them.

A folder of `traces-000001.jsonl`, `traces-000002.jsonl`, ... (each one the project's trajectory record per line,
through the one JSONL store, appended durably before the reply is sent; a new file once the current one passes
`max_bytes`, so no file grows without bound) and `feedback.jsonl` (`{id, correct}` or `{id, answer}` per line, the
latest per id counting). Nothing is ever rewritten: a folder can be copied or read while the server writes it.

The same folder is a dataset source (`distill.data.load_examples` reads a folder holding trace files): a question
whose answer was marked correct, or given a reference answer, is a training question with that answer, so the
traffic a student serves becomes the next round's questions (`distill improve`, whose leak guard still holds).
This module imports no model code: reading a folder is cheap, and `distill.data` reads it through here.
"""

from __future__ import annotations

import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Iterator

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from distill.errors import DistillError
from distill.rewoo.record import TrajectoryRecord
from distill.secrets import mask
from distill.store import JsonlStore, iter_jsonl

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
        from distill.run import folder_lock

        self._folder_lock = folder_lock(self.folder)  # one writer per folder, or two would append to one file
        self._folder_lock.__enter__()
        try:
            self._lock = threading.Lock()
            files = trace_files(self.folder)
            # ids served before a restart still take feedback
            self.ids: set[str] = {rec["id"] for path in files for _, rec in iter_jsonl(path) if "id" in rec}
            self._number = int(TRACE_FILE.match(files[-1].name).group(1)) if files else 1
            self._store = self._open(self._number)
            self._feedback = JsonlStore(self.folder / FEEDBACK_FILE, schema=Feedback)
        except BaseException:
            self._folder_lock.__exit__(None, None, None)
            raise
        self.written = 0

    def _open(self, number: int) -> JsonlStore:
        return JsonlStore(self.folder / f"traces-{number:06d}.jsonl", schema=TrajectoryRecord)

    @property
    def current(self) -> Path:
        return self._store.path

    def write(self, record: dict) -> None:
        """Append one record durably (returns once it is on disk), starting a new file first when the current
        one has reached `max_bytes`."""
        record = masked(record)
        with self._lock:
            if self._store.path.exists() and self._store.path.stat().st_size >= self.max_bytes:
                self._store.close()
                self._number += 1
                self._store = self._open(self._number)
            self._store.append(record)
            self.ids.add(record["id"])
            self.written += 1

    def feedback(self, item: Feedback) -> bool:
        """Store feedback on a served id; False (nothing written) for an id this folder never served."""
        if item.id not in self.ids:
            return False
        self._feedback.append(masked(item.model_dump(exclude_none=True) | {"at": now()}))
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
    is read once per served id; `distill.data` keeps the first of repeated questions."""
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
