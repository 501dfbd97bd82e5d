"""The local judge gives a row the same scores, to the last bit, whether the row is judged alone
(as the genai route judges it) or in a batch of 200 (as the other routes do). Issue 38: padding
moved embeddings in the 7th digit with their batch mates, and rounding to 1e-6 left values near
a boundary to chance (answer_relevancy 0.666 alone, 0.665999 batched)."""

from __future__ import annotations

import random

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges.providers.local import LocalJudge
from mlflow_rag_eval.records import Context, RagRecord

#: The metrics that read embeddings directly, over 200 rows.
METRICS = ["answer_relevancy", "context_relevance", "context_precision"]
#: Every metric the local judge scores, over 60 rows (issue 45): the claim metrics read the
#: support model and, where it decides, the cross-encoder, both batched by length.
LOCAL_METRICS = ["faithfulness", "answer_relevancy", "context_relevance", "context_precision", "context_recall",
                 "answer_correctness", "abstention", "false_abstention", "citation_support"]
WORDS = ("bike ticket costs euros dogs travel free train station price refund child senior card monthly "
         "weekend regional fare seat reservation luggage platform delay compensation night discount").split()


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 24))).capitalize() + "."


def rows(n: int = 200) -> list[RagRecord]:
    """Rows of many lengths, so that batches pad their texts to very different widths."""
    rng = random.Random(38)
    out = []
    for i in range(n):
        contexts = tuple(Context(text=" ".join(_sentence(rng) for _ in range(rng.randint(1, 2))), id=f"d{i}-{j}")
                         for j in range(rng.randint(1, 3)))
        out.append(RagRecord(question=f"How much is {_sentence(rng).lower()[:-1]}?",
                             answer=" ".join(_sentence(rng) for _ in range(rng.randint(1, 2))),
                             contexts=contexts, reference=_sentence(rng), answerable=i % 4 != 0))
    return out


def scores(result) -> dict[str, list]:
    return {m.name: [(r.value, r.error) for r in m.rows] for m in result.metrics}


def _alone_and_batched(records, metrics):
    # Two judges: each has its own vector memo, so no row reuses a vector the other computed.
    fields = {"answer", "contexts", "reference", "answerable"}  # a row alone has them as its batch has
    batched = scores(evaluate_records(records, metrics, LocalJudge(), available_fields=fields))
    alone_judge = LocalJudge()
    alone = {name: [] for name in metrics}
    for record in records:
        for name, row in scores(evaluate_records([record], metrics, alone_judge, available_fields=fields)).items():
            alone[name] += row
    return alone, batched


def _differ(alone, batched) -> dict:
    return {name: [(i, a, b) for i, (a, b) in enumerate(zip(alone[name], batched[name])) if a != b]
            for name in batched}


def test_200_rows_score_the_same_alone_and_batched():
    alone, batched = _alone_and_batched(rows(), METRICS)
    assert all(error is None for rows_ in batched.values() for _, error in rows_)
    differ = _differ(alone, batched)
    assert not any(differ.values()), {k: v[:3] for k, v in differ.items() if v}


def test_every_local_metric_scores_60_rows_the_same_alone_and_batched():
    alone, batched = _alone_and_batched(rows(60), LOCAL_METRICS)
    assert set(batched) == set(LOCAL_METRICS)
    scored = {name: sum(value is not None for value, _ in rows_) for name, rows_ in batched.items()}
    assert all(n > 0 for name, n in scored.items() if name != "citation_support"), scored  # real scores compared
    differ = _differ(alone, batched)
    assert not any(differ.values()), {k: v[:3] for k, v in differ.items() if v}
