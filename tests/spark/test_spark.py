"""The Spark route (``mlflow_rag_eval.spark.evaluate_spark``) against the single-process one.

Every row's result, every statistic (CIs with the same seed), the dataset digest, the worst
rows and the run's keys must equal what ``evaluate_records`` and ``log_evaluation`` give on the
same rows; a bad cell anywhere stops the run with the single-process error, global row
included, before any row is scored. One SparkSession (``local[2]``, loopback, no UI) serves
the session; Arrow batches of 300 rows make each engine block of 1,024 rows several batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

import mlflow  # noqa: E402
from conftest import figures_of  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from mlflow_rag_eval.evaluation.engine import evaluate_records  # noqa: E402
from mlflow_rag_eval.records import RecordError, dataset_digest, records_from_frame  # noqa: E402
from mlflow_rag_eval.report import worst_rows  # noqa: E402
from mlflow_rag_eval.tracking.run_logging import LINEAGE_FILE, TABLE_FILE, WORST_ROWS_FILE, log_evaluation  # noqa: E402

RETRIEVAL = ["hit@5", "mrr", "ndcg@10"]
SCRIPTED = ["faithfulness", "context_recall"]
#: the files of the 2,000 rows, the first the smallest (Spark reads files largest first)
PARTS = [300, 1000, 700]
FIELDS = {"answer", "contexts", "reference", "relevant_ids"}
WORDS = np.array("fare ticket train delay refund station platform bike seat pass child season route coast "
                 "valley lakes airport peak off-peak compensation claim".split())


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the test session: starting the JVM costs seconds."""
    from pyspark.sql import SparkSession

    # every service of the JVM on loopback; workers run this interpreter (PySpark reads the
    # variable, not the spark.pyspark.python setting, when it is started from Python)
    env = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    session = (
        SparkSession.builder.master("local[2]").appName("rag-eval-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "300")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def make_frame(n: int, seed: int = 0) -> pd.DataFrame:
    """Rows with every status: a relevant id at a random rank (or none retrieved), no graded
    relevance on every 7th row and no reference on every 11th (not applicable), answers taken
    from a passage (supported) or made up (not), repeated questions (the digest is a multiset)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        ids = [f"doc{int(j)}/{int(k)}" for j, k in zip(rng.integers(0, 5000, 5), rng.integers(0, 4, 5))]
        texts = [" ".join(rng.choice(WORDS, 12)) + "." for _ in ids]
        relevant = [{"id": ids[int(rng.integers(0, 5))] if rng.random() < 0.7 else "doc-missing/0", "grade": 2},
                    {"id": f"doc{int(rng.integers(0, 5000))}/0", "grade": 1}]
        answer = texts[int(rng.integers(0, 5))] if rng.random() < 0.6 else " ".join(rng.choice(WORDS, 9)) + "."
        rows.append({
            "question": f"question {i % 1500}: " + " ".join(rng.choice(WORDS, 6)) + "?",
            "answer": answer,
            "contexts": [{"id": d, "text": t} for d, t in zip(ids, texts)],
            "reference": None if i % 11 == 0 else texts[0],
            "relevant_ids": None if i % 7 == 0 else relevant,
        })
    return pd.DataFrame(rows)


def write_parts(frame: pd.DataFrame, folder: Path, sizes: list[int]) -> Path:
    """``frame`` as several Parquet files, the first the smallest: Spark packs files by size,
    largest first, so its own order is not the rows' order."""
    folder.mkdir()
    start = 0
    for k, size in enumerate(sizes):
        frame.iloc[start:start + size].to_parquet(folder / f"part-{k:05d}.parquet", index=False)
        start += size
    assert start == len(frame)
    return folder


@pytest.fixture(scope="module")
def rows_2000(tmp_path_factory):
    frame = make_frame(2000)
    path = write_parts(frame, tmp_path_factory.mktemp("data") / "rows", PARTS)
    read = pd.read_parquet(path)  # as the single-process route (the CLI) reads it: files in path order
    assert read["question"].tolist() == frame["question"].tolist()
    return read, path


@pytest.fixture(scope="module")
def rows_1200(tmp_path_factory):
    """Fewer rows for the local judge (~20 rows/s a side): the single process's first batch of
    1,024 rows still spans all three files, and Spark reads the largest first."""
    frame = make_frame(1200)
    path = write_parts(frame, tmp_path_factory.mktemp("data") / "rows", [200, 700, 300])
    return pd.read_parquet(path), path


def scored_rows(path: str) -> pd.DataFrame:
    out = pd.read_parquet(path).sort_values("row").reset_index(drop=True)
    assert out["row"].tolist() == list(range(len(out)))
    return out


def cells(column: pd.Series) -> list:
    """A text column's cells, None where missing (pandas reads a missing string as NaN)."""
    return [None if pd.isna(v) else v for v in column]


def assert_rows_equal(out: pd.DataFrame, single) -> None:
    """Per metric and row: the same value (1e-12), error, justification and status."""
    for m in single.metrics:
        scores = out[f"{m.key}/score"].to_numpy(dtype=float, na_value=np.nan)
        expected = np.array([r.value if r.status == "scored" else np.nan for r in m.rows], dtype=float)
        np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12, equal_nan=True, err_msg=m.name)
        assert cells(out[f"{m.key}/error"]) == [r.error for r in m.rows], m.name
        assert cells(out[f"{m.key}/justification"]) == [r.justification for r in m.rows], m.name
        skipped = [r.justification.removeprefix("not applicable: ") if r.status == "skipped" else None for r in m.rows]
        assert cells(out[f"{m.key}/skip_reason"]) == skipped, m.name


def assert_aggregates_equal(done, single) -> None:
    """The run's metrics (the means and CI bounds) and every statistic of its figures equal the
    single-process route's."""
    for got, expected in ((done.metrics, single.run_metrics()), (done.figures.aggregates(), single.aggregates())):
        assert set(got) == set(expected)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=0, abs=1e-12), key


def test_retrieval_rows_and_aggregates_equal_single_process(spark, rows_2000, tracking_uri, tmp_path):
    from mlflow_rag_eval.spark import evaluate_spark

    frame, path = rows_2000
    single = evaluate_records(records_from_frame(frame), RETRIEVAL, available_fields=FIELDS)
    assert {m.summary.n_skipped for m in single.metrics} != {0}  # not-applicable rows are in play
    with mlflow.start_run():
        done = evaluate_spark(path, RETRIEVAL, output=str(tmp_path / "scored"), max_table_rows=0)
    out = scored_rows(done.output)
    assert len(out) == len(frame)  # one output row per input row
    assert out["question"].tolist() == frame["question"].tolist()  # the global index is the files' order
    assert_rows_equal(out, single)
    assert_aggregates_equal(done, single)
    assert all(f"{m.key}/ci_low" in done.metrics for m in single.metrics)  # the CIs were compared, not skipped
    assert all(f"{m.key}/worst10_mean" in done.figures.aggregates() for m in single.metrics)  # and the worst deciles
    assert done.figures.dataset_digest == single.dataset_digest == dataset_digest(records_from_frame(frame))
    for a, b in zip(done.figures.metrics, single.metrics):
        assert a.skip_reasons() == b.skip_reasons() and a.failures() == b.failures()


def test_another_seed_gives_the_single_process_ci_of_that_seed(spark, rows_2000, tracking_uri, tmp_path):
    from mlflow_rag_eval.spark import evaluate_spark

    frame, path = rows_2000
    # a DataFrame of one file: its order is the file's, rows 300-1299 of the frame
    records = records_from_frame(frame.iloc[300:1300].reset_index(drop=True))
    with mlflow.start_run():
        done = evaluate_spark(spark.read.parquet(str(path / "part-00001.parquet")), ["mrr"], seed=7,
                              output=str(tmp_path / "scored"), max_table_rows=0)
    assert_aggregates_equal(done, evaluate_records(records, ["mrr"], available_fields=FIELDS, seed=7))
    seed_0 = evaluate_records(records, ["mrr"], available_fields=FIELDS).aggregates()
    assert done.metrics["mrr/ci_low"] != seed_0["mrr/ci_low"]  # the seed was used, not the default
    # a DataFrame has no path: its dataset input is MLflow's code source, named after the digest
    (logged,) = MlflowClient().get_run(done.run_id).inputs.dataset_inputs
    assert (logged.dataset.name, logged.dataset.source_type) == (f"golden-{dataset_digest(records)[:8]}", "code")
    assert logged.dataset.digest == done.figures.dataset_digest == dataset_digest(records)


def test_scripted_judge_rows_and_aggregates_equal_single_process(spark, rows_2000, tracking_uri, tmp_path):
    from mlflow_rag_eval.spark import evaluate_spark

    frame, _ = rows_2000
    path = tmp_path / "rows.parquet"  # one file, one partition: spread over both cores, in whole blocks
    frame.to_parquet(path, index=False)
    assert spark.read.parquet(str(path)).rdd.getNumPartitions() == 1
    single = evaluate_records(records_from_frame(frame), SCRIPTED, "scripted", available_fields=FIELDS)
    with mlflow.start_run():
        done = evaluate_spark(path, SCRIPTED, judge="scripted", output=str(tmp_path / "scored"), max_table_rows=0)
    out = scored_rows(done.output)
    assert_rows_equal(out, single)
    assert_aggregates_equal(done, single)
    assert done.figures.judge == single.judge
    assert done.figures.judge_usage["provider_calls"] + done.figures.judge_usage["cache_hits"] > 0


def test_local_judge_default_suite_equal_single_process(spark, rows_1200, tracking_uri, tmp_path):
    from mlflow_rag_eval.spark import evaluate_spark

    frame, path = rows_1200  # every row: the embedding batches of 1,024 rows span Spark's batches
    single = evaluate_records(records_from_frame(frame), None, "local:minilm-l6", available_fields=FIELDS)
    with mlflow.start_run():
        done = evaluate_spark(path, None, judge="local:minilm-l6", output=str(tmp_path / "scored"),
                              max_table_rows=0)
    assert [m.name for m in done.figures.metrics] == [m.name for m in single.metrics]
    assert done.figures.left_out == single.left_out  # the default suite drops the same metrics
    assert single.left_out and "answer_relevancy" in [m.name for m in single.metrics]
    assert_rows_equal(scored_rows(done.output), single)
    assert_aggregates_equal(done, single)
    assert done.figures.judge_usage["embedding_batches"] > 0  # summed over the workers


def _bad(frame: pd.DataFrame, row: int, column: str, value) -> pd.DataFrame:
    cells = frame[column].tolist()
    cells[row] = value
    return frame.assign(**{column: cells})



@pytest.mark.parametrize(
    ("cells", "metrics", "column", "files"),
    [
        # a bad cell in the last file (Spark reads it before the first): global row and column
        ({1700: ("question", "   ")}, SCRIPTED, "question", PARTS),
        # two bad cells, in two files: the lower row is the one named
        ({1950: ("contexts", [{"id": "a", "text": None}]), 450: ("relevant_ids", [{"id": "a", "grade": None}])},
         SCRIPTED, "relevant_ids", PARTS),
        # the same in one file, spread over both cores: the lower row still wins
        ({1950: ("contexts", [{"id": "a", "text": None}]), 450: ("relevant_ids", [{"id": "a", "grade": None}])},
         SCRIPTED, "relevant_ids", [2000]),
        # a metric refuses a row (hit@5 needs ids): after every record was read, as on one process
        ({1300: ("contexts", [{"id": None, "text": "no id"}])}, ["mrr", "hit@5"], "contexts", PARTS),
    ],
)
def test_bad_cell_raises_the_single_process_error_and_logs_nothing(spark, rows_2000, tracking_uri, tmp_path,
                                                                   cells, metrics, column, files):
    from mlflow_rag_eval.spark import evaluate_spark

    frame, _ = rows_2000
    for row, (col, value) in cells.items():
        frame = _bad(frame, row, col, value)
    path = write_parts(frame, tmp_path / "rows", files)
    with pytest.raises(RecordError) as expected:  # the single-process route on the same file
        evaluate_records(records_from_frame(pd.read_parquet(path)), metrics, "scripted", available_fields=FIELDS)
    output = tmp_path / "scored"
    with mlflow.start_run() as run, pytest.raises(RecordError) as raised:
        evaluate_spark(path, metrics, judge="scripted", output=str(output))
    assert (raised.value.row, raised.value.column) == (min(cells), column)
    assert str(raised.value) == str(expected.value)
    assert not output.exists()  # no row was scored
    data = MlflowClient().get_run(run.info.run_id).data
    assert data.metrics == {} and data.params == {}
    assert not [t for t in data.tags if t.startswith("rag_eval.") or t == "mlflow.runType"]
    assert MlflowClient().list_artifacts(run.info.run_id) == []


#: seal params whose value is a digest of what this run wrote (its lineage holds its own
#: timings; a run too large to hold its rows has no rows table to seal)
_RUN_DIGESTS = ("rag_eval.seal.rows_sha256", "rag_eval.seal.slices_sha256", "rag_eval.seal.lineage_sha256")


def _run_contents(run_id: str) -> tuple[dict, dict, set]:
    """A run's metrics, params (less its own digests) and tag keys."""
    client = MlflowClient()
    run = client.get_run(run_id)
    params = {k: v for k, v in run.data.params.items() if k not in _RUN_DIGESTS}
    return run.data.metrics, params, set(run.data.tags)


def _artifacts(run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for item in MlflowClient().list_artifacts(run_id, path):
        out |= _artifacts(run_id, item.path) if item.is_dir else {item.path}
    return out


def _text(run_id: str, path: str) -> str:
    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)).read_text()


@pytest.mark.parametrize("rows_logged", [True, False])
def test_run_holds_what_a_single_process_run_holds(spark, rows_2000, tracking_uri, tmp_path, rows_logged):
    from mlflow_rag_eval.spark import ROWS_ARTIFACT_DIR, ROWS_PATH_TAG, WORST_LIMIT, evaluate_spark

    frame, _ = rows_2000
    small = frame.iloc[:150].reset_index(drop=True)
    path = tmp_path / "small.parquet"
    small.to_parquet(path, index=False)
    metrics = RETRIEVAL + SCRIPTED
    result = evaluate_records(records_from_frame(small), metrics, "scripted", available_fields=FIELDS)
    with mlflow.start_run() as single_run:
        log_evaluation(result, single_run.info.run_id, log_traces=rows_logged)
    with mlflow.start_run() as spark_run:
        done = evaluate_spark(path, metrics, judge="scripted", output=str(tmp_path / "scored"),
                              max_table_rows=1000 if rows_logged else 100, log_traces=rows_logged)
    assert done.rows_logged is rows_logged
    single_metrics, single_params, single_tags = _run_contents(single_run.info.run_id)
    spark_metrics, spark_params, spark_tags = _run_contents(spark_run.info.run_id)
    assert set(spark_metrics) == set(single_metrics)
    for key, value in single_metrics.items():
        assert spark_metrics[key] == pytest.approx(value, rel=0, abs=1e-12), key
    assert spark_params == single_params  # judge identity, metrics, dataset digest
    (logged,) = MlflowClient().get_run(spark_run.info.run_id).inputs.dataset_inputs  # the file, by reference
    assert (logged.dataset.name, json.loads(logged.dataset.source)) == (
        f"golden-{single_params['rag_eval.dataset_digest'][:8]}", {"uri": str(path)})
    assert logged.dataset.digest == single_params["rag_eval.dataset_digest"]
    # the Spark run says where its rows are; without the table it announces the statistics table only
    assert spark_tags == single_tags | {ROWS_PATH_TAG}
    announced = json.loads(MlflowClient().get_run(spark_run.info.run_id).data.tags["mlflow.loggedArtifacts"])
    assert [a["path"] for a in announced] == (["eval_results_table.json"] if rows_logged else []) + [
        "rag_eval/statistics.json"]
    spark_files, single_files = _artifacts(spark_run.info.run_id), _artifacts(single_run.info.run_id)
    parquet = {f for f in spark_files if f.startswith(ROWS_ARTIFACT_DIR + "/")}
    assert parquet and all(f.endswith(".parquet") for f in parquet)
    assert spark_files - parquet == single_files - (set() if rows_logged else {TABLE_FILE})

    lineages = [json.loads(_text(r.info.run_id, LINEAGE_FILE)) for r in (single_run, spark_run)]
    for doc in lineages:
        for volatile in ("created_at", "usage", "timings_s"):
            doc.pop(volatile)
    assert lineages[0] == lineages[1]

    single_worst = json.loads(_text(single_run.info.run_id, WORST_ROWS_FILE))
    spark_worst = json.loads(_text(spark_run.info.run_id, WORST_ROWS_FILE))
    if rows_logged:  # the rows came back: the same table (but the trace ids) and worst rows
        tables = [json.loads(_text(r.info.run_id, TABLE_FILE)) for r in (single_run, spark_run)]
        for table in tables:
            at = table["columns"].index("trace_id")
            assert all(row.pop(at) for row in table["data"])  # each row has its trace
        assert tables[0] == tables[1]
        assert spark_worst == single_worst
        return
    assert spark_worst.pop("limit") == WORST_LIMIT
    assert spark_worst.keys() == single_worst.keys()
    for key, single_entry in single_worst["metrics"].items():
        entry = spark_worst["metrics"][key]
        listed = entry.pop("worst"), entry.pop("errors")
        expected = single_entry.pop("worst"), single_entry.pop("errors")
        assert listed == (expected[0][:WORST_LIMIT], expected[1][:WORST_LIMIT])
        assert entry == single_entry  # best, cut-off, note, counts
    report = _text(spark_run.info.run_id, "rag_eval/report.html")
    assert f"at most {WORST_LIMIT} per metric" in report and "distribution of faithfulness scores" in report
    assert "rows scored on both metrics" in report  # the quadrant, from the score columns


def test_worst_rows_of_large_runs_are_the_single_process_worst_first(spark, rows_2000, tracking_uri, tmp_path):
    from mlflow_rag_eval.spark import WORST_LIMIT, evaluate_spark

    frame, path = rows_2000
    result = evaluate_records(records_from_frame(frame), RETRIEVAL, available_fields=FIELDS)
    with mlflow.start_run() as run:
        evaluate_spark(path, RETRIEVAL, output=str(tmp_path / "scored"), max_table_rows=0)
    spark_worst = json.loads(_text(run.info.run_id, WORST_ROWS_FILE))["metrics"]
    for key, entry in worst_rows(result)["metrics"].items():
        assert len(entry["worst"]) > WORST_LIMIT  # the cap is exercised
        assert spark_worst[key]["worst"] == entry["worst"][:WORST_LIMIT]


def test_import_mlflow_rag_eval_does_not_import_pyspark():
    code = ("import sys, mlflow_rag_eval; assert 'evaluate_spark' in mlflow_rag_eval.__all__; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_an_unstable_row_index_is_refused():
    from mlflow_rag_eval.spark._collect import check_rows

    check_rows(np.arange(4), 4)
    for rows in (np.array([0, 1, 1, 3]), np.array([0, 1, 2]), np.array([1, 2, 3, 4])):
        with pytest.raises(RuntimeError, match="row index is not stable"):
            check_rows(rows, 4)


# -- slices, the error-rate limit ----------------------------------------------------------------
def _with_slice_fields(frame: pd.DataFrame) -> pd.DataFrame:
    """A ``difficulty`` column (one value per row) and a ``topics`` metadata key (a list: the
    slices overlap; missing on every 5th row)."""
    topics = [None if i % 5 == 0 else ["fares", "bikes"][: 1 + i % 2] for i in range(len(frame))]
    return frame.assign(difficulty=[["easy", "hard", "medium"][i % 3] for i in range(len(frame))],
                        metadata=[{"topics": t} for t in topics])


@pytest.mark.parametrize("rows_logged", [True, False])
def test_slices_equal_single_process(spark, rows_2000, tracking_uri, tmp_path, rows_logged):
    from mlflow_rag_eval.evaluation.slices import SLICES_FILE, attach_columns
    from mlflow_rag_eval.spark import evaluate_spark

    frame = _with_slice_fields(rows_2000[0])
    path = write_parts(frame, tmp_path / "rows", PARTS)
    slice_by = ["difficulty", "topics"]
    records = attach_columns(records_from_frame(frame), frame, slice_by)
    single = evaluate_records(records, RETRIEVAL, available_fields=FIELDS)
    with mlflow.start_run() as single_run:
        log_evaluation(single, single_run.info.run_id, log_traces=False, slice_by=slice_by, run_metrics="all")
    with mlflow.start_run() as spark_run:
        evaluate_spark(path, RETRIEVAL, output=str(tmp_path / "scored"), slice_by=slice_by,
                       max_table_rows=10_000 if rows_logged else 0, log_traces=False, run_metrics="all")
    single_metrics, single_params, _ = _run_contents(single_run.info.run_id)
    spark_metrics, spark_params, _ = _run_contents(spark_run.info.run_id)
    assert any("/slice/topics/" in k for k in single_metrics)  # the slices are in the comparison
    assert set(spark_metrics) == set(single_metrics)
    for key, value in single_metrics.items():
        assert spark_metrics[key] == pytest.approx(value, rel=0, abs=1e-12), key
    assert spark_params == single_params
    slices = [json.loads(_text(r.info.run_id, SLICES_FILE)) for r in (single_run, spark_run)]
    assert slices[0] == slices[1]
    from mlflow_rag_eval.evaluation.statistics import STATISTICS_FILE

    assert _text(single_run.info.run_id, STATISTICS_FILE) == _text(spark_run.info.run_id, STATISTICS_FILE)
    assert slices[1]["fields"]["topics"]["n_missing"] == len(range(0, 2000, 5))


def test_a_lower_is_better_worst10_mean_equals_single_process_on_the_run_and_its_slices(spark, rows_2000,
                                                                                       tracking_uri, tmp_path):
    """pollution@5's worst rows are its highest (a few rows repeat a parent): Spark passes the
    metric's direction as the single-process route does, for the run and for each slice."""
    from mlflow_rag_eval.evaluation.slices import attach_columns
    from mlflow_rag_eval.spark import evaluate_spark

    frame = _with_slice_fields(rows_2000[0])
    path = write_parts(frame, tmp_path / "rows", PARTS)
    metrics = ["mrr", "pollution@5"]
    records = attach_columns(records_from_frame(frame), frame, ["difficulty"])
    single = evaluate_records(records, metrics, available_fields=FIELDS)
    with mlflow.start_run() as single_run:
        log_evaluation(single, single_run.info.run_id, log_traces=False, slice_by=["difficulty"], run_metrics="all")
    with mlflow.start_run() as spark_run:
        evaluate_spark(path, metrics, output=str(tmp_path / "scored"), slice_by=["difficulty"], max_table_rows=0,
                       log_traces=False, run_metrics="all")
    single_metrics, spark_metrics = (_run_contents(r.info.run_id)[0] for r in (single_run, spark_run))
    worst = {k: v for k, v in single_metrics.items() if k.endswith("/worst10_mean")}
    assert {"pollution_at_5/worst10_mean", "pollution_at_5/slice/difficulty/hard/worst10_mean"} <= set(worst)
    assert single_metrics["pollution_at_5/worst10_mean"] > single_metrics["pollution_at_5/mean"]  # the highest rows
    assert {k: spark_metrics.get(k) for k in worst} == pytest.approx(worst, rel=0, abs=1e-12)


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [("difficulty", {"level": "hard"}, RecordError), ("nosuch", None, ValueError)],
    ids=["a dict is no slice value", "a field no row has"],
)
def test_a_bad_slice_field_is_refused_before_any_row_is_scored(spark, rows_2000, tracking_uri, tmp_path,
                                                               field, value, error):
    from mlflow_rag_eval.spark import evaluate_spark

    frame = _with_slice_fields(rows_2000[0])
    if value is not None:  # a column of one type: no value above row 1500, a dict from there on
        frame = frame.assign(**{field: [None] * 1500 + [value] * 500})
    path = write_parts(frame, tmp_path / "rows", [2000])  # one file: the files' column types must agree
    output = tmp_path / "scored"
    with pytest.raises(error) as raised:
        evaluate_spark(path, SCRIPTED, judge="scripted", output=str(output), slice_by=[field])
    if error is RecordError:
        assert (raised.value.row, raised.value.column) == (1500, field)
    else:
        assert "nosuch" in str(raised.value)
    assert not output.exists()
    assert mlflow.search_runs(output_format="list") == []  # no run was started


# -- an LLM judge behind a rate limit, on two executors --------------------------------------------
def _judged_rows(n: int) -> pd.DataFrame:
    passage = "Bikes travel for a flat fare of 5 euros per journey."
    return pd.DataFrame({"question": [f"What do bikes cost? ({i})" for i in range(n)],
                         "answer": [f"Row {i}: bikes cost 7 euros." for i in range(n)],
                         "contexts": [[passage]] * n})


def _claims_reply(request):
    from mlflow_rag_eval.testing.faults import Answer, completion

    claim = {"claim": "Bikes cost 7 euros.", "supported": False, "reason": "the passage says 5 euros",
             "evidence": "Bikes travel for a flat fare of 5 euros per journey.", "passage": 0}
    return Answer(body=completion(json.dumps({"claims": [claim]})))


def _row_of(request) -> int:
    import re

    return int(re.search(r"Row (\d+):", request.prompt).group(1))


@pytest.fixture
def judge_server():
    from mlflow_rag_eval.testing.faults import FaultyServer

    servers = []

    def start(respond):
        servers.append(FaultyServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_a_rate_limit_is_shared_by_the_executors_and_a_rerun_calls_nothing(spark, tracking_uri, judge_server,
                                                                            tmp_path):
    """5 requests/s set on the judge, 2 workers scoring at once: the server sees 5/s in total
    (each worker keeps to 2.5/s), not 10; a re-run of the finished job is answered by the
    workers' judge cache (shared here: one machine), with no request.

    What the shares guarantee: a worker's starts are at least 2/5 s apart, so any window of T
    seconds holds at most 5 T + 2 starts (one process: 5 T + 1); over the run, (n - 2) / span
    <= 5. A single second may hold 6: two workers' limiters are not in step."""
    import threading
    import time

    from mlflow_rag_eval.spark import evaluate_spark

    arrivals: list[tuple[float, int]] = []
    lock = threading.Lock()

    def respond(request):
        with lock:
            arrivals.append((time.monotonic(), _row_of(request)))
        return _claims_reply(request)

    server = judge_server(respond)
    n = 30
    data = spark.createDataFrame(_judged_rows(n))
    assert data.rdd.getNumPartitions() == 2  # rows 0-14 on one worker, 15-29 on the other
    judge = f"openai:/rate-test-{tmp_path.name}?base_url={server.base_url}&rate_limit=5&concurrency=8"
    with mlflow.start_run():
        done = evaluate_spark(data, ["faithfulness"], judge, output=str(tmp_path / "first"))
    assert done.figures.metrics[0].summary.n_scored == n
    assert len(arrivals) == n == done.figures.judge_usage["provider_calls"]
    times = sorted(t for t, _ in arrivals)
    span = times[-1] - times[0]
    rate = (n - 1) / span
    busiest = max(sum(t <= a < t + 1 for a in times) for t in times)
    print(f"\n[spark rate limit] {rate:.2f} requests/s over {span:.1f} s; busiest second {busiest}")
    # what the user set, in total (loopback jitter, a few ms, moves single arrivals: 2%)
    assert (n - 2) / span <= 5.0 * 1.02 and busiest <= 5 + 2
    # ... and both workers asked at once: each partition's requests span the other's
    first = [t for t, row in arrivals if row < 15]
    second = [t for t, row in arrivals if row >= 15]
    assert min(second) < max(first) and min(first) < max(second)
    assert rate >= 3.5  # the shares add up to the limit: not 2.5/s in all
    assert done.figures.judge.params["rate_limit"] == 5.0  # lineage: the user's limit

    with mlflow.start_run():
        again = evaluate_spark(data, ["faithfulness"], judge, output=str(tmp_path / "again"))
    assert len(arrivals) == n  # no request
    assert again.figures.judge_usage["provider_calls"] == 0 and again.figures.judge_usage["cache_hits"] == n
    assert again.metrics["faithfulness/mean"] == done.metrics["faithfulness/mean"]


def test_max_error_rate_fails_after_logging(spark, tracking_uri, judge_server, tmp_path):
    from mlflow_rag_eval.results import ErrorRateExceeded
    from mlflow_rag_eval.spark import evaluate_spark
    from mlflow_rag_eval.testing.faults import Answer

    def respond(request):  # row 3 is refused for good (a 400 is not retried)
        if _row_of(request) == 3:
            return Answer(status=400, body={"error": {"message": "refused"}})
        return _claims_reply(request)

    server = judge_server(respond)
    data = spark.createDataFrame(_judged_rows(10))
    judge = f"openai:/errors-{tmp_path.name}?base_url={server.base_url}"
    with mlflow.start_run() as run, pytest.raises(ErrorRateExceeded, match="faithfulness 10.0%"):
        evaluate_spark(data, ["faithfulness"], judge, output=str(tmp_path / "scored"), max_error_rate=0.05)
    metrics = figures_of(run.info.run_id)
    assert metrics["faithfulness/n_error"] == 1 and metrics["faithfulness/n_scored"] == 9  # logged first
    with mlflow.start_run():
        done = evaluate_spark(data, ["faithfulness"], judge, output=str(tmp_path / "again"), max_error_rate=0.1)
    assert done.figures.metrics[0].summary.n_error == 1


def test_cli_evaluate_on_spark_logs_the_run_the_single_process_cli_logs(spark, rows_2000, tracking_uri, tmp_path):
    from click.testing import CliRunner

    from mlflow_rag_eval.cli import main

    frame = _with_slice_fields(rows_2000[0].iloc[:300].reset_index(drop=True))
    folder = write_parts(frame, tmp_path / "rows", [100, 200])  # a folder of Parquet files, as Spark writes
    args = ["evaluate", "--data", str(folder), "--metrics", "hit@5,mrr", "--slice-by", "difficulty", "--no-traces",
            "--run-metrics", "all"]
    runner = CliRunner()
    single = runner.invoke(main, [*args, "--run-name", "one-process"])
    on_spark = runner.invoke(main, [*args, "--run-name", "on-spark", "--spark", "local[2]",
                                    "--output", str(tmp_path / "scored")])
    assert single.exit_code == 0 and on_spark.exit_code == 0, (single.output, on_spark.output)
    runs = [MlflowClient().get_run(r.stdout.strip().splitlines()[-1]) for r in (single, on_spark)]
    assert [r.info.run_name for r in runs] == ["one-process", "on-spark"]
    assert runs[1].data.tags["rag_eval.rows_path"] == str(tmp_path / "scored")
    assert "hit_at_5/slice/difficulty/hard/mean" in runs[1].data.metrics
    assert runs[1].data.metrics == pytest.approx(runs[0].data.metrics, rel=0, abs=1e-12)
    assert spark.sparkContext._jsc is not None  # the caller's session is left running
    # both name the folder as their dataset input, with the same digest
    (one,), (other,) = (r.inputs.dataset_inputs for r in runs)
    assert (one.dataset.name, one.dataset.digest, one.dataset.source) == \
        (other.dataset.name, other.dataset.digest, other.dataset.source)
    digest = runs[1].data.params["rag_eval.dataset_digest"]
    assert one.dataset.name == f"golden-{digest[:8]}" and one.dataset.digest == digest

    frame.loc[250, "question"] = "  "
    bad = write_parts(frame, tmp_path / "bad", [300])
    refused = runner.invoke(main, ["evaluate", "--data", str(bad), "--spark", "local[2]", "--metrics", "mrr"])
    assert refused.exit_code == 2 and "row 250, column 'question'" in refused.output
    assert len(mlflow.search_runs(output_format="list")) == 2  # no third run


def test_a_cluster_needs_an_output_every_executor_can_write(spark, rows_2000, tracking_uri, monkeypatch):
    from mlflow_rag_eval.spark import _run, evaluate_spark

    monkeypatch.setattr(_run, "_on_one_machine", lambda session: False)
    with pytest.raises(ValueError, match="on a cluster .* give output="):
        evaluate_spark(rows_2000[1], ["mrr"])
    assert mlflow.search_runs(output_format="list") == []


def test_cli_on_a_local_master_starts_its_workers_with_its_own_interpreter(rows_2000, tmp_path):
    """``.venv/bin/mlflow-rag-eval evaluate --spark local[1]`` from a shell without the venv
    activated: Spark's workers would start the first ``python3`` on PATH, which lacks pandas
    (the test puts one that exits at once first on PATH); they run the CLI's interpreter."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'not the venv python' >&2\nexit 7\n")
    (fake / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env.update(PATH=f"{fake}:{os.environ['PATH']}", SPARK_LOCAL_IP="127.0.0.1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    cli = Path(sys.executable).with_name("mlflow-rag-eval")
    proc = subprocess.run([str(cli), "evaluate", "--data", str(rows_2000[1]), "--spark", "local[1]",
                           "--metrics", "mrr", "--no-traces", "--output", str(tmp_path / "scored")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(proc.stdout.strip().splitlines()[-1])
    assert 0 < run.data.metrics["mrr/mean"] <= 1
