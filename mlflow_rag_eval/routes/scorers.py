"""Scorers for ``mlflow.genai.evaluate``: one per metric, the same names and values.

    mlflow.genai.evaluate(data=rows, predict_fn=my_rag, scorers=rag_scorers(["faithfulness",
                          "context_recall", "ndcg@10"], judge="local:minilm-l6"))

Each scorer reads ``inputs`` (``{"question": ...}``), ``outputs`` (a string answer, or
``{"answer": ..., "contexts": [...]}``) and ``expectations`` (``reference`` or
``expected_response``, ``relevant_ids``, ``answerable``, ``reference_contexts``). Contexts come
from ``outputs["contexts"]`` or, failing that, from the trace's RETRIEVER spans (their
documents' ``page_content`` and ``id`` / ``metadata.doc_uri``), in span order.

It returns the same ``Feedback`` the ``rag`` evaluator puts on a row's trace
(:func:`~mlflow_rag_eval.tracking.traces.row_feedback`): the value, the
justification as rationale, compact evidence in metadata, ``error`` when the judge could not
decide, source LLM_JUDGE (the judge's name) or CODE. Aggregations match the ``rag``
evaluator's run metrics: ``<metric>/mean``, and ``/ci_low``, ``/ci_high`` where the metric has
them, in the run and in the object ``mlflow.genai.evaluate`` returns alike; with
``rag_scorers(..., run_metrics="all")`` also ``/median``, ``/p10``, ``/worst10_mean``,
``/n_scored``, ``/n_error`` and the slices' statistics.

Inside ``mlflow.genai.evaluate`` the scorers also collect their rows, and when MLflow
aggregates them (after every row is scored) the run gets what a ``rag`` evaluator run holds:
``rag_eval.*`` params and tags, the table with each row's trace id, the statistics table, the
lineage, worst rows and report (:mod:`~mlflow_rag_eval.tracking.run_logging`), so
``compare`` and the gate accept the run. MLflow aggregates only metrics with at least one
value: if every row of every rag metric failed, the run holds the per-row errors on its
traces and MLflow's failure summary, but no ``rag_eval`` contents.

``rag_scorers(..., slice_by=[...])`` slices the run (:mod:`mlflow_rag_eval.evaluation.slices`) by keys of
the data rows' ``tags`` (``{"inputs": ..., "tags": {"difficulty": "hard"}}``), which MLflow
puts on each row's trace: they are read from the stored traces when the run's contents are
written, after every row is scored. A row without the tag is in no slice of it. A field no row
has is reported as an error and the run is written without slices (MLflow would swallow the
exception, and the run's other contents would be lost with it), so a gate's per-slice limit
then fails on the missing slices.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Feedback
from mlflow.genai.scorers import Scorer
from pydantic import PrivateAttr

from mlflow_rag_eval._util.callers_state import callers_logging_kept
from mlflow_rag_eval._util.mlflow_compat import search_traces
from mlflow_rag_eval.evaluation.engine import run_metric
from mlflow_rag_eval.evaluation.slices import check_slice_by, slice_members
from mlflow_rag_eval.evaluation.suite import ALL_FIELDS, prepare_suite
from mlflow_rag_eval.judges import Judge, JudgeInfo, JudgeUnreachable
from mlflow_rag_eval.keys import RUN_STATS, check_run_metrics
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import ColumnMapping, RagRecord, RecordError, dataset_digest, records_from_frame
from mlflow_rag_eval.results import MetricResult, RowResult, summarize
from mlflow_rag_eval.tracking.traces import EXPECTATION_FIELDS, row_feedback

_logger = logging.getLogger(__name__)

__all__ = ["RagScorer", "rag_scorer", "rag_scorers", "contexts_from_trace"]


#: added to a scorer's aggregations for one evaluation, when the run's contents are written, if
#: that metric has them: a CI that cannot be computed (one scored row, all rows equal) is left
#: out of the run, and MLflow would log a None (failing the whole run's metrics)
_CI_STATS = ("ci_low", "ci_high")
#: the statistics MLflow aggregates from the scorers' values (its list, per scorer), by
#: ``run_metrics``: the run's metrics are these (and the CI bounds, above)
_STATS = {"means": tuple(s for s in RUN_STATS if s not in _CI_STATS),
          "all": ("mean", "median", "p10", "worst10_mean", "n_scored", "n_error")}
#: the summaries of the runs written lately, run id -> metric key -> summary: what n_error and
#: the CI bounds are read from (MLflow hands an aggregation the scored values only)
_SUMMARIES: dict[str, dict[str, Any]] = {}


def _aggregation(stat: str, metric_key: str, *, greater_is_better: bool):
    """One of the rag evaluator's statistics over the values MLflow collected, in the metric's
    direction (which rows are its worst). The first call in an evaluation (every row is scored
    by then) writes the run's rag_eval contents; n_error and the CI bounds are the run's own."""

    def aggregate(values: list[float]) -> float | None:
        _flush_current_run()
        if stat in ("n_error", *_CI_STATS):
            written = _SUMMARIES.get(_current_run_id() or "", {}).get(metric_key)
            if written is None:
                raise LookupError(f"{metric_key}/{stat}: the run's rag_eval contents were not written (see above)")
            return getattr(written, stat)
        summary = summarize([RowResult.scored(v) for v in values], greater_is_better=greater_is_better)
        return getattr(summary, stat)

    aggregate.__name__ = stat  # MLflow names each metric `<scorer>/<function name>`
    aggregate.__qualname__ = f"{metric_key}/{stat}"
    aggregate.rag_eval_stat = stat
    return aggregate


def _offer_ci(scorer: RagScorer, summary) -> bool:
    """The CI bounds among this scorer's aggregations for the evaluation being aggregated, if its
    metric has them (returns whether it has). MLflow reads a scorer's list before it computes
    the first aggregation (which writes the run) and walks it after: the list is changed in
    place, behind the entry being computed."""
    aggregations = scorer.aggregations
    if aggregations is None:
        return False
    aggregations[:] = [a for a in aggregations if getattr(a, "rag_eval_stat", None) not in _CI_STATS]
    if summary.ci_low is None or summary.ci_high is None:
        return False
    aggregations.extend(_aggregation(s, scorer.name, greater_is_better=scorer._metric.greater_is_better)
                        for s in _CI_STATS)
    return True


def contexts_from_trace(trace) -> list[dict[str, Any]] | None:
    """The documents of the trace's RETRIEVER spans, in order, as ``{"id", "text"}``; None
    when there is no trace or it has no RETRIEVER span (nothing says what was retrieved)."""
    if trace is None:
        return None
    from mlflow.entities import SpanType

    spans = trace.search_spans(span_type=SpanType.RETRIEVER)
    if not spans:
        return None
    out = []
    for span in spans:
        for doc in span.outputs or []:
            if isinstance(doc, str):
                out.append({"text": doc})
                continue
            meta = doc.get("metadata") or {}
            text = doc.get("page_content", doc.get("text", doc.get("content", "")))
            doc_id = doc.get("id") or meta.get("doc_uri") or meta.get("id")
            item = {"text": text, "id": doc_id} if doc_id is not None else {"text": text}
            parent = doc.get("parent_id") or meta.get("parent_id")
            if parent is not None:  # the document a chunk belongs to (parent-grain metrics)
                item["parent_id"] = parent
            out.append(item)
    return out


def _record_frame(inputs, outputs, expectations, trace):
    inputs = inputs if isinstance(inputs, Mapping) else {"question": inputs}
    question = inputs.get("question")
    if question is None and len(inputs) == 1:
        question = next(iter(inputs.values()))
    if isinstance(outputs, Mapping):
        answer = outputs.get("answer", outputs.get("response"))
        contexts = outputs.get("contexts")
    else:
        answer, contexts = outputs, None
    if contexts is None:
        contexts = contexts_from_trace(trace)
    expectations = dict(expectations or {})
    row = {"question": question, "answer": answer, "contexts": contexts if contexts is not None else []}
    reference = expectations.get("reference", expectations.get("expected_response"))
    for key, value in (("reference", reference), ("relevant_ids", expectations.get("relevant_ids")),
                       ("answerable", expectations.get("answerable")),
                       ("reference_contexts", expectations.get("reference_contexts"))):
        if value is not None:
            row[key] = value
    import pandas as pd

    return pd.DataFrame([row]), contexts is not None


def _row_record(inputs, outputs, expectations, trace) -> tuple[RagRecord, set[str], bool]:
    """One genai row as a record (checked as every route checks its data), the record fields it
    provides, and whether it says what was retrieved (outputs or RETRIEVER spans).

    Raises:
        RecordError: a bad cell (the row is the only one: its number means nothing here).
    """
    frame, has_contexts = _record_frame(inputs, outputs, expectations, trace)
    fields = {"answer", "contexts"} | {c for c in EXPECTATION_FIELDS if c in frame}
    (record,) = records_from_frame(frame, ColumnMapping())
    return record, fields, has_contexts


class RagScorer(Scorer):
    """A genai Scorer computing one registered metric with one judge."""

    _metric: Metric = PrivateAttr()
    _judge: Judge | None = PrivateAttr(default=None)
    _position: int = PrivateAttr(default=0)
    #: keys of the rows' tags the run is sliced by
    _slice_by: tuple[str, ...] = PrivateAttr(default=())
    #: which statistics are the run's MLflow metrics (:data:`~mlflow_rag_eval.keys.RUN_METRICS`)
    _run_metrics: str = PrivateAttr(default="means")
    #: the golden set's name in the store (None: the caller's named dataset, else golden-<digest8>)
    _dataset_name: str | None = PrivateAttr(default=None)

    def __init__(self, metric: Metric, judge: Judge | None, *, run_metrics: str = "means", **kwargs):
        super().__init__(name=metric.key, aggregations=[
            _aggregation(s, metric.key, greater_is_better=metric.greater_is_better) for s in _STATS[run_metrics]],
                         description=(type(metric).__doc__ or "").strip().split("\n")[0], **kwargs)
        self._metric = metric
        self._judge = judge
        self._position = next(_SCORER_ORDER)
        self._run_metrics = run_metrics

    @callers_logging_kept()
    def __call__(self, *, inputs=None, outputs=None, expectations=None, trace=None) -> Feedback | None:
        """The row's Feedback; None (no assessment) when the metric does not apply to the row."""
        metric, judge = self._metric, self._judge
        start = time.perf_counter()
        if judge is not None:
            _judge_for_this_run(judge)
        record, fields = None, {"answer", "contexts"}
        try:
            record, fields, has_contexts = _row_record(inputs, outputs, expectations, trace)
            missing = [f for f in metric.requires if f not in fields]
            if "contexts" in metric.requires and not has_contexts:
                # Nothing says what was retrieved: scoring it as "retrieved nothing" would be a
                # made-up 0, so the row fails, saying where contexts are read from.
                row = RowResult.failed("NoContexts: the outputs have no 'contexts' and the trace no RETRIEVER span")
            elif missing:
                row = RowResult.not_applicable(f"no {missing[0]} in the expectations")
            else:
                if judge is not None:
                    judge.require(*metric.primitives, metric=metric.display_name)
                metric.validate([record], ColumnMapping())
                (row,) = run_metric(metric, [record], judge)
        except RecordError as exc:  # the row is the trace: its position in a one-row frame means nothing
            row = RowResult.failed(f"RecordError: column {exc.column!r}: {exc.reason}")
        except JudgeUnreachable as exc:
            # The engine stops on it; MLflow's harness cannot be stopped by a scorer (it turns a
            # raised exception into that row's error itself), so every row names it, and the judge,
            # declared unreachable, fails the later rows at once without a call.
            row = RowResult.failed(f"JudgeUnreachable: {exc}")
        except Exception as exc:  # one row's bad input is that row's named error
            row = RowResult.failed(f"{type(exc).__name__}: {exc}")
        result = MetricResult(name=metric.display_name, spec=metric.spec(), rows=(row,),
                              greater_is_better=metric.greater_is_better, judged=judge is not None)
        info = judge.info() if judge is not None else None
        _collect(self, trace, inputs, outputs, record, fields, result, info, time.perf_counter() - start)
        return row_feedback(result, row, judge=info)


#: judge -> the evaluation run it last judged for (the scorers of a notebook live on across runs)
_JUDGE_RUNS: weakref.WeakKeyDictionary[Judge, str | None] = weakref.WeakKeyDictionary()
_JUDGE_RUNS_LOCK = threading.Lock()


def _judge_for_this_run(judge: Judge) -> None:
    """A stop (an outage past its budget) holds for the evaluation it happened in, as on the
    engine's routes: the first row of another run restarts the judge."""
    run_id = _current_run_id()
    with _JUDGE_RUNS_LOCK:
        if judge in _JUDGE_RUNS and _JUDGE_RUNS[judge] == run_id:
            return
        first = judge not in _JUDGE_RUNS
        _JUDGE_RUNS[judge] = run_id
    if not first:
        judge.restart()


# --------------------------------------------------------------------------- run contents

_SCORER_ORDER = itertools.count()
_RUNS_LOCK = threading.Lock()
#: rows collected per evaluation run, until MLflow aggregates them (then written and dropped)
_RUNS: dict[str, _RunRows] = {}
_MAX_OPEN_RUNS = 16
#: run tag set when rows evaluated by the scorers are missing from the tracking store
LOST_ROWS_TAG = "rag_eval.rows_lost"


@dataclass
class _RunRows:
    """What one ``mlflow.genai.evaluate`` run's rag scorers computed, row by row."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # trace id -> row
    metrics: dict[str, tuple[int, MetricResult, JudgeInfo | None]] = field(default_factory=dict)
    judges: dict[str, Judge] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: scorer calls MLflow made without a trace: MLflow failed to store the row's trace
    traceless: int = 0
    #: the fields the scorers slice by (keys of the rows' tags)
    slice_by: tuple[str, ...] = ()
    #: metric name -> the scorer object MLflow's harness holds (whose aggregations it walks)
    scorers: dict[str, RagScorer] = field(default_factory=dict)
    #: the scorers' ``run_metrics`` ("all" when any says so)
    run_metrics: str = "means"
    lock: threading.Lock = field(default_factory=threading.Lock)


def _current_run_id() -> str | None:
    from mlflow.genai.evaluation.context import context_is_active, get_context

    return get_context().get_mlflow_run_id() if context_is_active() else None


def _collect(scorer: RagScorer, trace, inputs, outputs, record: RagRecord | None, fields: set[str],
             result: MetricResult, judge: JudgeInfo | None, seconds: float) -> None:
    run_id = _current_run_id()
    if run_id is None:
        return  # called outside an evaluation: nothing to write
    with _RUNS_LOCK:
        run = _RUNS.get(run_id)
        if run is None:
            while len(_RUNS) >= _MAX_OPEN_RUNS:  # runs MLflow never aggregated (all rows failed)
                _RUNS.pop(next(iter(_RUNS)))
            run = _RUNS[run_id] = _RunRows()
    if trace is None:  # MLflow could not store this row's trace (e.g. its sqlite pool ran dry)
        with run.lock:
            run.traceless += 1
        return
    if record is None:  # the row's input was unusable: keep it, with what can be shown
        question = inputs.get("question") if isinstance(inputs, Mapping) else inputs
        record = RagRecord(question=str(question if question is not None else ""),
                           answer=str(outputs.get("answer") if isinstance(outputs, Mapping) else outputs or ""))
    info = trace.info
    with run.lock:
        row = run.rows.setdefault(info.trace_id, {
            "order": (info.request_time or 0, info.trace_id), "record": record, "fields": set(),
            "model_id": (info.trace_metadata or {}).get("mlflow.modelId"), "results": {},
        })
        row["fields"] |= fields
        row["results"][result.name] = result.rows[0]
        run.metrics.setdefault(result.name, (scorer._position, result, judge))
        run.scorers.setdefault(result.name, scorer)
        run.slice_by = tuple(dict.fromkeys((*run.slice_by, *scorer._slice_by)))
        if scorer._run_metrics == "all":
            run.run_metrics = "all"
        if scorer._judge is not None:
            run.judges.setdefault(judge.fingerprint, scorer._judge)
        run.seconds[result.name] = run.seconds.get(result.name, 0.0) + seconds


def _flush_current_run() -> None:
    run_id = _current_run_id()
    if run_id is None:
        return
    with _RUNS_LOCK:
        run = _RUNS.pop(run_id, None)
    if run is None:
        return  # written already (by another metric's first aggregation), or nothing collected
    try:
        _write(run_id, run)
    except Exception:  # MLflow would swallow it as a failed aggregation: say it here
        _logger.exception("could not write the rag_eval contents of run %s", run_id)


def _write(run_id: str, run: _RunRows) -> None:
    from mlflow import MlflowClient

    from mlflow_rag_eval.evaluation.engine import no_judge
    from mlflow_rag_eval.evaluation.result import EvaluationResult
    from mlflow_rag_eval.tracking.run_logging import (
        announce,
        assert_run_is_fresh,
        log_golden_set_input,
        log_run_contents,
    )

    client = MlflowClient()
    try:
        assert_run_is_fresh(client, run_id)
    except ValueError as exc:
        _logger.warning("%s", exc)
        return
    rows = sorted(run.rows.values(), key=lambda r: r["order"])
    trace_ids = [r["order"][1] for r in rows]
    records = [r["record"] for r in rows]
    metrics = []
    for _, result, _judge in sorted(run.metrics.values(), key=lambda m: m[0]):
        missing = RowResult.failed("ScorerError: the scorer returned no result for this row")
        metrics.append(dataclasses.replace(
            result, rows=tuple(r["results"].get(result.name, missing) for r in rows)))
    judges = [j for _, m, j in run.metrics.values() if m.judged and j is not None]
    if len({j.fingerprint for j in judges}) > 1:
        _logger.warning("run %s: the rag scorers used %d different judges; the run records the first",
                        run_id, len({j.fingerprint for j in judges}))
    judge_info = judges[0] if judges else no_judge()
    judge = run.judges.get(judge_info.fingerprint)
    fields = set().union(*(r["fields"] for r in rows)) if rows else set()
    stored = _stored_traces(client, run_id)
    records, slice_by = _with_slice_tags(run_id, records, trace_ids, stored, run.slice_by)
    result = EvaluationResult(
        records=records, metrics=metrics, judge=judge_info, dataset_digest=dataset_digest(records),
        timings=dict(run.seconds), judge_usage=judge.usage() if judge is not None else {},
        fields=frozenset(fields),
    )
    # MLflow logs the statistics it aggregates itself (the CI bounds where the metric has them,
    # offered to it here); only the others are written here.
    with _RUNS_LOCK:
        while len(_SUMMARIES) >= _MAX_OPEN_RUNS:
            _SUMMARIES.pop(next(iter(_SUMMARIES)))
        _SUMMARIES[run_id] = {m.key: m.summary for m in metrics}
    with_ci = {m.name for m in metrics if _offer_ci(run.scorers[m.name], m.summary)}
    logged_by_mlflow = frozenset(
        f"{m.key}/{stat}" for m in metrics if m.summary.n_scored > 0
        for stat in (*_STATS[run.scorers[m.name]._run_metrics], *(_CI_STATS if m.name in with_ci else ()))
    )
    model_ids = {r["model_id"] for r in rows if r["model_id"]}
    tags = {"rag_eval.model_id": model_ids.pop()} if len(model_ids) == 1 else {}
    lost = _lost_rows(stored, result, trace_ids, traceless=run.traceless // max(len(metrics), 1))
    if lost:
        tags[LOST_ROWS_TAG] = str(lost)
    names = [s._dataset_name for s in run.scorers.values() if s._dataset_name]
    log_golden_set_input(client, run_id, result.dataset_digest, names[0] if names else None)
    log_run_contents(result, run_id, client, tags=tags, trace_ids=trace_ids, skip_metrics=logged_by_mlflow,
                     slice_by=slice_by, run_metrics=run.run_metrics)
    announce(result)
    if lost:
        _logger.error(
            "run %s: %d evaluated row(s) are not in the tracking store with their assessments (MLflow "
            "failed to store their traces or Feedback): its aggregates cover fewer rows than were "
            "evaluated. The run is tagged %s; re-run the evaluation (with MLFLOW_GENAI_EVAL_MAX_WORKERS=4 "
            "on a sqlite store).", run_id, lost, LOST_ROWS_TAG,
        )


def _stored_traces(client, run_id: str) -> dict[str, Any]:
    """The run's traces as the store holds them (trace id -> TraceInfo, without spans)."""
    run = client.get_run(run_id)
    stored: dict[str, Any] = {}
    token = None
    while True:
        page = search_traces(client, run.info.experiment_id, run_id=run_id, include_spans=False,
                             max_results=500, page_token=token)
        for trace in page:
            stored[trace.info.trace_id] = trace.info
        token = page.token
        if not token:
            break
    return stored


def _with_slice_tags(run_id: str, records: list[RagRecord], trace_ids: list[str], stored: dict[str, Any],
                     slice_by: tuple[str, ...]) -> tuple[list[RagRecord], tuple[str, ...]]:
    """The records with their rows' tags named in ``slice_by`` in their metadata, and the
    fields to slice by: none when a field is unusable (said loudly; see the module docstring)."""
    if not slice_by:
        return records, ()
    out = []
    for record, trace_id in zip(records, trace_ids):
        info = stored.get(trace_id)
        tags = dict(info.tags or {}) if info is not None else {}
        out.append(dataclasses.replace(record, metadata={**record.metadata,
                                                         **{f: tags[f] for f in slice_by if f in tags}}))
    try:
        slice_members(out, slice_by)
    except ValueError as exc:  # RecordError is one too
        _logger.error("run %s: cannot slice by %s: %s; the run is written without slices", run_id,
                      json.dumps(list(slice_by)), exc)
        return records, ()
    return out, slice_by


def _lost_rows(stored: dict[str, Any], result, trace_ids: list[str], *, traceless: int) -> int:
    """Rows whose trace or Feedback did not reach the store: the scorers saw no trace, or the
    stored trace lacks a Feedback a metric returned for it."""
    lost = traceless
    for i, trace_id in enumerate(trace_ids):
        expected = {m.key for m in result.metrics if m.rows[i].status != "skipped"}
        names = {a.name for a in stored[trace_id].assessments or []} if trace_id in stored else None
        if names is None or not expected <= names:
            lost += 1
    return lost


def rag_scorer(metric: str | Metric, judge: str | Judge | None = None, *,
               slice_by: list[str] | None = None, run_metrics: str = "means") -> RagScorer:
    """A genai scorer for any registered metric (``faithfulness``, ``ndcg@10``, a rubric...)."""
    (scorer,) = rag_scorers([metric], judge, slice_by=slice_by, run_metrics=run_metrics)
    return scorer


def rag_scorers(metrics: Iterable[str | Metric], judge: str | Judge | None = None, *,
                slice_by: list[str] | None = None, data=None, run_metrics: str = "means",
                dataset_name: str | None = None) -> list[RagScorer]:
    """Scorers sharing one judge (one model load, one cache). The metrics are checked here,
    as on every route: an unknown name, a missing extra or a metric the judge cannot perform
    is refused now, not turned into an error on every row.

    Args:
        slice_by: keys of the data rows' ``tags`` to slice the run by (see the module docstring).
        data: the rows ``mlflow.genai.evaluate`` will get (a list of dicts or a DataFrame with
            ``inputs``, ``outputs``, ``expectations``): their cells are checked now, as the
            evaluator plugin checks its data, and the first bad one is refused naming its row
            (a :class:`RecordError`) before any judge call or run. MLflow hands a scorer one row
            at a time, without its position, so without ``data`` a bad cell is that row's error.
        run_metrics: ``"means"`` (each metric's mean and CI bounds are the run's MLflow
            metrics; the rest is in its statistics table) or ``"all"`` (every statistic of the
            run and of each slice, for charting them): :data:`~mlflow_rag_eval.keys.RUN_METRICS`.
        dataset_name: the golden set's name in the store (the run's dataset input; default: a
            dataset the caller named, else ``golden-<digest8>``, as on every route).
    """
    if dataset_name is not None and (not isinstance(dataset_name, str) or not dataset_name.strip()):
        raise ValueError(f"dataset_name must be a non-empty string, got {dataset_name!r}")
    slice_by = check_slice_by(slice_by, "slice_by")
    run_metrics = check_run_metrics(run_metrics)
    suite = prepare_suite(metrics, judge, set(ALL_FIELDS))
    if data is not None:
        check_rows(data, suite.metrics)
    scorers = [RagScorer(m, suite.judge if m.primitives else None, run_metrics=run_metrics) for m in suite.metrics]
    for scorer in scorers:
        scorer._slice_by = slice_by
        scorer._dataset_name = dataset_name
    return scorers


def check_rows(data, metrics: Iterable[Metric]) -> None:
    """The cells of genai-route rows, checked as the plugin route checks its data: each row
    read into a record (its answer and contexts when the row has ``outputs``; with a
    ``predict_fn`` they come later, and only the question and expectations are checked), then
    validated by each metric whose fields the row has.

    Raises:
        RecordError: the first bad cell, naming its row in ``data`` and its field.
    """
    import pandas as pd

    rows = data.to_dict("records") if isinstance(data, pd.DataFrame) else list(data)
    metrics = list(metrics)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise RecordError(f"a row is a mapping of inputs, outputs, expectations, got {type(row).__name__}",
                              row=i, column="inputs")
        has_outputs = row.get("outputs") is not None
        outputs = row.get("outputs") if has_outputs else {"answer": "(from predict_fn)", "contexts": []}
        try:
            record, fields, has_contexts = _row_record(row.get("inputs") or {}, outputs, row.get("expectations"), None)
            for metric in metrics if has_outputs and has_contexts else ():
                if all(f in fields for f in metric.requires):
                    metric.validate([record], ColumnMapping())
        except RecordError as exc:
            raise RecordError(exc.reason, row=i, column=exc.column) from None
