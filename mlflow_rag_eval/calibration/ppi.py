"""PPI++ estimates on evaluation runs: the judge's scores on every row of a run and the human
labels on some (HUMAN feedback on its traces, or a labels file), combined by
:func:`mlflow_rag_eval.stats.ppi.ppi_mean` and logged on the run as ``<metric>/ppi_*``."""

from __future__ import annotations

from mlflow_rag_eval.stats.ppi import PPIEstimate, ppi_mean

__all__ = ["labels_from_file", "ppi_from_run"]


def ppi_from_run(run_id: str, metric: str = "faithfulness", *, label_name: str | None = None,
                 labels=None, confidence: float = 0.95, log: bool = True, client=None) -> PPIEstimate:
    """The PPI++ estimate of ``metric``'s mean on an evaluation run, from its judge's scores
    and the human labels on its traces (see the module docstring), or in ``labels``.

    ``labels``: a labels file (CSV or JSONL) or DataFrame instead of the traces' feedback, for
    labels collected elsewhere (a spreadsheet, a labelling tool): a ``label`` column (yes/no or a
    number in [0, 1]) and, to find each row of the run, ``trace_id``, or ``question`` (with
    ``answer`` too when the run asks a question twice); :func:`labels_from_file`.

    Rows the judge failed on carry no score and are left out on both sides (a label on such a
    row cannot be paired); labels are read as :func:`~mlflow_rag_eval.calibration.labels.labels_from_run`
    reads them (yes/no or a number in [0, 1], averaged over reviewers).

    Where the labels cannot give an interval (fewer than
    :data:`~mlflow_rag_eval.stats.ppi.MIN_LABELS`, or all one value: see
    :mod:`mlflow_rag_eval.stats.ppi`), the estimate says why (``reason``; ``ci_low``/``ci_high``
    None) and no ``<metric>/ppi_ci_low``, ``/ppi_ci_high`` or ``/ppi_se`` is logged, so that a
    floor on them fails as missing and ``decide_on: ppi`` cannot decide, never passes on a
    zero-width interval. MLflow cannot delete a metric: where an earlier estimate on the run
    logged an interval, its keys are overwritten with NaN, which fails every floor and ceiling
    (and which :func:`~mlflow_rag_eval.stats.ppi.ppi_difference` reads as no interval), rather
    than leave a stale interval beside the new estimate.

    Raises:
        ValueError: the run holds no rag evaluation, or fewer than 2 labelled or no unlabelled
            scored rows.
    """
    import time

    import mlflow
    from mlflow.entities import Metric

    from mlflow_rag_eval.calibration.labels import labels_from_run
    from mlflow_rag_eval.keys import metric_key

    client = client or mlflow.MlflowClient()
    if labels is not None:
        rows = labels_from_file(run_id, metric, labels, client=client)
    else:
        rows, _ = labels_from_run(run_id, metric, label_name=label_name, client=client, unlabelled=True)
    scored = rows[rows["status"] == "scored"]
    labelled = scored[scored["label"].notna()]
    others = scored[scored["label"].isna()]
    if len(labelled) < 2 or others.empty:
        raise ValueError(f"run {run_id}: PPI needs at least 2 labelled and 1 unlabelled row the judge scored on "
                         f"{metric_key(metric)}; found {len(labelled)} and {len(others)} (label rows in the MLflow UI "
                         "or with mlflow.log_feedback, source HUMAN)")
    estimate = ppi_mean(labelled["label"].astype(float), labelled["score"].astype(float),
                        others["score"].astype(float), confidence=confidence)
    if log:
        key = metric_key(metric)
        now = int(time.time() * 1000)
        figures = {**estimate.as_metrics(key), f"{key}/ppi_lambda": estimate.lam,
                   f"{key}/ppi_confidence": confidence}
        if estimate.reason:  # no interval: one an earlier estimate logged must not stand beside this one
            logged = client.get_run(run_id).data.metrics
            figures.update({k: float("nan") for k in (f"{key}/ppi_ci_low", f"{key}/ppi_ci_high", f"{key}/ppi_se")
                            if k in logged})
        client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in figures.items()])
    return estimate


def labels_from_file(run_id: str, metric: str, labels, *, client=None):
    """The run's rows (``status``, ``score`` of ``metric``, ``label`` or None) with the labels of
    a file or DataFrame matched to them by ``trace_id`` or by ``question`` (+ ``answer``).

    Raises:
        ValueError: no ``label`` column or no key column, a label that is no yes/no or number in
            [0, 1], a label matching no row of the run or several (naming the label's row).
    """
    import pandas as pd

    from mlflow_rag_eval.calibration.labels import label_value, read_labels_file
    from mlflow_rag_eval.compare import load_evaluation
    from mlflow_rag_eval.keys import metric_key, score_column

    if not isinstance(labels, pd.DataFrame):
        labels = read_labels_file(labels)
    table = load_evaluation(run_id, client).table
    column = score_column(metric_key(metric))
    if column not in table:
        raise ValueError(f"run {run_id} has no {metric_key(metric)} scores")
    keys = [k for k in (["trace_id"] if "trace_id" in labels else ["question", "answer"]) if k in labels]
    if "label" not in labels or not keys or keys[0] not in table:
        raise ValueError("labels need a 'label' column and 'trace_id' or 'question' (+ 'answer') to find the run's "
                         f"rows; got columns {list(labels.columns)}")
    index: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(*(table[k].astype(str) for k in keys))):
        index.setdefault(key, []).append(i)
    found: dict[int, float] = {}
    for j, (key, value) in enumerate(zip(zip(*(labels[k].astype(str) for k in keys)), labels["label"])):
        where = f"labels row {j} ({', '.join(f'{k}={v!r}' for k, v in zip(keys, key))})"
        rows = index.get(key, [])
        if len(rows) != 1:
            raise ValueError(f"{where}: matches {len(rows)} rows of run {run_id}"
                             + (" (add an 'answer' column, or use trace_id)" if rows else ""))
        try:
            found[rows[0]] = label_value(value)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    scores = pd.to_numeric(table[column], errors="coerce")
    return pd.DataFrame({"score": scores, "status": ["scored" if pd.notna(v) else "unscored" for v in scores],
                         "label": [found.get(i) for i in range(len(table))]})
