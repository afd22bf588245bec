"""Durable storage for long, costly runs: an append-only JSONL record file and a SQLite call cache.

A teacher run costs money and hours, so every record is flushed and fsynced as soon as it exists, a rerun
skips what is on disk, and a line torn by a crash is cut off and redone rather than kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from distill.errors import DistillError


def stable_hash(obj: Any) -> str:
    """Content address of any JSON-able value: the same value always gives the same key."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise DistillError(f"file not found: {path}")
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DistillError(f"{path}:{n}: invalid JSON ({exc.msg})") from None
    return out


def write_jsonl(path: str | Path, records) -> None:
    """Write a whole file atomically (temp file + rename), for outputs that are rebuilt, not appended."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def write_json(path: str | Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)


class JsonlStore:
    """Append-only JSONL with resume. Opening it repairs a torn last line; `append` is durable on return."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired = False
        self._records = self._load_and_repair()
        self._lock = threading.Lock()
        self._fh = self.path.open("a", encoding="utf-8")

    def _load_and_repair(self) -> list[dict]:
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        records, good_end, pos = [], 0, 0
        lines = raw.split(b"\n")
        for i, line in enumerate(lines):
            end = pos + len(line) + 1
            is_last = i == len(lines) - 1
            if line.strip():
                try:
                    if is_last:  # no trailing newline: written partly, whatever it parses as
                        raise ValueError("torn")
                    records.append(json.loads(line))
                except ValueError:
                    if not is_last and any(l.strip() for l in lines[i + 1 :]):
                        raise DistillError(f"{self.path}: line {i + 1} is corrupt (not the last line; fix by hand)")
                    with self.path.open("r+b") as f:
                        f.truncate(good_end)
                    self.repaired = True
                    break
            good_end = min(end, len(raw))
            pos = end
        return records

    def __len__(self) -> int:
        return len(self._records)

    def records(self) -> list[dict]:
        return list(self._records)

    def keys(self, key: Callable[[dict], Any]) -> set:
        return {key(r) for r in self._records}

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._records.append(record)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "JsonlStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CallCache:
    """Content-addressed cache of model and tool calls, so a rerun repeats no paid call."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, kind TEXT, value TEXT)")
        self._lock = threading.Lock()
        self.hits = 0
        self.misses_by_kind: dict[str, int] = {}

    @property
    def misses(self) -> int:
        return sum(self.misses_by_kind.values())

    def get(self, key: str, kind: str = "model") -> Any | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses_by_kind[kind] = self.misses_by_kind.get(kind, 0) + 1
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: Any, kind: str = "model") -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO calls (key, kind, value) VALUES (?, ?, ?)",
                (key, kind, json.dumps(value, ensure_ascii=False)),
            )

    def count(self, kind: str | None = None) -> int:
        q, args = ("SELECT COUNT(*) FROM calls", ()) if kind is None else ("SELECT COUNT(*) FROM calls WHERE kind=?", (kind,))
        with self._lock:
            return self._db.execute(q, args).fetchone()[0]

    def close(self) -> None:
        self._db.close()
