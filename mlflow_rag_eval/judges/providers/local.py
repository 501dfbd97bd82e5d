"""The embedded local judge: a sentence-embedding model plus lexical checks, no LLM, no key.

What it can judge: whether a sentence is backed by the contexts, as a support probability from
a small learned model over embedding and lexical features (similarity to the best-matching
sentence, content-word coverage, numbers, dates and names the contexts lack, negation and
modality changes; see :mod:`mlflow_rag_eval.judges.local_model.support_model`); whether a passage or a
sentence is on the question's topic; whether an answer abstains (fixed phrases and closeness to
abstention prototypes).

What it cannot judge: logic, most negations and swapped roles that keep every word of the
context ("A beat B" vs "B beat A"), claims that need several sentences combined, or anything
that needs world knowledge. It cannot generate questions or grade against a rubric; metrics
that need those refuse this judge up front. Treat its scores as a fast, offline screen that
ranks rows, and calibrate before gating on them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlflow_rag_eval._util.text import content_tokens, did_you_mean_each, shorten, split_sentences, strip_citations
from mlflow_rag_eval.judges.base import (
    Judge,
    JudgeInfo,
    Outcome,
    RelevanceItem,
    Verdict,
    VerifyItem,
)
from mlflow_rag_eval.judges.batch_independent import encode_batch_independent
from mlflow_rag_eval.judges.local_model.cross_encoder import (
    cross_encoder_sha256,
    default_cross_encoder_path,
    load_cross_encoder,
)
from mlflow_rag_eval.judges.local_model.embedding import Embedder
from mlflow_rag_eval.judges.local_model.support_model import (
    FEATURES,
    Premise,
    entailment_of,
    load_support_model,
    support_features,
)
from mlflow_rag_eval.judges.registry import as_float, register_judge_provider, split_judge_name

__all__ = ["LocalJudge", "LocalJudgeSettings", "parse_local_target"]

#: Version of the local judge's decision rules; bump it when a rule or default changes, so
#: fingerprints (and with them the gate) see the change.
RULES_VERSION = "local-rules-v6"  # v6: the veto only below the cross-encoder's confident cut, support kept above it

#: A sentence about what the speaker or the sources cannot tell, not a fact about the world:
#: "I don't know", "the documents do not say ...", "there is no information on ...", "this cannot
#: be determined". A fact stated in the negative ("the price does not include VAT", "the warranty
#: does not cover water damage") has a subject of its own and is a claim to verify.
_SOURCES = (r"(?:documents?|context|contexts|sources?|passages?|texts?|articles?|records|materials?|"
            r"information|data|excerpts?|results?|knowledge base|provided|available|given|retrieved)")
_ABSTAIN = re.compile(
    r"\b(?:i|we) (?:do not|don't|did not|didn't|cannot|can't|could not|couldn't|am unable to|am not able to|"
    r"are unable to) (?:know|answer|find|say|tell|help|determine|see|confirm|locate)\b"
    r"|\b(?:i|we) (?:do not|don't) have (?:that |this |the |enough |any |sufficient )?(?:information|details|data)\b"
    r"|\bi(?: a|')m not (?:sure|certain|able to)\b"
    rf"|\b{_SOURCES}(?: (?:provided|given|available|retrieved|here|above|below))? (?:do(?:es)?n[o']t|do(?:es)? not|"
    r"did not|didn't|cannot|can't|fail to) (?:say|mention|contain|specify|provide|include|state|tell|cover|give|"
    r"answer|list|indicate|address|discuss|describe|show|explain)\b"
    r"|\bthere (?:is|are|was|were) no (?:relevant |specific |such )?(?:information|details|mention|data|answer)\b"
    r"|\bno (?:relevant )?information (?:is|was) (?:available|provided|given)\b"
    r"|\bnot (?:enough|sufficient) (?:information|context|details)\b"
    r"|\b(?:it|this|that|which) (?:cannot|can't|could not|couldn't) be (?:answered|determined|found|said|known|"
    r"confirmed|told)\b"
    r"|\bunable to (?:answer|determine|find|say|tell|confirm)\b"
    rf"|\bnot (?:available|documented|mentioned|specified|stated|given|found) in (?:the |any |these )?{_SOURCES}\b",
    re.I,
)
_ABSTAIN_PROTOTYPES = (
    "I don't know.",
    "I cannot answer this question from the provided context.",
    "The documents do not contain this information.",
    "There is not enough information to answer.",
)


def _stable(value: float) -> float:
    """Round to 1e-6. A text's embedding moves in the 7th digit with the batch it is encoded
    in (padding changes the kernels' summation order); rounding keeps scores and threshold
    decisions the same whether a row is judged alone (genai scorers) or in a batch."""
    return round(float(value), 6)


@dataclass(frozen=True)
class LocalJudgeSettings:
    """The local judge's thresholds: its saved spec, part of its fingerprint."""

    model: str = "minilm-l6"
    #: the support model's JSON file; empty: the one shipped with the package
    support_model: str = ""
    #: the cross-encoder's weights (``.safetensors``, its JSON beside it); empty: the shipped one
    cross_encoder: str = ""
    #: a claim is supported when its support probability reaches this; None: the model's own
    support_threshold: float | None = None
    #: ... and the cross-encoder's P(entailed) reaches this (the veto); None: the model's own
    #: (``entailment_veto`` in its JSON), 0: no veto
    entailment_threshold: float | None = None
    #: a passage is relevant to a question when their cosine reaches this
    relevance_threshold: float = 0.35
    #: an answer abstains when its cosine to an abstention prototype reaches this
    abstention_threshold: float = 0.75


_F = {name: i for i, name in enumerate(FEATURES)}


def _support_reason(supported: bool, score: float, threshold: float, x: np.ndarray, source: int) -> str:
    """Why: the support probability and the features a person can check."""
    missing = [f"{int(x[_F[f]])} {what}" for f, what in
               (("missing_numbers", "number(s)"), ("missing_names", "name(s)"), ("missing_dates", "date word(s)"))
               if x[_F[f]] > 0]
    return (
        f"{'supported' if supported else 'unsupported'}: support {score:.2f} (threshold {threshold:.2f}; "
        f"cosine {x[_F['cosine_best']]:.2f} to context {source}, {x[_F['coverage']]:.0%} of content words found"
        + (f", not in context: {', '.join(missing)}" if missing else "")
        + (", negation differs" if x[_F["negation_mismatch"]] else "")
        + ")"
    )


def _probability(p: float) -> str:
    """A probability in a reason: two decimals, or two significant digits below 0.1, so a veto
    at 0.0119 and an entailment of 0.004 do not both read 0.01."""
    return f"{p:.2f}" if p >= 0.1 else f"{p:.2g}"


class LocalJudge(Judge):
    """MiniLM-based judge, the default when no judge is named. Name: ``local:minilm-l6``."""

    capabilities = frozenset(
        {"extract_claims", "verify", "extract_and_verify", "rate_relevance", "similarity",
         "is_abstention"}
    )

    def __init__(self, settings: LocalJudgeSettings | None = None, **overrides):
        # Overrides apply on top of the given settings (never silently dropped).
        self.settings = dataclasses.replace(settings, **overrides) if settings else LocalJudgeSettings(**overrides)
        self.embedder = Embedder(self.settings.model)
        self.support_model = load_support_model(self.settings.support_model or None)
        # where the cross-encoder is and its sha256, checked now; its weights load on first use
        self._cross_encoder_file, self._cross_encoder_sha256 = self._cross_encoder_identity()
        self._cross_encoder = None
        self.calls = 0
        self._info: JudgeInfo | None = None

    @property
    def cross_encoder(self):
        """The cross-encoder whose entailment the support model reads or its veto uses (None for
        a model that needs none), loaded on first use (once per process)."""
        if self._cross_encoder_sha256 is None:
            return None
        if self._cross_encoder is None:
            self._cross_encoder = load_cross_encoder(self._cross_encoder_file, self.settings.model)
        return self._cross_encoder

    def _cross_encoder_identity(self) -> tuple[str | None, str | None]:
        """(path, sha256) of the cross-encoder the judge needs, (None, None) when it needs none:
        the one named in the settings, else the one trained beside the model
        (``train-local-judge --train-cross-encoder``), else the shipped one. It must be the one
        the model was trained on: another one's probabilities mean something else."""
        if not self.support_model.features_use_entailment and self.entailment_veto is None:
            return None, None  # entailment_threshold=0 clears the shipped model's veto: nothing to run
        path = self.settings.cross_encoder or None
        beside = self.support_model.training.get("cross_encoder_file")
        if path is None and beside and self.settings.support_model:
            path = str(Path(self.settings.support_model).expanduser().resolve().parent / beside)
        found = Path(path).expanduser() if path else default_cross_encoder_path()
        if not found.is_file() or not found.with_suffix(".json").is_file():
            raise FileNotFoundError(f"no cross-encoder at {found} (with {found.with_suffix('.json').name} beside it)")
        sha = cross_encoder_sha256(found)
        trained_on = self.support_model.training.get("cross_encoder_sha256")
        if trained_on and sha[:16] != trained_on:
            raise ValueError(
                f"the support model was trained on the cross-encoder {trained_on}, not on {found} "
                f"({sha[:16]}); retrain it with train-local-judge or name its cross-encoder")
        return path, sha

    # -- identity -------------------------------------------------------------------------
    def info(self) -> JudgeInfo:
        if self._info is None:
            files_sha = self.embedder.files_sha256
            params = asdict(self.settings)
            # The support model counts by content, not by where its file lies.
            params["support_model_sha256"] = self.support_model.sha256[:16]
            if self._cross_encoder_sha256 is not None:  # its weights and settings, by content
                params["cross_encoder_sha256"] = self._cross_encoder_sha256[:16]
            # What computed the vectors (numpy, or sentence-transformers for other models).
            params["engine"] = self.embedder.engine
            blob = json.dumps(
                {"kind": "local", "rules": RULES_VERSION, "files": files_sha, "engine": params["engine"],
                 "params": {k: v for k, v in params.items() if k not in ("support_model", "cross_encoder")}},
                sort_keys=True,
            )
            short = self.settings.support_model or self.settings.model.split("/")[-1]
            self._info = JudgeInfo(
                name=f"local:{short}",
                kind="local",
                model=self.embedder.path,
                fingerprint=hashlib.sha256(blob.encode()).hexdigest()[:16],
                prompts_version=RULES_VERSION,
                params=params,
                model_files_sha256=files_sha,
            )
        return self._info

    def usage(self) -> dict:
        return {"embedding_batches": self.calls}

    # -- primitives -----------------------------------------------------------------------
    def _statements(self, text: str) -> tuple[list[str], list[str]]:
        """The sentences of ``text`` that state something, and those that say what the speaker
        or the sources cannot tell (questions and sentences without a content word are neither)."""
        claims, abstaining = [], []
        for sentence in split_sentences(strip_citations(text)):
            if sentence.rstrip().endswith("?") or not content_tokens(sentence):
                continue
            (abstaining if _ABSTAIN.search(sentence) else claims).append(sentence)
        return claims, abstaining

    def _abstains(self, answers: Sequence[str]) -> list[Verdict]:
        """Whether each answer as a whole abstains: it is empty, every sentence it states says
        what cannot be told, or it is short and close to an abstention prototype. Decided once
        per answer and used by both claim extraction and ``is_abstention``, so an answer that
        abstains makes no claims and one that states a fact in the negative is verified."""
        parts = [self._statements(a) for a in answers]
        short = [k for k, (claims, _) in enumerate(parts)
                 if claims and len(content_tokens(" ".join(claims))) <= 12]
        vectors = encode_batch_independent(self.embedder, list(_ABSTAIN_PROTOTYPES) + [answers[k] for k in short]) if short else None
        if short:
            self.calls += 1
        n = len(_ABSTAIN_PROTOTYPES)
        closeness = {k: _stable(np.max(vectors[:n] @ vectors[n + j])) for j, k in enumerate(short)}
        out = []
        for k, (answer, (claims, abstaining)) in enumerate(zip(answers, parts)):
            near = closeness.get(k, 0.0)
            if not answer.strip():
                out.append(Verdict(True, "empty answer", score=1.0))
            elif not claims and abstaining:
                phrase = _ABSTAIN.search(abstaining[0]).group(0)
                out.append(Verdict(True, f"says {phrase!r}", evidence=abstaining[0], score=1.0))
            elif not claims:
                out.append(Verdict(True, "states nothing", score=1.0))
            elif near >= self.settings.abstention_threshold:
                out.append(Verdict(True, f"close to an abstention (cosine {near:.2f})", score=near))
            else:
                reason = f"states {len(claims)} claim(s)" + (f", abstention cosine {near:.2f}" if k in closeness else "")
                out.append(Verdict(False, reason, score=near))
        return out

    def extract_claims(self, texts: Sequence[str]) -> list[Outcome[list[str]]]:
        """Claims are the sentences that state something, negative statements included; an
        answer that abstains as a whole has none, and a sentence saying what the sources do not
        tell is not a claim."""
        abstains = self._abstains(texts)
        return [[] if verdict.value else self._statements(text)[0] for text, verdict in zip(texts, abstains)]

    @property
    def entailment_veto(self) -> float | None:
        """The cross-encoder's P(entailed) below which it fails a claim whatever its support; None: no veto."""
        t = self.settings.entailment_threshold
        t = self.support_model.entailment_veto if t is None else t
        return t if t else None

    @property
    def support_threshold(self) -> float:
        """Support probability at which a claim counts as supported."""
        t = self.settings.support_threshold
        return self.support_model.threshold if t is None else t

    def verify(self, items: Sequence[VerifyItem]) -> list[Outcome[list[Verdict]]]:
        """Each claim's support probability from the support model, against the best-matching
        sentence (or pair of adjacent sentences) of the passages."""
        units_per_item = [Premise.units_of(item.passages) for item in items]
        texts = [c for item in items for c in item.claims] + [
            u for units, _ in units_per_item for u, _ in units
        ]
        vectors = encode_batch_independent(self.embedder, texts) if texts else np.zeros((0, 1), np.float32)
        self.calls += 1
        n_claims = sum(len(item.claims) for item in items)
        claim_vecs, unit_vecs = vectors[:n_claims], vectors[n_claims:]
        triples: list[tuple[str, np.ndarray, Premise]] = []  # per claim with a context
        ci = ui = 0
        for item, (units, n_sentences) in zip(items, units_per_item):
            premise = Premise.build(item.passages, units, n_sentences, unit_vecs[ui : ui + len(units)])
            ui += len(units)
            if units:
                triples += [(claim, claim_vecs[ci + k], premise) for k, claim in enumerate(item.claims)]
            ci += len(item.claims)
        computed = support_features(triples, self.cross_encoder if self.support_model.features_use_entailment else None)
        located = [(premise, best, x) for (_, _, premise), (x, best) in zip(triples, computed)]
        support = np.array([_stable(p) for p in self.support_model.predict(np.array([x for x, _ in computed]))]
                           if computed else [])
        threshold = self.support_threshold
        veto = self.entailment_veto
        entailed: list = [None] * len(triples)
        if veto is not None:  # only where it can decide: claims whose support passes
            passing = [k for k, s in enumerate(support) if s >= threshold]
            for k, e in zip(passing, entailment_of([triples[k] for k in passing], self.cross_encoder)):
                entailed[k] = e
        scores = support if veto is None else self.support_model.with_veto(
            support, [np.nan if e is None else e[0] for e in entailed], threshold, veto)
        where = iter(zip(located, support, scores, entailed))
        out: list[Outcome[list[Verdict]]] = []
        for item, (units, _) in zip(items, units_per_item):
            verdicts = []
            for claim in item.claims:
                if not units:
                    verdicts.append(Verdict(False, "no context to support it", score=0.0))
                    continue
                (premise, best, x), alone, score, entail = next(where)
                score = _stable(score)
                supported = score >= threshold
                if entail is not None and entail[0] < veto:  # the veto decided; no close unit entails it
                    evidence, source = premise.units[best]
                    reason = (f"unsupported: not entailed by {shorten(evidence, 80)!r} (entailment "
                              f"{_probability(entail[0])} < {_probability(veto)}), though "
                              + _support_reason(True, alone, threshold, x, source).removeprefix("supported: "))
                else:
                    evidence, source = premise.units[best]
                    reason = _support_reason(supported, score, threshold, x, source)
                    if entail is not None:
                        reason = reason[:-1] + f"; entailment {_probability(entail[0])}, veto below {_probability(veto)})"
                verdicts.append(Verdict(supported, reason, evidence=evidence, score=score, source_index=source))
            out.append(verdicts)
        return out

    def rate_relevance(self, items: Sequence[RelevanceItem]) -> list[Outcome[list[Verdict]]]:
        """Cosine of the question (or the reference, when given and closer) to each passage."""
        threshold = self.settings.relevance_threshold
        queries = [item.question for item in items]
        refs = [item.reference or "" for item in items]
        passages = [p for item in items for p in item.passages]
        vectors = encode_batch_independent(self.embedder, queries + refs + passages) if items else None
        self.calls += 1
        n = len(items)
        out: list[Outcome[list[Verdict]]] = []
        offset = 2 * n
        for i, item in enumerate(items):
            pv = vectors[offset : offset + len(item.passages)]
            offset += len(item.passages)
            cos = pv @ vectors[i] if len(pv) else np.zeros(0)
            if item.reference:
                cos = np.maximum(cos, pv @ vectors[n + i])
            verdicts = []
            for j, c in enumerate(cos):
                c = _stable(max(c, 0.0))
                relevant = c >= threshold
                verdicts.append(
                    Verdict(
                        relevant,
                        f"{'relevant' if relevant else 'not relevant'}: cosine {c:.2f} "
                        f"(threshold {threshold:.2f})",
                        score=c,
                        source_index=j,
                    )
                )
            out.append(verdicts)
        return out

    def similarity(self, pairs: Sequence[tuple[str, str]]) -> list[Outcome[float]]:
        """Cosine similarity, clipped at 0 (MiniLM rarely goes below; negative means unrelated)."""
        if not pairs:
            return []
        vectors = encode_batch_independent(self.embedder, [a for a, _ in pairs] + [b for _, b in pairs])
        self.calls += 1
        n = len(pairs)
        cos = np.einsum("ij,ij->i", vectors[:n], vectors[n:])
        return [_stable(max(c, 0.0)) for c in cos]

    def is_abstention(self, items: Sequence[tuple[str, str]]) -> list[Outcome[Verdict]]:
        """Whether each answer abstains as a whole (see :meth:`_abstains`)."""
        return list(self._abstains([answer for _, answer in items]))


#: The settings a ``local:`` judge name (and ``get_judge``'s keywords) may set: the thresholds.
_THRESHOLDS = tuple(f.name for f in dataclasses.fields(LocalJudgeSettings) if f.name.endswith("_threshold"))


def _local_judge(settings: LocalJudgeSettings, *, name: str, **options: Any) -> LocalJudge:
    """The ``build`` of the ``local`` scheme: ``options`` are thresholds, as in the name (a
    keyword overrides the name's value)."""
    allowed = (*_THRESHOLDS, "cross_encoder")  # cross_encoder: a path, for a model trained on another one
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for judge {name!r}{did_you_mean_each(unknown, allowed)}; "
            f"allowed: {sorted(allowed)} "
            "(LLM settings such as timeout or temperature do not apply to the local judge)"
        )
    return LocalJudge(settings, **options)


@register_judge_provider("local", build=_local_judge)
def parse_local_target(spec: str) -> LocalJudgeSettings:
    """Settings from a judge name: ``local:minilm-l6`` (the default), ``local:<model folder>``,
    ``local:<support model>.json``.

    The target is a packaged model's short name, a sentence-transformers model folder (kept as
    written: ``local:/abs/path`` is absolute), or a support model JSON file written by
    ``mlflow-rag-eval train-local-judge`` (with the packaged embedding model). Options, as a
    query string: the thresholds ``support_threshold`` (default: the support model's own),
    ``relevance_threshold`` and ``abstention_threshold``, e.g.
    ``local:minilm-l6?support_threshold=0.7``.
    """
    model, options = split_judge_name(spec, "local", {k: as_float for k in _THRESHOLDS}, strip_slash=False)
    if model.endswith(".json"):  # a support model trained with train-local-judge
        return LocalJudgeSettings(support_model=model, **options)
    return LocalJudgeSettings(model=model or "minilm-l6", **options)
