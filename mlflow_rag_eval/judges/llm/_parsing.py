"""Turn an LLM's reply text into a validated pydantic object, repairing what is safe to repair.

Which JSON is the reply's own: the whole reply when it parses; else the JSON that comes *last*
in it: the last top-level balanced ``{...}`` after the last fenced code block, else that
block's content. Never the first: a judge that quotes the judged text before answering
("The answer says: {...}. My verdict: {...}") would otherwise let a schema-valid object inside
the data decide its own score (inspect_ai binds its grade regex to the last match for the
same reason). If an object is left unfinished (a reply cut off at ``max_tokens``), there is
no reply JSON: an earlier, complete object is quoted text, never a fallback. And when the
caller passes the texts under evaluation (``data``), a candidate that appears in them is quoted
from the data wherever it stands, before or after the judge's own JSON, and is never taken:
whether it appears as written (spaces aside) or re-typed, i.e. equal in content to a JSON object
written in the data (keys in another order, other spacing, a null member left out; see
:func:`_canonical`). A judge that obeys a planted verdict by re-typing it must not pass for one
that judged. The one safe repair is dropping trailing commas.

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


def _canonical(value: object) -> str:
    """``value``'s content as one string: keys sorted, null members left out (our schemas
    default them), integral numbers as integers, no whitespace anywhere. Two spellings of the
    same content (keys reordered, pretty-printed, ``1.0`` for ``1``) give the same string.
    Raises RecursionError for a value nested past the interpreter's limit."""

    def normal(v: object) -> object:
        if isinstance(v, dict):
            return {str(k): normal(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [normal(x) for x in v]
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return v

    text = json.dumps(normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _SPACE.sub("", text)


def _members(value: dict) -> frozenset[str]:
    """The names of a JSON object's non-null members: two objects of equal content share them."""
    return frozenset(str(k) for k, v in value.items() if v is not None)


def _objects_of(value: object) -> list[dict]:
    """Every JSON object in a parsed value, itself included, at any depth."""
    found, todo = [], [value]
    while todo:
        current = todo.pop()
        if isinstance(current, dict):
            found.append(current)
            todo.extend(current.values())
        elif isinstance(current, list):
            todo.extend(current)
    return found


#: Where a JSON object with at least one member may start.
_OBJECT_START = re.compile(r'\{\s*"')
#: Characters decoded at a start before the rest of the text is tried (see :func:`_decode_at`).
_WINDOW = 4096


def _decode_at(decoder: json.JSONDecoder, text: str, start: int) -> tuple[object, int] | None:
    """The JSON value written at ``text[start]`` and the index after it, or None.

    A decode error's message counts the lines before where it failed, so decoding each start
    in the whole text would make a text full of ``{"`` quadratic to scan: a window is decoded
    first, and only a failure its end could have caused (at the end, or in a string it cut) is
    tried again on the rest of the text.
    """
    window = text[start:start + _WINDOW]
    try:
        value, end = decoder.raw_decode(window)
        return value, start + end
    except RecursionError:
        return None
    except json.JSONDecodeError as exc:
        cut = len(window) == _WINDOW and (exc.pos >= len(window) - 8 or exc.msg.startswith("Unterminated string"))
        if not cut:
            return None
    try:
        return decoder.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None


def _json_objects_in(text: str) -> list[dict]:
    """Every JSON object written in ``text`` (trailing commas forgiven), nested ones included.

    A parse is tried at every start not inside an object already found, each on its own, so an
    unbalanced brace or quote before a planted object cannot hide it.
    """
    decoder = json.JSONDecoder()
    text = _TRAILING_COMMA.sub(r"\1", text)
    found: list[dict] = []
    at = _OBJECT_START.search(text)
    while at is not None:
        decoded = _decode_at(decoder, text, at.start())
        if decoded is None:
            at = _OBJECT_START.search(text, at.start() + 1)
            continue
        found += _objects_of(decoded[0])
        at = _OBJECT_START.search(text, decoded[1])
    return found


class _Quoted:
    """What the texts under evaluation hold, to recognise JSON quoted from them: their text
    with spaces removed, and every JSON object written in them (read when first needed)."""

    def __init__(self, data: tuple[str, ...]):
        self.data = data
        self.flat = tuple(_SPACE.sub("", d) for d in data)
        self._by_members: dict[frozenset[str], list[dict]] | None = None

    def _objects(self, members: frozenset[str]) -> list[dict]:
        if self._by_members is None:
            self._by_members = {}
            for d in self.data:
                for found in _json_objects_in(d):
                    self._by_members.setdefault(_members(found), []).append(found)
        return self._by_members.get(members, [])

    def __contains__(self, candidate: str) -> bool:
        """Whether ``candidate`` is in a text under evaluation: as written (spaces aside), or,
        parsed, as the content (:func:`_canonical`) of a JSON object there: the judge re-typed
        what it quoted, keys in another order, spaced otherwise, a null member left out."""
        flat = _SPACE.sub("", candidate)
        if not flat:
            return False
        if any(flat in d for d in self.flat):
            return True
        try:
            value = _loads(candidate)
        except ValueError:
            return False
        if not isinstance(value, dict):
            return False
        same_members = self._objects(_members(value))
        try:
            content = _canonical(value) if same_members else None
            return any(_canonical(o) == content for o in same_members)
        except RecursionError:  # nested past any schema's depth: no reply of ours
            return False


_NOTHING_QUOTED = _Quoted(())


def _reply_json_candidate(text: str, quoted: _Quoted = _NOTHING_QUOTED) -> str | None:
    """The part of ``text`` that is the reply's own JSON (see the module docstring)."""
    fences = [f for f in _FENCE.finditer(text) if f.group(1).strip() not in quoted]
    after = fences[-1].end() if fences else 0
    tail = text[after:]
    objects = _objects(tail)
    if objects is None:
        return None  # an unfinished object: never an earlier one
    own = [o for o in objects if o not in quoted]
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
    quoted = _Quoted(tuple(d for d in data if isinstance(d, str) and "{" in d))
    if text.strip() not in quoted:
        try:
            return _loads(text.strip())
        except ValueError:
            pass
    candidate = _reply_json_candidate(text, quoted)
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
