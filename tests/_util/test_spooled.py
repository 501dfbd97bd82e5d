"""A spooled sequence reads like the tuple it replaces, keeps what would not pickle, and an
evaluation's rows past the first few thousand leave the process's memory (issue 47)."""

from __future__ import annotations

import copy
import pickle
import threading
import tracemalloc

import pytest

from mlflow_rag_eval._util import spooled
from mlflow_rag_eval._util.spooled import SpooledSequence
from mlflow_rag_eval.results import RowResult


def rows(n: int, start: int = 0) -> list[RowResult]:
    return [RowResult.scored((i % 10) / 10, f"row {i}: supported by passage {i % 3}", claims=[{"claim": f"c{i}"}])
            for i in range(start, start + n)]


def test_it_reads_like_a_tuple_with_most_items_in_the_file():
    items = rows(103)
    seq = SpooledSequence(items[:40], in_memory=10, chunk=8)
    for i in range(40, 103, 7):  # extended in uneven steps, as batches arrive
        seq.extend(items[i : i + 7])
    assert len(seq) == 103
    assert seq.spilled == 88  # 11 chunks of 8 past the 10 in memory; 5 pending
    assert list(seq) == items
    assert [seq[i] for i in range(103)] == items  # in order: each chunk decoded once
    assert [seq[i] for i in reversed(range(103))] == items[::-1]
    assert seq[-1] == items[-1] and seq[-6] == items[-6]
    assert seq[5:30:3] == tuple(items[5:30:3])
    assert seq == tuple(items) and tuple(items) == seq and seq == items
    assert seq != items[:-1] and seq != items[:-1] + [RowResult.failed("ParseError: x")]
    with pytest.raises(IndexError):
        seq[103]
    back = pickle.loads(pickle.dumps(seq))
    assert type(back) is tuple and back == tuple(items)
    assert copy.deepcopy(seq) == tuple(items)
    with pytest.raises(TypeError):
        hash(seq)


def test_items_that_do_not_pickle_stay_in_memory():
    lock = threading.Lock()
    items = rows(30)
    items[17] = RowResult.scored(0.5, "holds a lock", lock=lock)
    seq = SpooledSequence(items, in_memory=4, chunk=8)
    assert list(seq) == items
    assert seq[17].details["lock"] is lock  # its chunk was kept as it is
    assert seq.spilled == 16  # the other two full chunks went to the file


def test_reading_from_threads_while_walking():
    items = rows(500)
    seq = SpooledSequence(items, in_memory=16, chunk=32)
    seen: list[bool] = []

    def walk(order):
        seen.append(all(seq[i] == items[i] for i in order))

    threads = [threading.Thread(target=walk, args=(range(500),)),
               threading.Thread(target=walk, args=(reversed(range(500)),)),
               threading.Thread(target=walk, args=(range(0, 500, 37),))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [True, True, True]


def test_close_deletes_the_file():
    seq = SpooledSequence(rows(50), in_memory=0, chunk=10)
    file = seq._file
    assert file is not None and not file.closed
    seq.close()
    assert file.closed and len(seq) == 0 and list(seq) == []


def _retained_by_an_evaluation(n: int) -> int:
    from mlflow_rag_eval.evaluation.engine import evaluate_records
    from mlflow_rag_eval.records import Context, RagRecord

    records = [RagRecord(question=f"q{i}", answer="a", contexts=tuple(Context(text=f"t{k}", id=f"d{i}-{k}")
                                                                      for k in range(3)),
                         relevant_ids={f"d{i}-0": 1.0}) for i in range(n)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = evaluate_records(records, ["hit@3", "mrr", "ndcg@10"], progress=False)
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert sum(m.summary.n_scored for m in result.metrics) == 3 * n  # every row there, read back
    return retained


def test_an_evaluations_rows_past_the_first_thousands_leave_memory(monkeypatch):
    """What an evaluation keeps grows with its rows only by the file's index: 6,000 rows more
    keep less than 6 bytes a row more (each row's results held as objects: ~1 KiB a row)."""
    monkeypatch.setattr(spooled, "IN_MEMORY", 512)
    small, large = _retained_by_an_evaluation(2000), _retained_by_an_evaluation(8000)
    assert (large - small) / 6000 < 6, (small, large)
