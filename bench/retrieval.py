"""Benchmark the retrieval metric kernels against ranx.

Why: ``mlflow_rag_eval.metrics.ranking`` promises to be fast enough to score
100,000 queries interactively without numba. This script checks that claim
against ranx (numba-compiled, parallel) on identical data, and that both give
the same mean scores.

Usage::

    python bench/retrieval.py                # 100,000 queries x 100 ids
    python bench/retrieval.py --queries 5000 # quicker

What is timed (``time.perf_counter``, best of ``--repeats``; the first run is
also printed since hash caches of the id strings are cold only then):

* ours: ``RankedRelevance.from_lists(retrieved, relevant)`` plus the six
  metrics (hit@10, precision@10, recall@10, MRR, MAP, nDCG@10);
* ranx: ``Qrels(qrels_dict)`` + ``Run(run_dict)`` (construction) and
  ``evaluate(qrels, run, [...])`` (evaluation), reported separately. numba JIT
  compilation is excluded by evaluating a small input first.

Inputs are the same Python objects: ``retrieved`` lists (ours) and a
``{query: {doc: score}}`` dict with strictly decreasing scores (ranx) describe
the same rankings; both use the same ``{query: {doc: grade}}`` qrels dicts.
Every id string is a distinct object, as ids parsed from JSON would be.

Definitions: ranx ``hit_rate@k`` is trec_eval ``success_k`` and ranx
``ndcg@k`` uses linear gains (Jarvelin), like ours. ranx scores queries
without relevant ids as 0 instead of NaN; every generated query has relevant
ids, so this does not affect the comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mlflow_rag_eval.metrics.ranking import (  # noqa: E402
    RankedRelevance,
    average_precision,
    hit_rate,
    ndcg,
    precision,
    recall,
    reciprocal_rank,
)

RANX_METRICS = ["hit_rate@10", "precision@10", "recall@10", "mrr", "map", "ndcg@10"]


def make_data(n_queries: int, list_len: int = 100, corpus: int = 1_000_000, seed: int = 0):
    """Random duplicate-free rankings and ~5 graded relevant ids per query.

    About half of each query's relevant ids are taken from its own retrieved
    list (so they are hits) and the rest from the corpus at large.
    """
    rng = np.random.default_rng(seed)
    docs = rng.integers(0, corpus, size=(n_queries, list_len))
    # Redraw rows that contain a duplicate: ranx run dicts cannot hold them.
    while True:
        s = np.sort(docs, axis=1)
        bad = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
        if not bad.size:
            break
        docs[bad] = rng.integers(0, corpus, size=(bad.size, list_len))

    n_rel = rng.integers(1, 10, size=n_queries)  # mean 5
    slot_q = np.repeat(np.arange(n_queries), n_rel)
    from_run = rng.random(slot_q.size) < 0.5
    rel_doc = rng.integers(0, corpus, size=slot_q.size)
    pos = rng.integers(0, list_len, size=slot_q.size)
    rel_doc[from_run] = docs[slot_q[from_run], pos[from_run]]
    grade = rng.integers(1, 4, size=slot_q.size)

    qids = [f"q{i}" for i in range(n_queries)]
    retrieved = [[f"d{d}" for d in row] for row in docs.tolist()]
    relevant: list[dict[str, int]] = [{} for _ in range(n_queries)]
    for q, d, g in zip(slot_q.tolist(), rel_doc.tolist(), grade.tolist()):
        relevant[q][f"d{d}"] = g
    run = {
        q: {doc: float(list_len - r) for r, doc in enumerate(lst)}
        for q, lst in zip(qids, retrieved)
    }
    qrels = dict(zip(qids, relevant))
    return qids, retrieved, relevant, run, qrels


def ours(retrieved, relevant) -> dict[str, np.ndarray]:
    rr = RankedRelevance.from_lists(retrieved, relevant)
    return {
        "hit_rate@10": hit_rate(rr, 10),
        "precision@10": precision(rr, 10),
        "recall@10": recall(rr, 10),
        "mrr": reciprocal_rank(rr),
        "map": average_precision(rr),
        "ndcg@10": ndcg(rr, 10),
    }


def ranx_build(qrels_dict, run_dict):
    from ranx import Qrels, Run

    return Qrels(qrels_dict), Run(run_dict)


def ranx_eval(qrels, run):
    from ranx import evaluate

    return evaluate(qrels, run, RANX_METRICS)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--list-len", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-ranx", action="store_true", help="time ours only")
    args = ap.parse_args()

    t0 = time.perf_counter()
    qids, retrieved, relevant, run_dict, qrels_dict = make_data(args.queries, args.list_len)
    print(
        f"data: {args.queries:,} queries x {args.list_len} ids, "
        f"{sum(map(len, relevant)):,} relevant ids "
        f"(generated in {time.perf_counter() - t0:.1f}s)"
    )

    t_ours = []
    for _ in range(args.repeats):
        t, res_ours = timed(ours, retrieved, relevant)
        t_ours.append(t)
    means_ours = {m: float(np.nanmean(v)) for m, v in res_ours.items()}

    rows = [("ours: from_lists + 6 metrics", t_ours)]
    if not args.no_ranx:
        # JIT warm-up on a small input. >= 10 queries on purpose: ranx's
        # evaluate() sets numba to 1 thread for fewer than 10 queries, and
        # that setting would stick for the timed runs.
        wq = qids[:20]
        q_small, r_small = ranx_build(
            {q: qrels_dict[q] for q in wq}, {q: run_dict[q] for q in wq}
        )
        ranx_eval(q_small, r_small)

        t_build, t_eval, t_total = [], [], []
        for _ in range(args.repeats):
            tb, (qrels, run) = timed(ranx_build, qrels_dict, run_dict)
            te, means_ranx = timed(ranx_eval, qrels, run)
            t_build.append(tb)
            t_eval.append(te)
            t_total.append(tb + te)
        rows += [
            ("ranx: Qrels + Run construction", t_build),
            ("ranx: evaluate", t_eval),
            ("ranx: total", t_total),
        ]

    print(f"\n{'seconds':34s} {'best':>8s} {'first':>8s}")
    for name, ts in rows:
        print(f"{name:34s} {min(ts):8.3f} {ts[0]:8.3f}")

    if not args.no_ranx:
        best_ours, best_ranx = min(t_ours), min(t_total)
        print(
            f"\nranx total / ours = {best_ranx / best_ours:.1f}x "
            f"(ranx evaluate alone / ours = {min(t_eval) / best_ours:.2f}x)"
        )
        print(f"\n{'metric':14s} {'ours':>10s} {'ranx':>10s} {'abs diff':>10s}")
        diffs = []
        for m in RANX_METRICS:
            d = abs(means_ours[m] - float(means_ranx[m]))
            diffs.append(d)
            print(f"{m:14s} {means_ours[m]:10.6f} {float(means_ranx[m]):10.6f} {d:10.2e}")
        print(f"max abs difference of means: {max(diffs):.2e}")
    else:
        for m, v in means_ours.items():
            print(f"{m:14s} {v:10.6f}")


if __name__ == "__main__":
    main()
