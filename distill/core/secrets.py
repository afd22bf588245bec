"""The one secret masker: every secret this process holds, scrubbed from whatever it shows or writes.

A secret is the value of an environment variable whose name says KEY, TOKEN, SECRET or PASSWORD (`HF_TOKEN`,
`OPENAI_API_KEY`, `MY_PASSWORD`), a value given after a `--*token`, `--*key`, `--*password` or `--*secret` flag
(this process's own command line, or one it builds for a child), or a key `remember`ed when it was read (an
`api_key_env` may name a variable called anything). A server that echoes a request's Authorization header in
an error body would otherwise put the key into terminals, manifests and error records, so every message that
quotes a server goes through `mask`. This module imports nothing of distill's, so anything may use it.

A URL may carry a secret of its own: a user name and password (`https://user:password@host/v1`, or a token
written as the user name) or a key in its query (`?api_key=`, `?token=`, `?sig=`). A setting that holds one is
refused when the config is read (`url_credentials`, which distill.core.config asks of every value); `mask` scrubs them
from any text all the same, for the URL that reaches a message some other way (a server or a client library
quoting it back).
"""

from __future__ import annotations

import logging
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

# A URL's userinfo, up to the last @ before its host ends (`[^/?#...]` stops at the path, a quote or a space, so
# the @ of an email address further on is not taken for it); the scheme may be absent (`//user:pw@host`).
_URL_USERINFO = re.compile(r"(?P<lead>(?:\b[a-z][a-z0-9+.-]*:)?//)"
                           r"(?P<userinfo>[^/?#\s\"'<>`@]*(?:@[^/?#\s\"'<>`@]*)*)@",
                           re.IGNORECASE)
# `?name=value` and `&name=value`: the value runs to the next parameter, fragment, quote or space.
_URL_PARAM = re.compile(r"(?P<lead>[?&;](?P<name>[\w.\-\[\]]+)=)(?P<value>[^&;#\s\"'<>`]*)")
# A URL as it stands in a setting or a line of text, scheme first.
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s\"'<>`]*", re.IGNORECASE)
# The last word of a query parameter's name that makes its value a secret, beyond SECRET_NAME's (`sig` of a
# signed URL, `X-Amz-Credential`, `auth`, `jwt`).
URL_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "sig", "signature",
                              "auth", "credential", "credentials", "jwt"})


def is_secret_name(name: str) -> bool:
    """An environment variable or config key whose value is a secret."""
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET.search(name)


def is_secret_param(name: str) -> bool:
    """A URL query parameter whose value is a secret: `api_key`, `token`, `access_token`, `sig`, `X-Amz-Signature`
    (but not `api_key_env`, the name of a variable)."""
    return is_secret_name(name) or re.split(r"[_.\-]", name.lower())[-1] in URL_SECRET_WORDS and \
        not NOT_SECRET.search(name)


USERINFO = "user:password@ before the host"


def url_credentials(text: str) -> str | None:
    """What credentials a URL in `text` carries, in words that do not repeat them ("user:password@ before the
    host", "api_key= in its query"), or None. Any text: a setting may hold a URL among other
    words. A bare email address (`me@example.org`) is no URL and passes."""
    for url in _URL.findall(text):
        found = _URL_USERINFO.match(url)
        if found and found.group("userinfo"):
            return USERINFO
        for param in _URL_PARAM.finditer(url):
            if is_secret_param(param.group("name")):
                return f"{param.group('name')}= in its query"
    return None


# Where a refused URL's key belongs: a model endpoint's in the variable its api_key_env names.
IN_API_KEY_ENV = "an environment variable named by api_key_env"
IN_ENV = "an environment variable, never in a setting"


def credentials_refusal(what: str, remedy: str = IN_ENV) -> str:
    """The one refusal of a URL that carries credentials; `what` names their kind, never their value."""
    return f"a URL must not carry credentials ({what}); put the key in {remedy}"


def url_refusal(setting: str, value: str | None, remedy: str = IN_ENV) -> str | None:
    """`setting: <refusal>` when `value` holds a URL with credentials, else None: for a URL that is no config
    setting (an environment variable, a constructor's argument), which the caller raises as its one-line error."""
    what = url_credentials(value) if value else None
    return f"{setting}: {credentials_refusal(what, remedy)}" if what else None


def mask_urls(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by ***: the password of `user:password@` (a user
    name alone, which may be a token, goes whole) and the values of secret query parameters."""
    def userinfo(found: re.Match) -> str:
        user, colon, _ = found.group("userinfo").partition(":")
        return f"{found.group('lead')}{user + colon if colon else ''}{MASK}@"

    def param(found: re.Match) -> str:
        secret = is_secret_param(found.group("name")) and found.group("value")
        return f"{found.group('lead')}{MASK}" if secret else found.group(0)

    if "@" in text:
        text = _URL_USERINFO.sub(userinfo, text)
    if "=" in text:
        text = _URL_PARAM.sub(param, text)
    return text


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
    that holds another is masked whole, and with the credentials of any URL in it masked (`mask_urls`)."""
    values = secret_values() | {v for v in secrets or () if len(v) >= MIN_LENGTH}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, MASK)
    return mask_urls(text)


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


class MaskingFormatter(logging.Formatter):
    """A `logging` formatter that masks the whole formatted record: a traceback (`exc_info=True`) or stack can
    carry a secret the message alone does not, e.g. an exception whose text echoes a key back."""

    def format(self, record) -> str:
        return mask(super().format(record))


def mask_log_record(record) -> bool:
    """A `logging` filter: the record's message, arguments filled in, with every known secret masked."""
    message = record.getMessage()
    masked = mask(message)
    if masked != message:
        record.msg, record.args = masked, ()
    return True
