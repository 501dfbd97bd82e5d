"""References that are phrases: "49 euros.", "Two years.", "Yes.", "Paris".

Golden sets are full of short references. Split into claims and verified like a sentence, "Two
years." is never backed by "The Lumen X2 comes with a two-year warranty." (the answer's claim
is not in the phrase, the phrase alone states nothing). A phrase is read instead as the answer
to its row's question, and a text *states* it when one of its sentences holds every term of
the phrase, numbers and names normalised ("two-year" = "two years", "49 euros" = "€49" = "EUR
49"). Failing that, a phrase without a number is stated when a sentence is close to it in
embedding space (the judge's ``similarity``); a phrase with a number never is without the
number: "99 euros" is not "49 euros", however similar the sentences. A yes/no phrase is
stated by an answer that opens with the same word, or whose first sentence has (for "no") or
lacks (for "yes") a negation.

Answer correctness and context recall use this path on phrase references, for every judge:
the rule is the metric's, so routes and judges agree on what a phrase reference means.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mlflow_rag_eval._util.text import content_tokens, split_sentences
from mlflow_rag_eval.judges.base import Judge, JudgeFailure

__all__ = ["PhraseMatch", "is_fragment", "is_phrase", "is_yes_no", "match_phrases", "match_yes_no", "phrase_terms",
           "sentence_with_every_term", "with_question"]

#: A reference of at most this many words, in one sentence, is a phrase: "49 euros.", "Two
#: years.", "Paris, France." — four words ("Bikes cost 5 euros.") already make a sentence with a
#: verb, whose extra claims in the answer answer_correctness must still count.
PHRASE_MAX_WORDS = 3
#: Cosine at which a sentence states a phrase that has no number, when its terms are not all there.
SIMILARITY_THRESHOLD = 0.6

_WORDS = re.compile(r"[A-Za-z0-9€$£]+")
_CURRENCY = {"€": " eur ", "$": " usd ", "£": " gbp "}
_CURRENCY_WORDS = {"euro": "eur", "euros": "eur", "dollar": "usd", "dollars": "usd", "usd": "usd", "eur": "eur",
                   "pound": "gbp", "pounds": "gbp", "gbp": "gbp"}
_NUMBER_WORDS = {w: str(n) for n, w in enumerate(
    "zero _ two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split()) if w != "_"}
_NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70",
                      "eighty": "80", "ninety": "90", "hundred": "100", "dozen": "12", "single": "1"})
_NEGATION = re.compile(r"\b(?:not|no|never|none|neither|nor|without|cannot)\b|n't\b", re.I)
_YES_NO = re.compile(r"^\s*(yes|no)\b[\s,.!]*", re.I)
#: a first sentence that neither affirms nor denies ("I don't know.", "The documents do not say."):
#: its negation is about the answer's knowledge, not a "no"
_UNDECIDED = re.compile(r"\b(?:know|sure|certain|unclear|information|unable|(?:cannot|can't|not) (?:say|tell|answer|"
                        r"find|determine|mention|state|specify))\b", re.I)


@dataclass(frozen=True)
class PhraseMatch:
    """Whether a text states a phrase, and on what evidence."""

    stated: bool
    how: str
    score: float
    evidence: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def is_phrase(reference: str) -> bool:
    """A reference of one sentence and at most :data:`PHRASE_MAX_WORDS` words that names
    something: a yes/no, or terms without a negation ("I don't know." and "Not stated." are not
    answers to find, and go the claims' way: no claims, not applicable)."""
    words = _WORDS.findall(reference or "")
    if not (0 < len(words) <= PHRASE_MAX_WORDS and len(split_sentences(reference)) <= 1):
        return False
    return is_yes_no(reference) or (bool(phrase_terms(reference)) and not _NEGATION.search(reference))


#: A fragment has no verb that makes it a statement: no form of "be", "have", "do", no modal.
_FINITE = re.compile(r"\b(?:is|are|was|were|be|been|being|am|has|have|had|does|do|did|can|could|will|would|shall|"
                     r"should|may|might|must|'s|'re)\b|n't\b", re.I)
#: The longest reference read as a fragment (longer ones are claims, verbs or not).
FRAGMENT_MAX_WORDS = 12


def is_fragment(reference: str) -> bool:
    """A reference longer than a phrase that is still no statement of its own: one sentence of
    at most :data:`FRAGMENT_MAX_WORDS` words without a form of "be", "have", "do" or a modal
    ("Lisbon, Porto and Faro.", "Every weekday except Monday."). It answers its question, and is
    read with it (:func:`with_question`). A short sentence with a plain verb ("Bikes cost 5
    euros.") reads as one too, which changes nothing: read with its question it says the same."""
    words = _WORDS.findall(reference or "")
    return (PHRASE_MAX_WORDS < len(words) <= FRAGMENT_MAX_WORDS and len(split_sentences(reference)) <= 1
            and not _FINITE.search(reference))


def with_question(question: str, reference: str) -> str:
    """A fragment reference as the answer to its question, the premise an answer is checked
    against: "When is the office open? Every weekday except Monday."."""
    question = (question or "").strip()
    if not question:
        return reference
    return f"{question if question[-1:] in '?.!' else question + '?'} {reference.strip()}"


def is_yes_no(phrase: str) -> bool:
    """A phrase that answers yes or no ("Yes.", "No, it does not.")."""
    return bool(_YES_NO.match(phrase))


def _normalise(text: str) -> str:
    text = text.lower()
    for symbol, word in _CURRENCY.items():
        text = text.replace(symbol, word)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,200 -> 1200
    text = re.sub(r"(?<=[a-z0-9])-(?=[a-z0-9])", " ", text)  # two-year -> two year
    return text


def phrase_terms(text: str) -> list[str]:
    """The content words of ``text`` with numbers as digits, currencies as codes, hyphenated
    words split and a lone "one" (a pronoun as often as a number) dropped."""
    out = []
    for token in content_tokens(_normalise(text)):
        token = _CURRENCY_WORDS.get(token, token)
        token = _NUMBER_WORDS.get(token, token)
        if token not in ("one", "1") or re.search(r"\b(?:1|one)\s+[a-z]", _normalise(text)):
            out.append(token)
    return out


def match_yes_no(phrase: str, text: str) -> PhraseMatch:
    """Whether ``text`` gives the yes or no that ``phrase`` is."""
    wanted = _YES_NO.match(phrase).group(1).lower()
    sentences = split_sentences(text)
    first = sentences[0] if sentences else text
    opening = _YES_NO.match(first)
    if not opening and (not first.strip() or _UNDECIDED.search(first)):
        return PhraseMatch(False, "the answer says neither yes nor no", 0.0, first or None)
    said = opening.group(1).lower() if opening else ("no" if _NEGATION.search(first) else "yes")
    how = f"the answer {'opens with' if opening else 'reads as'} {said!r}"
    return PhraseMatch(said == wanted, how, 1.0 if said == wanted else 0.0, first)


def _by_terms(phrase: str, sentences: Sequence[str]) -> tuple[PhraseMatch | None, list[int]]:
    """The match on terms alone, or None with the sentences worth comparing by similarity."""
    terms = set(phrase_terms(phrase))
    if not terms:
        return None, list(range(len(sentences)))
    found = [terms & set(phrase_terms(s)) for s in sentences]
    for s, hit in zip(sentences, found):
        if hit == terms:
            return PhraseMatch(True, "a sentence holds every term of the reference", 1.0, s), []
    digits = {t for t in terms if t.replace(".", "").isdigit()}
    keep = [k for k, hit in enumerate(found) if digits <= hit]
    if digits and not keep:
        return PhraseMatch(False, f"no sentence states the number(s) {sorted(digits)}", 0.0), []
    return None, keep


def sentence_with_every_term(phrase: str, text: str) -> str | None:
    """The first sentence of ``text`` that holds every term of ``phrase`` (:func:`phrase_terms`),
    or None (also for a phrase without terms)."""
    match, _ = _by_terms(phrase, split_sentences(text) or [text])
    return match.evidence if match is not None and match.stated else None


def match_phrases(judge: Judge, items: Sequence[tuple[str, Sequence[str]]], *,
                  threshold: float = SIMILARITY_THRESHOLD) -> list[PhraseMatch | JudgeFailure]:
    """For each (phrase, texts): whether a sentence of the texts states the phrase. One
    ``similarity`` batch for the phrases that terms alone do not settle (and a judge that
    cannot measure similarity settles them as not stated, saying so)."""
    out: list[PhraseMatch | JudgeFailure | None] = [None] * len(items)
    pending: list[tuple[int, list[str]]] = []
    for i, (phrase, texts) in enumerate(items):
        sentences = [s for t in texts for s in (split_sentences(t) or [t]) if s.strip()]
        if not sentences:
            out[i] = PhraseMatch(False, "nothing to state it", 0.0)
            continue
        found, candidates = _by_terms(phrase, sentences)
        if found is not None:
            out[i] = found
        elif not judge.supports("similarity"):
            out[i] = PhraseMatch(False, "not every term of the reference is in one sentence", 0.0)
        else:
            pending.append((i, [sentences[k] for k in candidates]))
    pairs = [(items[i][0], s) for i, sentences in pending for s in sentences]
    scores = iter(judge.similarity(pairs) if pairs else [])
    for i, sentences in pending:
        got = [next(scores) for _ in sentences]
        failure = next((g for g in got if isinstance(g, JudgeFailure)), None)
        if failure is not None:
            out[i] = failure
            continue
        best = max(range(len(got)), key=lambda k: got[k])
        score = float(got[best])
        stated = score >= threshold
        out[i] = PhraseMatch(stated, f"closest sentence at cosine {score:.2f} (threshold {threshold:.2f})",
                             score, sentences[best])
    return out  # type: ignore[return-value]
