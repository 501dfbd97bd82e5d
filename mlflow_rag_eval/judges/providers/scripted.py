"""A deterministic chat backend shipped for tests and examples: the judge name ``scripted``.

It goes through the whole LLM-judge path (prompt rendering, cache, retries, parsing, repair,
accounting); only the model is replaced. By default it answers every template with simple
lexical rules, so examples run offline and give plausible numbers:

- a claim is supported when at least 80% of its content words and all its numbers appear in
  one passage (evidence: that passage's best sentence);
- a passage is relevant when it shares at least two content words with the question (or
  reference);
- an answer abstains / is noncommittal when it says it does not know;
- generated questions restate each claim of the answer as "What about: <claim>?";
- golden-set templates (:mod:`mlflow_rag_eval.golden`): a question is a passage's most
  informative sentence (the next one for a later variant, the second one per passage for a
  two-passage question) with its key span (a number, else a name, else its last content word)
  blanked out, and the reference is that sentence (two of them for a two-passage question);
  an unanswerable question asks for an aspect from a fixed list, in turn, about the passages'
  topic; a question is answerable when a passage holds at least 60% of its content words.

A *script* overrides any template: ``{template_id: reply}`` where a reply is a string (sent
as the raw reply text), a dict (sent as JSON), a ``ChatReply``, an exception instance (raised:
``TransientError``/``PermanentError`` to simulate faults), a callable ``f(variables) -> reply``,
or a list of those consumed one per call (for "malformed first, valid on retry").
Instructions inside the judged text have no effect on these rules, by construction.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from typing import Any

from mlflow_rag_eval._util.text import content_tokens, numbers, split_sentences, strip_citations
from mlflow_rag_eval.judges.llm.chat import ChatReply, ChatRequest
from mlflow_rag_eval.judges.registry import register_judge_provider, split_judge_name

__all__ = ["ScriptedBackend", "parse_scripted_target"]

_ABSTAIN = re.compile(r"\b(i don't know|i do not know|cannot answer|can't answer|not (?:say|mention|contain)|no information)\b", re.I)


def _support(claim: str, passages: list[str]) -> tuple[bool, int | None, str | None]:
    tokens = content_tokens(claim)
    best, best_cov = None, -1.0
    for i, passage in enumerate(passages):
        ptoks = set(content_tokens(passage))
        cov = sum(t in ptoks for t in tokens) / len(tokens) if tokens else 0.0
        if cov > best_cov:
            best, best_cov = i, cov
    if best is None:
        return False, None, None
    ok = best_cov >= 0.8 and numbers(claim) <= numbers(passages[best])
    sentences = split_sentences(passages[best]) or [passages[best]]
    claim_tokens = set(tokens)
    evidence = max(sentences, key=lambda s: len(claim_tokens & set(content_tokens(s))))
    return ok, best, evidence


def _claims(text: str) -> list[str]:
    return [s for s in split_sentences(strip_citations(text)) if not s.endswith("?") and not _ABSTAIN.search(s)]


def _default(template: str, v: Mapping[str, Any]) -> dict[str, Any]:
    if template == "claims_verdicts":
        out = []
        for claim in _claims(v["text"]):
            ok, index, evidence = _support(claim, v["passages"])
            out.append({"claim": claim, "supported": ok, "passage": index, "evidence": evidence,
                        "reason": "words found in a passage" if ok else "not found in the passages"})
        return {"claims": out}
    if template == "extract_claims":
        return {"claims": _claims(v["text"])}
    if template == "verify":
        verdicts = []
        for i, claim in enumerate(v["claims"]):
            ok, _, _ = _support(claim, v["passages"])
            verdicts.append({"index": i, "verdict": ok, "reason": "found" if ok else "not found"})
        return {"verdicts": verdicts}
    if template == "rate_relevance":
        query = set(content_tokens(v["question"] + " " + (v.get("reference") or "")))
        verdicts = []
        for i, passage in enumerate(v["passages"]):
            shared = len(query & set(content_tokens(passage)))
            verdicts.append({"index": i, "verdict": shared >= 2, "reason": f"{shared} shared words"})
        return {"verdicts": verdicts}
    if template == "generate_questions":
        claims = _claims(v["answer"])
        questions = [f"What about: {c.rstrip('.')}?" for c in claims][: v["n"]]
        return {"questions": questions, "noncommittal": not claims}
    if template == "is_abstention":
        hit = _ABSTAIN.search(v["answer"]) or not v["answer"].strip()
        return {"abstains": bool(hit), "reason": "says it does not know" if hit else "answers"}
    if template.startswith("golden_"):
        return _golden(template, v)
    if template == "grade":
        return {"steps": ["scripted"], "score": (v["low"] + v["high"]) / 2, "reason": "scripted midpoint"}
    raise KeyError(f"the scripted backend has no rule for template {template!r}")


# Aspects an unanswerable question asks about: generic, so most corpora do not cover them; the
# answerability check drops the ones a corpus does (as it would an LLM's mistaken question).
_ASPECTS = (
    "the carbon footprint", "the policy on pets", "the annual maintenance budget",
    "the rules for drones", "the name of the founding engineer", "the wifi password",
    "the parking charges", "the rules for cryptocurrency payments",
)
_NAME = re.compile(r"(?<!^)(?<![.!?] )\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")


def _key_sentence(text: str, pick: int = 0) -> str | None:
    """A passage's ``pick``-th most informative sentence (most content words; numbers first)."""
    sentences = [s for s in split_sentences(text) if len(content_tokens(s)) >= 4]
    ranked = sorted(sentences, key=lambda s: (not numbers(s), -len(content_tokens(s))))
    return ranked[pick % len(ranked)] if ranked else None


def _blank(sentence: str) -> str:
    """The sentence with its key span replaced by ``___``."""
    number = re.search(r"(?:[€$£]\s?)?(?<![\w.])\d+(?:[.,:]\d+)*(?:\s?%)?", sentence)
    name = _NAME.search(sentence)
    if number:
        span = number.span()
    elif name:
        span = name.span()
    else:
        words = list(re.finditer(r"[A-Za-z]{4,}", sentence))
        span = words[-1].span() if words else (len(sentence), len(sentence))
    return (sentence[: span[0]] + "___" + sentence[span[1]:]).rstrip(".")


def _topic(title: str, text: str) -> str:
    head = (title or "").split(":")[0].strip().lower()
    return head or " ".join(content_tokens(text)[:2])


def _golden(template: str, v: Mapping[str, Any]) -> dict[str, Any]:
    passages, titles = v.get("passages", []), v.get("titles") or [""] * len(v.get("passages", []))
    variant = int(v.get("variant", 0))
    if template == "golden_single":
        sentence = _key_sentence(passages[0], variant)
        if sentence is None:
            return {"question": "", "reference": "", "topic": ""}
        return {"question": f'What completes "{_blank(sentence)}"?', "reference": sentence,
                "topic": _topic(titles[0], passages[0])}
    if template == "golden_multi":
        # the second-best sentences: the best ones are what one-passage questions ask about
        first, second = (_key_sentence(p, variant + 1) for p in passages[:2])
        if first is None or second is None:
            return {"question": "", "reference": "", "topic": ""}
        return {"question": f'What completes "{_blank(first)}", and "{_blank(second)}"?',
                "reference": f"{first} {second}", "topic": _topic(titles[0], passages[0])}
    if template == "golden_unanswerable":
        topic = _topic(titles[0], passages[0])
        aspect = _ASPECTS[(int(v.get("ordinal", 0)) + variant) % len(_ASPECTS)]
        return {"question": f"What is {aspect} for {topic}?", "topic": topic}
    if template == "golden_answerable":
        words = content_tokens(v["question"].replace("___", " "))
        best = max((sum(w in set(content_tokens(p)) for w in words) / len(words) for p in passages),
                   default=0.0) if words else 0.0
        return {"answerable": best >= 0.6, "reason": f"{best:.0%} of the question's words in one passage"}
    raise KeyError(f"the scripted backend has no rule for template {template!r}")


class ScriptedBackend:
    """Answers from a script (or the default lexical rules); records every request."""

    provider = "scripted"
    base_url = None
    supports_schema = True
    default_concurrency = 8

    def __init__(self, script: Mapping[str, Any] | None = None, *, model: str = "scripted-rules-v1"):
        self.model = model
        self.script = {k: (list(v) if isinstance(v, list) else v) for k, v in (script or {}).items()}
        self.requests: list[ChatRequest] = []
        self._lock = threading.Lock()

    def identity(self) -> dict[str, Any]:
        # A custom script changes the answers: make it part of the identity (and cache key).
        scripted = sorted(self.script) if self.script else []
        return {"provider": self.provider, "model": self.model, "scripted_templates": scripted,
                "script_id": id(self.script) if self.script else None}

    def complete(self, request: ChatRequest) -> ChatReply:
        with self._lock:
            self.requests.append(request)
            entry = self.script.get(request.template_id, _default)
            if isinstance(entry, list):
                if not entry:
                    raise AssertionError(f"script for {request.template_id!r} ran out of replies")
                entry = entry.pop(0)
        if entry is _default:
            entry = _default(request.template_id, request.variables)
        elif callable(entry) and not isinstance(entry, BaseException):
            entry = entry(request.variables)
        if isinstance(entry, BaseException):
            raise entry
        if isinstance(entry, ChatReply):
            return entry
        text = entry if isinstance(entry, str) else json.dumps(entry)
        prompt_tokens = sum(len(m["content"]) for m in request.messages) // 4
        return ChatReply(text=text, model=self.model, tokens_in=prompt_tokens, tokens_out=len(text) // 4)


@register_judge_provider("scripted")
def parse_scripted_target(spec: str) -> ScriptedBackend:
    """The backend of the judge name ``scripted``: the default rules, no target, no options.

    A custom script is passed in code: ``LLMJudge(ScriptedBackend(script))``.
    """
    target, _ = split_judge_name(spec, "scripted", {})
    if target:
        raise ValueError(f"the scripted judge takes no model: use 'scripted', got {spec.partition('?')[0]!r}")
    return ScriptedBackend()
