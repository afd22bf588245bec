"""The `Wikipedia` tool, with three backends behind the one `Tool` interface.

- `OnlineWikipedia`: the MediaWiki API (search, then the intro extract of the best pages), as in the ReWOO
  paper. Needs the internet.
- `LocalWikipedia`: BM25 (bm25s) over a JSONL corpus of `{title, text}` paragraphs, so runs are offline and
  reproducible. The index is built once and persisted, keyed by a fingerprint of the corpus contents.
- `ScopedWikipedia` (`LocalWikipedia.scoped(...)`): BM25 over one question's own paragraphs (the HotpotQA
  distractor setting), in memory.

Every backend returns `Title: text` paragraphs, best first, or "" when nothing matches (the Worker records
that as empty evidence rather than the tool inventing something).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx

from distill.errors import DistillError
from distill.tools.registry import TOOL_DESCRIPTIONS

log = logging.getLogger(__name__)

DEFAULT_MAX_CHARS = 800
INDEX_FORMAT = 1  # bump when the tokenizer or on-disk layout changes, so old indexes are rebuilt
TOKENIZER = {"lib": "bm25s", "stopwords": "en", "stemmer": "english", "lower": True, "doc": "title. text"}
FINGERPRINT_FILE = "fingerprint.json"


@functools.cache
def _bm25s():
    """bm25s, imported late (it is slow to import) and quieted once: it sets its own logger to DEBUG on
    import, which would print a line per index built (one per question with a per-question scope)."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


@dataclass(frozen=True)
class Paragraph:
    title: str
    text: str

    def render(self) -> str:
        return f"{self.title}: {self.text}"


def format_paragraphs(paragraphs: Sequence[Paragraph], max_chars: int | None) -> str:
    """Join the best paragraphs and cap the total, cutting at a word boundary with an ellipsis."""
    text = "\n\n".join(p.render() for p in paragraphs)
    if max_chars is None or len(text) <= max_chars:
        return text
    cut = text[: max(max_chars - 1, 0)]
    if " " in cut[len(cut) // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + "…"


# ---------------------------------------------------------------------------------------------- BM25 core


def _stemmer() -> Any:
    try:
        import Stemmer
    except ImportError as exc:
        raise DistillError("the local Wikipedia tool needs PyStemmer: pip install PyStemmer") from exc
    return Stemmer.Stemmer(TOKENIZER["stemmer"])


class _Bm25:
    """A bm25s retriever plus the query side of its tokenizer, shared by the corpus and scoped backends.

    Queries are tokenized to strings and mapped through the index vocabulary, so a query word the corpus
    never used is simply ignored. A lock serialises searches because PyStemmer objects are not thread-safe
    and searches run in worker threads.
    """

    def __init__(self, retriever: Any, titles: Sequence[str]) -> None:
        self.retriever = retriever
        self._stemmer = _stemmer()
        self._lock = threading.Lock()
        self._by_title: dict[str, int] = {}
        for i, title in enumerate(titles):
            self._by_title.setdefault(_title_key(title), i)

    @classmethod
    def build(cls, paragraphs: Sequence[Paragraph]) -> "_Bm25":
        bm25s = _bm25s()

        # The title goes into the indexed text so that a query naming the page finds it.
        docs = [f"{p.title}. {p.text}" for p in paragraphs]
        tokens = bm25s.tokenize(docs, stopwords=TOKENIZER["stopwords"], stemmer=_stemmer(), show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        return cls(retriever, [p.title for p in paragraphs])

    @property
    def num_docs(self) -> int:
        return int(self.retriever.scores["num_docs"])

    def search(self, query: str, k: int) -> list[int]:
        """Indices of the k best documents with a positive score; a page whose title is the query comes first."""
        bm25s = _bm25s()
        import numpy as np

        with self._lock:
            tokens = bm25s.tokenize(
                [query], return_ids=False, stopwords=TOKENIZER["stopwords"], stemmer=self._stemmer, show_progress=False
            )[0]
        exact = self._by_title.get(_title_key(query))
        ranked: list[int] = [] if exact is None else [exact]
        known = [t for t in tokens if t in self.retriever.vocab_dict]
        if known:
            scores = self.retriever.get_scores(known)
            order = np.argsort(-scores, kind="stable")[: k + 1]
            ranked += [int(i) for i in order if scores[i] > 0 and int(i) != exact]
        return ranked[:k]


def _title_key(text: str) -> str:
    return " ".join(text.casefold().split())


# -------------------------------------------------------------------------------------- corpus and index


def read_corpus(path: Path) -> tuple[list[Paragraph], bytes]:
    """Parse a JSONL corpus; return its paragraphs and raw bytes (the bytes are hashed for the fingerprint)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DistillError(f"cannot read Wikipedia corpus {path}: {exc.strerror}") from exc
    paragraphs: list[Paragraph] = []
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if line.strip():
            paragraphs.append(_parse_record(line, path, lineno))
    if not paragraphs:
        raise DistillError(f"Wikipedia corpus {path} has no records")
    return paragraphs, raw


def _parse_record(line: str, path: Path, lineno: int) -> Paragraph:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DistillError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("title", "text")):
        raise DistillError(f"{path}:{lineno}: a corpus record needs string fields 'title' and 'text'")
    return Paragraph(record["title"], record["text"])


def corpus_fingerprint(path: Path, raw: bytes) -> dict[str, Any]:
    """What an index was built from: the sha256 decides validity; size and mtime are there for people."""
    st = path.stat()
    return {
        "format": INDEX_FORMAT,
        "tokenizer": TOKENIZER,
        "size": st.st_size,
        "mtime": st.st_mtime,
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def _same_index(stored: dict[str, Any], current: dict[str, Any]) -> bool:
    return all(stored.get(key) == current[key] for key in ("format", "tokenizer", "sha256"))


def cache_root() -> Path:
    return Path(os.environ.get("DISTILL_CACHE", Path.home() / ".cache" / "distill"))


def _writable(directory: Path) -> bool:
    """Whether we may write in `directory`.

    The mode bits are checked as well as os.access because root passes os.access everywhere, and a folder
    marked read-only (the shared data folder) must be left alone even by root.
    """
    try:
        mode = directory.stat().st_mode
    except OSError:
        return False
    return os.access(directory, os.W_OK) and bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def index_dirs(corpus: Path, fingerprint: dict[str, Any]) -> list[Path]:
    """Where the index may live, in order of preference: beside the corpus, else in the user cache."""
    key = hashlib.sha256(json.dumps(fingerprint["tokenizer"], sort_keys=True).encode()).hexdigest()[:8]
    cached = cache_root() / "bm25" / f"{fingerprint['sha256'][:24]}-{fingerprint['format']}-{key}"
    beside = corpus.with_name(corpus.name + ".bm25s")
    return [beside, cached] if _writable(corpus.parent) else [cached]


def _load_index(directory: Path, fingerprint: dict[str, Any], paragraphs: Sequence[Paragraph]) -> _Bm25 | None:
    """The persisted index in `directory` if it was built from this exact corpus, else None."""
    bm25s = _bm25s()

    try:
        stored = json.loads((directory / FINGERPRINT_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not _same_index(stored, fingerprint):
        return None
    try:
        retriever = bm25s.BM25.load(str(directory), load_corpus=False, show_progress=False)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("the BM25 index in %s is unreadable (%s: %s); rebuilding it", directory, type(exc).__name__, exc)
        return None
    if int(retriever.scores["num_docs"]) != len(paragraphs):
        return None
    return _Bm25(retriever, [p.title for p in paragraphs])


def _save_index(index: _Bm25, directory: Path, fingerprint: dict[str, Any]) -> None:
    """Write into a temporary sibling and rename it into place, so a reader never sees half an index."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the index is as readable as the corpus it came from
    try:
        index.retriever.save(str(tmp), show_progress=False)
        (tmp / FINGERPRINT_FILE).write_text(json.dumps(fingerprint, indent=1) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ tools


class ScopedWikipedia:
    """BM25 over a handful of given paragraphs (one HotpotQA question's context); in memory, never saved."""

    name = "Wikipedia"
    description = TOOL_DESCRIPTIONS["Wikipedia"]

    def __init__(
        self, paragraphs: Sequence[tuple[str, str]], *, top_k: int = 1, max_chars: int | None = DEFAULT_MAX_CHARS
    ):
        if not paragraphs:
            raise DistillError("a scoped Wikipedia needs at least one (title, text) paragraph")
        self.paragraphs = [Paragraph(title, text) for title, text in paragraphs]
        self.top_k = top_k
        self.max_chars = max_chars
        self.index = _Bm25.build(self.paragraphs)

    async def run(self, query: str) -> str:
        # Ten paragraphs score in microseconds: no thread needed.
        hits = self.index.search(query, self.top_k)
        return format_paragraphs([self.paragraphs[i] for i in hits], self.max_chars)


class LocalWikipedia:
    """BM25 over a JSONL corpus of `{title, text}` records (extra fields are ignored).

    The index is persisted beside the corpus (`<corpus>.bm25s/`) or, when the corpus folder is read-only,
    under `$DISTILL_CACHE/bm25/<fingerprint>/`; it is rebuilt only when the corpus contents change.
    `index_built` tells whether this instance had to build it, `index_dir` where it lives (None if it could
    not be saved anywhere).
    """

    name = "Wikipedia"
    description = TOOL_DESCRIPTIONS["Wikipedia"]

    def __init__(
        self, corpus_path: str | os.PathLike[str], *, top_k: int = 1, max_chars: int | None = DEFAULT_MAX_CHARS
    ):
        if top_k < 1:
            raise DistillError(f"wikipedia top_k must be at least 1, got {top_k}")
        self.corpus_path = Path(corpus_path)
        self.top_k = top_k
        self.max_chars = max_chars
        self.paragraphs, raw = read_corpus(self.corpus_path)
        self.fingerprint = corpus_fingerprint(self.corpus_path, raw)
        self.index_built = False
        self.index_dir: Path | None = None
        self.build_seconds: float | None = None
        self.index = self._load_or_build()

    @classmethod
    def scoped(
        cls, paragraphs: Sequence[tuple[str, str]], *, top_k: int = 1, max_chars: int | None = DEFAULT_MAX_CHARS
    ) -> ScopedWikipedia:
        """A Wikipedia tool that searches only `paragraphs`, e.g. one question's distractor context."""
        return ScopedWikipedia(paragraphs, top_k=top_k, max_chars=max_chars)

    async def run(self, query: str) -> str:
        hits = await asyncio.to_thread(self.index.search, query, self.top_k)
        return format_paragraphs([self.paragraphs[i] for i in hits], self.max_chars)

    def _load_or_build(self) -> _Bm25:
        candidates = index_dirs(self.corpus_path, self.fingerprint)
        for directory in candidates:
            index = _load_index(directory, self.fingerprint, self.paragraphs)
            if index is not None:
                self.index_dir = directory
                return index
        start = time.perf_counter()
        index = _Bm25.build(self.paragraphs)
        self.build_seconds = time.perf_counter() - start
        self.index_built = True
        log.info("built BM25 index over %d paragraphs in %.1fs", len(self.paragraphs), self.build_seconds)
        self.index_dir = self._persist(index, candidates)
        return index

    def _persist(self, index: _Bm25, candidates: list[Path]) -> Path | None:
        for directory in candidates:
            try:
                _save_index(index, directory, self.fingerprint)
                return directory
            except OSError as exc:
                log.warning("could not save the BM25 index to %s (%s); trying the next place", directory, exc)
        log.warning("the BM25 index for %s was not saved; it will be rebuilt next time", self.corpus_path)
        return None


class OnlineWikipedia:
    """Search the MediaWiki API, then return the plain-text intro of the best pages.

    A new HTTP client per call, because the Worker may run under a fresh event loop each time
    (`run_plan_sync`) and a client is bound to the loop that opened it. `transport` lets tests answer
    the HTTP requests in-process.
    """

    name = "Wikipedia"
    description = TOOL_DESCRIPTIONS["Wikipedia"]
    API_URL = "https://en.wikipedia.org/w/api.php"
    USER_AGENT = "distill-rewoo/0.1 (research; ReWOO planner distillation)"

    def __init__(
        self,
        *,
        user_agent: str = USER_AGENT,
        timeout_s: float = 10.0,
        top_k: int = 1,
        sentences: int | None = None,
        max_chars: int | None = DEFAULT_MAX_CHARS,
        api_url: str = API_URL,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.user_agent = user_agent
        self.timeout_s = timeout_s
        self.top_k = top_k
        self.sentences = sentences
        self.max_chars = max_chars
        self.api_url = api_url
        self.transport = transport

    async def run(self, query: str) -> str:
        headers = {"User-Agent": self.user_agent}
        async with httpx.AsyncClient(transport=self.transport, headers=headers, timeout=self.timeout_s) as client:
            titles = await self._search(client, query)
            if not titles:
                return ""
            paragraphs = await self._extracts(client, titles)
        return format_paragraphs(paragraphs, self.max_chars)

    async def _get(self, client: httpx.AsyncClient, params: dict[str, Any]) -> dict[str, Any]:
        params = {"format": "json", "formatversion": "2", **params}
        response = await client.get(self.api_url, params=params)
        response.raise_for_status()
        data = response.json()
        if "error" in data:
            error = data["error"]
            raise RuntimeError(f"Wikipedia API error {error.get('code')}: {error.get('info')}")
        return data

    async def _search(self, client: httpx.AsyncClient, query: str) -> list[str]:
        params = {"action": "query", "list": "search", "srsearch": query, "srlimit": str(self.top_k), "srprop": ""}
        data = await self._get(client, params)
        return [hit["title"] for hit in data.get("query", {}).get("search", [])]

    async def _extracts(self, client: httpx.AsyncClient, titles: list[str]) -> list[Paragraph]:
        params = {
            "action": "query",
            "prop": "extracts",
            "exintro": "1",
            "explaintext": "1",
            "redirects": "1",
            "exlimit": str(len(titles)),
            "titles": "|".join(titles),
        }
        if self.sentences:
            params["exsentences"] = str(self.sentences)
        query = (await self._get(client, params)).get("query", {})
        pages = {page["title"]: page for page in query.get("pages", []) if not page.get("missing")}
        renamed = {r["from"]: r["to"] for r in query.get("normalized", []) + query.get("redirects", [])}
        found = []
        for title in titles:  # keep the search ranking; the API returns pages in its own order
            page = pages.get(renamed.get(title, title))
            if page and page.get("extract", "").strip():
                found.append(Paragraph(page["title"], " ".join(page["extract"].split())))
        return found
