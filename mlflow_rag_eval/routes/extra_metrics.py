"""``extra_metrics`` for MLflow's default evaluator: one ``EvaluationMetric`` per metric.

    mlflow.models.evaluate(data=df, predictions="answer", model_type=None,
                           extra_metrics=rag_metrics(["faithfulness", "ndcg@10"]),
                           evaluator_config={"col_mapping": {"question": "query"}})

(``model_type=None``: MLflow's built-in question-answering type downloads tiktoken data and
fails offline.) The evaluation function's parameters are record fields (``question``,
``contexts``, ``reference``, ...), which MLflow fills from same-named columns or from its
``col_mapping``; ``predictions`` is the answer, and ``targets`` stands in for ``reference``.
Keys, per-row scores and aggregates are those of the ``rag`` evaluator: ``faithfulness/mean``,
``/ci_low``, ``/ci_high``, and with ``run_metrics="all"`` ``faithfulness/p10``,
``faithfulness/n_error``, ... The judge's identity is logged as the same params and tags;
MLflow's default evaluator has no hook for our lineage or statistics artifacts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pandas as pd

from mlflow_rag_eval._util.callers_state import callers_logging_kept
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.evaluation.suite import ALL_FIELDS, prepare_suite
from mlflow_rag_eval.judges import Judge
from mlflow_rag_eval.keys import check_run_metrics
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import records_from_frame

__all__ = ["rag_metric", "rag_metrics"]

_logger = logging.getLogger(__name__)


#: the tag naming this route on its runs: compare and the gate say why they cannot use them
ROUTE_TAG = "rag_eval.route"


def _log_judge_identity(result) -> None:
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return
    client = mlflow.MlflowClient()
    client.set_tag(run.info.run_id, ROUTE_TAG, "extra_metrics")
    if result.judge.kind == "none":
        return
    existing = client.get_run(run.info.run_id).data.params
    identity = {
        "rag_eval.judge": result.judge.name,
        "rag_eval.judge_fingerprint": result.judge.fingerprint,
        "rag_eval.prompts_version": result.judge.prompts_version,
    }
    for key, value in identity.items():
        if existing.get(key, value) != value:
            raise ValueError(f"run already has {key}={existing[key]!r}; one judge per run (got {value!r})")
        if key not in existing:
            client.log_param(run.info.run_id, key, value)
        client.set_tag(run.info.run_id, key, value)


def rag_metric(metric: str | Metric, judge: str | Judge | None = None, *, run_metrics: str = "means"):
    """An MLflow ``EvaluationMetric`` computing ``metric`` with ``judge`` (default: local);
    ``run_metrics`` as on every route (:data:`~mlflow_rag_eval.keys.RUN_METRICS`): ``"means"``
    aggregates the mean and its CI bounds, ``"all"`` every statistic."""
    from mlflow.metrics import MetricValue, make_metric

    check_run_metrics(run_metrics)
    # Checked as on every route: unknown name, missing extra, a judge that cannot perform it.
    suite = prepare_suite([metric], judge, set(ALL_FIELDS))
    (resolved,), judge_obj = suite.metrics, suite.judge

    @callers_logging_kept()
    def eval_fn(predictions, targets=None, question=None, contexts=None, context_ids=None,
                reference=None, relevant_ids=None, reference_contexts=None, answerable=None):
        columns = {"question": question, "answer": predictions, "contexts": contexts,
                   "context_ids": context_ids, "reference": reference if reference is not None else targets,
                   "relevant_ids": relevant_ids, "reference_contexts": reference_contexts,
                   "answerable": answerable}
        # MLflow probes each metric on the first row but passes model-output columns (e.g.
        # contexts) whole; row i of them belongs to prediction i, so cut them to match.
        n = len(predictions)
        frame = pd.DataFrame({k: list(v)[:n] for k, v in columns.items() if v is not None})
        present = {"answer", "contexts"} | {k for k in ("reference", "relevant_ids", "reference_contexts",
                                                        "answerable") if k in frame}
        # A bar per metric (MLflow computes them one by one), on the rule of every route.
        result = evaluate_records(records_from_frame(frame), [resolved], judge_obj,
                                  available_fields=present, progress=None)
        (metric_result,) = result.metrics
        _log_judge_identity(result)
        if metric_result.summary.n_error:  # MLflow's default evaluator would show only the numbers
            kind, count, example = metric_result.failures()[0]
            _logger.warning("rag eval: %s failed on %d of %d rows (%dx %s, e.g. %s)", metric_result.name,
                            metric_result.summary.n_error, len(metric_result.rows), count, kind, example[:200])
        prefix = f"{metric_result.key}/"
        aggregates = {k[len(prefix):]: v for k, v in metric_result.figures().run_metrics(run_metrics).items()}
        return MetricValue(
            scores=[row.value for row in metric_result.rows],
            justifications=[row.justification for row in metric_result.rows],
            aggregate_results=aggregates,
        )

    return make_metric(
        eval_fn=eval_fn,
        greater_is_better=resolved.greater_is_better,
        name=resolved.key,
        long_name=resolved.display_name,
        # no `version=`: MLflow would append it to every key (faithfulness/v1/mean)
        metric_metadata=resolved.spec(),
    )


def rag_metrics(metrics: Iterable[str | Metric], judge: str | Judge | None = None, *,
                run_metrics: str = "means") -> list:
    """``rag_metric`` for each metric, sharing one judge (one model load, one cache)."""
    check_run_metrics(run_metrics)
    suite = prepare_suite(metrics, judge, set(ALL_FIELDS))
    return [rag_metric(m, suite.judge, run_metrics=run_metrics) for m in suite.metrics]
