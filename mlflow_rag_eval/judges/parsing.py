"""Turn an LLM's reply text into a validated pydantic object, repairing what is safe to repair.

Repairs, in order: a fenced code block is unwrapped; the first balanced JSON object is cut out of
surrounding prose; trailing commas are dropped. Anything still invalid is a
:class:`ReplyParseError` carrying the validation message, which the judge shows to the model in
its one retry. Nothing here ever returns a default or a NaN in place of a reply.
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ValidationError

__all__ = ["ReplyParseError", "extract_json", "inline_refs", "parse_reply"]

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


class ReplyParseError(ValueError):
    """The reply is not valid JSON for the schema, even after repair.

    ``reason`` says what is wrong without quoting the reply: it is what the corrective retry
    shows the model, so text the model echoed from the data (an injected instruction, say)
    never comes back to it outside the data tags. ``str()`` adds a snippet, for the row's error.
    """

    def __init__(self, reason: str, snippet: str | None = None):
        self.reason = reason
        super().__init__(reason if snippet is None else f"{reason}: {snippet!r}")


def _first_object(text: str) -> str | None:
    """The first balanced ``{...}`` in text, respecting strings and escapes."""
    start = text.find("{")
    while start != -1:
        depth, in_string, escaped = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start : i + 1]
        start = text.find("{", start + 1)
    return None


def extract_json(text: str) -> object:
    """The JSON value in ``text`` after the safe repairs; raises ReplyParseError."""
    candidates = [text.strip()]
    fenced = _FENCE.search(text)
    if fenced:
        candidates.append(fenced.group(1).strip())
    obj = _first_object(text)
    if obj is not None:
        candidates.append(obj)
    for candidate in candidates:
        for attempt in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
            try:
                return json.loads(attempt)
            except (json.JSONDecodeError, ValueError):
                continue
    raise ReplyParseError("no valid JSON object in the reply", text.strip().replace("\n", " ")[:120])


def parse_reply(text: str, schema: type[BaseModel]) -> BaseModel:
    """Validate ``text`` against ``schema``; raises ReplyParseError with the reason."""
    value = extract_json(text)
    try:
        return schema.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise ReplyParseError(f"reply does not match the schema: {problems}") from None


def inline_refs(schema: dict) -> dict:
    """``schema`` with every local ``$ref`` (``#/$defs/X``) replaced by its definition.

    Pydantic puts nested models under ``$defs``; grammar-constrained servers (llama.cpp) do
    not all follow references, and then constrain nothing. Recursive models are left as refs.
    """
    defs = schema.get("$defs", {})

    def resolve(node, seen: tuple[str, ...]):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.split("/")[-1]
                if name in seen or name not in defs:
                    return node
                merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
                return resolve(merged, seen + (name,))
            return {k: resolve(v, seen) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v, seen) for v in node]
        return node

    return resolve(schema, ())
