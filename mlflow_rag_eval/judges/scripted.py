"""A deterministic chat backend shipped for tests and examples: the judge name ``scripted``.

It goes through the whole LLM-judge path (prompt rendering, cache, retries, parsing, repair,
accounting); only the model is replaced. By default it answers every template with simple
lexical rules, so examples run offline and give plausible numbers:

- a claim is supported when at least 80% of its content words and all its numbers appear in
  one passage (evidence: that passage's best sentence);
- a passage is relevant when it shares at least two content words with the question (or
  reference);
- an answer abstains / is noncommittal when it says it does not know;
- generated questions restate each claim of the answer as "What about: <claim>?".

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

from mlflow_rag_eval.judges.chat import ChatReply, ChatRequest
from mlflow_rag_eval.judges.registry import register_judge_provider, split_judge_name
from mlflow_rag_eval.text import content_tokens, numbers, split_sentences, strip_citations

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
    if template == "grade":
        return {"steps": ["scripted"], "score": (v["low"] + v["high"]) / 2, "reason": "scripted midpoint"}
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
