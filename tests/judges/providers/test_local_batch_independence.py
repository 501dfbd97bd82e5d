"""The local judge gives a row the same scores, to the last bit, whether the row is judged alone
(as the genai route judges it) or in a batch of 200 (as the other routes do). Issue 38: padding
moved embeddings in the 7th digit with their batch mates, and rounding to 1e-6 left values near
a boundary to chance (answer_relevancy 0.666 alone, 0.665999 batched)."""

from __future__ import annotations

import random

from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges.providers.local import LocalJudge
from mlflow_rag_eval.records import Context, RagRecord

#: The metrics that read embeddings directly (the claim metrics, faithfulness, context_recall and
#: answer_correctness, were measured batch-independent too, at 3 minutes more: not in the suite).
METRICS = ["answer_relevancy", "context_relevance", "context_precision"]
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
                             contexts=contexts, reference=_sentence(rng)))
    return out


def scores(result) -> dict[str, list]:
    return {m.name: [(r.value, r.error) for r in m.rows] for m in result.metrics}


def test_200_rows_score_the_same_alone_and_batched():
    records = rows()
    # Two judges: each has its own vector memo, so no row reuses a vector the other computed.
    batched = scores(evaluate_records(records, METRICS, LocalJudge()))
    alone_judge = LocalJudge()
    alone = {name: [] for name in METRICS}
    for record in records:
        for name, row in scores(evaluate_records([record], METRICS, alone_judge)).items():
            alone[name] += row
    assert all(error is None for rows_ in batched.values() for _, error in rows_)
    differ = {name: [(i, a, b) for i, (a, b) in enumerate(zip(alone[name], batched[name])) if a != b]
              for name in METRICS}
    assert not any(differ.values()), {k: v[:3] for k, v in differ.items() if v}
