"""Golden sets written from the user's own passages by a judge, and checked by the same judge.

Three kinds of question, in the proportions of ``mix``:

- ``single``: one passage answers it (that passage is graded 2 in ``relevant_ids``);
- ``multi``: it needs two related passages (each graded 2) — a passage and its nearest
  neighbour by embedding, skipping near-duplicates of it;
- ``unanswerable``: close to a passage's topic (the generator sees the passage and its two
  nearest neighbours) but not answered by the corpus; the pipeline should abstain.

Every candidate then passes the same checks, in this order, and every one it fails is a named
drop in the report (nothing is dropped silently):

1. ``judge_failure``: the judge gave no usable reply (a named :class:`JudgeFailure`);
2. ``empty``: no question (or no reference for an answerable one);
3. ``near_duplicate``: cosine of its question to a question kept before it >= ``dedupe_threshold``
   (MiniLM embeddings, the judge's own embedder where it has one);
4. ``reference_unsupported``: an answerable question is kept only if the judge finds every
   claim of its reference supported by its source passages;
5. ``answerable_from_corpus``: an unanswerable question is kept only if the judge finds no
   answer in the ``unanswerable_check_k`` passages of the whole corpus nearest to it.

Kept answerable questions get *supporting* passages (graded 1): among the ``supporting_k``
nearest other passages, those the judge rates relevant given the question and reference.

Difficulty is measured, not asked for: ``hard`` for two-passage questions; for one-passage
questions ``easy`` when at least 60% of the question's content words are in its passage (a
lexical match finds it), else ``medium``; for unanswerable ones ``hard`` when the nearest
passage's cosine is at least 0.5 (a retriever will find something close), else ``medium``.
Tags: the passage's ``metadata.tags`` / ``metadata.topic`` and the judge's topic, lower-cased.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mlflow_rag_eval._util.text import content_tokens
from mlflow_rag_eval.golden.prompts import GOLDEN_PROMPTS, GOLDEN_PROMPTS_VERSION, variant_clause
from mlflow_rag_eval.judges.base import ClaimsItem, Judge, JudgeCapabilityError, JudgeFailure, RelevanceItem
from mlflow_rag_eval.judges.prompts import data_block
from mlflow_rag_eval.records import dataset_digest, records_from_frame

__all__ = [
    "DropReason", "GoldenRow", "GoldenSet", "GoldenSetReport", "Passage", "QUESTION_TYPES",
    "generate_golden_set", "load_passages",
]

QUESTION_TYPES = ("single", "multi", "unanswerable")
#: why a candidate was dropped, in the order the checks run
DropReason = str
DROP_REASONS = ("judge_failure", "empty", "near_duplicate", "reference_unsupported", "answerable_from_corpus")

_EASY_OVERLAP = 0.6
_HARD_UNANSWERABLE_COSINE = 0.5


@dataclass(frozen=True)
class Passage:
    """One passage of the user's corpus."""

    id: str
    text: str
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def shown(self) -> str:
        """What the generator reads: the title (where there is one) and the text."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    def tags(self) -> list[str]:
        tags = self.metadata.get("tags") or []
        tags = [tags] if isinstance(tags, str) else list(tags)
        if self.metadata.get("topic"):
            tags.append(self.metadata["topic"])
        return [str(t).strip().lower() for t in tags if str(t).strip()]


def load_passages(path: str | Path) -> list[Passage]:
    """Passages from JSONL: ``id`` and ``text`` required, ``title`` and ``metadata`` optional.

    Raises ValueError naming the line of a row without an id or text, or a repeated id:
    relevance is graded by id, so ids must be unique.
    """
    passages, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            pid, text = row.get("id"), row.get("text")
            if pid is None or not isinstance(text, str) or not text.strip():
                raise ValueError(f"{path}, line {n}: a passage needs an 'id' and a non-empty 'text'")
            if str(pid) in seen:
                raise ValueError(f"{path}, line {n}: passage id {pid!r} is repeated")
            seen.add(str(pid))
            passages.append(Passage(str(pid), text, str(row.get("title") or ""), dict(row.get("metadata") or {})))
    if not passages:
        raise ValueError(f"{path}: no passages")
    return passages


class _Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Provenance(_Forbid):
    passages: list[str] = Field(description="ids of the passages the generator was shown")
    template: str = Field(description="the template that wrote the question, id@version")
    prompts_version: str = Field(description="version of every golden-set template")
    generator: str = Field(description="the judge that wrote and checked it")
    generator_fingerprint: str
    seed: int


class GoldenMetadata(_Forbid):
    question_type: str = Field(description="single, multi or unanswerable")
    difficulty: str = Field(description="easy, medium or hard (see mlflow_rag_eval.golden.generate)")
    tags: list[str] = Field(default_factory=list)
    provenance: Provenance


class GoldenRow(_Forbid):
    """One row of a generated golden set, as written to JSONL (the columns evaluation reads)."""

    question: str
    reference: str
    relevant_ids: dict[str, int] = Field(description="source passages 2, supporting passages 1")
    answerable: bool
    metadata: GoldenMetadata


@dataclass(frozen=True)
class Drop:
    """A candidate that did not make it, and why."""

    question_type: str
    reason: DropReason
    question: str
    passages: tuple[str, ...]
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"question_type": self.question_type, "reason": self.reason, "question": self.question,
                "passages": list(self.passages), "detail": self.detail}


@dataclass(frozen=True)
class GoldenSetReport:
    """What was asked for, made, kept and dropped (with why)."""

    requested: dict[str, int]
    generated: dict[str, int]
    kept: dict[str, int]
    drops: tuple[Drop, ...]
    #: candidates that passed every check but were not needed (their kind's quota was met);
    #: per kind, generated = kept + dropped + unused
    unused: dict[str, int] = field(default_factory=dict)
    judge_calls: int | None = None

    def drop_counts(self) -> dict[str, dict[str, int]]:
        """``{reason: {question_type: count}}`` for every reason that dropped something."""
        out: dict[str, dict[str, int]] = {}
        for d in self.drops:
            out.setdefault(d.reason, Counter())[d.question_type] += 1
        return {r: dict(c) for r, c in out.items()}

    def to_text(self) -> str:
        lines = [f"{'question type':<14}{'requested':>10}{'generated':>10}{'kept':>7}{'dropped':>9}{'unused':>8}"]
        for kind in QUESTION_TYPES:
            dropped = sum(d.question_type == kind for d in self.drops)
            lines.append(f"{kind:<14}{self.requested[kind]:>10}{self.generated[kind]:>10}"
                         f"{self.kept[kind]:>7}{dropped:>9}{self.unused.get(kind, 0):>8}")
        counts = self.drop_counts()
        if counts:
            lines.append("dropped:")
            for reason in DROP_REASONS:
                if reason in counts:
                    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(counts[reason].items()))
                    example = next(d for d in self.drops if d.reason == reason)
                    lines.append(f"  {reason:<24}{sum(counts[reason].values()):>4}  ({by_kind})  "
                                 f"e.g. {example.question[:70]!r}{': ' + example.detail[:80] if example.detail else ''}")
        else:
            lines.append("dropped: none")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "generated": self.generated, "kept": self.kept,
                "unused": self.unused, "drop_counts": self.drop_counts(), "drops": [d.as_dict() for d in self.drops],
                "judge_calls": self.judge_calls}


@dataclass(frozen=True)
class GoldenSet:
    """A generated golden set: its rows, the report of how it was made, and its digest.

    ``digest`` is :func:`mlflow_rag_eval.records.dataset_digest` of the rows: the digest every
    evaluation on this set logs as ``rag_eval.dataset_digest``, which ``compare`` and the gate
    pair runs on.
    """

    rows: tuple[GoldenRow, ...]
    report: GoldenSetReport
    generator: dict[str, Any]

    @property
    def digest(self) -> str:
        # Through the same reader an evaluation uses, so the digests agree by construction.
        frame = self.to_frame().assign(contexts=[[] for _ in self.rows])
        return dataset_digest(records_from_frame(frame, require_answer=False))

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.model_dump() for r in self.rows]

    def to_records(self) -> list[dict[str, Any]]:
        """The rows as the evaluation data, ``relevant_ids`` as ``[{"id", "grade"}]`` lists: the
        form MLflow infers a schema for in linear time (not ``{id: grade}`` dicts, whose every
        id becomes a schema field; see :class:`~mlflow_rag_eval.records.ColumnMapping`)."""
        return [{**r, "relevant_ids": [{"id": k, "grade": g} for k, g in r["relevant_ids"].items()]}
                for r in self.to_dicts()]

    def to_frame(self):
        """:meth:`to_records` as a DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.to_records(), columns=list(GoldenRow.model_fields))

    def to_jsonl(self, path: str | Path) -> Path:
        """:meth:`to_records`, one JSON line each (what ``testset --out`` writes)."""
        path = Path(path)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.to_records()),
                        encoding="utf-8")
        return path


@dataclass
class _Candidate:
    kind: str
    sources: tuple[int, ...]  # passage indices with grade 2 (single, multi) or shown (unanswerable)
    template: str
    question: str = ""
    reference: str = ""
    topic: str = ""
    failure: JudgeFailure | None = None


def _quotas(n: int, mix: Sequence[float]) -> dict[str, int]:
    if len(mix) != 3 or any(m < 0 for m in mix) or not sum(mix):
        raise ValueError(f"mix must be three non-negative shares (single, multi, unanswerable), got {mix!r}")
    shares = [m / sum(mix) for m in mix]
    counts = [math.floor(n * s) for s in shares]
    for i in sorted(range(3), key=lambda i: -(n * shares[i] - counts[i]))[: n - sum(counts)]:
        counts[i] += 1
    return dict(zip(QUESTION_TYPES, counts))


def _embedder(judge: Judge, embedder):
    if embedder is not None:
        return embedder
    own = getattr(judge, "embedder", None)
    if own is not None:
        return own
    from mlflow_rag_eval.judges.local_model.embedding import Embedder

    return Embedder()


def _passages_block(passages: Sequence[Passage]) -> str:
    return "\n".join(data_block("passage", p.shown, index=i) for i, p in enumerate(passages))


def generate_golden_set(
    passages: Sequence[Passage | Mapping[str, Any]],
    judge: Judge | str,
    *,
    n: int = 100,
    mix: Sequence[float] = (0.5, 0.25, 0.25),
    seed: int = 0,
    oversample: float = 1.25,
    dedupe_threshold: float = 0.9,
    supporting_k: int = 3,
    unanswerable_check_k: int = 5,
    embedder=None,
) -> GoldenSet:
    """Write a golden set of about ``n`` questions from ``passages`` with ``judge``.

    ``oversample`` candidates are written per wanted question, so drops can be made up; each
    kind keeps at most its quota. Fewer than ``n`` rows come back when too many candidates
    were dropped: the report says which and why. Raises JudgeCapabilityError when the judge
    cannot write text (the embedded ``local`` judge: use an LLM judge, or ``scripted`` offline).
    """
    judge = _resolve_judge(judge)
    corpus = _as_corpus(passages)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    quotas = _quotas(n, mix)
    rng = random.Random(seed)
    enc = _embedder(judge, embedder)
    vectors = enc.encode([p.shown for p in corpus])
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -1.0)

    candidates = _plan(corpus, sims, quotas, oversample, dedupe_threshold, rng)
    _write(judge, corpus, candidates)
    info = judge.info()
    drops: list[Drop] = []

    def drop(c: _Candidate, reason: str, detail: str = "") -> None:
        drops.append(Drop(c.kind, reason, c.question, tuple(corpus[i].id for i in c.sources), detail))

    alive = _screen(candidates, drop)
    alive = _dedupe(alive, enc, dedupe_threshold, drop)
    alive = _check(judge, corpus, vectors, enc, alive, unanswerable_check_k, drop)

    chosen, per_kind = _choose(alive, quotas)
    kept = _rows(judge, corpus, vectors, enc, chosen, supporting_k, info, seed)
    report = GoldenSetReport(
        requested=quotas,
        generated={k: sum(c.kind == k for c in candidates) for k in QUESTION_TYPES},
        kept={k: sum(r.metadata.question_type == k for r in kept) for k in QUESTION_TYPES},
        drops=tuple(drops),
        unused={k: sum(c.kind == k for c in alive) - per_kind[k] for k in QUESTION_TYPES},
        judge_calls=getattr(judge, "calls", None),
    )
    generator = {"judge": info.name, "fingerprint": info.fingerprint, "prompts_version": GOLDEN_PROMPTS_VERSION,
                 "seed": seed, "n": n, "mix": list(mix), "oversample": oversample,
                 "dedupe_threshold": dedupe_threshold, "n_passages": len(corpus)}
    return GoldenSet(tuple(kept), report, generator)


def _resolve_judge(judge: Judge | str) -> Judge:
    """The judge by name or as given, refused unless it can write questions and check them."""
    from mlflow_rag_eval.judges import get_judge

    judge = get_judge(judge) if isinstance(judge, str) else judge
    if not judge.supports("fill"):
        raise JudgeCapabilityError(
            f"judge {judge.info().name!r} cannot write questions: a golden set needs an LLM judge "
            "(e.g. 'openai:/gpt-4o-mini', 'llamacpp:/path/model.gguf'), or 'scripted' (rules, offline)")
    judge.require("extract_and_verify", "rate_relevance", metric="golden set generation")
    return judge


def _as_corpus(passages: Sequence[Passage | Mapping[str, Any]]) -> list[Passage]:
    """The passages as :class:`Passage` objects, refused when an id repeats."""
    corpus = [p if isinstance(p, Passage) else Passage(str(p["id"]), p["text"], str(p.get("title") or ""),
                                                           dict(p.get("metadata") or {})) for p in passages]
    if len({p.id for p in corpus}) != len(corpus):
        raise ValueError("passage ids must be unique: relevance is graded by id")
    return corpus


def _screen(candidates: list[_Candidate], drop) -> list[_Candidate]:
    """The candidates the judge wrote in full; the others dropped as judge failures or empty."""
    alive = []
    for c in candidates:
        if c.failure is not None:
            drop(c, "judge_failure", str(c.failure))
        elif not c.question.strip() or (c.kind != "unanswerable" and not c.reference.strip()):
            drop(c, "empty", "no question" if not c.question.strip() else "no reference answer")
        else:
            alive.append(c)
    return alive


def _choose(alive: list[_Candidate], quotas: dict[str, int]) -> tuple[list[_Candidate], Counter]:
    """Each kind's earliest survivors, up to its quota, and how many of each kind were chosen."""
    chosen, per_kind = [], Counter()
    for c in alive:
        if per_kind[c.kind] < quotas[c.kind]:
            per_kind[c.kind] += 1
            chosen.append(c)
    return chosen, per_kind


def _rows(judge: Judge, corpus, vectors, enc, chosen: list[_Candidate], supporting_k: int, info,
          seed: int) -> list[GoldenRow]:
    """The chosen candidates as golden rows: relevance graded, difficulty measured, provenance kept."""
    kept: list[GoldenRow] = []
    supporting = _supporting(judge, corpus, vectors, enc, [c for c in chosen if c.kind != "unanswerable"],
                             supporting_k)
    question_vectors = enc.encode([c.question for c in chosen]) if chosen else None
    for i, c in enumerate(chosen):
        relevant = {corpus[j].id: 2 for j in c.sources} if c.kind != "unanswerable" else {}
        for pid in supporting.get(id(c), []):
            relevant.setdefault(pid, 1)
        tags = [t for j in c.sources for t in corpus[j].tags()] + ([c.topic.strip().lower()] if c.topic.strip() else [])
        kept.append(GoldenRow(
            question=c.question.strip(),
            reference=c.reference.strip() if c.kind != "unanswerable" else "The documents do not say.",
            relevant_ids=relevant,
            answerable=c.kind != "unanswerable",
            metadata=GoldenMetadata(
                question_type=c.kind,
                difficulty=_difficulty(c, corpus, vectors, question_vectors[i]),
                tags=list(dict.fromkeys(tags)),
                provenance=Provenance(passages=[corpus[j].id for j in c.sources], template=GOLDEN_PROMPTS[c.template].ref,
                                      prompts_version=GOLDEN_PROMPTS_VERSION, generator=info.name,
                                      generator_fingerprint=info.fingerprint, seed=seed),
            ),
        ))
    return kept


def _plan(corpus, sims, quotas, oversample, dedupe_threshold, rng) -> list[_Candidate]:
    """Which passages each candidate is written from; candidates of the three kinds interleaved,
    so a kind's quota is met from its earliest survivors whatever the others' drops."""
    order = list(range(len(corpus)))
    rng.shuffle(order)

    def cycle(k: int):
        return [order[i % len(order)] for i in range(k)]

    want = {k: math.ceil(q * oversample) for k, q in quotas.items()}
    plans: dict[str, list[_Candidate]] = {k: [] for k in QUESTION_TYPES}
    for i in cycle(want["single"]):
        plans["single"].append(_Candidate("single", (i,), "golden_single"))
    pairs_seen: set[tuple[int, int]] = set()
    for i in cycle(want["multi"] * 2):
        if len(plans["multi"]) == want["multi"]:
            break
        # the nearest passage that is related but not a near-copy of this one
        for j in np.argsort(-sims[i]):
            pair = (min(i, int(j)), max(i, int(j)))
            if sims[i, j] < dedupe_threshold and pair not in pairs_seen:
                pairs_seen.add(pair)
                plans["multi"].append(_Candidate("multi", (i, int(j)), "golden_multi"))
                break
    for i in cycle(want["unanswerable"]):
        neighbours = [int(j) for j in np.argsort(-sims[i])[:2]] if len(corpus) > 1 else []
        plans["unanswerable"].append(_Candidate("unanswerable", (i, *neighbours), "golden_unanswerable"))
    out = []
    for step in range(max(map(len, plans.values()), default=0)):
        out += [plans[k][step] for k in QUESTION_TYPES if step < len(plans[k])]
    return out


def _write(judge: Judge, corpus: Sequence[Passage], candidates: list[_Candidate]) -> None:
    """Ask the judge for every candidate's question (and reference), per template in one batch."""
    for template in ("golden_single", "golden_multi", "golden_unanswerable"):
        todo = [c for c in candidates if c.template == template]
        if not todo:
            continue
        seen: Counter = Counter()
        items = []
        for ordinal, c in enumerate(todo):
            shown = [corpus[i] for i in c.sources]
            # the how-many-th candidate from these passages asks about something else
            variant = seen[c.sources]
            seen[c.sources] += 1
            items.append(({"passages": _passages_block(shown), "variant": variant_clause(variant)},
                          {"passages": [p.text for p in shown], "titles": [p.title for p in shown],
                           "variant": variant, "ordinal": ordinal}))
        for c, reply in zip(todo, judge.fill(GOLDEN_PROMPTS[template], items)):
            if isinstance(reply, JudgeFailure):
                c.failure = reply
                continue
            c.question, c.topic = reply.question, reply.topic
            c.reference = getattr(reply, "reference", "")


def _dedupe(alive: list[_Candidate], enc, threshold: float, drop) -> list[_Candidate]:
    if not alive:
        return alive
    vectors = enc.encode([c.question.strip() for c in alive])
    kept: list[int] = []
    for i, c in enumerate(alive):
        if kept:
            sims = vectors[kept] @ vectors[i]
            j = int(np.argmax(sims))
            if sims[j] >= threshold:
                drop(c, "near_duplicate", f"cosine {float(sims[j]):.2f} to {alive[kept[j]].question[:60]!r}")
                continue
        kept.append(i)
    return [alive[i] for i in kept]


def _nearest(vectors: np.ndarray, query: np.ndarray, k: int, exclude: Sequence[int] = ()) -> list[int]:
    scores = vectors @ query
    return [int(j) for j in np.argsort(-scores) if int(j) not in set(exclude)][:k]


def _check(judge: Judge, corpus, vectors, enc, alive: list[_Candidate], check_k: int, drop) -> list[_Candidate]:
    """The judge's checks: references supported by their sources; unanswerable ones unanswered."""
    answerable = [c for c in alive if c.kind != "unanswerable"]
    unanswerable = [c for c in alive if c.kind == "unanswerable"]
    failed: set[int] = set()
    verdicts = judge.extract_and_verify(
        [ClaimsItem(c.reference, [corpus[i].text for i in c.sources]) for c in answerable])
    for c, outcome in zip(answerable, verdicts):
        if isinstance(outcome, JudgeFailure):
            drop(c, "judge_failure", f"checking the reference: {outcome}")
        elif not outcome:
            drop(c, "reference_unsupported", "the judge found no claim in the reference")
        elif not all(v.value for _, v in outcome):
            claim = next(cl for cl, v in outcome if not v.value)
            drop(c, "reference_unsupported", f"unsupported: {claim[:100]!r}")
        else:
            continue
        failed.add(id(c))
    if unanswerable:
        qv = enc.encode([c.question for c in unanswerable])
        items = []
        for c, v in zip(unanswerable, qv):
            near = [corpus[j] for j in _nearest(vectors, v, check_k)]
            items.append(({"question": data_block("question", c.question), "passages": _passages_block(near)},
                          {"question": c.question, "passages": [p.text for p in near]}))
        for c, reply in zip(unanswerable, judge.fill(GOLDEN_PROMPTS["golden_answerable"], items)):
            if isinstance(reply, JudgeFailure):
                drop(c, "judge_failure", f"checking answerability: {reply}")
            elif reply.answerable:
                drop(c, "answerable_from_corpus", reply.reason)
            else:
                continue
            failed.add(id(c))
    return [c for c in alive if id(c) not in failed]


def _supporting(judge: Judge, corpus, vectors, enc, answerable: list[_Candidate], k: int) -> dict[int, list[str]]:
    """Per candidate, ids of other passages the judge rates relevant (graded 1). A judge failure
    here costs the row its supporting grades, never the row: its sources stay graded 2."""
    if not answerable or k < 1:
        return {}
    qv = enc.encode([f"{c.question} {c.reference}" for c in answerable])
    shown = [[corpus[j] for j in _nearest(vectors, v, k, exclude=c.sources)] for c, v in zip(answerable, qv)]
    outcomes = judge.rate_relevance([RelevanceItem(c.question, [p.text for p in ps], c.reference)
                                     for c, ps in zip(answerable, shown)])
    out = {}
    for c, ps, outcome in zip(answerable, shown, outcomes):
        if not isinstance(outcome, JudgeFailure):
            out[id(c)] = [p.id for p, v in zip(ps, outcome) if v.value]
    return out


def _difficulty(c: _Candidate, corpus, vectors, question_vector) -> str:
    if c.kind == "multi":
        return "hard"
    if c.kind == "unanswerable":
        return "hard" if float(np.max(vectors @ question_vector)) >= _HARD_UNANSWERABLE_COSINE else "medium"
    words = content_tokens(c.question.replace("___", " "))
    source = set(content_tokens(corpus[c.sources[0]].text))
    overlap = sum(w in source for w in words) / len(words) if words else 0.0
    return "easy" if overlap >= _EASY_OVERLAP else "medium"
