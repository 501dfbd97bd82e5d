"""Retrieval metrics at the parent grain (``parent_hit@k``, ``parent_mrr``, ``parent_ndcg@k``...)
and ``pollution@k``.

The parent grain is checked against ``pytrec_eval`` on runs and qrels collapsed to parents by
the plain Python below (written from the definition, not with the code under test): each parent
once at the rank of its first chunk, a parent's grade the highest grade of the relevant ids
that map to it. Pollution is checked on hand-written lists, the expected value written as the
formula ``repeated slots in the top k / min(k, retrieved)``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.keys import display_name
from mlflow_rag_eval.metrics import resolve_metric
from mlflow_rag_eval.metrics.ranking import pollution
from mlflow_rag_eval.records import Context, RagRecord, RecordError, records_from_frame


def slash_parent(doc_id: str) -> str:
    """The test's own ``/`` rule: before the last ``/``, else the id."""
    return doc_id.rsplit("/", 1)[0] if "/" in doc_id else doc_id


def collapse(retrieved: list[str], relevant: dict[str, int]) -> tuple[list[str], dict[str, int]]:
    """The run and qrels at the parent grain, by the definition (no code under test)."""
    run: list[str] = []
    for doc_id in retrieved:
        if slash_parent(doc_id) not in run:
            run.append(slash_parent(doc_id))
    qrels: dict[str, int] = {}
    for doc_id, grade in relevant.items():
        parent = slash_parent(doc_id)
        qrels[parent] = max(qrels.get(parent, grade), grade)
    return run, qrels


def record(retrieved, relevant, question="q") -> RagRecord:
    contexts = tuple(c if isinstance(c, Context) else Context(text=f"text of {c}", id=c) for c in retrieved)
    return RagRecord(question=question, answer="a", contexts=contexts, relevant_ids=relevant)


def values(name: str, records) -> list[float | None]:
    return [r.value for r in resolve_metric(name).compute(records, None)]


def _random_chunked_case(seed: int, n_queries: int = 300, n_docs: int = 25, max_chunks: int = 6):
    """Chunk ids ``doc{i}/{j}``; relevant ids name chunks or whole documents; retrieved lists
    often hold several chunks of one document, sometimes the same chunk twice."""
    rng = np.random.default_rng(seed)
    chunks = {f"doc{i}": [f"doc{i}/{j}" for j in range(int(rng.integers(1, max_chunks + 1)))]
              for i in range(n_docs)}
    docs = list(chunks)
    retrieved, relevant = [], []
    for _ in range(n_queries):
        rel: dict[str, int] = {}
        for doc in rng.choice(docs, size=int(rng.integers(0, 5)), replace=False):
            picks = rng.choice(chunks[doc], size=int(rng.integers(1, len(chunks[doc]) + 1)), replace=False)
            for chunk in picks:
                rel[str(chunk)] = int(rng.integers(0, 4))  # 0 = judged non-relevant
            if rng.random() < 0.3:
                rel[str(doc)] = int(rng.integers(0, 4))  # the whole document named too
        relevant.append(rel)
        pool = [c for d in docs for c in chunks[d]]
        liked = [c for c in pool if slash_parent(c) in {slash_parent(r) for r in rel}]
        length = int(rng.integers(0, 25))
        ids = [str(rng.choice(liked)) if liked and rng.random() < 0.4 else str(rng.choice(pool))
               for _ in range(length)]
        retrieved.append(ids)  # drawn with replacement: repeated chunks and parents
    return retrieved, relevant


MEASURES = {
    "success_1": "parent_hit@1",
    "success_5": "parent_hit@5",
    "success_10": "parent_hit@10",
    "P_5": "parent_precision@5",
    "recall_5": "parent_recall@5",
    "recip_rank": "parent_mrr",
    "map": "parent_map",
    "map_cut_5": "parent_map@5",
    "ndcg_cut_5": "parent_ndcg@5",
    "ndcg_cut_10": "parent_ndcg@10",
}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_parent_grain_agrees_with_pytrec_eval_on_collapsed_runs(seed):
    import pytrec_eval  # the reference implementation: a dev dependency, never skipped

    retrieved, relevant = _random_chunked_case(seed)
    qids = [f"q{i}" for i in range(len(retrieved))]
    collapsed = [collapse(r, rel) for r, rel in zip(retrieved, relevant)]
    qrels = {q: rel for q, (_, rel) in zip(qids, collapsed) if rel}
    # Strictly decreasing scores, so trec_eval's ranking is the collapsed list order.
    run = {q: {p: float(len(parents) - rank) for rank, p in enumerate(parents)}
           for q, (parents, _) in zip(qids, collapsed)}
    ref = pytrec_eval.RelevanceEvaluator(qrels, set(MEASURES)).evaluate(run)

    records = [record(r, rel) for r, rel in zip(retrieved, relevant)]
    ours = {m: values(name, records) for m, name in MEASURES.items()}

    # The generated data must exercise what the collapse changes.
    has_relevant = [any(g > 0 for g in rel.values()) for rel in relevant]
    assert sum(not h for h in has_relevant) > 10
    assert sum(h and not r for h, r in zip(has_relevant, retrieved)) > 0  # nothing retrieved
    assert sum(len(parents) < len(set(r)) for r, (parents, _) in zip(retrieved, collapsed)) > 100
    assert sum(len(r) > len(set(r)) for r in retrieved) > 50  # a chunk retrieved twice
    assert sum(len(rel) < len(raw) for raw, (_, rel) in zip(relevant, collapsed)) > 50  # grades merged
    assert sum(any("/" not in i for i in rel) for rel in relevant) > 50  # parents named directly
    assert sum(h and v == 1.0 for h, v in zip(has_relevant, ours["success_10"])) > 50
    assert sum(h and v == 0.0 for h, v in zip(has_relevant, ours["success_10"])) > 10
    # ...and differ from the id grain, or the comparison would prove little.
    assert values("ndcg@10", records) != ours["ndcg_cut_10"]

    for i, q in enumerate(qids):
        if has_relevant[i]:
            for m in MEASURES:
                assert ours[m][i] == pytest.approx(ref[q][m], abs=1e-9), (q, m)
        else:  # not applicable, as at the id grain (trec_eval scores it 0 or leaves it out)
            for m in MEASURES:
                assert ours[m][i] is None, (q, m)
                if q in ref:
                    assert ref[q][m] == 0.0, (q, m)


def test_a_parent_ranks_at_its_first_chunk_with_its_best_grade():
    rec = record(["b/1", "a/1", "b/2", "c/1", "a/2"], {"a/2": 1, "a/1": 0, "a": 2, "c/9": 3})
    # parents b, a, c at ranks 1, 2, 3; grades a = max(1, 0, 2) = 2, c = 3 (c/9 never retrieved)
    dcg = 2 / math.log2(3) + 3 / math.log2(4)
    idcg = 3 / math.log2(2) + 2 / math.log2(3)
    assert values("parent_ndcg@10", [rec]) == [pytest.approx(dcg / idcg, abs=1e-12)]
    assert values("parent_mrr", [rec]) == [1 / 2]
    assert values("parent_hit@1", [rec]) == [0.0]
    assert values("parent_hit@2", [rec]) == [1.0]
    assert values("parent_precision@2", [rec]) == [1 / 2]
    # At the id grain the same list finds a/1 (grade 0) and a/2 (rank 5) only.
    assert values("mrr", [rec]) == [1 / 5]


def test_rows_without_parents_compute_as_at_the_id_grain():
    """Ids with no ``/`` and no parent_id: each context is its own parent, so both grains agree."""
    records = [record(["d1", "d2", "d3"], {"d3": 2, "d9": 1}), record(["x", "r1"], {"r1": 1}),
               record(["d1"], None)]
    for base in ("hit@1", "hit@5", "precision@3", "recall@3", "mrr", "map", "ndcg@10"):
        assert values(f"parent_{base}", records) == values(base, records), base
    assert values("parent_mrr", records)[2] is None  # not applicable without relevant ids


def _as_parent_id_contexts(retrieved: list[str], relevant: dict[str, int]):
    """The same row with opaque chunk ids (``c3.1``) and an explicit ``parent_id``.

    An unretrieved relevant chunk cannot be placed under its parent from an opaque id (the
    documented limit), so it is named by its parent in the relevant ids, with the same grade.
    """
    opaque = {c: "c" + c.removeprefix("doc").replace("/", ".") for c in retrieved}
    contexts = [{"id": opaque[c], "parent_id": slash_parent(c), "text": f"text of {c}"} for c in retrieved]
    rel: dict[str, int] = {}
    for doc_id, grade in relevant.items():
        key = opaque.get(doc_id, slash_parent(doc_id))
        rel[key] = max(rel.get(key, grade), grade)
    return contexts, rel


@pytest.mark.parametrize("seed", [0, 1])
def test_parent_id_contexts_score_like_the_slash_form(seed):
    retrieved, relevant = _random_chunked_case(seed, n_queries=150)
    slash = records_from_frame(pd.DataFrame({
        "question": [f"q{i}" for i in range(len(retrieved))], "answer": "a",
        "contexts": [[{"id": c, "text": f"text of {c}"} for c in r] for r in retrieved],
        "relevant_ids": relevant,
    }))
    pairs = [_as_parent_id_contexts(r, rel) for r, rel in zip(retrieved, relevant)]
    explicit = records_from_frame(pd.DataFrame({
        "question": [f"q{i}" for i in range(len(retrieved))], "answer": "a",
        "contexts": [c for c, _ in pairs], "relevant_ids": [rel for _, rel in pairs],
    }))
    assert all("/" not in c.id and c.parent_id for r in explicit for c in r.contexts)
    for name in list(MEASURES.values()) + ["pollution@5", "pollution@20"]:
        assert values(name, explicit) == pytest.approx(values(name, slash), abs=1e-12, nan_ok=True), name


def test_context_parent_rules():
    assert Context("t", "docs/a.md/3").parent == "docs/a.md"  # the last "/", so paths keep their path
    assert Context("t", "doc7").parent == "doc7"  # no "/": its own parent
    assert Context("t", "/x").parent == "/x"  # nothing before the "/": its own parent
    assert Context("t", "doc7/2", parent_id="thread-9").parent == "thread-9"  # parent_id wins
    assert Context("t", None, parent_id="thread-9").parent == "thread-9"
    assert Context("t").parent is None


def test_parent_id_is_read_from_context_dicts_and_kept_with_a_context_ids_column():
    df = pd.DataFrame({
        "question": ["q"], "answer": ["a"],
        "contexts": [[{"text": "t1", "doc_id": "c1", "parent_id": "post-1"}, {"text": "t2", "id": "c2"},
                      {"text": "t3", "parent_id": 7}]],
        "relevant_ids": [["c1"]],
    })
    (rec,) = records_from_frame(df)
    assert rec.contexts == (Context("t1", "c1", "post-1"), Context("t2", "c2"), Context("t3", None, "7"))
    (rec,) = records_from_frame(df.assign(context_ids=[["x1", "x2", "x3"]]))
    assert [(c.id, c.parent_id) for c in rec.contexts] == [("x1", "post-1"), ("x2", None), ("x3", "7")]
    with pytest.raises(RecordError, match="ids must be strings or ints"):
        records_from_frame(df.assign(contexts=[[{"text": "t", "parent_id": 1.5}]]))


def test_a_relevant_id_that_is_a_retrieved_parent_is_not_split_further():
    """``docs/a.md`` named as relevant, chunks ``docs/a.md/0``... retrieved: it is their parent,
    not a chunk of ``docs``."""
    rec = record(["docs/b.md/0", "docs/a.md/0", "docs/a.md/1"], {"docs/a.md": 1})
    assert values("parent_mrr", [rec]) == [1 / 2]


def test_contexts_with_a_parent_id_but_no_id_score_at_the_parent_grain_only():
    rec = record([Context("t", parent_id="d1"), Context("t", parent_id="d2")], {"d2": 1})
    result = evaluate_records([rec], ["parent_mrr", "pollution@5"], progress=False)
    assert [m.rows[0].value for m in result.metrics] == [1 / 2, 0 / 2]
    with pytest.raises(RecordError, match="needs an id for every retrieved context"):
        evaluate_records([rec], ["mrr"], progress=False)
    with pytest.raises(RecordError, match="needs an id or a parent_id"):
        evaluate_records([record([Context("no id")], {"d2": 1})], ["parent_mrr"], progress=False)


# --- pollution@k

@pytest.mark.parametrize(("retrieved", "k", "expected"), [
    # parents a a b a c: the slots at ranks 2 and 4 repeat a parent
    (["a/1", "a/2", "b/1", "a/3", "c/1"], 1, 0 / min(1, 5)),
    (["a/1", "a/2", "b/1", "a/3", "c/1"], 3, 1 / min(3, 5)),
    (["a/1", "a/2", "b/1", "a/3", "c/1"], 5, 2 / min(5, 5)),
    (["a/1", "a/2", "b/1", "a/3", "c/1"], 10, 2 / min(10, 5)),  # slots past the list do not count
    (["a", "b"], 5, 0 / min(5, 2)),  # no parents: each id its own
    (["x/1", "x/1", "x/1"], 5, 2 / min(5, 3)),  # the same chunk again repeats its parent
    (["a/1", "b/1", "b/2", "b/3", "a/2", "c/1"], 4, 2 / min(4, 6)),
], ids=["k1", "k3", "k5", "k-past-the-list", "no-parents", "repeated-id", "two-parents"])
def test_pollution_on_hand_written_lists(retrieved, k, expected):
    assert values(f"pollution@{k}", [record(retrieved, None)]) == [pytest.approx(expected, abs=1e-12)]


def test_pollution_needs_no_relevant_ids_and_skips_empty_lists():
    metric = resolve_metric("pollution@3")
    assert metric.requires == ("contexts",)
    assert metric.greater_is_better is False and metric.spec()["greater_is_better"] is False
    rows = metric.compute([record([], {"a": 1}), record(["a/1", "a/2"], None)], None)
    assert rows[0].status == "skipped" and "no retrieved contexts" in rows[0].justification
    assert rows[1].value == 1 / 2 and "rank(s) [2]" in rows[1].justification


def test_pollution_kernel_is_vectorised_over_queries():
    lists = [["a", "a", "b"], [], ["x", "y", "x", "y"], None, ["p"] * 7]
    out = pollution(lists, 4)
    assert out.dtype == np.float64 and out.shape == (5,)
    np.testing.assert_allclose(out, [1 / 3, np.nan, 2 / 4, np.nan, 3 / 4], rtol=0, atol=1e-12)
    assert pollution([], 3).shape == (0,)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        pollution(lists, 0)
    with pytest.raises(TypeError, match="got a string"):
        pollution(["abc"], 3)


# --- end to end, by name

def test_parent_metrics_and_pollution_run_by_name_through_evaluate_records():
    df = pd.DataFrame({
        "question": ["q0", "q1", "q2"], "answer": ["a", "a", "a"],
        "contexts": [
            [{"id": "d1/0", "text": "t"}, {"id": "d1/1", "text": "t"}, {"id": "d2/0", "text": "t"}],
            [{"id": "k9", "parent_id": "thread-1", "text": "t"}, {"id": "k3", "parent_id": "thread-2", "text": "t"}],
            [],
        ],
        "relevant_ids": [["d2/5"], {"k3": 2}, None],
    })
    names = ["parent_hit@1", "parent_mrr", "parent_ndcg@10", "pollution@3", "hit@1", "mrr"]
    result = evaluate_records(records_from_frame(df), names, progress=False)
    by_name = {m.name: [r.value for r in m.rows] for m in result.metrics}
    assert list(by_name) == names
    assert by_name["parent_hit@1"] == [0.0, 0.0, None]
    assert by_name["parent_mrr"] == [1 / 2, 1 / 2, None]  # d2 is the 2nd parent; thread-2 the 2nd
    assert by_name["parent_ndcg@10"] == [pytest.approx((1 / math.log2(3)) / 1), pytest.approx(1 / math.log2(3)),
                                         None]
    assert by_name["pollution@3"] == [1 / 3, 0 / 2, None]
    assert by_name["mrr"] == [0.0, 1 / 2, None]  # d2/5 itself never retrieved
    greater = {m.name: m.greater_is_better for m in result.metrics}
    assert greater["pollution@3"] is False and greater["parent_mrr"] is True
    # MLflow keys take the names as they are; the key gives the name back.
    for m in result.metrics:
        assert "@" not in m.key and "/" not in m.key and display_name(m.key) == m.name


def test_parent_metrics_are_not_in_the_default_suite():
    from mlflow_rag_eval.evaluation.suite import DEFAULT_METRICS

    assert not [n for n in DEFAULT_METRICS if n.startswith(("parent_", "pollution"))]


def test_bad_cut_offs_are_refused_by_name():
    for name in ("parent_hit@0", "pollution@0"):
        with pytest.raises(ValueError, match="cut-off k must be an integer of at least 1"):
            resolve_metric(name)
