"""Faithful rewrites and one-word edits of plain sentences, made in pairs, for the cross-encoder.

A judge trained on entailment data alone has seen many ways to contradict a sentence and few
ways to say the same thing differently: it learns that a changed sentence is a wrong one, and
fails correct paraphrases with the edits. Each :class:`RewriteEditPair` here holds one sentence
(the premise), a *faithful rewrite* of it (entailed: label 1) and a *one-word edit* of it (not
entailed: label 0), so that training can put the two in one batch and rank the rewrite above
the edit.

Faithful rewrites (:data:`REWRITES`): a trailing phrase moved to the front, a list reordered,
a regular verb put into the passive, numbers, percentages and dates written another way, a
word replaced by a synonym or a broader word from a curated list, a clause or a trailing phrase
dropped (only where nothing in the sentence reverses entailment: no negation, no "no", "few",
"every"), and the sentence itself read inside a longer premise.

One-word edits (:data:`EDITS`): an antonym, a sibling term (another colour, country, weekday,
month, unit), a changed number, a swapped name or place, a "not" inserted or removed, a stronger
quantifier ("some" -> "all") or modality ("may" -> "will"), a comparative reversed, "from A to B"
reversed, two names exchanged, a fact added. The word lists are written out here, not drawn
from WordNet: WordNet mixes word senses ("red" and "purse" are co-hyponyms there), so a swap
it calls a contradiction often is not one.

Every function is pure given the sentence and a seeded ``random.Random`` and returns ``None``
where it does not apply; nothing emits an unchanged sentence.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mlflow_rag_eval.judges.local_model.corruptions import _DAYS, _MONTHS, _names, entity_swap, number_change, role_swap

__all__ = ["EDITS", "REWRITES", "RewriteEditPair", "rewrite_edit_pairs"]


@dataclass(frozen=True)
class RewriteEditPair:
    """``premise`` entails ``rewrite`` and does not entail ``edit`` (one word changed)."""

    premise: str
    rewrite: str
    rewrite_kind: str
    edit: str
    edit_kind: str


def _pairs(text: str) -> dict[str, str]:
    """"a b, c d" -> {a: b, b: a, c: d, d: c}."""
    out = {}
    for item in text.split(","):
        a, b = item.split()
        out.setdefault(a, b)
        out.setdefault(b, a)
    return out


#: Antonyms (both ways), common verbs in their past and present forms, adjectives and adverbs.
ANTONYMS = _pairs(
    "rose fell, rises falls, rise fall, increased decreased, increases decreases, increase decrease, "
    "grew shrank, grows shrinks, gained lost, won lost, wins loses, win lose, opened closed, opens closes, "
    "accepted rejected, accepts rejects, approved rejected, allowed banned, allows bans, passed failed, "
    "succeeded failed, started stopped, starts stops, began ended, begins ends, arrived departed, "
    "bought sold, buys sells, hired fired, raised lowered, raises lowers, added removed, adds removes, "
    "joined left, entered exited, included excluded, includes excludes, confirmed denied, confirms denies, "
    "supported opposed, supports opposes, agreed disagreed, agrees disagrees, remembered forgot, "
    "expanded reduced, expands reduces, strengthened weakened, improved worsened, improves worsens, "
    "higher lower, high low, more less, larger smaller, large small, bigger smaller, big small, "
    "longer shorter, long short, older younger, old young, faster slower, fast slow, early late, "
    "earlier later, before after, above below, inside outside, first last, cheaper dearer, "
    "cheap expensive, hot cold, warm cool, wide narrow, thick thin, strong weak, rich poor, "
    "easy difficult, easier harder, safe dangerous, full empty, true false, correct incorrect, "
    "possible impossible, legal illegal, public private, permanent temporary, majority minority, "
    "maximum minimum, north south, east west, always never, often rarely, "
    "profit loss, profits losses, success failure, victory defeat, winner loser, positive negative, "
    "alive dead, married divorced, domestic foreign, ancient modern, inner outer, "
    "upper lower, clean dirty, wet dry, quiet loud, happy sad, open closed, online offline, "
    "internal external, import export, imports exports, minor major, win loss, wins losses, "
    "exceeded missed, peak trough, surplus deficit, cheapest dearest, highest lowest, largest smallest, "
    "biggest smallest, best worst, better worse, most least, oldest youngest, fastest slowest"
)

#: Sibling terms: a word swapped for another of its kind says something else.
SIBLINGS: tuple[tuple[str, ...], ...] = (
    ("red", "blue", "green", "yellow", "black", "white", "orange", "purple", "brown", "grey", "pink"),
    ("France", "Germany", "Spain", "Italy", "Portugal", "Canada", "Mexico", "Brazil", "Japan", "China", "India",
     "Australia", "Egypt", "Kenya", "Norway", "Sweden", "Poland", "Ireland", "Greece", "Turkey", "Russia"),
    ("Paris", "Berlin", "Madrid", "Rome", "Lisbon", "London", "Dublin", "Vienna", "Prague", "Warsaw", "Oslo",
     "Stockholm", "Tokyo", "Beijing", "Sydney", "Toronto", "Chicago", "Boston", "Seattle", "Denver", "Cairo"),
    ("French", "German", "Spanish", "Italian", "Portuguese", "Japanese", "Chinese", "Russian", "Dutch", "Greek"),
    ("dog", "cat", "horse", "cow", "sheep", "goat", "pig", "rabbit", "mouse", "bird", "fish"),
    ("dogs", "cats", "horses", "cows", "sheep", "goats", "pigs", "rabbits", "birds"),
    ("man", "woman", "boy", "girl"), ("men", "women", "boys", "girls"),
    ("apple", "banana", "orange", "pear", "grape", "lemon", "cherry"),
    ("car", "bus", "truck", "bicycle", "train", "motorcycle", "boat", "plane"),
    ("doctor", "nurse", "teacher", "lawyer", "engineer", "farmer", "pilot", "chef", "soldier", "student"),
    ("football", "basketball", "tennis", "baseball", "golf", "hockey", "cricket", "rugby"),
    ("guitar", "piano", "violin", "drum", "trumpet", "flute"),
    ("summer", "winter", "spring", "autumn"), ("morning", "evening", "afternoon", "night"),
    ("daily", "weekly", "monthly", "yearly"), ("husband", "wife"), ("father", "mother"), ("son", "daughter"),
    ("brother", "sister"), ("king", "queen"), ("uncle", "aunt"),
    ("Democrats", "Republicans"), ("Democratic", "Republican"), ("Christian", "Muslim", "Jewish", "Hindu"),
    ("gold", "silver", "bronze"), ("Mars", "Venus", "Jupiter", "Saturn", "Mercury"),
    ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    ("January", "February", "March", "April", "June", "July", "August", "September", "October", "November",
     "December"),
)

#: Units, each swapped only within its row (a number in one unit is not that number in another).
UNITS: tuple[tuple[str, ...], ...] = (
    ("km", "miles", "metres", "meters", "feet", "kilometres", "kilometers"),
    ("kg", "pounds", "grams", "tonnes", "tons", "kilograms"),
    ("seconds", "minutes", "hours", "days", "weeks", "months", "years"),
    ("dollars", "euros", "yen", "rupees", "francs"),
    ("MB", "GB", "TB"), ("percent", "points"), ("Celsius", "Fahrenheit"), ("litres", "gallons", "liters"),
)

#: Faithful single-word replacements (a synonym, or a broader word), both in one direction.
SYNONYMS = {
    "big": "large", "large": "big", "small": "little", "began": "started", "started": "began",
    "bought": "purchased", "purchased": "bought", "helped": "assisted", "showed": "displayed", "said": "stated",
    "says": "states", "told": "informed", "quick": "fast", "rapidly": "quickly", "quickly": "rapidly",
    "ended": "finished", "completed": "finished", "obtained": "received", "received": "got", "utilised": "used",
    "built": "constructed", "constructed": "built", "allowed": "permitted", "permitted": "allowed",
    "required": "needed", "needed": "required", "approximately": "about", "roughly": "approximately",
    "nearly": "almost", "almost": "nearly", "shut": "closed", "children": "kids", "kids": "children",
    "child": "kid", "film": "movie", "movie": "film", "car": "vehicle", "cars": "vehicles", "dog": "animal",
    "cat": "animal", "dogs": "animals", "man": "person", "woman": "person", "men": "people", "women": "people",
    "boy": "child", "girl": "child", "town": "place", "job": "position", "road": "street", "street": "road",
    "chose": "selected", "attempted": "tried", "tried": "attempted", "wanted": "wished", "often": "frequently",
    "frequently": "often", "main": "principal", "principal": "main", "entire": "whole", "whole": "entire",
    "stated": "said", "announced": "said", "near": "close to", "beside": "next to", "guitar": "instrument",
    "piano": "instrument", "soccer": "football", "physician": "doctor", "doctor": "physician",
    "automobile": "car", "couch": "sofa", "sofa": "couch", "photo": "picture", "photograph": "picture",
    "outdoors": "outside", "talking": "speaking", "speaking": "talking", "sprinting": "running",
    "jumping": "leaping", "leaping": "jumping", "purchase": "buy", "assist": "help", "commence": "begin",
    "terminate": "end", "reside": "live", "resides": "lives", "resided": "lived", "enormous": "huge",
    "huge": "enormous", "tiny": "small", "pupils": "students", "students": "pupils",
}

#: A stronger word where the premise has the weaker one: the claim says more than the premise.
STRONGER = {"some": "all", "several": "all", "many": "all", "most": "all", "few": "no", "often": "always",
            "sometimes": "always", "usually": "always", "occasionally": "always", "may": "will", "might": "will",
            "could": "will", "possibly": "certainly", "probably": "certainly", "likely": "certain",
            "partly": "fully", "partially": "fully", "nearly": "fully", "almost": "fully", "plans": "agreed",
            "planned": "agreed", "proposed": "approved", "expected": "confirmed", "hopes": "expects",
            "considering": "completing", "about": "exactly", "approximately": "exactly", "around": "exactly",
            "up to": "exactly", "at least": "exactly", "can": "must", "should": "must"}

_ROUGHLY = {"about", "approximately", "around", "up to", "at least"}
_QUANTIFIERS = {"some", "several", "many", "most", "few"}
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_REVERSING = re.compile(r"\b(not|no|never|none|nobody|nothing|neither|nor|few|without|every|all|each|only|"
                        r"n't|unless|if|whether|fails?|failed|refused?|lacks?|denied|doubt\w*)\b", re.I)
_PHRASE_END = re.compile(r"^(?P<main>[^:;?]+?[\w%]),? (?P<phrase>(?:in|on|at|during|after|before|since)"
                         r" [^,;:.!?()]{3,50})(?P<end>[.!])$")
_FUNCTION = {"the", "a", "an", "this", "that", "these", "those", "it", "its", "he", "she", "they", "we", "his",
             "her", "their", "our", "there", "some", "many", "most", "all", "each", "every", "one", "two", "in",
             "on", "at", "after", "before", "during", "for", "with", "by", "from", "to", "of", "as", "when", "while"}
_AUX_NEG = re.compile(r"\b(is|are|was|were|has|have|had|will|can|could|should|would|must|may|might|does|do|did)"
                      r" not\b|\b(is|are|was|were|has|have|had|does|do|did|could|would|should)n't\b")
_FROM_TO = re.compile(r"\bfrom (?P<a>\$?[\w.,%:$]+(?: [A-Z]\w+)?) to (?P<b>\$?[\w.,%:$]+(?: [A-Z]\w+)?)\b")
_THAN = re.compile(r"\b(?P<a>[A-Z]\w+(?: [A-Z]\w+)?) (?P<mid>(?:is|was|are|were) \w+er than) "
                   r"(?P<b>[A-Z]\w+(?: [A-Z]\w+)?)\b")
_PASSIVE = re.compile(r"^(?P<subj>(?:The|A|An|Its|Their|His|Her|[A-Z]\w+)(?: [\w-]+){0,3}?) "
                      r"(?P<verb>[a-z]+ed) (?P<obj>(?:the|a|an|its|their|his|her|two|three|\d+) [\w-]+(?: [\w-]+){0,3}?)"
                      r"(?P<rest>(?: (?:in|on|at|during|after|before|for|with|from|to|by|since|over|under|last|this)"
                      r" [^.]*)?)(?P<end>[.!?]?)$")
_NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve").split()
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)(%| percent\b| per cent\b)")
_MILLION = re.compile(r"\b(\d+(?:\.\d+)?) (million|billion)\b")
_THOUSANDS = re.compile(r"(?<![\d.,])(\d{1,3}),(\d{3})(?![\d,])")
_SMALL = re.compile(r"(?<![\w.,$%-])([2-9]|1[0-2])(?= [a-z])(?![\w.,%])")
_DAY_MONTH = re.compile(r"\b([1-9]|[12]\d|3[01]) (" + "|".join(_MONTHS) + r")\b")
_MONTH_DAY = re.compile(r"\b(" + "|".join(_MONTHS) + r") ([1-9]|[12]\d|3[01])\b(?!,? ?\d)")
_ORDINAL = {1: "st", 2: "nd", 3: "rd", 21: "st", 22: "nd", 23: "rd", 31: "st"}


def _case_like(old: str, new: str) -> str:
    return new[:1].upper() + new[1:] if old[:1].isupper() else new


def _replace_word(sentence: str, m: re.Match, new: str) -> str:
    return sentence[:m.start()] + _case_like(m.group(0), new) + sentence[m.end():]


def _lower_first(text: str) -> str:
    """The first word in lower case when it is a function word ("The", "It"); the encoder is
    uncased, so a capital left on a noun changes nothing it reads."""
    first = text.split(" ", 1)[0]
    return text[:1].lower() + text[1:] if first.lower() in _FUNCTION else text


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


# --- faithful rewrites -------------------------------------------------------------------------

def front_phrase(sentence: str, rng: random.Random) -> str | None:
    """A trailing prepositional or time phrase moved to the front: "X in May." -> "In May, X."."""
    m = _PHRASE_END.match(sentence.strip())
    if m is None or len(m.group("main").split()) < 3 or m.group("main").split()[-1] in ("is", "are", "was", "were"):
        return None
    return f"{_capital(m.group('phrase'))}, {_lower_first(m.group('main'))}{m.group('end') or '.'}"


def reorder_list(sentence: str, rng: random.Random) -> str | None:
    """The items of "A, B and C" (or "A and B") of names or single words reordered."""
    m = re.search(r"\b((?:[A-Z]\w+, )+[A-Z]\w+,? and [A-Z]\w+|[A-Z]\w+ and [A-Z]\w+)\b", sentence)
    if m is None or m.start() == 0:
        return None
    items = [x for x in re.split(r",? and |, ", m.group(1)) if x]
    if len(set(items)) < 2:
        return None
    shuffled = items[:]
    while shuffled == items:
        rng.shuffle(shuffled)
    joined = shuffled[0] if len(shuffled) == 1 else ", ".join(shuffled[:-1]) + " and " + shuffled[-1]
    return sentence[:m.start()] + joined + sentence[m.end():]


def passive(sentence: str, rng: random.Random) -> str | None:
    """"The committee accepted the proposal at ..." -> "The proposal was accepted by the committee at ..."."""
    m = _PASSIVE.match(sentence.strip())
    if m is None or _REVERSING.search(sentence):
        return None
    obj = m.group("obj")
    head = obj.split()[-1]
    be = "were" if head.endswith("s") and not head.endswith("ss") or obj.split()[0] in ("two", "three") else "was"
    return (f"{_capital(obj)} {be} {m.group('verb')} by {_lower_first(m.group('subj'))}{m.group('rest')}"
            f"{m.group('end') or '.'}")


def reformat_number(sentence: str, rng: random.Random) -> str | None:
    """A number written another way: "12%" / "12 percent", "3.5 million" / "3,500,000", "1,200" /
    "1200", "3" / "three"."""
    options = []
    for m in _PERCENT.finditer(sentence):
        new = f"{m.group(1)} percent" if m.group(2) == "%" else f"{m.group(1)}%"
        options.append((m.start(), m.end(), new))
    for m in _MILLION.finditer(sentence):
        value = float(m.group(1)) * (1e6 if m.group(2) == "million" else 1e9)
        if value == int(value):
            options.append((m.start(), m.end(), f"{int(value):,}"))
    for m in _THOUSANDS.finditer(sentence):
        options.append((m.start(), m.end(), m.group(1) + m.group(2)))
    for m in _SMALL.finditer(sentence):
        options.append((m.start(), m.end(), _NUMBER_WORDS[int(m.group(1))]))
    for m in re.finditer(r"\b(" + "|".join(_NUMBER_WORDS[2:]) + r")\b(?= [a-z])", sentence):
        options.append((m.start(), m.end(), str(_NUMBER_WORDS.index(m.group(1).lower()))))
    if not options:
        return None
    start, end, new = rng.choice(options)
    return sentence[:start] + new + sentence[end:]


def reformat_date(sentence: str, rng: random.Random) -> str | None:
    """A date written another way: "4 May" / "May 4" / "May 4th" / "the 4th of May"."""
    m = _DAY_MONTH.search(sentence)
    if m:
        day, month = int(m.group(1)), m.group(2)
        new = rng.choice([f"{month} {day}", f"{month} {day}{_ORDINAL.get(day, 'th')}"])
        return sentence[:m.start()] + new + sentence[m.end():]
    m = _MONTH_DAY.search(sentence)
    if m:
        month, day = m.group(1), int(m.group(2))
        new = rng.choice([f"{day} {month}", f"the {day}{_ORDINAL.get(day, 'th')} of {month}"])
        return sentence[:m.start()] + new + sentence[m.end():]
    return None


def synonym_swap(sentence: str, rng: random.Random) -> str | None:
    """One word replaced by a synonym or a broader word (:data:`SYNONYMS`), where nothing in the
    sentence reverses the direction of entailment."""
    if _REVERSING.search(sentence):
        return None
    found = [m for m in _WORD.finditer(sentence) if m.group(0).lower() in SYNONYMS and m.start() > 0]
    if not found:
        return None
    m = rng.choice(found)
    return _replace_word(sentence, m, SYNONYMS[m.group(0).lower()])


def shorten(sentence: str, rng: random.Random) -> str | None:
    """A trailing phrase or a subordinate clause dropped (what is left is still said), where
    nothing in the sentence reverses the direction of entailment."""
    if _REVERSING.search(sentence):
        return None
    clause = re.search(r",\s+(?:which|who|while|although|though|as|where)\b[^,.;]*(?=[,.;]|$)", sentence)
    if clause:
        out = (sentence[:clause.start()] + sentence[clause.end():]).strip()
    else:
        m = _PHRASE_END.match(sentence.strip())
        if m is None:
            return None
        out = m.group("main") + (m.group("end") or ".")
    return out if out != sentence and len(out.split()) >= 4 else None


REWRITES = {"front_phrase": front_phrase, "reorder_list": reorder_list, "passive": passive,
            "reformat_number": reformat_number, "reformat_date": reformat_date, "synonym_swap": synonym_swap,
            "shorten": shorten}


# --- one-word edits ----------------------------------------------------------------------------

def antonym(sentence: str, rng: random.Random) -> str | None:
    """One word replaced by its antonym (:data:`ANTONYMS`)."""
    found = [m for m in _WORD.finditer(sentence) if m.group(0).lower() in ANTONYMS]
    if not found:
        return None
    m = rng.choice(found)
    return _replace_word(sentence, m, ANTONYMS[m.group(0).lower()])


def _sibling_of(word: str, rows, rng: random.Random) -> str | None:
    for row in rows:
        lowered = [w.lower() for w in row]
        if word.lower() in lowered:
            return rng.choice([w for w in row if w.lower() != word.lower()])
    return None


_SIBLING_WORDS = {w.lower() for row in SIBLINGS for w in row}
_UNIT_WORDS = {w.lower() for row in UNITS for w in row}


def sibling(sentence: str, rng: random.Random) -> str | None:
    """A colour, country, city, weekday, month, animal, ... replaced by another of its kind."""
    found = [m for m in _WORD.finditer(sentence) if m.group(0).lower() in _SIBLING_WORDS]
    if not found:
        return None
    m = rng.choice(found)
    new = _sibling_of(m.group(0), SIBLINGS, rng)
    return sentence[:m.start()] + (new if m.group(0)[:1].isupper() or new[:1].isupper() else new.lower()) \
        + sentence[m.end():] if new else None


def unit(sentence: str, rng: random.Random) -> str | None:
    """The unit after a number replaced by another unit of its kind ("12 km" -> "12 miles")."""
    found = [m for m in re.finditer(r"(?<=\d )[A-Za-z]+|(?<=\d)(?:km|kg|MB|GB|TB)\b", sentence)
             if m.group(0).lower() in _UNIT_WORDS]
    if not found:
        return None
    m = rng.choice(found)
    new = _sibling_of(m.group(0), UNITS, rng)
    return sentence[:m.start()] + new + sentence[m.end():] if new else None


def negate(sentence: str, rng: random.Random) -> str | None:
    """"not" inserted after the first auxiliary, or removed where the sentence has one."""
    m = _AUX_NEG.search(sentence)
    if m:
        if m.group(1):
            return sentence[:m.start()] + m.group(1) + sentence[m.end():]
        return sentence[:m.start()] + m.group(2) + sentence[m.end():]
    m = re.search(r"\b(is|are|was|were|has|have|had|will|can|could|should|would|must|may|might)\b", sentence)
    if m:
        return sentence[:m.end()] + " not" + sentence[m.end():]
    return None


def stronger(sentence: str, rng: random.Random) -> str | None:
    """A quantifier or hedge made stronger (:data:`STRONGER`): "some" -> "all", "may" -> "will"."""
    found = [m for m in re.finditer(r"\b(?:up to|at least|[A-Za-z]+)\b", sentence) if m.group(0).lower() in STRONGER
             and not (m.group(0) == "May" or sentence[max(0, m.start() - 2):m.start()].lower() == "a ")
             and (m.group(0).lower() not in _QUANTIFIERS or re.match(r" \w+s\b", sentence[m.end():]))
             and (m.group(0).lower() not in _ROUGHLY or re.match(r" \$?\d", sentence[m.end():]))]
    if not found:
        return None
    m = rng.choice(found)
    return _replace_word(sentence, m, STRONGER[m.group(0).lower()])


def from_to(sentence: str, rng: random.Random) -> str | None:
    """"from A to B" -> "from B to A"."""
    m = _FROM_TO.search(sentence)
    if m is None or m.group("a") == m.group("b"):
        return None
    return sentence[:m.start()] + f"from {m.group('b')} to {m.group('a')}" + sentence[m.end():]


def comparison_swap(sentence: str, rng: random.Random) -> str | None:
    """"A is larger than B" -> "B is larger than A"."""
    m = _THAN.search(sentence)
    if m is None or m.group("a") == m.group("b"):
        return None
    return sentence[:m.start()] + f"{m.group('b')} {m.group('mid')} {m.group('a')}" + sentence[m.end():]


def changed_number(sentence: str, rng: random.Random) -> str | None:
    return number_change(sentence, rng)


def changed_name(sentence: str, rng: random.Random, names: Sequence[str] = ()) -> str | None:
    """One name of the sentence replaced by another name of the collection (a few drawn, not
    the whole list scanned: collections hold tens of thousands of names)."""
    own = _names(sentence)
    if not own or not names:
        return None
    others = [n for n in (names[rng.randrange(len(names))] for _ in range(8)) if n not in sentence]
    return entity_swap(sentence, rng, others[:1]) if others else None


def swapped_roles(sentence: str, rng: random.Random) -> str | None:
    """Two names exchanged, unless they are only items of one list ("A, B and C" says the same in
    any order)."""
    swapped = role_swap(sentence, rng)
    if swapped is None:
        return None
    names = list(dict.fromkeys(_names(sentence)))
    for a in names:
        for b in names:
            if a != b and re.search(re.escape(a) + r"(?:,| and|, and|/) " + re.escape(b), sentence):
                return None
    return swapped


def added_fact(sentence: str, rng: random.Random, pool: Sequence[str] = ()) -> str | None:
    """The sentence with a clause of another sentence joined to it (a fact the premise lacks)."""
    others = [s for s in pool if s != sentence and 4 <= len(s.split()) <= 20]
    if not others:
        return None
    other = rng.choice(others).rstrip(".!? ")
    return f"{sentence.rstrip('.!? ')}, and {_lower_first(other)}."


EDITS = {"antonym": antonym, "sibling": sibling, "unit": unit, "negation": negate, "stronger": stronger,
         "from_to": from_to, "comparison_swap": comparison_swap, "number": changed_number, "name": changed_name,
         "role_swap": swapped_roles, "added_fact": added_fact}


def rewrite_edit_pairs(passages: Iterable[Sequence[str]], *, seed: int = 0, per_sentence: int = 2,
                       min_words: int = 5, max_words: int = 40) -> list[RewriteEditPair]:
    """Up to ``per_sentence`` (rewrite, edit) pairs of each sentence of ``passages`` (each a list
    of sentences, in order): the kinds drawn among those that apply, the rarer kinds first (a
    sentence with a date gets its date reformatted before a synonym swapped). Half the premises
    are the sentence with its neighbour in the passage, as a judge reads a window of a context;
    where no rewrite applies, the sentence itself is the claim (a premise of two sentences, or
    the sentence alone). Deterministic for a seed; names for swaps and facts to add come from the
    whole collection."""
    rng = random.Random(seed)
    passages = [[s.strip() for s in p if s.strip()] for p in passages]
    sentences = [s for p in passages for s in p]
    names = sorted({n for s in sentences for n in _names(s)})
    seen: set[str] = set()
    out: list[RewriteEditPair] = []
    for passage in passages:
        for index, sentence in enumerate(passage):
            if sentence in seen or not (min_words <= len(sentence.split()) <= max_words) or sentence[-1:] not in ".!?":
                continue
            seen.add(sentence)
            rewrites = {k: f(sentence, rng) for k, f in REWRITES.items()}
            rewrites = {k: v for k, v in rewrites.items() if v and v != sentence}
            edits = {}
            for kind, f in EDITS.items():
                extra = {"name": {"names": names},
                         "added_fact": {"pool": [sentences[rng.randrange(len(sentences))] for _ in range(3)]}}.get(kind, {})
                changed = f(sentence, rng, **extra)
                if changed and changed != sentence:
                    edits[kind] = changed
            if not edits:
                continue
            rewrite_kinds = sorted(rewrites, key=lambda k: (_COMMON.get(k, 0), rng.random()))
            edit_kinds = sorted(edits, key=lambda k: (_COMMON.get(k, 0), rng.random()))
            neighbours = [passage[j] for j in (index - 1, index + 1) if 0 <= j < len(passage)]
            for i in range(min(per_sentence, len(edit_kinds))):
                premise = sentence
                if neighbours and (not rewrite_kinds or rng.random() < 0.5):
                    other = rng.choice(neighbours)
                    premise = f"{other} {sentence}" if passage.index(other) < index else f"{sentence} {other}"
                if rewrite_kinds:
                    rk = rewrite_kinds[i % len(rewrite_kinds)]
                    rewrite = rewrites[rk]
                else:
                    rk, rewrite = "same_sentence", sentence
                out.append(RewriteEditPair(premise, rewrite, rk, edits[edit_kinds[i]], edit_kinds[i]))
    return out


#: How often a kind applies (higher: drawn later), so that the rare kinds are not crowded out.
_COMMON = {"added_fact": 3, "negation": 2, "name": 2, "shorten": 2, "front_phrase": 1, "synonym_swap": 1,
           "role_swap": 1, "number": 1}


_NOT_BE = r"(?!(?:is|are|was|were|has|have|had|be|been)\b)"
_TRAILING = re.compile(r"^(?P<subj>(?:The|A|An|Its|Their|His|Her|Our) (?:" + _NOT_BE + r"[a-z][\w'-]* ){0,2}"
                       + _NOT_BE + r"[a-z][\w'-]*"
                       r"|[A-Z][a-z]+(?: [A-Z][a-z]+)?) (?P<verb>[a-z]{3,}ed|is|are|was|were) "
                       r"(?P<middle>(?:[a-z][\w'-]* ){0,4}?)(?P<prep>in|on|at|during|since) "
                       r"(?P<answer>[^;:()]{2,50}?)(?P<end>[.!])$")
_WHEN = re.compile(r"\b(?:\d{4}|\d+(?::\d\d)? ?(?:am|pm)|" + "|".join(_MONTHS + _DAYS) +
                   r"|morning|evening|afternoon|night|spring|summer|autumn|winter|week|weekend|year|month|day)\b",
                   re.I)


def _lemma(verb: str, known) -> tuple[str, str] | None:
    """("did"/"does"/"do", the verb's base form) of a regular past or third-person form whose
    base form is a known word; None otherwise."""
    if verb.endswith("ed"):
        stem = verb[:-2]
        candidates = [stem[:-1] + "y" if stem.endswith("i") else None, stem[:-1] if len(stem) > 2
                      and stem[-1] == stem[-2] else None, stem + "e", stem]
        aux = "did"
    elif verb.endswith("s") and not verb.endswith("ss"):
        stem = verb[:-1]
        candidates = [verb[:-3] + "y" if verb.endswith("ies") else None, verb[:-2] if verb.endswith("es") else None,
                      stem]
        aux = "does"
    else:
        return None
    for c in candidates:
        if c and len(c) > 1 and known(c):
            return aux, c
    return None


def question_answer_pairs(passages: Iterable[Sequence[str]], known, *, seed: int = 0,
                          max_words: int = 30) -> list[RewriteEditPair]:
    """Sentences read as a question and a short answer, the way a golden set holds them
    ("When is the meeting? On Tuesday."): the premise is the question and the answer phrase,
    the rewrite the sentence itself (or a rewrite of it), the edit the sentence with one word
    changed. ``known(word)`` says whether a word is a base form (for "When did the bridge
    open?"). A sentence is used when it ends in a time or place phrase ("... in May.", "... at
    the station.") after a regular verb or a form of "be"."""
    rng = random.Random(seed)
    out: list[RewriteEditPair] = []
    sentences = [s.strip() for p in passages for s in p]
    names = sorted({n for s in sentences for n in _names(s)})
    for sentence in dict.fromkeys(sentences):
        if len(sentence.split()) > max_words or _REVERSING.search(sentence):
            continue
        m = _TRAILING.match(sentence)
        if m is None or re.search(r"\b(?:to|that|which|who|and|or|but|when|if)\b", m.group("middle")):
            continue
        subj, verb, middle, prep, answer = (m.group("subj"), m.group("verb"), m.group("middle"), m.group("prep"),
                                            m.group("answer"))
        wh = "When" if _WHEN.search(answer) or prep in ("during", "since") else (
            "Where" if prep in ("in", "at", "from", "to") and answer[:1].isupper() or prep == "at" else "What")
        subject = _lower_first(subj)
        if verb in ("is", "are", "was", "were"):
            question = (f"{wh} {verb} {subject} {middle.strip()}".strip() if middle.strip() else f"{wh} {verb} {subject}")
            if wh == "What":
                question += f" {prep}"
        else:
            form = _lemma(verb, known)
            if form is None:
                continue
            question = f"{wh} {form[0]} {subject} {form[1]} {middle.strip()}".strip()
            if wh == "What":
                question += f" {prep}"
        phrase = f"{prep} {answer}" if wh != "What" and rng.random() < 0.5 else answer
        premise = f"{question}? {_capital(phrase)}."
        edits = {}
        for kind, f in EDITS.items():
            if kind == "added_fact":
                continue
            changed = f(sentence, rng, names) if kind == "name" else f(sentence, rng)
            if changed and changed != sentence:
                edits[kind] = changed
        if not edits:
            continue
        kind = sorted(edits, key=lambda k: (_COMMON.get(k, 0), rng.random()))[0]
        rewrites = {k: f(sentence, rng) for k, f in REWRITES.items() if k not in ("shorten",)}
        rewrites = {k: v for k, v in rewrites.items() if v and v != sentence}
        rk = rng.choice(sorted(rewrites)) if rewrites and rng.random() < 0.5 else "same_sentence"
        out.append(RewriteEditPair(premise, rewrites.get(rk, sentence), f"answer_{rk}", edits[kind], f"answer_{kind}"))
    return out
