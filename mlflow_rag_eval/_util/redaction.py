"""The one redactor: every secret the process holds, in every form a text could carry it.

A judge server may echo what it was sent (a 401 quoting the ``Authorization`` header, a reply
that repeats the prompt and the headers), and whatever a reply or an error holds reaches the
cache, the justifications, the rows table, the lineage, the report and the logs. So every text
that leaves a judge, and every text a sink writes, goes through :func:`redact`.

Which secrets: the values of the environment variables that hold credentials
(:data:`SECRET_ENVS`, and any variable whose name ends like one, e.g. ``*_API_KEY``), the MLflow
Basic-auth pair ``user:password``, the userinfo of a tracking, gateway or proxy URL, and every value a backend :func:`remember`-s when it sends it
(an ``api_key_env`` value, each header value, the userinfo of a URL, AWS credentials boto3
resolved). Which forms: as written, reversed, in any letter case, as hex, as base64 or
base64url (of the value alone or inside a longer encoded text, ``Bearer <value>`` or
``user:password``), and each of those with any character JSON-escaped (``\\u0073``),
percent-encoded (``%73``) or written as an HTML character reference (``&#115;``). Matching
happens in place: a reply's JSON stays the JSON it was, with ``***`` where the secret was.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import os
import re
import threading
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["SECRET_ENVS", "known_secrets", "redact", "redact_json_text", "redact_strings", "remember", "scrub", "spellings"]

#: Environment variables whose values are credentials wherever they are set.
SECRET_ENVS = (
    "OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "ANTHROPIC_API_KEY",
    "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD",
    "DATABRICKS_TOKEN", "DATABRICKS_CLIENT_SECRET",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
)
#: Any other variable named like a credential (``MY_GATEWAY_API_KEY``, ``HF_TOKEN``).
_SECRET_ENV_NAME = re.compile(r"(?:API_?KEY|_TOKEN|_SECRET|SECRET_(?:ACCESS_)?KEY|_PASSWORD|_PASSWD)$", re.I)
#: Secrets shorter than this are not redacted: local servers take placeholder keys such as
#: ``EMPTY`` or ``ollama``, and replacing those words would corrupt replies.
MIN_SECRET_CHARS = 8
#: How much of an error body goes into an exception message (:func:`scrub`).
_DETAIL_CHARS = 300

_REMEMBERED: set[str] = set()
_LOCK = threading.Lock()


def remember(*values: str | None) -> None:
    """Add ``values`` (a header value, a password, a token) to what :func:`redact` hides, for
    the rest of the process. Values shorter than :data:`MIN_SECRET_CHARS` are ignored."""
    fresh = {v for v in values if isinstance(v, str) and len(v.strip()) >= MIN_SECRET_CHARS}
    with _LOCK:
        _REMEMBERED.update(v.strip() for v in fresh)


def known_secrets() -> tuple[str, ...]:
    """Every secret the process holds now: credential variables, the MLflow Basic-auth pair,
    and what was :func:`remember`-ed. Sorted, so that the compiled pattern is cached."""
    found = {os.environ.get(name) for name in _secret_names(tuple(os.environ))} - {None}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        found.add(f"{user}:{password}")
    for name in _URL_ENVS:  # a tracking server or proxy given as http://user:password@host
        found.update(_userinfo(os.environ.get(name)))
    with _LOCK:
        found |= _REMEMBERED
    return tuple(sorted(v for v in found if len(v) >= MIN_SECRET_CHARS))


#: Variables holding URLs that may carry ``user:password@`` (sent as Basic or proxy auth).
_URL_ENVS = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_DEPLOYMENTS_TARGET", "OPENAI_BASE_URL",
             "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@functools.lru_cache(maxsize=32)
def _userinfo(url: str | None) -> tuple[str, ...]:
    """The password and the ``user:password`` pair (percent-decoded, as sent) of ``url``."""
    if not url or "@" not in url:
        return ()
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return ()
    if not password:
        return (unquote(user),) if user else ()
    return unquote(password), f"{unquote(user or '')}:{unquote(password)}"


@functools.lru_cache(maxsize=8)
def _secret_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """The variables among ``names`` that hold credentials (cached: read on every redaction)."""
    return tuple(n for n in names if n in SECRET_ENVS or _SECRET_ENV_NAME.search(n))


def _base64_cores(data: bytes) -> list[str]:
    """The base64 text that encodes ``data`` wherever it sits in a longer encoded text: for each
    of the three alignments, the 4-character groups made of ``data``'s bytes only."""
    cores = [base64.b64encode(data).decode()]  # data alone, padding included
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + data).decode()
        core = encoded[4 if offset else 0: 4 * ((offset + len(data)) // 3)]
        if len(core) >= MIN_SECRET_CHARS:
            cores.append(core)
    return cores


def spellings(secret: str) -> list[str]:
    """The texts ``secret`` may be written as, before any character escaping: as is, reversed,
    hex, and the base64 / base64url forms of it (alone or inside any encoded text, which
    covers ``Bearer <secret>`` and ``user:<secret>``). Longest first, so that a match takes
    the whole encoded form."""
    data = secret.encode()
    b64 = _base64_cores(data) + _base64_cores(f"Bearer {secret}".encode())
    forms = {secret, secret[::-1], data.hex(), *b64, *(f.replace("+", "-").replace("/", "_").rstrip("=") for f in b64)}
    return sorted(forms, key=lambda f: (-len(f), f))


def _hex(digits: str) -> str:
    """A pattern for hex ``digits`` in either case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in digits)


def _char_pattern(char: str) -> str:
    """``char`` as written, or in any encoding a stored text may be decoded from: a JSON escape
    (behind any number of backslashes: JSON text inside JSON, as a reply's content is), the
    percent-encoding of its UTF-8 bytes, an HTML character reference (of either case)."""
    forms = []
    for variant in dict.fromkeys((char, char.lower(), char.upper())):
        code = ord(variant)
        forms.append("".join("%" + _hex(f"{b:02x}") for b in variant.encode()))
        if code < 0x10000:
            forms.append(r"\\+u" + _hex(f"{code:04x}"))
        forms.append(f"&#(?:0*{code}|[xX]0*{_hex(f'{code:x}')});")
    if char in "\"\\/":
        forms.append(r"\\+" + re.escape(char))
    return "(?:" + re.escape(char) + "|" + "|".join(forms) + ")"


@functools.lru_cache(maxsize=16)
def _forms(secrets: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(spelling, its casefolded form) of every secret, longest first."""
    forms = sorted({f for s in secrets for f in spellings(s)}, key=lambda f: (-len(f), f))
    return tuple((f, f.casefold()) for f in forms)


@functools.lru_cache(maxsize=256)
def _pattern(forms: tuple[str, ...]) -> re.Pattern:
    """The pattern of ``forms`` with each character in any escaping (:func:`_char_pattern`)."""
    return re.compile("|".join("".join(_char_pattern(c) for c in f) for f in forms), re.IGNORECASE)


def redact(text: str, secrets: tuple[str | None, ...] = ()) -> str:
    """``text`` with every spelling (see :func:`spellings`) of every secret the process holds
    (:func:`known_secrets`, plus ``secrets``) replaced by ``***``, nothing else changed.

    A few linear passes decide whether any spelling is there at all (the text with its escapes
    undone, casefolded); only the spellings found are then matched in place, in every escaping.
    """
    if not text:
        return text
    wanted = tuple(sorted({s for s in (*secrets, *known_secrets()) if s and len(s) >= MIN_SECRET_CHARS}))
    return _redact_forms(text, _forms(wanted))


def _redact_forms(text: str, forms) -> str:
    """``text`` with the secrets whose spellings are ``forms`` (see :func:`_forms`) hidden."""
    if not forms or not text:
        return text
    view = _decoded(text)
    found = tuple(f for f, folded in forms if folded in view)
    if not found:
        return text  # the common case
    return _pattern(found).sub("***", text)


_JSON_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")
_PERCENT_RUN = re.compile(r"(?:%[0-9a-fA-F]{2})+")


def _decoded(text: str) -> str:
    """``text`` with every escaping :func:`_char_pattern` knows undone, casefolded: whether
    any spelling is there at all. String methods where they do (a ``\\+`` pattern scans a
    10 MB table 5x slower than ``str.replace``)."""
    if "\\" in text:
        while "\\\\" in text:  # JSON inside JSON: any depth of backslashes
            text = text.replace("\\\\", "\\")
        if "\\u" in text:
            text = _JSON_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
        text = text.replace('\\"', '"').replace("\\/", "/")
    if "%" in text:  # runs of %XX only: unquote() over a text of many "100%" is 10x slower
        text = _PERCENT_RUN.sub(lambda m: unquote(m.group(0)), text)
    if "&#" in text:
        text = html.unescape(text)
    return text.casefold()


def redact_strings(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with :func:`redact` applied to
    every string in it, keys included; for documents a sink writes (a cache entry, the lineage).
    The process's secrets are read once for the whole document, not once per string."""
    forms = _forms(tuple(sorted({s for s in known_secrets() if len(s) >= MIN_SECRET_CHARS})))

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return _redact_forms(node, forms)
        if isinstance(node, dict):
            return {walk(k): walk(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [walk(v) for v in node]
        return node

    return walk(value)


def redact_json_text(text: str) -> str:
    """A JSON document's text, redacted in place (fast on a large table); should a
    replacement ever cut into JSON syntax, each string of the parsed document instead."""
    hidden = redact(text)
    if hidden is text or hidden == text:
        return text
    try:
        json.loads(hidden)
        return hidden
    except ValueError:
        return json.dumps(redact_strings(json.loads(text)), ensure_ascii=False)


def scrub(text: str, secrets: tuple[str | None, ...] = ()) -> str:
    """:func:`redact`, whitespace collapsed and cut to a readable length: for error bodies
    that go into an exception message (OpenAI's 401 names the key it was given)."""
    text = redact(text, secrets)
    for secret in secrets:  # a short key given explicitly is still kept out of a message
        if secret and len(secret) < MIN_SECRET_CHARS:
            text = text.replace(secret, "***")
    text = " ".join(text.split())
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."
