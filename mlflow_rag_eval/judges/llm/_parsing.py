"""Turn an LLM's reply text into a validated pydantic object, repairing what is safe to repair.

Which JSON is the reply's own: the whole reply when it parses; else the JSON that comes *last*
in it: the last top-level balanced ``{...}`` after the last fenced code block, else that
block's content. Never the first: a judge that quotes the judged text before answering
("The answer says: {...}. My verdict: {...}") would otherwise let a schema-valid object inside
the data decide its own score (inspect_ai binds its grade regex to the last match for the
same reason). If an object is left unfinished (a reply cut off at ``max_tokens``), there is
no reply JSON: an earlier, complete object is quoted text, never a fallback. And when the
caller passes the texts under evaluation (``data``), a candidate that appears in them (spaces
aside) is quoted from the data wherever it stands, before or after the judge's own JSON, and is
never taken. The one safe repair is dropping trailing commas.

Anything still invalid is a :class:`ReplyParseError` carrying the validation message, which
the judge shows to the model in its one retry. Nothing here ever returns a default or a NaN
in place of a reply.
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


def _object_end(text: str, start: int) -> int | None:
    """The index after the ``}`` closing the ``{`` at ``start``, respecting strings and
    escapes; None when the text ends first."""
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
                return i + 1
    return None


def _objects(text: str) -> list[str] | None:
    """The top-level balanced ``{...}`` in text, in order; None when one never closes.

    Objects are found left to right, each scan resuming after the object found. A ``{`` that
    never closes ends the search with None: what follows it is inside it, so the reply's own
    JSON is unfinished (cut off at ``max_tokens``) or a stray brace hides it; either way an
    earlier, complete object is quoted text, not the answer, and the judge's corrective retry
    asks again. (This also keeps the scan linear in the reply's length.)
    """
    found: list[str] = []
    start = text.find("{")
    while start != -1:
        end = _object_end(text, start)
        if end is None:
            return None
        found.append(text[start:end])
        start = text.find("{", end)
    return found


_SPACE = re.compile(r"\s+")


def _quoted(candidate: str, data: tuple[str, ...]) -> bool:
    """Whether ``candidate`` appears in one of the texts under evaluation (spaces aside)."""
    if not data:
        return False
    flat = _SPACE.sub("", candidate)
    return bool(flat) and any(flat in _SPACE.sub("", d) for d in data)


def _reply_json_candidate(text: str, data: tuple[str, ...] = ()) -> str | None:
    """The part of ``text`` that is the reply's own JSON (see the module docstring)."""
    fences = [f for f in _FENCE.finditer(text) if not _quoted(f.group(1).strip(), data)]
    after = fences[-1].end() if fences else 0
    tail = text[after:]
    objects = _objects(tail)
    if objects is None:
        return None  # an unfinished object: never an earlier one
    own = [o for o in objects if not _quoted(o, data)]
    if own:
        return own[-1]
    if fences:
        return fences[-1].group(1).strip()
    return None


def _loads(candidate: str) -> object:
    """``candidate`` as JSON, as written or without trailing commas; raises ValueError."""
    for attempt in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
        try:
            return json.loads(attempt)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            continue
    raise ValueError("not JSON")


def extract_json(text: str, data: tuple[str, ...] = ()) -> object:
    """The reply's own JSON value after the safe repairs; raises ReplyParseError.

    ``data``: the texts under evaluation; JSON found in them is never the reply's.
    """
    text = text if isinstance(text, str) else str(text)
    data = tuple(d for d in data if isinstance(d, str) and "{" in d)
    if not _quoted(text.strip(), data):
        try:
            return _loads(text.strip())
        except ValueError:
            pass
    candidate = _reply_json_candidate(text, data)
    if candidate is not None:
        try:
            return _loads(candidate)
        except ValueError:
            pass
    raise ReplyParseError("no valid JSON object in the reply", text.strip().replace("\n", " ")[:120])


def parse_reply(text: str, schema: type[BaseModel], data: tuple[str, ...] = ()) -> BaseModel:
    """Validate ``text`` against ``schema``; raises ReplyParseError with the reason.

    ``data``: the texts under evaluation (the answer, the passages...); a JSON object quoted
    from them is never taken for the reply, wherever it stands in the reply.
    """
    value = extract_json(text, data)
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
