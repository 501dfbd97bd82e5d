"""Per-slice results: membership, statistics equal to an evaluation of the slice alone, MLflow
keys a real store accepts, the rag evaluator's slice_by, compare's per-slice table and the
gate's per-slice limits.

No judge: retrieval metrics (mrr, hit@5) score from ids, so nothing loads a model.
"""

from __future__ import annotations

import json
import os

import mlflow
import numpy as np
import pandas as pd
import pytest

from mlflow_rag_eval import keys
from mlflow_rag_eval.compare import compare_runs
from mlflow_rag_eval.evaluation.engine import evaluate_records, no_judge
from mlflow_rag_eval.evaluation.result import EvaluationResult
from mlflow_rag_eval.evaluation.slices import (
    MAX_SLICES_PER_FIELD,
    SLICES_FILE,
    check_slice_by,
    compute_slices,
    slice_members,
)
from mlflow_rag_eval.gate import PolicyError, load_policy
from mlflow_rag_eval.gate.checks import slice_checks
from mlflow_rag_eval.records import Context, RagRecord, RecordError, records_from_frame
from mlflow_rag_eval.results import MetricResult, RowResult, summarize

METRICS = ["mrr", "hit@5"]
RELEVANT = {"id": "p1", "text": "Bikes travel for a flat fare of 5 euros per journey."}
OTHERS = [{"id": "p2", "text": "Dogs travel free."}, {"id": "p3", "text": "Cats travel in a carrier."}]
DIFFICULTY = ["easy", "hard", "medium", None]
TAGS = [["billing", "refunds"], ["billing"], [], ["refunds", "refunds"], None, ["travel"]]


def _frame(n: int = 24, *, first_every: int = 3) -> pd.DataFrame:
    """Golden rows with a ``difficulty`` column and ``tags`` in the metadata; the relevant
    passage is ranked first on every ``first_every``-th row and last on the others."""
    rows = []
    for i in range(n):
        first = i % first_every == 0
        rows.append({
            "question": f"Question {i}: how much does a bike cost?",
            "answer": "Bikes travel for a flat fare of 5 euros per journey.",
            "contexts": [RELEVANT, *OTHERS] if first else [*OTHERS, RELEVANT],
            "reference": "A bike costs 5 euros.",
            "relevant_ids": ["p1"] if i % 5 else None,  # every fifth row: not judged, skipped
            "difficulty": DIFFICULTY[i % 4],
            "metadata": {"tags": TAGS[i % 6], "source": "faq"},
        })
    return pd.DataFrame(rows)


def _evaluate(data: pd.DataFrame, slice_by=("difficulty", "tags"), **config) -> str:
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag",
                               evaluator_config={"metrics": METRICS, "slice_by": list(slice_by),
                                                 "log_traces": False, **config})
    return run.info.run_id


def _hand_result() -> EvaluationResult:
    """Records with metadata, and a metric with scored, failed and not-applicable rows."""
    rng = np.random.default_rng(3)
    n = 40
    records = [RagRecord(question=f"q{i}", answer="a", contexts=(Context("c", id="d"),),
                         metadata={"difficulty": DIFFICULTY[i % 4], "tags": TAGS[i % 6], "bucket": float(i % 3)})
               for i in range(n)]
    rows = []
    for i in range(n):
        if i % 11 == 4:
            rows.append(RowResult.failed("ParseError: not JSON"))
        elif i % 7 == 2:
            rows.append(RowResult.not_applicable("no reference"))
        else:
            rows.append(RowResult.scored(float(np.round(rng.uniform(), 2))))
    metrics = [MetricResult("faithfulness", {"name": "faithfulness"}, tuple(rows)),
               MetricResult("ndcg@10", {"name": "ndcg@10"}, tuple(RowResult.scored(1.0 - i / n) for i in range(n)))]
    return EvaluationResult(records=records, metrics=metrics, judge=no_judge(), dataset_digest="d")


# -- the must-show: a slice's figures are those of its rows alone ------------------------------
def test_slice_aggregates_equal_summarize_on_the_slice_rows_alone():
    result = _hand_result()
    table = compute_slices(result, ["difficulty", "tags", "bucket"])
    for field in table.fields:
        expected_values = set()
        for record in result.records:  # membership written out by hand, not by slice_members
            value = record.metadata[field.field]
            values = value if isinstance(value, list) else [value]
            expected_values |= {str(int(v)) if isinstance(v, float) else v for v in values if v is not None}
        assert {s.value for s in field.slices} == expected_values
        for s in field.slices:
            def holds(record):
                value = record.metadata[field.field]
                values = value if isinstance(value, list) else [value]
                return s.value in [str(int(v)) if isinstance(v, float) else v for v in values]

            rows = [i for i, r in enumerate(result.records) if holds(r)]
            assert list(s.rows) == rows
            for m in result.metrics:
                alone = summarize([m.rows[i] for i in rows])
                assert s.summaries[m.key] == alone  # every statistic, the CI included, exactly
                logged = {k.rsplit("/", 1)[1]: v for k, v in table.as_metrics().items()
                          if k.startswith(keys.slice_prefix(m.key, field.key, s.key) + "/")}
                assert logged == {k.rsplit("/", 1)[1]: v for k, v in alone.as_metrics(m.key).items()}


def test_a_slices_worst10_mean_is_the_worst_tenth_of_its_own_rows_in_the_metrics_direction():
    """A lower-is-better metric's worst rows are its highest, on each slice as on the run."""
    result = _hand_result()
    pollution = MetricResult("pollution@3", {}, tuple(RowResult.scored(round(i * 0.37 % 1, 2)) for i in range(40)),
                             greater_is_better=False)
    table = compute_slices(result.records, ["difficulty"], [*result.metrics, pollution])
    for field in table.fields:
        for s in field.slices:
            for m in (*result.metrics, pollution):
                values = sorted(m.rows[i].value for i in s.rows if m.rows[i].status == "scored")
                k = -(-len(values) // 10)
                worst = values[-k:] if m is pollution else values[:k]
                expected = sum(worst) / k
                assert s.summaries[m.key].worst10_mean == pytest.approx(expected, abs=1e-12)
                key = keys.slice_prefix(m.key, field.key, s.key) + "/worst10_mean"
                assert table.as_metrics()[key] == pytest.approx(expected, abs=1e-12)
                assert table.as_dict()["fields"][field.field]["slices"][s.value]["metrics"][m.key][
                    "worst10_mean"] == pytest.approx(expected, abs=1e-12)
    hard = next(s for s in table.fields[0].slices if s.value == "hard")
    assert hard.summaries[pollution.key].worst10_mean > hard.summaries[pollution.key].mean  # the highest, not lowest


def test_a_slice_evaluated_alone_gives_the_same_figures():
    """End to end through the engine: the slice of an evaluation vs an evaluation of the
    slice's rows (a new evaluation, its own records)."""
    frame = _frame()
    records = records_from_frame(frame.drop(columns=["difficulty"]))
    from mlflow_rag_eval.evaluation.slices import attach_columns

    records = attach_columns(records, frame, ["difficulty"])
    table = compute_slices(evaluate_records(records, METRICS, progress=False), ["difficulty", "tags"])
    hard = next(s for f in table.fields for s in f.slices if (f.field, s.value) == ("difficulty", "hard"))
    alone = evaluate_records(records_from_frame(frame[frame.difficulty == "hard"].drop(columns=["difficulty"])),
                             METRICS, progress=False)
    assert {m.key: m.summary for m in alone.metrics} == dict(hard.summaries)
    refunds = next(s for f in table.fields for s in f.slices if (f.field, s.value) == ("tags", "refunds"))
    mask = [isinstance(t, list) and "refunds" in t for t in (m["tags"] for m in frame.metadata)]
    alone = evaluate_records(records_from_frame(frame[mask].drop(columns=["difficulty"])), METRICS, progress=False)
    assert {m.key: m.summary for m in alone.metrics} == dict(refunds.summaries)


# -- which rows are in which slice --------------------------------------------------------------
def test_a_list_value_counts_the_row_in_each_element_and_missing_values_in_none():
    records = [RagRecord("q", "a", metadata=m) for m in (
        {"tags": ["a", "b"]}, {"tags": ["b", "b"]}, {"tags": []}, {"tags": None}, {"tags": float("nan")},
        {"tags": ""}, {}, {"tags": ("c", None)}, {"tags": np.array(["a"])}, {"tags": pd.NA},
    )]
    (by_value, missing), = slice_members(records, ["tags"]).values()
    assert by_value == {"a": [0, 8], "b": [0, 1], "c": [7]}  # a repeated tag counts once
    assert missing == 6  # [], None, NaN, "", no key, pd.NA
    table = compute_slices(records, ["tags"], [MetricResult("m", {}, tuple(RowResult.scored(1.0) for _ in records))])
    (field,) = table.fields
    assert field.n_missing == 6 and sum(len(s.rows) for s in field.slices) == 5  # overlapping: 0 is in a and b
    assert table.as_dict()["fields"]["tags"]["n_missing"] == 6


def test_values_are_labelled_as_text():
    records = [RagRecord("q", "a", metadata={"level": v}) for v in (3, 3.0, np.int64(3), 2.5, True, "3")]
    (by_value, _), = slice_members(records, ["level"]).values()
    assert by_value == {"2.5": [3], "3": [0, 1, 2, 5], "True": [4]}  # 3.0 is 3: pandas makes ints floats


def test_a_value_that_is_no_json_scalar_is_refused_naming_its_row():
    """Its str() would be a label that changes every run (``<object object at 0x7f...>``)."""
    class Tag:
        pass

    for value in (Tag(), object(), b"bytes", [Tag()]):
        records = [RagRecord("q", "a", metadata={"tag": "x"}), RagRecord("q", "a", metadata={"tag": value})]
        with pytest.raises(RecordError, match="is not a slice value") as info:
            slice_members(records, ["tag"])
        assert (info.value.row, info.value.column) == (1, "tag")


def test_unusable_fields_and_values_are_refused():
    records = [RagRecord("q", "a", metadata={"tags": ["x"]}), RagRecord("q", "a", metadata={"tags": {"k": 1}})]
    with pytest.raises(RecordError, match="a dict is not a slice value") as info:
        slice_members(records, ["tags"])
    assert (info.value.row, info.value.column) == (1, "tags")
    with pytest.raises(ValueError, match="'difficulty' is in no row's metadata .*'tags'"):
        slice_members(records[:1], ["difficulty"])
    many = [RagRecord("q", "a", metadata={"id": i}) for i in range(MAX_SLICES_PER_FIELD + 1)]
    with pytest.raises(ValueError, match=f"has {MAX_SLICES_PER_FIELD + 1} values"):
        slice_members(many, ["id"])
    for bad in ("tags", [""], ["a", "a"], [3], {"tags": 1}):
        with pytest.raises(ValueError, match="slice_by"):
            check_slice_by(bad)
    assert check_slice_by(None) == () and check_slice_by(["a", "b"]) == ("a", "b")


# -- keys ----------------------------------------------------------------------------------------
NASTY = ["hard", "Hard", "a b", "a_b", ".", "..", "x" * 300, "x" * 299 + "y", "café/ü:=?", "multi-hop", "1/2",
         "über", "uber"]


def test_segments_are_safe_distinct_and_stable():
    segments = keys.slice_segments(NASTY)
    assert len(set(s.lower() for s in segments.values())) == len(NASTY)  # none merge, case aside
    assert segments["multi-hop"] == "multi-hop" and segments["1/2"] == "1_2" and segments["über"] == "_ber"
    assert segments["hard"] != "hard" and segments["hard"].startswith("hard-")  # Hard/hard: one file on macOS
    assert segments["a b"].startswith("a_b-") and segments["a_b"].startswith("a_b-")
    assert all(len(s) <= keys.SEGMENT_LIMIT and s.strip(".") for s in segments.values())
    assert segments["x" * 300] != segments["x" * 299 + "y"]  # cut, but apart
    assert keys.slice_segments(reversed(NASTY)) == segments  # not an accident of order
    assert keys.slice_segments(["easy", "hard"]) == {"easy": "easy", "hard": "hard"}  # readable when clean


def test_slice_keys_are_accepted_by_real_mlflow_stores(tmp_path, monkeypatch):
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, _validate_metric_name

    assert keys.MAX_KEY_LENGTH == MAX_ENTITY_KEY_LENGTH
    records = [RagRecord("q", "a", metadata={"weird field/name=1": v}) for v in NASTY]
    metric = MetricResult("ndcg@10", {}, tuple(RowResult.scored(i / len(NASTY)) for i in range(len(NASTY))))
    flat = compute_slices(records, ["weird field/name=1"], [metric]).as_metrics()
    assert len(flat) == len(NASTY) * 6  # mean, median, p10, worst10_mean, n_scored, n_error: one row, no CI
    for key in flat:
        _validate_metric_name(key)
        assert keys.is_slice_key(key) and len(key) <= MAX_ENTITY_KEY_LENGTH
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # keys are file paths there
    for uri in (f"file://{tmp_path / 'mlruns'}", f"sqlite:///{tmp_path / 'mlflow.db'}"):
        client = mlflow.MlflowClient(uri)
        run = client.create_run(client.create_experiment("slices", artifact_location=str(tmp_path / "art")))
        from mlflow.entities import Metric

        client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in flat.items()])
        assert client.get_run(run.info.run_id).data.metrics == flat


# -- the rag evaluator ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store (artifacts beside it) for the module's runs, which the tests share."""
    home = tmp_path_factory.mktemp("slices_store")
    saved = os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    experiment_id = mlflow.MlflowClient().create_experiment("slices", artifact_location=str(home / "artifacts"))
    mlflow.set_experiment(experiment_id=experiment_id)  # exports MLFLOW_EXPERIMENT_ID: restored below
    yield home
    if mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(None)
    os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
    if saved is not None:
        os.environ["MLFLOW_EXPERIMENT_ID"] = saved


@pytest.fixture(scope="module")
def sliced_runs(store):
    """Two sliced runs on the same golden rows, ranking the relevant passage first on
    different rows (so their slice means differ); every statistic of each slice is a run metric
    (``run_metrics="all"``), so that the tests below compare them all."""
    return _evaluate(_frame(first_every=2), run_metrics="all"), _evaluate(_frame(first_every=3), run_metrics="all")


def test_evaluator_config_slice_by_logs_each_slice_as_its_rows_alone(store, sliced_runs):
    run_id = sliced_runs[1]
    frame = _frame()
    data = mlflow.MlflowClient().get_run(run_id).data
    assert json.loads(data.params["rag_eval.slice_by"]) == ["difficulty", "tags"]
    doc = json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/{SLICES_FILE}"))
    assert list(doc["fields"]["difficulty"]["slices"]) == ["easy", "hard", "medium"]
    assert doc["fields"]["difficulty"]["n_missing"] == 6 and doc["fields"]["tags"]["n_missing"] == 8  # None, []
    subsets = {
        ("difficulty", "hard"): frame[frame.difficulty == "hard"],
        ("tags", "billing"): frame[[isinstance(m["tags"], list) and "billing" in m["tags"] for m in frame.metadata]],
    }
    for (field, value), rows in subsets.items():
        alone = evaluate_records(records_from_frame(rows.drop(columns=["difficulty"])), METRICS,
                                 progress=False).aggregates()
        logged = {k.replace(f"/slice/{field}/{value}", ""): v for k, v in data.metrics.items()
                  if f"/slice/{field}/{value}/" in k}
        assert logged == pytest.approx(alone, rel=1e-12) and set(logged) == set(alone)
        stats = doc["fields"][field]["slices"][value]
        assert stats["n_rows"] == len(rows) and stats["metrics"]["mrr"]["mean"] == pytest.approx(alone["mrr/mean"])
    overall = {k: v for k, v in data.metrics.items() if not keys.is_slice_key(k)}
    assert overall == pytest.approx(evaluate_records(records_from_frame(frame.drop(columns=["difficulty"])),
                                                     METRICS, progress=False).aggregates())
    report = mlflow.artifacts.load_text(f"runs:/{run_id}/rag_eval/report.html")
    assert '<h2 id="slices">Slices</h2>' in report and "<h3>difficulty</h3>" in report and "billing" in report


def test_an_unsliced_run_holds_no_slices(store):
    run_id = _evaluate(_frame(6), slice_by=())
    data = mlflow.MlflowClient().get_run(run_id).data
    assert "rag_eval.slice_by" not in data.params and not any(keys.is_slice_key(k) for k in data.metrics)
    assert 'id="slices"' not in mlflow.artifacts.load_text(f"runs:/{run_id}/rag_eval/report.html")


@pytest.mark.parametrize("slice_by, message", [
    ("difficulty", "must be a list of field names"),
    (["difficulty", "difficulty"], "names 'difficulty' twice"),
    (["level"], "'level' is neither a column .* nor a metadata key .*'source', 'tags'"),
    (["source", "source_col"], "'source' is both a column and a metadata key"),
])
def test_a_bad_slice_by_is_refused_before_anything_is_logged(store, slice_by, message):
    frame = _frame(4).assign(source="web", source_col=1)
    with mlflow.start_run() as run:
        with pytest.raises(ValueError, match=message):
            mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                                   evaluator_config={"metrics": METRICS, "slice_by": slice_by, "log_traces": False})
    data = mlflow.MlflowClient().get_run(run.info.run_id).data
    assert not data.metrics and "rag_eval.judge" not in data.params


# -- compare -------------------------------------------------------------------------------------
def test_compare_shows_per_slice_means_of_both_runs_and_the_delta(store, sliced_runs):
    a, b = sliced_runs
    comparison = compare_runs(a, b, log_to=None)
    by = {(s.field, s.value, s.metric): s for s in comparison.slices}
    doc_a = json.loads(mlflow.artifacts.load_text(f"runs:/{a}/{SLICES_FILE}"))
    doc_b = json.loads(mlflow.artifacts.load_text(f"runs:/{b}/{SLICES_FILE}"))
    hard = by[("difficulty", "hard", "mrr")]
    mean_a = doc_a["fields"]["difficulty"]["slices"]["hard"]["metrics"]["mrr"]["mean"]
    mean_b = doc_b["fields"]["difficulty"]["slices"]["hard"]["metrics"]["mrr"]["mean"]
    assert (hard.mean_a, hard.mean_b, hard.delta) == (mean_a, mean_b, mean_b - mean_a) and mean_a != mean_b
    assert {k[:2] for k in by} == {("difficulty", v) for v in ("easy", "hard", "medium")} | {
        ("tags", v) for v in ("billing", "refunds", "travel")}
    text = comparison.to_text()
    assert "per slice" in text and f"{hard.delta:+.3f}" in text
    assert comparison.as_dict()["slices"][0].keys() >= {"field", "value", "metric", "mean_a", "mean_b", "delta"}
    assert "Per slice" in comparison.to_html()
    from click.testing import CliRunner

    from mlflow_rag_eval.cli import main

    out = CliRunner().invoke(main, ["compare", a, b, "--no-log"])
    assert out.exit_code == 0 and "per slice" in out.output and "difficulty  hard" in out.output


def test_compare_shows_no_slices_unless_both_runs_have_the_field(store, sliced_runs):
    only_tags = _evaluate(_frame(), slice_by=["tags"])
    comparison = compare_runs(sliced_runs[0], only_tags, log_to=None)
    assert comparison.slices and {s.field for s in comparison.slices} == {"tags"}
    unsliced = _evaluate(_frame(), slice_by=())
    comparison = compare_runs(sliced_runs[0], unsliced, log_to=None)
    assert comparison.slices == [] and "per slice" not in comparison.to_text()


# -- the gate's per-slice limits -------------------------------------------------------------
def _doc(**slices) -> dict:
    """A slices.json with one field ``difficulty`` and the given {value: mrr stats}."""
    return {"slice_by": ["difficulty"], "fields": {"difficulty": {"key": "difficulty", "n_missing": 0, "slices": {
        value: {"key": value, "n_rows": stats["n_scored"], "metrics": {"mrr": stats}}
        for value, stats in slices.items()}}}}


def _policy(**limits):
    return load_policy({"slice_min_scored_rows": 5, "calibration": {"required": False}, **limits})


def test_slice_floors_pass_and_fail_per_slice():
    doc = _doc(easy={"mean": 0.9, "n_scored": 10, "n_error": 0}, hard={"mean": 0.4, "n_scored": 10, "n_error": 0})
    limits = {"difficulty": {"hard": {"mrr/mean": 0.5}, "easy": {"mrr/mean": 0.5}}}
    checks = slice_checks(doc, _policy(slice_floors=limits))
    by = {(c.slice, c.kind): c for c in checks}
    assert by[("difficulty=easy", "floor mean")].passed and by[("difficulty=easy", "min_scored_rows")].passed
    failed = by[("difficulty=hard", "floor mean")]
    assert not failed.passed and failed.value == 0.4 and failed.label == "floor mean [difficulty=hard]"
    assert failed.reason == "mrr/mean on slice difficulty=hard = 0.400 < floor 0.5 (n=10)"


def test_every_slice_star_and_a_named_override():
    doc = _doc(easy={"mean": 0.9, "n_scored": 10, "n_error": 0}, hard={"mean": 0.4, "n_scored": 10, "n_error": 0})
    policy = _policy(slice_floors={"difficulty": {"*": {"mrr/mean": 0.5}, "hard": {"mrr/mean": 0.3}}})
    floors = {c.slice: c for c in slice_checks(doc, policy) if c.kind == "floor mean"}
    assert set(floors) == {"difficulty=easy", "difficulty=hard"}
    assert floors["difficulty=hard"].passed and floors["difficulty=hard"].threshold == 0.3  # the named one replaces *
    assert floors["difficulty=easy"].threshold == 0.5


@pytest.mark.parametrize("doc, limits, reason", [
    (None, {"difficulty": {"hard": {"mrr/mean": 0.5}}}, "the run was not sliced by 'difficulty' (sliced by: none)"),
    ({"slice_by": ["tags"], "fields": {"tags": {"slices": {}}}}, {"difficulty": {"*": {"mrr/mean": 0.5}}},
     "the run was not sliced by 'difficulty' (sliced by: tags)"),
    (_doc(easy={"mean": 0.9, "n_scored": 10, "n_error": 0}), {"difficulty": {"hard": {"mrr/mean": 0.5}}},
     "the run has no slice difficulty=hard (its values: easy)"),
    (_doc(), {"difficulty": {"*": {"mrr/mean": 0.5}}}, "the run has no slice of 'difficulty': no row has a value"),
    (_doc(hard={"mean": 0.9, "n_scored": 1, "n_error": 0}), {"difficulty": {"hard": {"mrr/ci_low": 0.5}}},
     "mrr/ci_low on slice difficulty=hard was not logged (the CI is not computable"),
    (_doc(hard={"n_scored": 0, "n_error": 3}), {"difficulty": {"hard": {"mrr/mean": 0.5}}},
     "was not logged (no row scored)"),
])
def test_a_slice_limit_never_passes_by_absence(doc, limits, reason):
    checks = slice_checks(doc, _policy(slice_floors=limits))
    assert checks and any(not c.passed and reason in c.reason for c in checks), [c.reason for c in checks]


def test_a_slice_with_too_few_scored_rows_fails_and_says_n():
    doc = _doc(hard={"mean": 0.9, "n_scored": 4, "n_error": 0})
    policy = load_policy({"min_scored_rows": 6, "slice_floors": {"difficulty": {"hard": {"mrr/mean": 0.5}}}})
    (rows,) = [c for c in slice_checks(doc, policy) if c.kind == "min_scored_rows"]
    assert not rows.passed and rows.value == 4 and rows.threshold == 6  # default: min_scored_rows
    assert "4 scored rows < 6" in rows.reason
    relaxed = load_policy({"min_scored_rows": 6, "slice_min_scored_rows": 3,
                           "slice_floors": {"difficulty": {"hard": {"mrr/mean": 0.5}}}})
    assert all(c.passed for c in slice_checks(doc, relaxed))


def test_slice_limits_in_the_policy():
    policy = load_policy({"slice_floors": {"difficulty": {"hard": {"ndcg@10/mean": 0.6}, 3: {"mrr/p10": 0.1}},
                                           "tags": {"*": {"faithfulness/mean": 0.5}}},
                          "slice_ceilings": {"tags": {"refunds": {"false_abstention/mean": 0.2}}}})
    assert policy.slice_floors["difficulty"] == {"hard": {"ndcg_at_10/mean": 0.6}, "3": {"mrr/p10": 0.1}}
    assert policy.gated_metrics == ["ndcg_at_10", "mrr", "faithfulness", "false_abstention"]
    assert policy.min_slice_rows == 30
    plain = {"require_metrics": ["faithfulness"]}
    assert "slice_floors" not in load_policy(plain).as_dict()  # old policies keep their hash
    assert load_policy({**plain, "slice_floors": {"d": {"h": {"faithfulness/mean": 0.5}}}}).policy_hash != \
        load_policy(plain).policy_hash
    assert load_policy({"slice_floors": {"d": {"h": {"faithfulness/mean": 0.5}}}}).gated_metrics == ["faithfulness"]


@pytest.mark.parametrize("policy, key, message", [
    ({"slice_floors": {"d": {"h": {"faithfulness/mean": 1.5}}}}, "slice_floors.d.h.faithfulness/mean",
     "must be in [0, 1], got 1.5"),
    ({"slice_floors": {"d": {"h": {"faithfulness/avg": 0.5}}}}, "slice_floors.d.h.faithfulness/avg",
     "unknown statistic 'avg'"),
    ({"slice_floors": {"d": {"h": {"false_abstention/mean": 0.1}}}}, "slice_floors.d.h.false_abstention/mean",
     "put its limit under slice_ceilings"),
    ({"slice_floors": {"d": {"h": 0.5}}}, "slice_floors.d.h", "must be a mapping"),
    ({"slice_floors": {"d": {3: {"mrr/mean": 0.5}, "3": {"mrr/mean": 0.5}}}}, "slice_floors.d.3",
     "the same slice twice"),
    ({"floors": {"mrr/slice/d/h/mean": 0.5}}, "floors.mrr/slice/d/h/mean", "goes under slice_floors"),
    ({"slice_floors": {"d": {"h": {"mrr/mean": 0.5}}}, "slice_min_scored_rows": -1}, "slice_min_scored_rows",
     "must be >= 0"),
    ({"slice_floors": {"d": {"h": {"mrr/mean": 0.5}}}, "slice_floor": {}}, "slice_floor", "unknown key"),
])
def test_a_bad_slice_limit_names_the_key(policy, key, message):
    with pytest.raises(PolicyError) as info:
        load_policy(policy)
    assert info.value.key == key and message in str(info.value)


def test_assert_metrics_meet_reads_a_runs_slices(store, sliced_runs):
    from mlflow_rag_eval.pytest_plugin import assert_metrics_meet

    run_id = sliced_runs[1]
    doc = json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/{SLICES_FILE}"))
    hard = doc["fields"]["difficulty"]["slices"]["hard"]["metrics"]["mrr"]["mean"]
    base = {"min_scored_rows": 1, "max_error_rate": 1.0}
    assert_metrics_meet(run_id, {**base, "slice_floors": {"difficulty": {"hard": {"mrr/mean": hard}}}})
    with pytest.raises(AssertionError, match=r"floor mean \[difficulty=hard\]: mrr/mean on slice difficulty=hard"):
        assert_metrics_meet(run_id, {**base, "slice_floors": {"difficulty": {"hard": {"mrr/mean": hard + 0.01}}}})
    metrics = mlflow.MlflowClient().get_run(run_id).data.metrics
    with pytest.raises(AssertionError, match="not sliced by 'difficulty'"):  # a mapping holds no slices
        assert_metrics_meet(metrics, {**base, "slice_floors": {"difficulty": {"hard": {"mrr/mean": 0.0}}}})


# -- the genai scorers route ----------------------------------------------------------------------
def test_genai_scorers_slice_by_the_rows_tags(store, monkeypatch):
    from mlflow_rag_eval.routes.scorers import rag_scorers

    monkeypatch.setenv("MLFLOW_GENAI_EVAL_MAX_WORKERS", "2")
    frame = _frame(12)
    rows = [{"inputs": {"question": r.question}, "outputs": {"answer": r.answer, "contexts": r.contexts},
             "expectations": {"relevant_ids": r.relevant_ids} if isinstance(r.relevant_ids, list) else {},
             **({"tags": {"difficulty": r.difficulty}} if isinstance(r.difficulty, str) else {})}
            for r in frame.itertuples()]
    result = mlflow.genai.evaluate(data=rows, scorers=rag_scorers(METRICS, None, slice_by=["difficulty"],
                                                                  run_metrics="all"))
    data = mlflow.MlflowClient().get_run(result.run_id).data
    assert json.loads(data.params["rag_eval.slice_by"]) == ["difficulty"]
    doc = json.loads(mlflow.artifacts.load_text(f"runs:/{result.run_id}/{SLICES_FILE}"))
    assert list(doc["fields"]["difficulty"]["slices"]) == ["easy", "hard", "medium"]
    assert doc["fields"]["difficulty"]["n_missing"] == 3
    hard = frame[frame.difficulty == "hard"]
    alone = evaluate_records(records_from_frame(hard.drop(columns=["difficulty"])), METRICS,
                             progress=False).aggregates()
    logged = {k.replace("/slice/difficulty/hard", ""): v for k, v in data.metrics.items()
              if "/slice/difficulty/hard/" in k}
    assert logged == pytest.approx(alone, rel=1e-12) and set(logged) == set(alone)
    with pytest.raises(ValueError, match="slice_by must be a list"):
        rag_scorers(METRICS, None, slice_by="difficulty")


def test_a_spooled_result_is_sliced_in_one_walk_of_each_metrics_rows():
    """Rows a long run keeps in its temporary file are read once per metric, not once per
    slice value (a field can have hundreds), and give the same figures as rows in memory."""
    import dataclasses

    from mlflow_rag_eval._util.spooled import SpooledSequence

    loads: list[int] = []

    class CountingLoads(SpooledSequence):
        def _load(self, number):
            loads.append(number)
            return super()._load(number)

    result = _hand_result()
    spooled = dataclasses.replace(result, metrics=[dataclasses.replace(m, rows=CountingLoads(m.rows, in_memory=4,
                                                                                             chunk=4))
                                                   for m in result.metrics])
    assert all(m.rows.spilled == 36 for m in spooled.metrics)
    table = compute_slices(spooled, ["difficulty", "tags", "bucket"])
    assert table == compute_slices(result, ["difficulty", "tags", "bucket"])
    assert sum(len(f.slices) for f in table.fields) == 9
    assert sorted(loads) == sorted(list(range(9)) * 2)  # 9 chunks of 4 past the 4 in memory, per metric
