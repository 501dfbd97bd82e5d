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
    "other_passage", "role_swap", "synthetic_examples", "answer_corruptions", "CORRUPTIONS", "word_relation_examples",
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


#: Words whose swap makes a claim stronger than its sentence (not entailed): quantity and
#: frequency words for a universal, hedges for a certainty.
_STRONGER = {"some": "all", "most": "all", "many": "all", "several": "all", "few": "many", "often": "always",
             "sometimes": "always", "usually": "always", "may": "will", "might": "will", "could": "will",
             "can": "will", "possibly": "certainly", "probably": "certainly", "likely": "certain"}
_TOKEN = re.compile(r"[A-Za-z]+")


def _swap_word(sentence: str, start: int, end: int, new: str) -> str:
    old = sentence[start:end]
    if old[:1].isupper():
        new = new[:1].upper() + new[1:]
    return sentence[:start] + new + sentence[end:]


def word_relation_examples(sentences: Iterable[str], relations: dict[str, dict[str, list[str]]], *,
                           seed: int = 0, min_words: int = 5) -> list[SupportExample]:
    """One-word edits of ``sentences``, each against its own sentence as the passage, so that a
    judge learns what a changed word does to meaning and not merely that a word changed:

    - entailed (1): the sentence itself, a clause deleted, one word replaced by a synonym or a
      hypernym from ``relations`` (word -> relation -> words: ``synonym``, ``hypernym``,
      ``antonym``, ``cohyponym``);
    - not entailed (0): one word replaced by an antonym or a co-hyponym (a sibling term: another
      weekday, colour, country), a quantity or hedge made stronger ("most" -> "all", "may" ->
      "will"), a fact added from another sentence, and the rule-based corruptions of
      :data:`CORRUPTIONS` (numbers, dates, names, negation, roles).

    Deterministic for a seed.
    """
    rng = random.Random(seed)
    sentences = [s for s in dict.fromkeys(sentences) if len(s.split()) >= min_words]
    names = sorted({n for s in sentences for n in _names(s)})
    out: list[SupportExample] = []
    for index, sentence in enumerate(sentences):
        out.append(SupportExample(sentence, sentence, 1, "sentence"))
        shorter = clause_deletion(sentence, rng)
        if shorter:
            out.append(SupportExample(shorter, sentence, 1, "clause_deletion"))
        words = [m for m in _TOKEN.finditer(sentence) if m.group(0).lower() in relations]
        rng.shuffle(words)
        done: set[str] = set()
        for m in words:
            rel = relations[m.group(0).lower()]
            for kinds, label in ((("synonym", "hypernym"), 1), (("antonym", "cohyponym"), 0)):
                if label in done:
                    continue
                options = [(k, w) for k in kinds for w in rel.get(k, ())]
                if options:
                    kind, new = rng.choice(options)
                    out.append(SupportExample(_swap_word(sentence, m.start(), m.end(), new), sentence, label,
                                              f"{kind}_swap"))
                    done.add(label)
        stronger = [m for m in _TOKEN.finditer(sentence) if m.group(0).lower() in _STRONGER]
        if stronger:
            m = rng.choice(stronger)
            out.append(SupportExample(_swap_word(sentence, m.start(), m.end(), _STRONGER[m.group(0).lower()]),
                                      sentence, 0, "stronger_word"))
        other = sentences[rng.randrange(len(sentences))]
        if other != sentence and len(sentences) > 1:
            added = other.rstrip(".!? ")
            out.append(SupportExample(f"{sentence.rstrip('.!? ')}, and {added[:1].lower()}{added[1:]}.", sentence, 0,
                                      "added_fact"))
        kind = rng.choice([k for k in CORRUPTIONS if k != "other_passage"])
        changed = CORRUPTIONS[kind](sentence, rng, names) if kind == "entity_swap" else CORRUPTIONS[kind](sentence, rng)
        if changed and changed != sentence:
            out.append(SupportExample(changed, sentence, 0, kind))
    return out
