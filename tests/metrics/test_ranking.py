"""Tests for the vectorised retrieval metric kernels.

Hand-computed cases pin the definitions; a randomised comparison with
``pytrec_eval`` (trec_eval) checks that the vectorised joins, padding and
cut-offs agree with the reference implementation query by query.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlflow_rag_eval.metrics.ranking import (
    RankedRelevance,
    average_precision,
    hit_rate,
    ndcg,
    precision,
    recall,
    reciprocal_rank,
)

CUT_METRICS = [hit_rate, precision, recall, ndcg]
OPTIONAL_K_METRICS = [reciprocal_rank, average_precision]
ALL_METRICS = CUT_METRICS + OPTIONAL_K_METRICS


def log2(x: float) -> float:
    return math.log2(x)


# Query A: graded; hits at ranks 1 (grade 3) and 3 (grade 1); d6 (grade 2)
#          never retrieved; d2 judged non-relevant (grade 0).
# Query B: binary via a plain list; hits at ranks 3 and 5.
# Query C: no judgements at all.
RETRIEVED = [
    ["d1", "d2", "d3", "d4", "d5"],
    ["x", "y", "r1", "z", "r2"],
    ["d1", "d2"],
]
RELEVANT = [
    {"d1": 3, "d3": 1, "d6": 2, "d2": 0},
    ["r1", "r2"],
    None,
]


@pytest.fixture
def rr() -> RankedRelevance:
    return RankedRelevance.from_lists(RETRIEVED, RELEVANT)


def assert_values(actual, expected):
    actual = np.asarray(actual)
    assert actual.dtype == np.float64
    assert actual.shape == (len(expected),)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- structure


def test_from_lists_arrays(rr):
    np.testing.assert_array_equal(
        rr.gains,
        [[3, 0, 1, 0, 0], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0]],
    )
    assert rr.gains.dtype == np.float64
    np.testing.assert_array_equal(rr.lengths, [5, 5, 2])
    assert rr.lengths.dtype == np.int64
    np.testing.assert_array_equal(rr.n_relevant, [3, 2, 0])
    assert rr.n_relevant.dtype == np.int64
    np.testing.assert_array_equal(rr.ideal_gains, [[3, 2, 1], [1, 1, 0], [0, 0, 0]])
    assert rr.ideal_gains.dtype == np.float64


# ------------------------------------------------------- hand-computed values


def test_hit_rate(rr):
    assert_values(hit_rate(rr, 1), [1.0, 0.0, np.nan])
    assert_values(hit_rate(rr, 2), [1.0, 0.0, np.nan])
    assert_values(hit_rate(rr, 3), [1.0, 1.0, np.nan])


def test_precision(rr):
    assert_values(precision(rr, 1), [1 / 1, 0 / 1, np.nan])
    assert_values(precision(rr, 3), [2 / 3, 1 / 3, np.nan])
    assert_values(precision(rr, 5), [2 / 5, 2 / 5, np.nan])


def test_recall(rr):
    assert_values(recall(rr, 1), [1 / 3, 0 / 2, np.nan])
    assert_values(recall(rr, 3), [2 / 3, 1 / 2, np.nan])
    assert_values(recall(rr, 5), [2 / 3, 2 / 2, np.nan])


def test_reciprocal_rank(rr):
    assert_values(reciprocal_rank(rr), [1 / 1, 1 / 3, np.nan])
    assert_values(reciprocal_rank(rr, 2), [1 / 1, 0.0, np.nan])
    assert_values(reciprocal_rank(rr, 3), [1 / 1, 1 / 3, np.nan])


def test_average_precision(rr):
    assert_values(average_precision(rr), [(1 / 1 + 2 / 3) / 3, (1 / 3 + 2 / 5) / 2, np.nan])
    assert_values(average_precision(rr, 2), [(1 / 1) / 3, 0.0, np.nan])
    assert_values(average_precision(rr, 3), [(1 / 1 + 2 / 3) / 3, (1 / 3) / 2, np.nan])


def test_ndcg_graded(rr):
    ideal_a = 3 / log2(2) + 2 / log2(3) + 1 / log2(4)
    ideal_b = 1 / log2(2) + 1 / log2(3)
    assert_values(ndcg(rr, 1), [(3 / log2(2)) / (3 / log2(2)), 0.0, np.nan])
    assert_values(
        ndcg(rr, 2),
        [(3 / log2(2)) / (3 / log2(2) + 2 / log2(3)), 0.0, np.nan],
    )
    assert_values(
        ndcg(rr, 3),
        [(3 / log2(2) + 1 / log2(4)) / ideal_a, (1 / log2(4)) / ideal_b, np.nan],
    )
    assert_values(
        ndcg(rr, 5),
        [
            (3 / log2(2) + 1 / log2(4)) / ideal_a,
            (1 / log2(4) + 1 / log2(6)) / ideal_b,
            np.nan,
        ],
    )


def test_fractional_and_negative_grades():
    rr = RankedRelevance.from_lists(
        [["a", "b", "c"]], [{"a": 0.5, "b": -1.0, "c": 2.0, "d": 0.0}]
    )
    np.testing.assert_array_equal(rr.n_relevant, [2])
    assert_values(precision(rr, 3), [2 / 3])
    assert_values(reciprocal_rank(rr), [1 / 1])
    assert_values(
        ndcg(rr, 3),
        [(0.5 / log2(2) + 2.0 / log2(4)) / (2.0 / log2(2) + 0.5 / log2(3))],
    )


def test_set_and_tuple_relevant_mean_grade_one():
    rr = RankedRelevance.from_lists(
        [["a", "b"], ["a", "b"]], [{"b"}, ("a", "a", "b")]
    )
    np.testing.assert_array_equal(rr.n_relevant, [1, 2])
    np.testing.assert_array_equal(rr.gains, [[0, 1], [1, 1]])


# ------------------------------------------------------------------ edge cases


@pytest.mark.parametrize(
    "no_relevant", [None, {}, [], set(), {"a": 0}, {"a": 0, "b": -2.5}]
)
@pytest.mark.parametrize("retrieved", [["a", "b"], []])
def test_no_relevant_ids_gives_nan(no_relevant, retrieved):
    rr = RankedRelevance.from_lists([retrieved, ["a"]], [no_relevant, {"a": 1}])
    for metric in ALL_METRICS:
        out = metric(rr, 1)
        assert math.isnan(out[0]), metric.__name__
        assert out[1] == 1.0, metric.__name__
    for metric in OPTIONAL_K_METRICS:
        assert math.isnan(metric(rr)[0])


def test_k_larger_than_list():
    rr = RankedRelevance.from_lists([["r", "x"]], [{"r": 1}])
    assert_values(hit_rate(rr, 10), [1.0])
    assert_values(precision(rr, 10), [1 / 10])  # still divides by k
    assert_values(recall(rr, 10), [1 / 1])
    assert_values(reciprocal_rank(rr, 10), [1 / 1])
    assert_values(average_precision(rr, 10), [(1 / 1) / 1])
    assert_values(ndcg(rr, 10), [1.0])


def test_duplicates_only_first_occurrence_counts():
    rr = RankedRelevance.from_lists(
        [["r", "r", "x", "x", "s", "r"], ["x", "x", "t"]],
        [{"r": 2, "s": 1}, {"t": 1}],
    )
    np.testing.assert_array_equal(rr.gains, [[2, 0, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(rr.lengths, [6, 3])
    assert_values(precision(rr, 2), [1 / 2, 0 / 2])
    assert_values(precision(rr, 6), [2 / 6, 1 / 6])
    assert_values(recall(rr, 6), [2 / 2, 1 / 1])
    assert_values(hit_rate(rr, 2), [1.0, 0.0])
    # Duplicates keep their rank: t is still at rank 3.
    assert_values(reciprocal_rank(rr), [1 / 1, 1 / 3])
    assert_values(average_precision(rr), [(1 / 1 + 2 / 5) / 2, (1 / 3) / 1])
    assert_values(
        ndcg(rr, 6),
        [
            (2 / log2(2) + 1 / log2(6)) / (2 / log2(2) + 1 / log2(3)),
            (1 / log2(4)) / (1 / log2(2)),
        ],
    )


def test_empty_retrieved_list_scores_zero():
    rr = RankedRelevance.from_lists(
        [[], ["a"], [], ["b", "a"], []],
        [{"a": 1}, {"a": 1}, {"x": 2}, {"a": 1}, {"b": 3}],
    )
    np.testing.assert_array_equal(rr.lengths, [0, 1, 0, 2, 0])
    np.testing.assert_array_equal(rr.gains, [[0, 0], [1, 0], [0, 0], [0, 1], [0, 0]])
    assert_values(hit_rate(rr, 2), [0.0, 1.0, 0.0, 1.0, 0.0])
    assert_values(precision(rr, 2), [0.0, 1 / 2, 0.0, 1 / 2, 0.0])
    assert_values(recall(rr, 2), [0.0, 1 / 1, 0.0, 1 / 1, 0.0])
    assert_values(reciprocal_rank(rr), [0.0, 1 / 1, 0.0, 1 / 2, 0.0])
    assert_values(average_precision(rr), [0.0, 1 / 1, 0.0, (1 / 2) / 1, 0.0])
    assert_values(ndcg(rr, 2), [0.0, 1.0, 0.0, (1 / log2(3)) / (1 / log2(2)), 0.0])


def test_all_lists_empty():
    rr = RankedRelevance.from_lists([[], None], [{"a": 1}, None])
    assert rr.gains.shape == (2, 0)
    for metric in ALL_METRICS:
        assert_values(metric(rr, 5), [0.0, np.nan])
    for metric in OPTIONAL_K_METRICS:
        assert_values(metric(rr), [0.0, np.nan])


def test_no_queries():
    rr = RankedRelevance.from_lists([], [])
    for metric in ALL_METRICS:
        out = metric(rr, 5)
        assert out.shape == (0,) and out.dtype == np.float64
    for metric in OPTIONAL_K_METRICS:
        assert metric(rr).shape == (0,)


def test_single_query_shape():
    rr = RankedRelevance.from_lists([["a"]], [{"a": 1}])
    for metric in ALL_METRICS:
        out = metric(rr, 1)
        assert out.shape == (1,) and out.dtype == np.float64


@pytest.mark.parametrize("bad_k", [0, -1, 1.5, 2.0, True, "3", None])
@pytest.mark.parametrize("metric", CUT_METRICS)
def test_bad_k_raises(rr, metric, bad_k):
    with pytest.raises(ValueError):
        metric(rr, bad_k)


@pytest.mark.parametrize("bad_k", [0, -3, 1.5, False, "3"])
@pytest.mark.parametrize("metric", OPTIONAL_K_METRICS)
def test_bad_optional_k_raises(rr, metric, bad_k):
    with pytest.raises(ValueError):
        metric(rr, bad_k)


def test_numpy_integer_k_accepted(rr):
    assert_values(precision(rr, np.int64(5)), [2 / 5, 2 / 5, np.nan])


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        RankedRelevance.from_lists([["a"]], [])


def test_bare_string_rejected():
    with pytest.raises(TypeError):
        RankedRelevance.from_lists(["abc"], [{"a": 1}])
    with pytest.raises(TypeError):
        RankedRelevance.from_lists([["a"]], ["a"])


# ------------------------------------------------------ agreement with trec_eval


def _random_case(seed: int, n_queries: int = 300, pool: int = 50):
    """Random graded qrels and duplicate-free runs over a shared id pool.

    Ids come from one pool shared by all queries, so the same id is relevant
    for some queries and not others; runs and qrels overlap only partly.
    """
    rng = np.random.default_rng(seed)
    ids = [f"doc{i}" for i in range(pool)]
    retrieved, relevant = [], []
    for _ in range(n_queries):
        n_judged = int(rng.integers(0, 9))
        judged = rng.choice(pool, size=n_judged, replace=False)
        grades = rng.integers(0, 4, size=n_judged)  # 0 = judged non-relevant
        relevant.append({ids[j]: int(g) for j, g in zip(judged, grades)})
        length = int(rng.integers(0, 31))
        # Bias towards judged ids so that hits are common but not certain.
        if n_judged and length:
            from_judged = rng.choice(judged, size=min(n_judged, length // 2 + 1), replace=False)
        else:
            from_judged = np.array([], dtype=int)
        rest = rng.permutation(np.setdiff1d(np.arange(pool), from_judged))
        docs = np.concatenate([from_judged, rest])[:length]
        docs = rng.permutation(docs)
        retrieved.append([ids[j] for j in docs])
    return retrieved, relevant


@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_pytrec_eval(seed):
    import pytrec_eval  # the reference implementation: a dev dependency, never skipped
    retrieved, relevant = _random_case(seed)
    n = len(retrieved)
    qids = [f"q{i}" for i in range(n)]

    # Queries with no judgements at all are simply absent from trec_eval's
    # qrels; an empty run dict is accepted and scores 0 on every measure.
    qrels = {q: rel for q, rel in zip(qids, relevant) if rel}
    # Strictly decreasing scores, so trec_eval's ranking is our list order.
    run = {
        q: {doc: float(len(docs) - rank) for rank, doc in enumerate(docs)}
        for q, docs in zip(qids, retrieved)
    }
    measures = {
        "success_1", "success_5", "success_10", "P_5", "P_10", "recall_5",
        "recall_10", "recip_rank", "map", "map_cut_5", "map_cut_10",
        "ndcg_cut_5", "ndcg_cut_10",
    }  # fmt: skip
    ref = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)

    rr = RankedRelevance.from_lists(retrieved, relevant)
    ours = {
        "success_1": hit_rate(rr, 1),
        "success_5": hit_rate(rr, 5),
        "success_10": hit_rate(rr, 10),
        "P_5": precision(rr, 5),
        "P_10": precision(rr, 10),
        "recall_5": recall(rr, 5),
        "recall_10": recall(rr, 10),
        "recip_rank": reciprocal_rank(rr),
        "map": average_precision(rr),
        "map_cut_5": average_precision(rr, 5),
        "map_cut_10": average_precision(rr, 10),
        "ndcg_cut_5": ndcg(rr, 5),
        "ndcg_cut_10": ndcg(rr, 10),
    }

    has_relevant = np.array([any(g > 0 for g in rel.values()) for rel in relevant])
    # The generated data must exercise every case the comparison relies on.
    lengths = np.array([len(docs) for docs in retrieved])
    assert (~has_relevant).sum() > 10
    assert (has_relevant & (lengths == 0)).sum() > 0
    assert (has_relevant & (ours["success_10"] == 1)).sum() > 50
    assert (has_relevant & (recall(rr, 30) < 1)).sum() > 25

    for i, q in enumerate(qids):
        if has_relevant[i]:
            assert q in ref
            for m in measures:
                assert ours[m][i] == pytest.approx(ref[q][m], abs=1e-9), (q, m)
        else:
            # Semantic difference: we say "not applicable" (NaN) whereas
            # trec_eval drops unjudged queries and scores queries whose
            # judgements are all non-relevant as 0.
            for m in measures:
                assert np.isnan(ours[m][i]), (q, m)
                if q in ref:
                    assert ref[q][m] == 0.0, (q, m)
