"""The `Wikipedia` tool, with three backends behind the one `Tool` interface.

- `OnlineWikipedia`: the MediaWiki API (search, then the intro extract of the best pages), as in the ReWOO
  paper. Needs the internet.
- `LocalWikipedia`: BM25 (bm25s) over a JSONL corpus of `{title, text}` paragraphs, so runs are offline and
  reproducible. The index is built in memory each run.
- `ScopedWikipedia`: BM25 over one question's own paragraphs (the HotpotQA
  distractor setting), in memory.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

import httpx

from distill import __version__
from distill.errors import DistillError, clip, one_line
from distill.retry import Fault, retry_after_s, with_retries
from distill.store import read_jsonl
from distill.tools.registry import TOOL_DESCRIPTIONS

log = logging.getLogger(__name__)

DEFAULT_MAX_CHARS = 800
TOKENIZER = {"stopwords": "en", "stemmer": "english"}


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


# ------------------------------------------------------------------------------------------------ corpus


def read_corpus(path: Path) -> list[Paragraph]:
    """The paragraphs of a JSONL corpus, read by the project's one JSONL reader."""
    paragraphs: list[Paragraph] = []
    for n, record in enumerate(read_jsonl(path), 1):
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("title", "text")):
            raise DistillError(f"{path}: record {n}: a corpus record needs string fields 'title' and 'text'")
        paragraphs.append(Paragraph(record["title"], record["text"]))
    if not paragraphs:
        raise DistillError(f"Wikipedia corpus {path} has no records")
    return paragraphs


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
        self._index([Paragraph(title, text) for title, text in paragraphs], top_k, max_chars)

    def _index(self, paragraphs: list[Paragraph], top_k: int, max_chars: int | None) -> None:
        if top_k < 1:
            raise DistillError(f"wikipedia top_k must be at least 1, got {top_k}")
        self.paragraphs, self.top_k, self.max_chars = paragraphs, top_k, max_chars
        self.index = _Bm25.build(paragraphs)

    def _search(self, query: str) -> str:
        return format_paragraphs([self.paragraphs[i] for i in self.index.search(query, self.top_k)], self.max_chars)

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
        self.corpus_path = Path(corpus_path)
        start = time.perf_counter()
        self._index(read_corpus(self.corpus_path), top_k, max_chars)
        log.info("built BM25 index over %d paragraphs in %.1fs", len(self.paragraphs), time.perf_counter() - start)

    @classmethod
    def scoped(cls, paragraphs: Sequence[tuple[str, str]], **options: Any) -> ScopedWikipedia:
        """A Wikipedia tool that searches only `paragraphs`, e.g. one question's distractor context."""
        return ScopedWikipedia(paragraphs, **options)

    async def run(self, query: str) -> str:
        return await asyncio.to_thread(self._search, query)


# ------------------------------------------------------------------------------------------- online API


class OnlineWikipedia:
    """Search the MediaWiki API, then return the plain-text intro of the best pages.

    A teacher run makes thousands of these calls, so the API's rate limits are a matter of course, not an
    accident: 429, 5xx, timeouts, dropped connections and the API's own `ratelimited`/`maxlag` errors are
    retried (distill.retry), waiting as long as `Retry-After` asks (up to `max_wait_s`).
    When the retries run out the call raises one `DistillError` line naming the API and the fault, which the
    Worker records as a tool error, so the filter drops that trajectory instead of keeping one built on a
    silent "No evidence found". `budget_s` bounds one `run` (retries and waits included) and ends it the same
    way; built from a config it sits just inside the Worker's tool timeout, so the record names the fault
    rather than a bare timeout. `retries` counts the retries made, for the run summary.

    One pooled HTTP client and one semaphore (at most `max_concurrency` requests in flight, as the API
    etiquette asks of clients) per event loop: both belong to the loop that made them, and `run_plan_sync`
    or an evaluation may start a new loop for each run, which then gets its own.
    """

    name = "Wikipedia"
    description = TOOL_DESCRIPTIONS["Wikipedia"]
    API_URL = "https://en.wikipedia.org/w/api.php"
    RETRY_API_CODES = frozenset({"ratelimited", "maxlag"})

    def __init__(
        self,
        *,
        contact: str | None = None,
        timeout_s: float = 10.0,
        max_retries: int = 5,
        max_concurrency: int = 4,
        backoff_s: float = 0.5,
        max_wait_s: float = 20.0,
        budget_s: float | None = None,
        top_k: int = 1,
        sentences: int | None = None,
        max_chars: int | None = DEFAULT_MAX_CHARS,
        api_url: str = API_URL,
    ):
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise DistillError(
                "online Wikipedia needs max_concurrency >= 1, max_retries >= 0 and timeout_s > 0, got "
                f"{max_concurrency}, {max_retries}, {timeout_s}"
            )
        if not contact:
            log.warning(
                "online Wikipedia without a contact: set wikipedia_contact to a URL or email, as the Wikimedia "
                "User-Agent policy asks (https://meta.wikimedia.org/wiki/User-Agent_policy)"
            )
        about = f"ReWOO planner distillation; {contact}" if contact else "ReWOO planner distillation"
        self.user_agent = f"distill/{__version__} ({about}) httpx/{httpx.__version__}"
        self.timeout_s, self.max_retries, self.max_concurrency = timeout_s, max_retries, max_concurrency
        self.backoff_s, self.max_wait_s, self.budget_s = backoff_s, max_wait_s, budget_s
        self.top_k = top_k
        self.sentences = sentences
        self.max_chars = max_chars
        self.api_url = api_url
        self.retries = 0
        self.faults: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> "OnlineWikipedia":
        """Built from an AgentConfig's `wikipedia_*` settings."""
        return cls(
            contact=cfg.wikipedia_contact,
            timeout_s=cfg.wikipedia_timeout_s,
            max_retries=cfg.wikipedia_max_retries,
            max_concurrency=cfg.wikipedia_max_concurrency,
            max_wait_s=cfg.wikipedia_max_wait_s,
            # A little inside the Worker's own timeout, so that a call which runs out names its fault.
            budget_s=0.9 * cfg.tool_timeout_s,
            top_k=cfg.wikipedia_top_k,
            max_chars=cfg.wikipedia_max_chars,
        )

    async def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        # No pool limit: the semaphore is the cap, and it queues without the pool's timeout.
        self._client = httpx.AsyncClient(headers={"User-Agent": self.user_agent}, timeout=self.timeout_s)
        self._sem = asyncio.Semaphore(self.max_concurrency)
        self._closer = _close_when_loop_ends(self._client)
        await self._closer.asend(None)

    async def run(self, query: str) -> str:
        await self._bind()
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
                found.append(Paragraph(page["title"], " ".join(extract.split())))
        return format_paragraphs(found, self.max_chars)

    async def _get(self, params: dict[str, str]) -> dict[str, Any]:
        """One attempt; every failure is a `Fault` that says whether another attempt may help."""
        async with self._sem:
            try:
                response = await self._client.get(self.api_url, params={"format": "json", "formatversion": "2", **params})
            except httpx.TimeoutException:
                raise Fault("timeout", f"no answer within {self.timeout_s:g}s", retry=True) from None
            except httpx.TransportError as exc:
                raise Fault("connect", f"connection failed ({one_line(exc, 200)})", retry=True) from None
        status = response.status_code
        if status != 200:
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


async def _close_when_loop_ends(client: httpx.AsyncClient) -> AsyncIterator[None]:
    """Parked at its `yield` until the loop's end: `asyncio.run` closes every open async generator before it
    closes the loop, which closes the kept-alive connections while their loop can still do it."""
    try:
        yield
    finally:
        await client.aclose()


def _items(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """`data["query"][key]` as a list of objects, whatever the API left out."""
    query = data.get("query")
    items = query.get(key) if isinstance(query, dict) else None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
