"""Metric name <-> MLflow key <-> display name: one mapping, used everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mlflow_rag_eval
from mlflow_rag_eval import keys
from mlflow_rag_eval.compare import EvaluatedRun
from mlflow_rag_eval.results import MetricResult


@pytest.mark.parametrize("name, key, shown", [
    ("ndcg@10", "ndcg_at_10", "ndcg@10"),
    ("hit@5", "hit_at_5", "hit@5"),
    ("faithfulness", "faithfulness", "faithfulness"),
    ("ragas:faithfulness", "ragas_faithfulness", "ragas_faithfulness"),  # ":" does not round-trip
    ("deepeval:answer_relevancy", "deepeval_answer_relevancy", "deepeval_answer_relevancy"),
])
def test_name_key_and_display_name(name, key, shown):
    assert keys.metric_key(name) == key
    assert keys.metric_key(key) == key  # idempotent: a key may be given where a name is expected
    assert keys.display_name(key) == shown
    assert keys.display_name(name) == name  # a name is returned as it is
    assert keys.aggregate_key(name, "p10") == f"{key}/p10"
    assert keys.score_column(name) == f"{key}/score"
    assert keys.is_namespaced(name) == (":" in name)


def test_aggregate_keys_split_on_the_last_slash():
    assert keys.split_aggregate_key("ndcg@10/mean") == ("ndcg@10", "mean")
    for bad in ("faithfulness", "/mean"):
        with pytest.raises(ValueError, match="is not <metric>/<stat>"):
            keys.split_aggregate_key(bad)
    columns = ["question", "ndcg_at_10/score", "ndcg_at_10/justification", "faithfulness/score"]
    assert keys.metrics_in_columns(columns) == ["ndcg_at_10", "faithfulness"]


def test_every_caller_uses_the_one_mapping():
    from mlflow_rag_eval import metrics, results
    from mlflow_rag_eval.gate import policy

    assert results.metric_key is keys.metric_key  # the old import path keeps working
    assert MetricResult("ndcg@10", {}, ()).key == "ndcg_at_10"
    assert metrics.display_name is keys.display_name and policy.STATS == (*keys.AGGREGATES, *keys.PPI_STATS)
    run = EvaluatedRun("r", {}, __import__("pandas").DataFrame({"question": ["q"], "ndcg_at_10/score": [0.5]}), {})
    assert run.metric_keys() == ["ndcg_at_10"] and run.scores("ndcg@10").tolist() == [0.5]


def test_no_module_spells_the_mapping_itself():
    """Found by review: four copies of name <-> key (`.replace("@", "_at_")`, `_at_(\\d+)`...)."""
    spelled = re.compile(r"""replace\(\s*["']@["']|["']_at_["']|_at_\(\\d""")
    package = Path(mlflow_rag_eval.__file__).parent
    copies = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
              if path.name != "keys.py" and spelled.search(path.read_text(encoding="utf-8"))]
    assert copies == []
