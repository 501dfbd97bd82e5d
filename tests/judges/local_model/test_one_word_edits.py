"""One changed word through the public plugin route (issue 43): the edits of
``bench/data/one_word_edits.jsonl`` fail, their faithful twins and the synonym / hypernym
controls pass, and the row's support ranks each twin above its edit; with the default judge
(its veto only where the cross-encoder is confident) and with the veto at the cross-encoder's
balanced threshold (opt-in: it costs AUROC across the labelled sources, bench/faithfulness_dev.py). ``bench/one_word_edits.py`` prints the same
figures, per kind."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
from conftest import ROOT

CASES = [json.loads(line) for line in (ROOT / "bench" / "data" / "one_word_edits.jsonl").read_text().splitlines()
         if line.strip()]
VETO = "local:minilm-l6?entailment_threshold=0.705"
#: What each judge reaches (bench/one_word_edits.py): (edits failing, faithful twins passing,
#: pairs ordered by support, controls passing); a change that loses any of it fails here.
REACHED = {"local:minilm-l6": (0.52, 1.0, 0.74, 0.93), VETO: (0.85, 0.88, 0.92, 0.75)}
EDITS = [k for k, c in enumerate(CASES) if c["edited"]]
CONTROLS = [k for k, c in enumerate(CASES) if not c["edited"]]




def figures(table) -> tuple[float, float, float, float]:
    """Share of edits failing, of faithful twins passing, of pairs ordered by support, of controls passing."""
    score, support = table["faithfulness/score"], table["faithfulness/support"]
    return (sum(score[f"e{k}"] < 1 for k in EDITS) / len(EDITS), sum(score[f"f{k}"] == 1 for k in EDITS) / len(EDITS),
            sum(support[f"f{k}"] > support[f"e{k}"] for k in EDITS) / len(EDITS),
            sum(score[f"f{k}"] == 1 for k in CONTROLS) / len(CONTROLS))


@pytest.fixture(scope="module", params=sorted(REACHED))
def table(request, tmp_path_factory):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path_factory.mktemp('one_word') / 'mlflow.db'}")
    try:
        experiment = mlflow.set_experiment("one-word-edits")
        rows = [(f"f{k}", c["context"], c["faithful"]) for k, c in enumerate(CASES)]
        rows += [(f"e{k}", CASES[k]["context"], CASES[k]["edited"]) for k in EDITS]
        frame = pd.DataFrame({"question": ["What does the document say?"] * len(rows),
                              "answer": [r[2] for r in rows],
                              "contexts": [[{"id": "d0", "text": r[1]}] for r in rows]})
        with mlflow.start_run(experiment_id=experiment.experiment_id):
            result = mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                                            evaluator_config={"metrics": ["faithfulness"], "judge": request.param})
        out = result.tables["eval_results_table"]
        out.index = [r[0] for r in rows]
        out.attrs["judge"] = request.param
        return out
    finally:
        mlflow.set_tracking_uri(None)


def test_the_set_covers_every_kind_the_issue_names():
    kinds = {CASES[k]["kind"] for k in EDITS}
    assert len(EDITS) >= 60 and len(CONTROLS) >= 15
    assert {"antonym", "weekday", "month", "number", "person", "place", "negation", "negation_removed",
            "quantifier", "role", "from_to", "comparative", "modality", "unit", "added_fact"} <= kinds, kinds


def test_the_default_judge_fails_one_changed_word_and_passes_its_faithful_twin(table):
    assert not table["faithfulness/score"].isna().any()
    failed, passed, ordered, controls = figures(table)
    said = f"failed {failed:.1%}, passed {passed:.1%}, ordered {ordered:.1%}, controls {controls:.1%}"
    want_failed, want_passed, want_ordered, want_controls = REACHED[table.attrs["judge"]]
    assert (failed >= want_failed and passed >= want_passed and ordered >= want_ordered
            and controls >= want_controls), said


@pytest.mark.xfail(strict=True, reason="issue 43: the default judge fails 52% of edits (target 90%) and orders 75% "
                   "of pairs (95%); the veto at 0.705 lets role, from/to, comparative, modality and unit edits "
                   "through and fails 4 of 16 controls")
def test_the_issues_targets(table):
    failed, passed, ordered, controls = figures(table)
    assert failed >= 0.90 and passed >= 0.90 and ordered >= 0.95 and controls >= 0.90
