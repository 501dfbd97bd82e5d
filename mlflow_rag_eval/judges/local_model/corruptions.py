"""Synthetic support examples from any passage collection, by rule-based corruption.

Each example is a (claim, passage, label) triple: label 1 when the passage supports the claim,
0 when it does not. Faithful claims are a passage's own sentence, or that sentence with a
clause deleted; unfaithful ones are the sentence after one corruption:

==================  ======================================================================
``entity_swap``     a capitalised name replaced by another name of the collection
``number_change``   a number changed (a different value of the same kind)
``date_change``     a month or weekday replaced by another one
``negation``        "not" inserted after the first auxiliary verb ("was" -> "was not")
``role_swap``       two names of the sentence exchanged ("A beat B" -> "B beat A")
``other_passage``   a sentence taken from another passage
==================  ======================================================================

Every transformation is a pure function of the sentence (and a seeded ``random.Random``) and
returns ``None`` where it does not apply (no number to change, no auxiliary to negate), so a
generator never emits an unchanged sentence labelled unsupported. The learned support model of
the local judge (:mod:`mlflow_rag_eval.judges.local_model.training`) trains on these examples.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mlflow_rag_eval._util.text import split_sentences

__all__ = [
    "SupportExample", "clause_deletion", "date_change", "entity_swap", "negation", "number_change",
    "other_passage", "role_swap", "synthetic_examples", "answer_corruptions", "CORRUPTIONS",
]

_AUX = re.compile(
    r"\b(is|are|was|were|has|have|had|will|can|could|should|would|must|may|might|does|do|did)\b(?! not\b)(?!n't)"
)
_NUM = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)?)(?![\w])")
_NAME = re.compile(r"(?<!^)(?<![.!?]\s)\b[A-Z][a-z]+(?:\s[A-Z][a-z]+)*\b")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_DATE = re.compile(r"\b(" + "|".join(_MONTHS + _DAYS) + r")\b")
_CLAUSE = re.compile(r",\s+(?:which|who|while|although|though|after|before|as|where|and)\b[^,.;]*(?=[,.;]|$)")


@dataclass(frozen=True)
class SupportExample:
    """One training example: does ``passage`` support ``claim``? ``kind`` names how it was made."""

    claim: str
    passage: str
    label: int
    kind: str


def _names(sentence: str) -> list[str]:
    """Capitalised names of a sentence, sentence-initial words and date words left out."""
    return [m.group(0) for m in _NAME.finditer(sentence) if not _DATE.fullmatch(m.group(0))]


def entity_swap(sentence: str, rng: random.Random, names: Sequence[str] = ()) -> str | None:
    """One name of the sentence replaced by a different name from ``names``."""
    own = _names(sentence)
    others = sorted({n for n in names if n not in sentence})
    if not own or not others:
        return None
    old = rng.choice(own)
    return sentence.replace(old, rng.choice(others), 1)


def number_change(sentence: str, rng: random.Random) -> str | None:
    """One number of the sentence changed: integers by a nonzero step (years by 1-5), decimals
    scaled; the result always differs from every number of the sentence."""
    found = [m for m in _NUM.finditer(sentence)]
    if not found:
        return None
    m = rng.choice(found)
    text = m.group(1)
    present = {x.group(1) for x in found}
    for _ in range(10):
        if re.fullmatch(r"\d+", text):
            value = int(text)
            step = rng.randint(1, 5) if 1900 <= value <= 2100 else max(1, round(value * rng.uniform(0.2, 0.8)))
            new = str(value + rng.choice((-1, 1)) * step if value - step > 0 else value + step)
        else:
            new = text.replace(",", "")
            new = f"{float(new) * rng.choice((0.5, 1.5, 2, 3)):g}"
        if new not in present:
            return sentence[: m.start(1)] + new + sentence[m.end(1):]
    return None


def date_change(sentence: str, rng: random.Random) -> str | None:
    """A month or weekday replaced by another of its kind."""
    found = list(_DATE.finditer(sentence))
    if not found:
        return None
    m = rng.choice(found)
    pool = _MONTHS if m.group(1) in _MONTHS else _DAYS
    new = rng.choice([x for x in pool if x != m.group(1)])
    return sentence[: m.start(1)] + new + sentence[m.end(1):]


def negation(sentence: str, rng: random.Random) -> str | None:
    """"not" after the first auxiliary verb that is not negated already."""
    m = _AUX.search(sentence)
    if m is None:
        return None
    return sentence[: m.end()] + " not" + sentence[m.end():]


def role_swap(sentence: str, rng: random.Random) -> str | None:
    """Two different names of the sentence exchanged."""
    own = list(dict.fromkeys(_names(sentence)))
    if len(own) < 2:
        return None
    a, b = rng.sample(own, 2)
    if a in b or b in a:
        return None
    return sentence.replace(a, "\x00").replace(b, a).replace("\x00", b)


def other_passage(sentence: str, rng: random.Random, pool: Sequence[str] = ()) -> str | None:
    """A sentence of another passage (``pool``), standing in for this one."""
    others = [s for s in pool if s != sentence]
    return rng.choice(others) if others else None


def clause_deletion(sentence: str, rng: random.Random) -> str | None:
    """The sentence with one subordinate or coordinate clause removed (still supported)."""
    found = list(_CLAUSE.finditer(sentence))
    if not found:
        return None
    m = rng.choice(found)
    out = (sentence[: m.start()] + sentence[m.end():]).strip()
    return out if out != sentence and len(out.split()) >= 4 else None


#: Corruptions that make a claim unsupported, by name.
CORRUPTIONS = {
    "entity_swap": entity_swap, "number_change": number_change, "date_change": date_change,
    "negation": negation, "role_swap": role_swap, "other_passage": other_passage,
}


def synthetic_examples(passages: Iterable[str], *, seed: int = 0, per_passage: int = 2,
                       min_words: int = 6) -> list[SupportExample]:
    """Faithful and corrupted claims from ``passages``; deterministic for a seed.

    From each passage, up to ``per_passage`` sentences of at least ``min_words`` words are
    drawn; each yields the sentence itself (label 1), a clause deletion where one applies
    (label 1), and one example of every corruption that applies to it (label 0). Names and
    sentences for swaps come from the whole collection.
    """
    rng = random.Random(seed)
    passages = [p for p in passages if p and p.strip()]
    sentences = [[s for s in split_sentences(p) if len(s.split()) >= min_words] for p in passages]
    names = sorted({n for sents in sentences for s in sents for n in _names(s)})
    out: list[SupportExample] = []
    for index, (passage, sents) in enumerate(zip(passages, sentences)):
        pool = [s for j, other in enumerate(sentences) if j != index for s in other[:5]]
        for sentence in rng.sample(sents, min(per_passage, len(sents))):
            out.append(SupportExample(sentence, passage, 1, "sentence"))
            shorter = clause_deletion(sentence, rng)
            if shorter:
                out.append(SupportExample(shorter, passage, 1, "clause_deletion"))
            for kind, corrupt in CORRUPTIONS.items():
                extra = {"entity_swap": {"names": names}, "other_passage": {"pool": pool}}.get(kind, {})
                claim = corrupt(sentence, rng, **extra)
                if claim and claim != sentence:
                    out.append(SupportExample(claim, passage, 0, kind))
    return out


def answer_corruptions(answers: Iterable[tuple[str, str]], *, seed: int = 0) -> list[SupportExample]:
    """Unsupported claims made from claims a person judged supported: each (claim, context) pair
    yields one example of every corruption that applies to the claim (names for swaps from its
    own context; no ``other_passage``), labelled 0 against that context.

    Corrupted passage sentences differ from their context by one edit of a sentence the context
    holds verbatim; a faithful answer is a paraphrase, and its corruption keeps that distance
    from the context while changing one fact (the shape of SummEdits' inconsistent summaries).
    """
    rng = random.Random(seed)
    out: list[SupportExample] = []
    for claim, context in answers:
        names = sorted(set(_names(context)))
        for kind, corrupt in CORRUPTIONS.items():
            if kind == "other_passage":
                continue
            changed = corrupt(claim, rng, names) if kind == "entity_swap" else corrupt(claim, rng)
            if changed and changed != claim:
                out.append(SupportExample(changed, context, 0, kind))
    return out
