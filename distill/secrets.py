"""The one secret masker: every secret this process holds, scrubbed from whatever it shows or writes.

A secret is the value of an environment variable whose name says KEY, TOKEN, SECRET or PASSWORD (`HF_TOKEN`,
`OPENAI_API_KEY`, `MY_PASSWORD`), a value given after a `--*token`, `--*key`, `--*password` or `--*secret` flag
(this process's own command line, or one it builds for a child), or a key `remember`ed when it was read (an
`api_key_env` may name a variable called anything). A server that echoes a request's Authorization header in
an error body would otherwise put the key into terminals, manifests and error records, so every message that
quotes a server goes through `mask`. This module imports nothing of distill's, so anything may use it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping

MASK = "***"
# KEY, TOKEN, ... as the end of a word: TOKENIZERS_PARALLELISM is no secret, HF_TOKEN and OPENAI_API_KEY are.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)(?![A-Z])", re.IGNORECASE)
# `--hf-token`, `--api-key`, `--hub_token`, `--db-password`; a tokenizer's special tokens are not secrets, nor is
# `api_key_env`, which holds the *name* of a variable.
SECRET_FLAG = re.compile(r"--[\w-]*(token|key|password|passwd|secret)", re.IGNORECASE)
NOT_SECRET = re.compile(r"((^|[_-])(eos|bos|pad|unk|sep|cls|mask)[_-]token|[_-]env)$", re.IGNORECASE)
# Shorter values are left alone: no real secret is that short, and masking `1` or `no` would garble every line.
MIN_LENGTH = 4

_remembered: set[str] = set()


def is_secret_name(name: str) -> bool:
    """An environment variable or config key whose value is a secret."""
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET.search(name)


def _is_secret_flag(word: str) -> bool:
    name = word.split("=", 1)[0]
    return bool(SECRET_FLAG.fullmatch(name)) and not NOT_SECRET.search(name.lstrip("-"))


def flag_values(argv: Iterable[str]) -> list[str]:
    """The values after secret flags, as `--hf-token X` or `--hf-token=X`."""
    words, found = list(argv), []
    for i, word in enumerate(words):
        if not _is_secret_flag(word):
            continue
        if "=" in word:
            found.append(word.split("=", 1)[1])
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            found.append(words[i + 1])
    return found


def masked_argv(argv: Iterable[str]) -> list[str]:
    """A command line fit to show or store: secret flags keep their names, their values become ***."""
    words = list(argv)
    out = []
    for i, word in enumerate(words):
        if _is_secret_flag(word) and "=" in word:
            out.append(f"{word.split('=', 1)[0]}={MASK}")
        elif i and _is_secret_flag(words[i - 1]) and "=" not in words[i - 1] and not word.startswith("--"):
            out.append(MASK)
        else:
            out.append(word)
    return out


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: MASK if is_secret_name(k) else v for k, v in env.items()}


def remember(value: str | None) -> None:
    """A secret read from somewhere this module cannot see (a key named by `api_key_env`)."""
    if value:
        _remembered.add(value)


def secret_values(argv: Iterable[str] = (), env: Mapping[str, str] | None = None) -> set[str]:
    """Every secret known: remembered ones, this process's environment and command line, and the given
    `argv`/`env` of a child it starts."""
    found = set(_remembered)
    for source in (os.environ, env or {}):
        found |= {v for k, v in source.items() if is_secret_name(k)}
    found |= set(flag_values(sys.argv)) | set(flag_values(argv))
    return {v for v in found if len(v) >= MIN_LENGTH}


def mask(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with every secret (those known, plus `secrets`) replaced by ***, the longest first so a secret
    that holds another is masked whole."""
    values = secret_values() | {v for v in secrets or () if len(v) >= MIN_LENGTH}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def masked_mapping(data):
    """A config (nested dicts and lists) with the values of secret keys replaced by ***, and any known secret
    value masked wherever it appears: fit to write to a file."""
    if isinstance(data, Mapping):
        return {k: MASK if is_secret_name(str(k)) and v else masked_mapping(v) for k, v in data.items()}
    if isinstance(data, list):
        return [masked_mapping(v) for v in data]
    if isinstance(data, str):
        return mask(data)
    return data


def mask_log_record(record) -> bool:
    """A `logging` filter: the record's message, arguments filled in, with every known secret masked."""
    message = record.getMessage()
    masked = mask(message)
    if masked != message:
        record.msg, record.args = masked, ()
    return True
