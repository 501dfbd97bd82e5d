"""Typed RAG records, and the one place where user data is turned into them.

Every check on user data happens here, before any judge is called: a bad cell stops the
evaluation with one :class:`RecordError` that names the row and the column, so nothing is
half-computed and nothing is half-logged.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "ColumnMapping",
    "Context",
    "RagRecord",
    "RecordError",
    "golden_set_name",
    "records_from_frame",
    "predictions_to_frame",
    "refuse_duplicate_columns",
    "validate_inputs",
    "dataset_digest",
    "dataset_item",
    "digest_of_sorted_items",
    "expectation_fields",
    "is_blank",
    "parent_of",
]


class RecordError(ValueError):
    """A cell of the evaluation data cannot be turned into a RAG record.

    Attributes:
        row: the 0-based position of the row in the data (None for a whole-column problem).
        column: the column at fault.
    """

    def __init__(self, message: str, *, row: int | None, column: str):
        self.row = row
        self.column = column
        self.reason = message
        where = f"column {column!r}" if row is None else f"row {row}, column {column!r}"
        super().__init__(f"{where}: {message}")


def parent_of(doc_id: str) -> str:
    """The parent of an id by the ``/`` rule: everything before the last ``/`` (``docs/a.md/3``
    -> ``docs/a.md``), or the id itself when it has no ``/`` or nothing before it.

    The last ``/``, not the first, so that path-like document ids keep their path and only the
    chunk suffix is cut; ids whose parents are not a prefix give ``parent_id`` instead.
    """
    head, sep, _ = doc_id.rpartition("/")
    return head if sep and head else doc_id


@dataclass(frozen=True)
class Context:
    """One retrieved passage, in rank order within its record.

    ``parent_id`` names the larger unit the passage is a chunk of (the document of a chunk,
    the thread of a post), for the retrieval metrics at the parent grain; without it the
    parent is read from the id (:func:`parent_of`).
    """

    text: str
    id: str | None = None
    parent_id: str | None = None

    @property
    def parent(self) -> str | None:
        """``parent_id`` when given, else :func:`parent_of` the id; None without either."""
        if self.parent_id is not None:
            return self.parent_id
        return parent_of(self.id) if self.id is not None else None


@dataclass(frozen=True)
class RagRecord:
    """One question, what the pipeline did with it, and what a human expects.

    ``relevant_ids`` maps an id to a graded relevance (a plain list of ids becomes grade 1
    each); ``None`` means "not judged", which retrieval metrics treat as not applicable.
    """

    question: str
    answer: str
    contexts: tuple[Context, ...] = ()
    reference: str | None = None
    relevant_ids: Mapping[str, float] | None = None
    reference_contexts: tuple[str, ...] | None = None
    answerable: bool = True
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: how long the pipeline took on this row, in milliseconds, when the data says (a
    #: ``latency_ms`` column, or the model's output): the duration of the row's trace
    latency_ms: float | None = None

    @property
    def context_texts(self) -> list[str]:
        return [c.text for c in self.contexts]

    @property
    def context_ids(self) -> list[str | None]:
        return [c.id for c in self.contexts]


@dataclass(frozen=True)
class ColumnMapping:
    """Which column holds which record field. Override any of them via ``evaluator_config``.

    ``contexts`` cells are lists of strings or of dicts with ``text`` (or ``page_content`` /
    ``content``), an optional ``id`` (or ``doc_id``) and an optional ``parent_id`` (the
    document the passage is a chunk of). ``context_ids`` is an optional separate column with
    the ids of the contexts, in the same order.

    ``relevant_ids`` cells are a list of ids (grade 1 each), a list of ``{"id", "grade"}``
    dicts, a list of ``[id, grade]`` pairs, an ``{id: grade}`` dict, or any of these as a JSON
    string; or a list of ids with their grades, in order, in a ``relevance_grades`` column.
    Prefer the ``{"id", "grade"}`` list (or the two parallel lists) for more than a few
    thousand rows: ``mlflow.evaluate`` infers the data's schema before any evaluator runs, and
    for ``{id: grade}`` dicts every distinct id is a field of the schema, a cost that grows
    with the square of the rows (``mlflow.evaluate`` of retrieval metrics on 3,000 rows: 48.5 s
    with dicts, 2.4 s with ``{"id", "grade"}`` lists; ``bench/scale.py``).
    """

    question: str = "question"
    answer: str = "answer"
    contexts: str = "contexts"
    context_ids: str = "context_ids"
    reference: str = "reference"
    relevant_ids: str = "relevant_ids"
    relevance_grades: str = "relevance_grades"
    reference_contexts: str = "reference_contexts"
    answerable: str = "answerable"
    metadata: str = "metadata"
    latency_ms: str = "latency_ms"

    @classmethod
    def from_config(cls, config: Mapping[str, str] | None) -> ColumnMapping:
        config = dict(config or {})
        known = {f.name for f in fields(cls)}
        unknown = set(config) - known
        if unknown:
            raise ValueError(
                f"unknown column mapping key(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        return replace(cls(), **config)


_TEXT_KEYS = ("text", "page_content", "content")
_ID_KEYS = ("id", "doc_id", "document_id")
#: only this key: ``doc_id`` already names the passage itself (an id alias), not its parent
_PARENT_KEY = "parent_id"


def is_missing(value: Any) -> bool:
    """Whether a cell holds no value: None, NaN, ``pd.NA`` or ``pd.NaT``."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return value is pd.NA or value is pd.NaT


def _as_list(value: Any, *, row: int, column: str, what: str) -> list:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise RecordError(
            f"{what} must be a list, got {type(value).__name__}", row=row, column=column
        )
    return list(value)


def _as_id(value: Any, *, row: int, column: str) -> str:
    # bool is an int subclass; an id of True is a data bug, not an id.
    if isinstance(value, bool) or not isinstance(value, (str, int, np.integer)):
        raise RecordError(
            f"ids must be strings or ints, got {type(value).__name__} ({value!r})",
            row=row,
            column=column,
        )
    return str(value)


#: Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt): code points a
#: renderer shows nothing for when it has no glyph of them: the soft hyphen, the combining
#: grapheme joiner, zero-width spaces and joiners, bidi marks, the Hangul fillers, variation
#: selectors (U+FE00..U+FE0F, U+E0100..U+E01EF), tag characters, the BOM.
DEFAULT_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
                     (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                     (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
#: Blank besides: the braille blank (a symbol to Unicode, nothing on screen).
_BLANK_SYMBOLS = frozenset("\u2800")


def _ignorable(c: str) -> bool:
    code = ord(c)
    return any(low <= code <= high for low, high in DEFAULT_IGNORABLE)


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: only whitespace, control and format characters, default
    ignorable code points (:data:`DEFAULT_IGNORABLE`: zero-width spaces and joiners, the BOM, bidi
    marks, soft hyphens, variation selectors, the combining grapheme joiner) and blank fillers.
    ``"\\u200b"`` is no question, and a passage of ``"\\ufeff"`` holds nothing to judge."""
    return all(c.isspace() or c in _BLANK_SYMBOLS or unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp")
               or _ignorable(c) for c in text)


def _text(value: Any, *, row: int, column: str, allow_empty: bool = True) -> str:
    """A text cell; text that shows nothing (:func:`is_blank`) is the empty text, so that no
    route counts it as present."""
    if is_missing(value):
        raise RecordError("missing value (None/NaN)", row=row, column=column)
    if not isinstance(value, str):
        raise RecordError(
            f"must be a string, got {type(value).__name__}", row=row, column=column
        )
    if is_blank(value):
        if not allow_empty:
            raise RecordError("must not be empty (it holds only whitespace, control or zero-width characters)"
                              if value else "must not be empty", row=row, column=column)
        return ""
    return value


def _contexts(value: Any, ids: Any, *, row: int, mapping: ColumnMapping) -> tuple[Context, ...]:
    column = mapping.contexts
    if is_missing(value):
        raise RecordError("missing value (None/NaN); use [] for no contexts", row=row, column=column)
    items = _as_list(value, row=row, column=column, what="contexts")
    out: list[Context] = []
    for position, item in enumerate(items):
        if isinstance(item, str):
            out.append(Context(text="" if is_blank(item) else item))
        elif isinstance(item, Mapping):
            text_key = next((k for k in _TEXT_KEYS if k in item), None)
            if text_key is None:
                raise RecordError(
                    f"context {position} has none of the keys {list(_TEXT_KEYS)}",
                    row=row,
                    column=column,
                )
            text = item[text_key]
            if not isinstance(text, str):
                raise RecordError(
                    f"context {position} text must be a string, got {type(text).__name__}",
                    row=row,
                    column=column,
                )
            id_key = next((k for k in _ID_KEYS if k in item and item[k] is not None), None)
            cid = _as_id(item[id_key], row=row, column=column) if id_key else None
            parent = item.get(_PARENT_KEY)
            parent = None if is_missing(parent) else _as_id(parent, row=row, column=column)
            out.append(Context(text="" if is_blank(text) else text, id=cid, parent_id=parent))
        else:
            raise RecordError(
                f"context {position} must be a string or a dict, got {type(item).__name__}",
                row=row,
                column=column,
            )
    if ids is not None and not is_missing(ids):
        id_list = _as_list(ids, row=row, column=mapping.context_ids, what="context ids")
        if len(id_list) != len(out):
            raise RecordError(
                f"{len(id_list)} ids for {len(out)} contexts",
                row=row,
                column=mapping.context_ids,
            )
        out = [
            replace(c, id=_as_id(i, row=row, column=mapping.context_ids))
            for c, i in zip(out, id_list)
        ]
    return tuple(out)


def _grade(doc_id: str, grade: Any, *, row: int, column: str) -> float:
    if isinstance(grade, bool) or not isinstance(grade, (int, float, np.number)):
        raise RecordError(f"grade of id {doc_id!r} must be a number, got {type(grade).__name__}",
                          row=row, column=column)
    if not math.isfinite(float(grade)):
        raise RecordError(f"grade of id {doc_id!r} is not finite", row=row, column=column)
    return float(grade)


def _relevant_ids(value: Any, *, row: int, column: str, grades: Any = None,
                  grades_column: str = "relevance_grades") -> dict[str, float] | None:
    """``{id: grade}`` from any of the accepted forms (see :class:`ColumnMapping`).

    A list item is an id (grade 1, or its entry in ``grades``), an ``{"id", "grade"}`` dict or
    an ``[id, grade]`` pair; a string starting with ``{`` or ``[`` is read as JSON of any of
    these. An id given twice with two grades is refused: which one would be meant?
    """
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RecordError(f"relevant ids look like JSON but do not parse: {exc}", row=row, column=column) from None
    if is_missing(value):
        return None
    if isinstance(value, Mapping):
        if not is_missing(grades):
            raise RecordError(f"grades are given twice: in the {{id: grade}} dict and in {grades_column!r}",
                              row=row, column=column)
        return {(doc_id := _as_id(k, row=row, column=column)): _grade(doc_id, g, row=row, column=column)
                for k, g in value.items()}
    items = _as_list(value, row=row, column=column, what="relevant ids")
    parallel = None
    if not is_missing(grades):
        parallel = _as_list(grades, row=row, column=grades_column, what="relevance grades")
        if len(parallel) != len(items):
            raise RecordError(f"{len(items)} relevant ids but {len(parallel)} grades in {grades_column!r}",
                              row=row, column=grades_column)
    out: dict[str, float] = {}
    for k, item in enumerate(items):
        if isinstance(item, Mapping):
            if set(item) != {"id", "grade"}:
                raise RecordError(f"a relevant id given as a dict needs exactly the keys 'id' and 'grade', "
                                  f"got {sorted(map(str, item))}", row=row, column=column)
            doc_id, grade = _as_id(item["id"], row=row, column=column), item["grade"]
        elif isinstance(item, (list, tuple, np.ndarray)):
            if len(item) != 2:
                raise RecordError(f"a relevant id given as a list must be an [id, grade] pair, got {list(item)!r}",
                                  row=row, column=column)
            doc_id, grade = _as_id(item[0], row=row, column=column), item[1]
        else:
            doc_id, grade = _as_id(item, row=row, column=column), 1
        if parallel is not None:
            if isinstance(item, (Mapping, list, tuple, np.ndarray)):
                raise RecordError(f"grades are given twice: in the relevant ids and in {grades_column!r}",
                                  row=row, column=column)
            grade = parallel[k]
        grade = _grade(doc_id, grade, row=row, column=column)
        if out.get(doc_id, grade) != grade:
            raise RecordError(f"id {doc_id!r} is listed twice, with grades {out[doc_id]:g} and {grade:g}",
                              row=row, column=column)
        out[doc_id] = grade
    return out


def _answerable(value: Any, *, row: int, column: str) -> bool:
    if is_missing(value):
        return True
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise RecordError(f"must be a boolean, got {value!r}", row=row, column=column)


def _latency_ms(value: Any, *, row: int, column: str) -> float | None:
    if is_missing(value):
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or float(value) < 0:
        raise RecordError(f"must be a number of milliseconds >= 0, got {value!r}", row=row, column=column)
    return float(value)


def records_from_frame(
    df: pd.DataFrame, mapping: ColumnMapping | None = None, *, require_answer: bool = True
) -> list[RagRecord]:
    """Validate a DataFrame and turn each row into a :class:`RagRecord`.

    Required columns: question, answer (unless ``require_answer`` is false) and contexts.
    Every other field is read when its column is present.

    Raises:
        RecordError: at the first bad cell, naming its row and column.
    """
    mapping = mapping or ColumnMapping()
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    refuse_duplicate_columns(df)
    required = [mapping.question, mapping.contexts] + ([mapping.answer] if require_answer else [])
    for column in required:
        if column not in df.columns:
            raise RecordError(
                f"required column is missing (columns: {list(map(str, df.columns))}); "
                "map another column to it: evaluator_config={'col_mapping': {...}}, or --col FIELD=COLUMN in the CLI",
                row=None,
                column=column,
            )
    has = {name: getattr(mapping, name) in df.columns for name in (
        "answer", "context_ids", "reference", "relevant_ids", "relevance_grades", "reference_contexts",
        "answerable", "metadata", "latency_ms",
    )}
    records = []
    for row, cells in enumerate(df.to_dict(orient="records")):
        def cell(name: str) -> Any:
            return cells[getattr(mapping, name)] if has.get(name, True) else None

        question = _text(cell("question"), row=row, column=mapping.question, allow_empty=False)
        answer = _text(cell("answer"), row=row, column=mapping.answer) if has["answer"] else ""
        contexts = _contexts(cell("contexts"), cell("context_ids"), row=row, mapping=mapping)
        reference = None
        if has["reference"] and not is_missing(cell("reference")):
            reference = _text(cell("reference"), row=row, column=mapping.reference)
        reference_contexts = None
        if has["reference_contexts"] and not is_missing(cell("reference_contexts")):
            items = _as_list(
                cell("reference_contexts"), row=row, column=mapping.reference_contexts,
                what="reference contexts",
            )
            reference_contexts = tuple(
                _text(t, row=row, column=mapping.reference_contexts) for t in items
            )
        metadata = cell("metadata") if has["metadata"] else None
        if metadata is not None and not is_missing(metadata) and not isinstance(metadata, Mapping):
            raise RecordError("must be a dict", row=row, column=mapping.metadata)
        records.append(
            RagRecord(
                question=question,
                answer=answer,
                contexts=contexts,
                reference=reference,
                relevant_ids=_relevant_ids(
                    cell("relevant_ids"), row=row, column=mapping.relevant_ids,
                    grades=cell("relevance_grades"), grades_column=mapping.relevance_grades
                ),
                reference_contexts=reference_contexts,
                answerable=_answerable(cell("answerable"), row=row, column=mapping.answerable),
                metadata=dict(metadata) if isinstance(metadata, Mapping) else {},
                latency_ms=_latency_ms(cell("latency_ms"), row=row, column=mapping.latency_ms)
                if has["latency_ms"] else None,
            )
        )
    return records


def expectation_fields(values: Mapping[str, Any], *, row: int | None = None) -> dict[str, Any]:
    """The record fields named expectations give (``reference`` or its alias
    ``expected_response``, ``relevant_ids``, ``answerable``, ``reference_contexts``), checked
    by the very rules of the data columns of the same names: an id listed twice with two
    grades, a grade that is a boolean or no finite number, ``answerable`` that is no boolean
    (``"false"``, a string, included) are refused with a :class:`RecordError` naming the
    expectation as its column. Other names are left out (they feed no metric)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in ("reference", "expected_response"):
            if "reference" in out:
                raise RecordError("given twice (reference and expected_response)", row=row, column=name)
            out["reference"] = _text(value, row=row, column=name)
        elif name == "relevant_ids":
            out["relevant_ids"] = _relevant_ids(value, row=row, column=name)
        elif name == "answerable":
            if is_missing(value):
                raise RecordError("missing value (None/NaN)", row=row, column=name)
            out["answerable"] = _answerable(value, row=row, column=name)
        elif name == "reference_contexts":
            items = _as_list(value, row=row, column=name, what="reference contexts")
            out["reference_contexts"] = tuple(_text(t, row=row, column=name) for t in items)
    return out


def refuse_duplicate_columns(df: pd.DataFrame) -> None:
    """Two columns with one name: which one a field reads would be an accident of order."""
    names = [str(c) for c in df.columns]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise RecordError(
            f"the data has {names.count(duplicated[0])} columns with this name; keep one", row=None,
            column=duplicated[0],
        )


def validate_inputs(df: pd.DataFrame, mapping: ColumnMapping | None = None) -> None:
    """Check the fields a pipeline does not produce (question, expectations, metadata) before
    the pipeline runs; the answer and contexts are checked when it has produced them.

    Raises:
        RecordError: at the first bad cell, naming its row and column.
    """
    mapping = mapping or ColumnMapping()
    refuse_duplicate_columns(df)
    if mapping.question not in df.columns:
        raise RecordError(
            f"required column is missing (columns: {list(map(str, df.columns))}); "
            "map another column to it: evaluator_config={'col_mapping': {...}}, or --col FIELD=COLUMN in the CLI",
            row=None,
            column=mapping.question,
        )
    outputs = [mapping.answer, mapping.contexts, mapping.context_ids]
    placeholder = df.drop(columns=[c for c in outputs if c in df.columns]).assign(
        **{mapping.contexts: [[] for _ in range(len(df))]}
    )
    records_from_frame(placeholder, mapping, require_answer=False)


def predictions_to_frame(output: Any, n_rows: int, mapping: ColumnMapping | None = None) -> pd.DataFrame:
    """Normalise a pyfunc RAG model's output to a DataFrame with answer and contexts columns.

    Accepted: a DataFrame; a list of dicts (one per row); a dict of columns (lists); a dict
    for a single row; a list of strings (answers only, no contexts).
    """
    mapping = mapping or ColumnMapping()
    if isinstance(output, pd.DataFrame):
        frame = output.reset_index(drop=True)
    elif isinstance(output, Mapping):
        if all(isinstance(v, (list, tuple, np.ndarray, pd.Series)) for v in output.values()) and (
            n_rows != 1 or not all(isinstance(v, str) for v in output.values())
        ):
            frame = pd.DataFrame({k: list(v) for k, v in output.items()})
        else:
            frame = pd.DataFrame([dict(output)])
    elif isinstance(output, (list, tuple, np.ndarray, pd.Series)):
        items = list(output)
        if all(isinstance(i, Mapping) for i in items):
            frame = pd.DataFrame([dict(i) for i in items])
        elif all(isinstance(i, str) for i in items):
            frame = pd.DataFrame({mapping.answer: items})
        else:
            raise RecordError(
                "model output must be a DataFrame, a dict, a list of dicts or a list of strings",
                row=None,
                column=mapping.answer,
            )
    else:
        raise RecordError(
            f"model output of type {type(output).__name__} is not supported",
            row=None,
            column=mapping.answer,
        )
    if len(frame) != n_rows:
        raise RecordError(
            f"the model returned {len(frame)} rows for {n_rows} inputs",
            row=None,
            column=mapping.answer,
        )
    if mapping.answer not in frame.columns:
        raise RecordError(
            f"the model output has no answer column (columns: {list(frame.columns)})",
            row=None,
            column=mapping.answer,
        )
    return frame


def dataset_digest(records: Sequence[RagRecord]) -> str:
    """A digest of what stays fixed between pipeline versions: questions and expectations.

    Answers and retrieved contexts are left out on purpose: two versions of a pipeline
    evaluated on the same golden set must get the same digest, so the gate can pair them.
    The rows are a multiset, not a sequence: the same golden rows in another order (as
    ``mlflow.genai.evaluate``, scoring rows concurrently, hands them over) give the same digest.
    """
    return digest_of_sorted_items(sorted(dataset_item(r) for r in records))


def golden_set_name(digest: str, name: str | None = None) -> str:
    """The name of a golden set in the store: the one its user gave, else ``golden-<digest8>``
    (:func:`dataset_digest`'s first 8 characters: the same rows get the same name on every route)."""
    return name or f"golden-{digest[:8]}"


def dataset_item(record: RagRecord) -> str:
    """One record's share of :func:`dataset_digest`: its question and expectations as JSON.

    A function of its own so that a route holding no rows (Spark computes each row's item in
    its executors and sorts them there) digests exactly the same text.
    """
    return json.dumps(
        {
            "q": record.question,
            "ref": record.reference,
            "rel": sorted((record.relevant_ids or {}).items()) if record.relevant_ids is not None else None,
            "refctx": list(record.reference_contexts) if record.reference_contexts is not None else None,
            "ans": record.answerable,
        },
        sort_keys=True,
        ensure_ascii=False,
    )


def digest_of_sorted_items(items: Iterable[str]) -> str:
    """:func:`dataset_digest` of :func:`dataset_item` texts given in sorted order, in constant
    memory (an iterator is read once).

    The order is Python's ``str`` order, code point by code point, which is also the byte
    order of their UTF-8 (Spark's binary string sort gives the same sequence). The bytes hashed
    are each item followed by a newline; an item (JSON) holds no newline, so consecutive items
    may also be given joined by newlines, as one string: the same bytes, fewer calls.
    """
    h = hashlib.sha256()
    for item in items:
        h.update(item.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]
