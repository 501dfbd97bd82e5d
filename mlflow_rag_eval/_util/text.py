"""Small text utilities shared by the local judge and the metrics: sentences, content words,
numbers. Deliberately simple and deterministic; no model, no download."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__all__ = ["did_you_mean", "did_you_mean_each", "split_sentences", "content_tokens", "numbers", "readable_prefix", "strip_citations"]

# Split after . ! ? (optionally followed by a closing quote/bracket) when whitespace and an
# upper-case letter, digit or quote follow, and on line breaks. Common abbreviations are
# protected so "e.g. the" or "Mr. Smith" stay in one sentence.
_ABBREV = re.compile(r"\b(?:e\.g|i\.e|etc|vs|Mr|Mrs|Ms|Dr|Prof|St|No|approx|incl)\.", re.I)
_SPLIT = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[A-Z0-9\"'(\[])|\n+")
_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")
_CITATION = re.compile(r"\s*\[\[?\s*[A-Za-z0-9_.:\-]+(?:\s*,\s*[A-Za-z0-9_.:\-]+)*\s*\]?\]")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:\s?%)?")

STOPWORDS = frozenset(
    """a an the and or but if then than so of to in on at by for with from into onto about over
    under as is are was were be been being am do does did doing have has had having it its it's
    this that these those there here their they them he she him her his hers we us our you your
    i me my mine who whom whose which what when where why how not no nor can could should would
    may might must will shall also just only very too more most some any each all both few
    other such own same s t don now up down out off again further once per via""".split()
)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, stripped, empty ones dropped."""
    protected = _ABBREV.sub(lambda m: m.group(0).replace(".", "\x00"), text)
    parts = (p.replace("\x00", ".").strip() for p in _SPLIT.split(protected))
    return [p for p in parts if p and re.search(r"\w", p)]


def content_tokens(text: str) -> list[str]:
    """Lower-cased words without stopwords, crudely stemmed (plural s, -ed, -ing)."""
    out = []
    for w in _WORD.findall(text.lower()):
        if w in STOPWORDS:
            continue
        if len(w) > 4 and w.endswith("ing"):
            w = w[:-3]
        elif len(w) > 3 and w.endswith("ed"):
            w = w[:-2]
        elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


def numbers(text: str) -> set[str]:
    """Numbers written in ``text``, normalised (thousands separators and spaces removed)."""
    return {re.sub(r"[,\s]", "", m) for m in _NUMBER.findall(text)}


def strip_citations(text: str) -> str:
    """``text`` without citation markers (``[1]``, ``[[2]]``, ``[doc-7]``): they are pointers,
    not claims, and their digits must not count as numbers the context has to contain."""
    return _CITATION.sub("", text)


def shorten(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace collapsed), cut at a word boundary when longer than
    ``limit``, saying how much was left out: a message is never cut inside a value."""
    one_line = " ".join(str(text).split())
    if len(one_line) <= limit:
        return one_line
    cut = one_line[:limit].rsplit(" ", 1)[0] if " " in one_line[:limit] else one_line[:limit]
    return f"{cut} … ({len(one_line) - len(cut)} more characters)"


def readable_prefix(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at the last whitespace of its last quarter
    when there is one, so that no word is cut (a cut word would tokenize differently)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    for i in range(limit - 1, limit - limit // 4 - 1, -1):
        if cut[i].isspace():
            return cut[:i]
    return cut


def did_you_mean(word: str, known: Iterable[str], suffix: str = "") -> str:
    """``" (did you mean 'faithfulness'?)"`` for the known names closest to a mistyped one
    (:func:`difflib.get_close_matches`, at most three; ``suffix`` added to each, e.g. a metric's
    ``@10``), or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(known), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c + suffix) for c in close) + "?)"


def did_you_mean_each(words: Iterable[str], known: Iterable[str]) -> str:
    """:func:`did_you_mean` for several mistyped names at once (unknown options, keys): one
    name gets its closest known names; several get the closest one each
    (``" (did you mean 'timeout' for 'tmeout', 'seed' for 'sed'?)"``); ``""`` when none is close."""
    words, known = list(words), list(known)
    if len(words) == 1:
        return did_you_mean(words[0], known)
    pairs = [(difflib.get_close_matches(w, known, n=1, cutoff=0.6), w) for w in words]
    found = [f"{close[0]!r} for {w!r}" for close, w in pairs if close]
    return f" (did you mean {', '.join(found)}?)" if found else ""
