"""The `Wikipedia` tool: the MediaWiki API as in the ReWOO paper (`OnlineWikipedia`), or BM25 over a JSONL
corpus of `{title, text}` paragraphs so that runs are offline and reproducible (`LocalWikipedia`), or over one
question's own paragraphs, the HotpotQA distractor setting (`ScopedWikipedia`).

Every backend returns `Title: text` paragraphs, best first, or "" when nothing matches (the Worker records
that as empty evidence rather than the tool inventing something).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import httpx
import numpy as np

from distill import __version__
from distill.core.errors import DistillError, clip, one_line
from distill.core.retry import Fault, bind, retry_after_s, with_retries
from distill.core.secrets import url_refusal
from distill.core.store import read_jsonl, stable_hash
from distill.core.text import title_key

log = logging.getLogger(__name__)

DEFAULT_MAX_CHARS = 800
# What the Planner is told of every Wikipedia backend: the same line whichever one answers.
DESCRIPTION = (
    "Worker that searches for similar page contents from Wikipedia. Useful when you need to get holistic "
    "knowledge about people, places, companies, historical events, or other subjects. "
    "Input should be a search query."
)


@functools.cache
def _bm25s():
    """bm25s, imported late (it is slow to import) and quieted once: it sets its own logger to DEBUG on
    import, which would print a line per index built (one per question with a per-question scope)."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def format_paragraphs(paragraphs: Sequence[tuple[str, str]], max_chars: int | None) -> str:
    """Join the best (title, text) paragraphs and cap the total, cutting at a word boundary with an ellipsis."""
    text = "\n\n".join(f"{title}: {body}" for title, body in paragraphs)
    if max_chars is None or len(text) <= max_chars:
        return text
    cut = text[: max(max_chars - 1, 0)]
    if " " in cut[len(cut) // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + "…"


class ScopedWikipedia:
    """BM25 over a handful of given paragraphs (one HotpotQA question's context); in memory, never saved.
    A lock serialises tokenizing because PyStemmer objects are not thread-safe and searches run in threads."""

    name = "Wikipedia"
    description = DESCRIPTION

    def __init__(
        self, paragraphs: Sequence[tuple[str, str]], *, top_k: int = 1, max_chars: int | None = DEFAULT_MAX_CHARS
    ):
        import Stemmer

        if not paragraphs:
            raise DistillError("a scoped Wikipedia needs at least one (title, text) paragraph")
        if top_k < 1:
            raise DistillError(f"wikipedia top_k must be at least 1, got {top_k}")
        self.paragraphs = list(paragraphs)
        self.top_k, self.max_chars = top_k, max_chars
        # what a cached answer depends on besides the query (distill.llm.cached.CachedTool)
        self.cache_settings = {"top_k": top_k, "max_chars": max_chars, "paragraphs": stable_hash(self.paragraphs)}
        self._stemmer = Stemmer.Stemmer("english")
        self._lock = threading.Lock()
        self._by_title: dict[str, int] = {}
        for i, (title, _) in enumerate(self.paragraphs):
            self._by_title.setdefault(title_key(title), i)
        # The title goes into the indexed text so that a query naming the page finds it.
        docs = [f"{title}. {text}" for title, text in self.paragraphs]
        self._retriever = _bm25s().BM25()
        self._retriever.index(_bm25s().tokenize(docs, stopwords="en", stemmer=self._stemmer, show_progress=False),
                              show_progress=False)

    def _search(self, query: str) -> str:
        """The top_k paragraphs with a positive score; a page whose title is the query comes first."""
        with self._lock:
            tokens = _bm25s().tokenize([query], return_ids=False, stopwords="en", stemmer=self._stemmer,
                                       show_progress=False)[0]
        exact = self._by_title.get(title_key(query))
        ranked: list[int] = [] if exact is None else [exact]
        known = [t for t in tokens if t in self._retriever.vocab_dict]  # a word the corpus never used: ignored
        if known:
            scores = self._retriever.get_scores(known)
            order = np.argsort(-scores, kind="stable")[: self.top_k + 1]
            ranked += [int(i) for i in order if scores[i] > 0 and int(i) != exact]
        return format_paragraphs([self.paragraphs[i] for i in ranked[: self.top_k]], self.max_chars)

    async def run(self, query: str) -> str:
        return self._search(query)  # ten paragraphs score in microseconds: no thread needed


class LocalWikipedia(ScopedWikipedia):
    """BM25 over a JSONL corpus of `{title, text}` records (extra fields are ignored).

    The index is built in memory on every run: that takes seconds even for the 18k-paragraph HotpotQA pool,
    and a persisted copy would need fingerprints to stay correct and a folder to write beside the user's data.
    """

    def __init__(
        self, corpus_path: str | os.PathLike[str], *, top_k: int = 1, max_chars: int | None = DEFAULT_MAX_CHARS
    ):
        path, start = Path(corpus_path), time.perf_counter()
        paragraphs = []
        for n, record in enumerate(read_jsonl(path), 1):
            if not all(isinstance(record.get(k), str) for k in ("title", "text")):  # read_jsonl gives only objects
                raise DistillError(f"{path}: record {n}: a corpus record needs string fields 'title' and 'text'")
            paragraphs.append((record["title"], record["text"]))
        if not paragraphs:
            raise DistillError(f"Wikipedia corpus {path} has no records")
        super().__init__(paragraphs, top_k=top_k, max_chars=max_chars)
        log.info("built BM25 index over %d paragraphs in %.1fs", len(self.paragraphs), time.perf_counter() - start)

    @classmethod
    def scoped(cls, paragraphs: Sequence[tuple[str, str]], **options: Any) -> ScopedWikipedia:
        """A Wikipedia tool that searches only `paragraphs`, e.g. one question's distractor context."""
        return ScopedWikipedia(paragraphs, **options)

    async def run(self, query: str) -> str:
        return await asyncio.to_thread(self._search, query)


@dataclass(kw_only=True, eq=False)
class OnlineWikipedia:
    """Search the MediaWiki API, then return the plain-text intro of the best pages.

    A teacher run makes thousands of these calls, so rate limits are a matter of course: 429, 5xx, timeouts,
    dropped connections and the API's `ratelimited`/`maxlag` errors are retried (distill.core.retry). When retries
    run out, one `DistillError` line names the API and the fault; the Worker records it as a tool error, so the
    filter drops that trajectory instead of keeping one built on a silent "No evidence found". `budget_s`
    bounds one `run`, waits included. At most `max_concurrency` requests are in flight, as the API etiquette asks.
    """

    name = "Wikipedia"
    description = DESCRIPTION
    RETRY_API_CODES = frozenset({"ratelimited", "maxlag"})

    contact: str | None = None
    timeout_s: float = 10.0
    max_retries: int = 5
    max_concurrency: int = 4
    backoff_s: float = 0.5
    max_wait_s: float = 20.0
    budget_s: float | None = None
    top_k: int = 1
    sentences: int | None = None
    max_chars: int | None = DEFAULT_MAX_CHARS
    api_url: str = "https://en.wikipedia.org/w/api.php"
    retries: int = field(default=0, init=False)
    faults: Counter[str] = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or self.max_retries < 0 or self.timeout_s <= 0:
            raise DistillError("online Wikipedia needs max_concurrency >= 1, max_retries >= 0 and timeout_s > 0, "
                               f"got {self.max_concurrency}, {self.max_retries}, {self.timeout_s}")
        for setting, value in (("api_url", self.api_url), ("wikipedia_contact", self.contact)):
            if refusal := url_refusal(f"online Wikipedia's {setting}", value):
                raise DistillError(refusal)  # the contact goes out in every User-Agent
        if not self.contact:
            log.warning("online Wikipedia without a contact: set wikipedia_contact to a URL or email, as the "
                        "Wikimedia User-Agent policy asks (https://meta.wikimedia.org/wiki/User-Agent_policy)")
        about = "ReWOO planner distillation" + (f"; {self.contact}" if self.contact else "")
        self.user_agent = f"distill/{__version__} ({about}) httpx/{httpx.__version__}"

    @property
    def cache_settings(self) -> dict:
        """What a cached answer depends on besides the query (distill.llm.cached.CachedTool)."""
        return {"api_url": self.api_url, "top_k": self.top_k, "sentences": self.sentences, "max_chars": self.max_chars}

    @classmethod
    def from_config(cls, cfg: Any) -> "OnlineWikipedia":
        """Built from an AgentConfig's `wikipedia_*` settings; the budget sits a little inside the Worker's own
        tool timeout, so that a call which runs out names its fault rather than a bare timeout."""
        return cls(
            contact=cfg.wikipedia_contact, timeout_s=cfg.wikipedia_timeout_s, max_retries=cfg.wikipedia_max_retries,
            max_concurrency=cfg.wikipedia_max_concurrency, max_wait_s=cfg.wikipedia_max_wait_s,
            budget_s=0.9 * cfg.tool_timeout_s, top_k=cfg.wikipedia_top_k, max_chars=cfg.wikipedia_max_chars,
            api_url=cfg.wikipedia_api_url,
        )

    async def run(self, query: str) -> str:
        await bind(self, headers={"User-Agent": self.user_agent}, timeout=self.timeout_s)
        deadline = None if self.budget_s is None else self._loop.time() + self.budget_s
        search = {"action": "query", "list": "search", "srsearch": query, "srlimit": str(self.top_k), "srprop": ""}
        try:
            hits = _items(await with_retries(self, lambda: self._get(search), deadline), "search")
            titles = [hit["title"] for hit in hits if isinstance(hit.get("title"), str)]
            if not titles:
                return ""
            extracts = {"action": "query", "prop": "extracts", "exintro": "1", "explaintext": "1", "redirects": "1",
                        "exlimit": str(len(titles)), "titles": "|".join(titles)}
            if self.sentences:
                extracts["exsentences"] = str(self.sentences)
            data = await with_retries(self, lambda: self._get(extracts), deadline)
        except Fault as fault:
            raise DistillError(f"Wikipedia API {self.api_url}: {fault.describe()}") from None
        pages = {p["title"]: p for p in _items(data, "pages") if isinstance(p.get("title"), str)}
        renamed = {r.get("from"): r.get("to") for r in _items(data, "normalized") + _items(data, "redirects")}
        found = []
        for title in titles:  # keep the search ranking; the API returns pages in its own order
            page = pages.get(renamed.get(title, title))
            extract = page.get("extract") if page and not page.get("missing") else None
            if isinstance(extract, str) and extract.strip():
                found.append((page["title"], " ".join(extract.split())))
        return format_paragraphs(found, self.max_chars)

    async def _get(self, params: dict[str, str]) -> dict[str, Any]:
        """One attempt; every failure is a `Fault` that says whether another attempt may help."""
        params = {"format": "json", "formatversion": "2", **params}
        async with self._sem:
            try:
                response = await self._client.get(self.api_url, params=params)
            except httpx.TimeoutException:
                raise Fault("timeout", f"no answer within {self.timeout_s:g}s", retry=True) from None
            except httpx.TransportError as exc:
                raise Fault("connect", f"connection failed ({one_line(exc, 200)})", retry=True) from None
        if (status := response.status_code) != 200:
            retry = status == 429 or status >= 500
            wait = retry_after_s(response.headers.get("Retry-After")) if retry else None
            raise Fault(str(status), f"HTTP {status} {response.reason_phrase}", retry=retry, wait_s=wait)
        try:
            data = response.json()
        except ValueError:  # an overloaded proxy answers with an HTML page
            raise Fault("not json", "answered 200 with a body that is not JSON", retry=True) from None
        if not isinstance(data, dict):
            raise Fault("not json", "answered 200 with JSON that is not an object", retry=True)
        error = data.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            info = error.get("info") if isinstance(error, dict) else error
            wait = retry_after_s(response.headers.get("Retry-After"))
            raise Fault(str(code), f"error {code}: {clip(str(info), 200)}", code in self.RETRY_API_CODES, wait)
        return data


def _items(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """`data["query"][key]` as a list of objects, whatever the API left out."""
    query = data.get("query")
    items = query.get(key) if isinstance(query, dict) else None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
