"""Text keys shared by retrieval and its metrics, kept apart from both so either can import them cheaply."""

from __future__ import annotations

import unicodedata


def title_key(title: str) -> str:
    """Page titles compare after NFKC, case folding, underscores as spaces and folded whitespace, so
    `Ed_Wood`, `ed wood` and the resolved online title `Ed Wood` are one page. The Wikipedia tool's exact-title
    lookup and evidence recall both use this one key: a page recall counts as found is one a query naming it
    finds first."""
    return " ".join(unicodedata.normalize("NFKC", title).replace("_", " ").casefold().split())
