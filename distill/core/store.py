"""Durable storage for long, costly runs: an append-only JSONL record file and a SQLite call cache.

A teacher run costs money and hours, so every record is flushed and fsynced as soon as it exists, a rerun
skips what is on disk, and a line torn by a crash is cut off and redone rather than kept.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import sqlite3
import sys
import threading
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import IO, Any, Callable, Container, Hashable, Iterable, Iterator

from pydantic import BaseModel, ValidationError

from distill.core.errors import DistillError, clip

Schema = type[BaseModel]


def stable_hash(obj: Any) -> str:
    """Content address of any JSON-able value: the same value always gives the same key."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# Past this size a file is fingerprinted by its size, mtime and both ends: hashing a 15 GB merged 7B model
# would cost half a minute per run, while a retrained file of the same name never keeps all four.
FULL_HASH_MAX_BYTES = 2 << 30


@functools.cache
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        if size <= FULL_HASH_MAX_BYTES:
            return hashlib.file_digest(f, "sha256").hexdigest()
        digest = hashlib.sha256(f"{size}:{mtime_ns}".encode())
        digest.update(f.read(16 << 20))
        f.seek(-(16 << 20), 2)
        digest.update(f.read())
        return digest.hexdigest()


def file_digest(path: str | Path) -> str:
    """The content address of one file, computed once per process for a file that has not changed since."""
    stat = os.stat(path)
    return _file_digest(str(path), stat.st_size, stat.st_mtime_ns)


def content_digest(path: str | Path, skip: Iterable[str] = ()) -> str | None:
    """A file's digest, or a folder's (every file under it by relative name, except names matching a `skip`
    pattern), or None when there is nothing there: what a later stage was made from, so a rerun can tell it
    changed."""
    path = Path(path)
    if path.is_file():
        return file_digest(path)
    if not path.is_dir():
        return None
    skip = list(skip)
    files = sorted(p for p in path.rglob("*") if p.is_file() and not any(fnmatch(p.name, pat) for pat in skip))
    return stable_hash({str(p.relative_to(path)): file_digest(p) for p in files})


_BOM = b"\xef\xbb\xbf"
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def describe(errors: list[dict]) -> str:
    """The first of a pydantic ValidationError's errors, as `field `a.b`: what is wrong`."""
    first = errors[0]
    field = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"field `{field}`: {message}{more}" if field else f"{message}{more}"


def conform(schema: Schema | None, record: dict, where: str) -> dict:
    """`record` as `schema` (the model its writer used) reads it, else one DistillError naming `where` and the
    first bad field, so a later stage never meets a shape its code did not expect halfway through."""
    if schema is None:
        return record
    try:
        # Dumped back with the schema's defaults filled in, so a reader never meets an absent optional field.
        return schema.model_validate(record).model_dump()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise DistillError(clip(f"{where}: {describe(errors)}", 500)) from None
    except RecursionError:
        raise DistillError(f"{where}: a field is nested too deeply to check") from None


def iter_jsonl(path: str | Path, schema: Schema | None = None,
               only: Container[int] | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; the first bad line stops with one line naming file:line
    (and, with `schema`, the first field that does not fit it).
    Lines are split on `\n` bytes only and decoded one by one, so a U+2028 inside a JSON string (which
    `ensure_ascii=False` writes raw) stays in its line and bad bytes are reported where they are.
    With `only`, just those line numbers are parsed: the second pass of a reader that checked every line in a
    first one and kept only what it chose (the filter's line numbers), so a large file is never held whole."""
    path = Path(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise DistillError(f"file not found: {path}") from None
    except OSError as exc:
        raise DistillError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        for number, raw in enumerate(handle, 1):
            if number == 1:
                raw = raw.removeprefix(_BOM)
            if (only is None or number in only) and raw.strip():
                where = f"{path}:{number}"
                yield number, conform(schema, parse_line(raw, where), where)


def read_jsonl(path: str | Path, schema: Schema | None = None) -> list[dict]:
    """Every record of a file, all checked against `schema` before the caller does any work with one."""
    return [record for _, record in iter_jsonl(path, schema)]


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string in `value` holds a surrogate code point: JSON's escapes can spell one, Python keeps
    it, and the first write of it as UTF-8 (a kept record, a report) would fail."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def refuse_lone_surrogates(text: str, value: Any, where: str) -> None:
    """`value`, parsed from the JSON `text`, may not hold a lone surrogate: one error naming `where` now
    rather than a UnicodeEncodeError at the first write of it. Only text that spells one is walked."""
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise DistillError(f"{where}: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is no text")


def parse_line(raw: bytes, where: str) -> dict:
    """One JSONL line to one object. Model output ends up in these files, so nothing in a line is trusted:
    bad bytes, bad JSON, nesting deep enough to exhaust the parser's recursion and non-objects are all one
    `DistillError` naming `where`, never a traceback."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DistillError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start + 1} of the line)") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DistillError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise DistillError(f"{where}: JSON nested too deeply to read") from None
    refuse_lone_surrogates(text, value, where)
    if not isinstance(value, dict):
        raise DistillError(f"{where}: expected a JSON object, got {_JSON_TYPES.get(type(value), 'a value')}")
    return value


def key_of(key: Callable[[dict], Hashable], record: dict, where, number: int) -> Hashable:
    """A record's key, or one line naming the file and record that lacks it (a hand-edited or foreign file)."""
    try:
        return key(record)
    except (KeyError, TypeError, IndexError) as exc:
        raise DistillError(f"{where}: record {number} has no key field {exc}") from None


class FirstPerKey:
    """Called on each record in order: True for the first of its key, False (counted in `dropped`) for a later
    copy. Only the keys stay in memory, so a reader that streams a file can drop copies as `dedupe` does."""

    def __init__(self, key: Callable[[dict], Hashable], origin: str = "records"):
        self.key, self.origin = key, origin
        self.seen: set = set()
        self.dropped = 0
        self._n = 0

    def __call__(self, record: dict) -> bool:
        self._n += 1
        k = key_of(self.key, record, self.origin, self._n)
        if k in self.seen:
            self.dropped += 1
            return False
        self.seen.add(k)
        return True


def dedupe(records: Iterable[dict], key: Callable[[dict], Hashable], origin: str = "records") -> tuple[list[dict], int]:
    """The first record per key, in order, and how many later ones were dropped. Two runs on one folder (or a
    crash between a write and its bookkeeping) can answer a question twice; a resumed run counted the first."""
    first = FirstPerKey(key, origin)
    kept = [record for record in records if first(record)]
    return kept, first.dropped


def _fsync_dir(folder: Path) -> None:
    """Make a rename or a new file survive power loss; a platform that cannot open folders just skips it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _replace(path: str | Path, write: Callable[[IO[str]], None]) -> None:
    """Write beside the target, fsync, rename over it, fsync the folder: readers see the old file or the
    whole new one, never half, and the target may also be the input that was just read."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise DistillError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    _fsync_dir(path.parent)


def write_jsonl(path: str | Path, records: Iterable[dict]) -> None:
    """Write a whole file atomically and durably, for outputs that are rebuilt, not appended."""
    _replace(path, lambda handle: handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def read_json(path: str | Path, optional: bool = False) -> dict | None:
    """The one reader of a JSON object file (an adapter's or a model's config, a summary, a marker read for a
    report). Unreadable or not an object: one DistillError line naming the file; `optional` (what provenance and
    the report read, best effort): None instead."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        if optional:
            return None
        raise DistillError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        if optional:
            return None
        raise DistillError(f"{path}: expected a JSON object")
    return data


def write_json(path: str | Path, obj: Any) -> None:
    _replace(path, lambda handle: handle.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n"))


def overwrite_in_place(path: str | Path, obj: Any) -> None:
    """Rewrite an existing small JSON file over its own bytes, compact: the last resort when the atomic write
    failed on a full disk, since blocks the file already holds need no new space. Not atomic, so only for
    a status that would otherwise stay wrong (a manifest still saying `running` after its run stopped)."""
    blob = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    try:
        with open(path, "r+b") as handle:
            handle.write(blob)
            handle.truncate()
            with contextlib.suppress(OSError):  # best effort: the page cache holds the news even so
                handle.flush()
                os.fsync(handle.fileno())
    except OSError as exc:
        raise DistillError(f"cannot write {path}: {exc.strerror or exc}") from None


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _write_failure(exc: BaseException, tmp: Path, target: Path) -> BaseException:
    """The error of a write into `tmp` told in terms of `target`, naming the file that failed where it is known."""
    if isinstance(exc, OSError):
        where = str(exc.filename) if exc.filename else str(tmp)
        return DistillError(f"cannot write {where.replace(str(tmp), str(target))}: {exc.strerror or exc}")
    if isinstance(exc, DistillError):
        return DistillError(str(exc).replace(str(tmp), str(target)))
    return exc


@contextlib.contextmanager
def replace_folder(target: str | Path, marker: str) -> Iterator[Path]:
    """A fresh folder beside `target` for the block to fill; when the block ends it is fsynced and renamed into
    `target`'s place, the old folder removed only after. If the block or a write fails (a full disk), the
    new folder is removed, `target` is as it was, and the error names the file that failed. An existing
    `target` is replaced only when it is empty or holds `marker` (a file only this output writes), so a
    mistyped path never removes a folder of the user's."""
    target = Path(target)
    if target.exists() and not (target.is_dir() and (not any(target.iterdir()) or (target / marker).exists())):
        raise DistillError(f"{target} exists and is not an output of this command (no {marker}); choose another "
                           "output or remove it")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    old = target.with_name(f".{target.name}.{os.getpid()}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        yield tmp
        _fsync_tree(tmp)
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not target.exists():
            os.replace(old, target)
        failure = _write_failure(exc, tmp, target)
        if failure is exc:
            raise
        raise failure from None
    shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(target.parent)


@contextlib.contextmanager
def replace_files(folder: str | Path) -> Iterator[Path]:
    """A staging folder inside `folder` for the block to write its files into; when the block ends each file
    is renamed over its namesake in `folder`. For outputs that share a folder with other files (a report
    beside the records it is built from): a failure leaves every old file as it was and no new one."""
    folder = Path(folder)
    tmp = folder / f".staging.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        yield tmp
        _fsync_tree(tmp)
        for path in sorted(tmp.iterdir()):
            os.replace(path, folder / path.name)
    except BaseException as exc:
        failure = _write_failure(exc, tmp, folder)
        if failure is exc:
            raise
        raise failure from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _fsync_dir(folder)


class JsonlStore(contextlib.AbstractContextManager):
    """Append-only JSONL with resume. Opening it repairs a torn last line (and says so on stderr: the run that
    made it crashed); `append` is durable on return.

    With `key`, the store holds at most one record per key: loading keeps the first and counts the rest in
    `duplicates`, and `append` of a key already held writes nothing and returns False rather than raising: the
    record on disk is the answer the run counted, and stopping a paid run (losing the answers in flight) over
    a copy of something already safe would be the worse failure."""

    def __init__(self, path: str | Path, key: Callable[[dict], Hashable] | None = None, schema: Schema | None = None):
        self.path = Path(path)
        self.key = key
        self.schema = schema  # every record loaded or appended must fit it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired = False
        self.duplicates = 0
        # Only the keys (and a count) stay in memory, never the records: a 16k-question teacher run's records
        # are hundreds of MB as Python objects, and the loop needs nothing of them but whether a key is done.
        self._keys: set = set()
        self._count = 0
        self._load_and_repair()
        self._lock = threading.Lock()
        created = not self.path.exists()
        # Unbuffered: a write that fails (a full disk) leaves nothing behind for `close` to fail on a second time.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if created:
            _fsync_dir(self.path.parent)

    def _load_and_repair(self) -> None:
        """Check every line (against the schema too) and note its key, reading line by line; a torn last line
        is cut off. Later copies of a key count as `duplicates`."""
        if not self.path.exists():
            return
        good_end = 0
        with self.path.open("rb") as handle:
            for number, raw in enumerate(handle, 1):
                if raw.strip():
                    where = f"{self.path}:{number}"
                    try:
                        if not raw.endswith(b"\n"):  # no trailing newline: written partly, whatever it parses as
                            raise DistillError("torn")
                        record = parse_line(raw, where)
                    except DistillError as exc:
                        if any(rest.strip() for rest in handle):
                            raise DistillError(f"{exc} (not the last line, so not a torn write: fix by hand)") from None
                        os.truncate(self.path, good_end)
                        self.repaired = True
                        print(f"note: {self.path} ended in a torn line from an earlier crash; it was cut and will be "
                              "redone", file=sys.stderr)
                        break
                    record = conform(self.schema, record, where)  # a whole line that does not fit: not torn
                    self._note(record, number)
                good_end += len(raw)

    def _note(self, record: dict, number: int) -> None:
        if self.key is None:
            self._count += 1
            return
        k = key_of(self.key, record, self.path, number)
        if k in self._keys:
            self.duplicates += 1
        else:
            self._keys.add(k)
            self._count += 1

    def __len__(self) -> int:
        return self._count

    def iter_records(self) -> Iterator[dict]:
        """The records on disk, read back one at a time (the first per key), as the schema reads them."""
        seen: set = set()
        for _, record in iter_jsonl(self.path, self.schema) if self.path.exists() else ():
            if self.key is not None:
                if (k := self.key(record)) in seen:
                    continue
                seen.add(k)
            yield record

    def records(self) -> list[dict]:
        return list(self.iter_records())

    def keys(self, key: Callable[[dict], Any] | None = None) -> set:
        if key is None or key is self.key:
            return set(self._keys)
        return {key(r) for r in self.iter_records()}

    def append(self, record: dict) -> bool:
        """Write one record durably; False (nothing written) when the store already holds its key. A record that
        does not fit the store's schema is refused before anything is written."""
        conform(self.schema, record, f"a record for {self.path}")
        line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            k = self.key(record) if self.key is not None else None
            if self.key is not None and k in self._keys:
                return False
            try:
                self._write(line)
            except OSError as exc:
                raise DistillError(f"cannot write {self.path}: {exc.strerror or exc}") from None
            if self.key is not None:
                self._keys.add(k)
            self._count += 1
        return True

    def _write(self, data: bytes) -> None:
        """All of `data` at the end of the file, fsynced; a failure cuts the file back to where it was, so a
        full disk leaves no torn line (the record is simply not there, and a rerun makes it)."""
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __exit__(self, *exc) -> None:
        self.close()


class CallCache:
    """Content-addressed cache of model and tool calls, so a rerun repeats no paid call.

    Several processes may share one cache file (a generation and an evaluation, two runs side by side), so a
    write that finds the file locked waits `busy_timeout_s` inside SQLite, then is retried `retries` times with
    doubling pauses from `backoff_s` (counted in `lock_retries`), and only then fails as one line."""

    @classmethod
    def open(cls, setting: str | None, auto: Path) -> contextlib.AbstractContextManager[CallCache | None]:
        """A stage's `cache` setting as a context that closes the cache: None means no cache, "auto" the
        stage's own file `auto`, anything else a file of the user's choosing (shared between runs)."""
        if setting is None:
            return contextlib.nullcontext()
        return contextlib.closing(cls(auto if setting == "auto" else setting))

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5):
        self.path = Path(path)
        self.busy_timeout_s, self.retries, self.backoff_s = busy_timeout_s, retries, backoff_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.hits = 0
        self.lock_retries = 0
        self.misses_by_kind: dict[str, int] = {}
        try:
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise DistillError(f"cannot open call cache {self.path}: {exc}") from None
        try:
            self._execute("PRAGMA journal_mode=WAL")
            self._execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, kind TEXT, value TEXT)")
        except DistillError:
            self._db.close()
            raise

    def _execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        for attempt in range(self.retries + 1):
            if attempt:
                self.lock_retries += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with self._lock:
                    return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                if not (isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))):
                    raise DistillError(f"call cache {self.path}: {exc}") from None
        raise DistillError(f"call cache {self.path} stayed locked by another process ({self.retries + 1} tries, "
                           f"{self.busy_timeout_s:g} s wait each); let that run finish or give this one its own cache")

    @property
    def misses(self) -> int:
        return sum(self.misses_by_kind.values())

    def get(self, key: str, kind: str = "model") -> Any | None:
        rows = self._execute("SELECT value FROM calls WHERE key = ?", (key,))
        if not rows:
            self.misses_by_kind[kind] = self.misses_by_kind.get(kind, 0) + 1
            return None
        self.hits += 1
        return json.loads(rows[0][0])

    def put(self, key: str, value: Any, kind: str = "model") -> None:
        self._execute("INSERT OR REPLACE INTO calls (key, kind, value) VALUES (?, ?, ?)",
                      (key, kind, json.dumps(value, ensure_ascii=False)))

    def close(self) -> None:
        self._db.close()
