"""One exception type for user-facing failures: the CLI prints its message on one line and exits 2."""

from __future__ import annotations

from distill.core.secrets import mask

# Libraries whose exceptions mean "a server or the network failed", not "the code is wrong": named by module
# so that telling them apart imports none of them.
_CLIENT_MODULES = ("openai", "httpx", "httpcore", "aiohttp", "requests", "urllib3", "sqlite3", "huggingface_hub")


class DistillError(Exception):
    """Bad input, bad config or an unusable environment: said in one line, never as a traceback."""


class ServerUnreachable(DistillError):
    """A model server that still did not answer after its retries. A run stops on it at once rather than
    turning every remaining question into an error record (see distill.core.run)."""


def clip(text: str, limit: int) -> str:
    """Text folded onto one line, its secrets masked (before the cut, which could leave half a key) and cut to
    `limit` characters, for quoting a server's error body or the like."""
    text = " ".join(mask(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(exc: BaseException, limit: int = 500) -> str:
    """The exception as one bounded line, `Type: message` unless it is a DistillError (whose message is written
    for users already): manifests and terminals get a reason, never a multi-line dump, and never a secret."""
    text = str(exc).strip() or "(no message)"
    return clip(text if isinstance(exc, DistillError) else f"{type(exc).__name__}: {text}", limit)


def is_environment_failure(exc: BaseException) -> bool:
    """I/O, network or model-server client failures: the user's world, not a bug, so no traceback."""
    if isinstance(exc, (DistillError, OSError, TimeoutError)):
        return True
    return any(c.__module__.split(".")[0] in _CLIENT_MODULES for c in type(exc).__mro__)
