"""The local judge's learned support model: features, the JSON file, retraining, naming a model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT  # noqa: E402

from mlflow_rag_eval.cli import main
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.judges.base import VerifyItem
from mlflow_rag_eval.judges.local_model.embedding import Embedder
from mlflow_rag_eval.judges.local_model.support_model import (
    FEATURES,
    SupportModel,
    default_model_path,
    load_support_model,
)
from mlflow_rag_eval.judges.local_model.training import (
    FeatureTable,
    Featurizer,
    load_corpus,
    load_pairs,
    train_support_model,
)
from mlflow_rag_eval.records import Context, RagRecord

CORPUS = ROOT / "examples" / "rag_pipeline" / "data" / "corpus.jsonl"
PAIRS = [ROOT / "training_data" / f for f in
         ("summedits_dev.jsonl.gz", "wice_dev.jsonl.gz", "begin_dev.jsonl.gz", "northwind_pairs.jsonl")]
FEATURE_TABLE = ROOT / "training_data" / "support_features.npz"
PASSAGE = ("Northwind Rail was founded in 1994 as Northwind Regional Railways. The company adopted the name "
           "Northwind Rail in 2003. Its head office is in Hull.")


#: the rebuild test computes again the feature rows of one passage list in 16 (~6% of the
#: encoder's work); a feature whose code changed moves hundreds of rows: it cannot slip through
RECHECK_EVERY = 16


def test_the_shipped_model_is_what_make_support_model_rebuilds():
    """Retrain from the repository's own data (the Makefile's command) and compare: on the feature
    rows `make support-model` wrote beside the model, one in RECHECK_EVERY computed again here
    and found equal (all of them took ~5.5 min of the suite's 2 cores; the fit is the same)."""
    from mlflow_rag_eval.judges.local_model.cross_encoder import load_cross_encoder

    shipped = load_support_model()
    table = FeatureTable.load(FEATURE_TABLE, recheck_every=RECHECK_EVERY)
    assert table.identity["training"] == shipped.training  # written by the run that wrote the model
    retrained = train_support_model(load_corpus(CORPUS), [p for f in PAIRS for p in load_pairs(f)], seed=0,
                                    cross_encoder=load_cross_encoder(), veto=True, feature_table=table)
    assert table.computed == 0 and table.rechecked > len(table.rows) // (2 * RECHECK_EVERY)
    assert retrained.training == shipped.training  # same inputs, digests and settings
    # embeddings may move in the 7th digit across CPUs; coefficients follow within far less than 1e-3
    np.testing.assert_allclose(retrained.coef, shipped.coef, atol=1e-3)
    np.testing.assert_allclose(retrained.mean, shipped.mean, atol=1e-4)
    assert retrained.intercept == pytest.approx(shipped.intercept, abs=1e-3)
    assert retrained.threshold == pytest.approx(shipped.threshold, abs=0.01)
    assert retrained.entailment_veto == shipped.entailment_veto  # the cross-encoder's confident cut


def test_a_feature_table_is_refused_when_a_rechecked_row_differs_or_another_encoder_wrote_it(tmp_path):
    """The table is a cache the rebuild test trusts: a row computed again must equal it, and a
    table of another encoder or feature list is not read at all."""
    pairs = [(f"Northwind Rail was founded in {1990 + i}.", [PASSAGE]) for i in range(8)]
    table = FeatureTable()
    fresh = Featurizer(Embedder(), table=table)(pairs)
    assert table.computed == 8 and table.identity["features"] == list(FEATURES)
    table.save(tmp_path / "t.npz", note="x")
    again = FeatureTable.load(tmp_path / "t.npz", recheck_every=1)  # every row checked
    np.testing.assert_array_equal(Featurizer(Embedder(), table=again)(pairs), fresh)
    assert again.rechecked == 8 and again.computed == 0 and again.identity["note"] == "x"
    key = FeatureTable.key(*pairs[3])
    again.rows[key] = again.rows[key] + np.eye(len(FEATURES))[FEATURES.index("coverage")] * 0.01
    with pytest.raises(ValueError, match=r"stale: for the claim 'Northwind Rail was founded in 1993\.', coverage"):
        Featurizer(Embedder(), table=again)(pairs)
    other = FeatureTable.load(tmp_path / "t.npz")
    other.identity["encoder_sha256"] = "0" * 64
    with pytest.raises(ValueError, match="the feature table was computed by"):
        Featurizer(Embedder(), table=other)


def test_model_json_round_trips_and_refuses_other_features(tmp_path):
    model = load_support_model()
    again = SupportModel.from_json(model.to_json())
    assert again == model and again.sha256 == model.sha256
    data = json.loads(model.to_json())
    data["features"] = data["features"][:-1] + ["something_else"]
    with pytest.raises(ValueError, match=r"does not compute \(\['something_else'\]\).*retrain"):
        SupportModel.from_json(json.dumps(data))
    with pytest.raises(FileNotFoundError, match="train-local-judge"):
        load_support_model(tmp_path / "nope.json")
    assert default_model_path().name == "support_model.json"


def test_a_model_on_fewer_features_reads_todays_rows():
    """A model names the features it uses: one trained before a feature was added still
    predicts from today's rows, reading its own columns."""
    X = np.random.default_rng(0).normal(size=(5, len(FEATURES)))
    used = FEATURES[:3]
    model = SupportModel(features=used, mean=(0.0,) * 3, scale=(1.0,) * 3, coef=(1.0, -2.0, 0.5),
                         intercept=0.1, threshold=0.5)
    expected = 1 / (1 + np.exp(-(X[:, :3] @ np.array([1.0, -2.0, 0.5]) + 0.1)))
    np.testing.assert_allclose(model.predict(X), expected)
    again = SupportModel.from_json(model.to_json())
    np.testing.assert_allclose(again.predict(X), expected)


def test_support_is_a_probability_that_ranks_corruptions_below_the_sentence(local_judge):
    claims = [
        "The company adopted the name Northwind Rail in 2003.",  # the passage's own sentence
        "The company adopted the name Northwind Rail in 2011.",  # number changed
        "Its head office is in Leeds.",  # name swapped
        "Bikes travel free on every train.",  # from nowhere
    ]
    (verdicts,) = local_judge.verify([VerifyItem(passages=[PASSAGE], claims=claims)])
    scores = [v.score for v in verdicts]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores[0] > max(scores[1:]) and verdicts[0].value and not verdicts[3].value
    assert "not in context: 1 number(s)" in verdicts[1].reason
    assert "not in context: 1 name(s)" in verdicts[2].reason
    assert f"threshold {local_judge.support_threshold:.2f}" in verdicts[0].reason
    assert local_judge.support_threshold == load_support_model().threshold


def test_faithfulness_rows_carry_the_weakest_claims_support(local_judge):
    records = [
        RagRecord(question="q", answer="The company adopted the name Northwind Rail in 2003.",
                  contexts=(Context(PASSAGE),)),
        RagRecord(question="q", answer="The company adopted the name Northwind Rail in 2003. Its head office is in Leeds.",
                  contexts=(Context(PASSAGE),)),
    ]
    result = evaluate_records(records, ["faithfulness"], local_judge)
    (metric,) = result.metrics
    first, second = metric.rows
    claims = second.details["claims"]
    assert second.details["support"] == min(c["score"] for c in claims)
    assert first.details["support"] > second.details["support"]
    assert "(support " in second.justification
    table = result.table()
    assert list(table["faithfulness/support"]) == [first.details["support"], second.details["support"]]


def test_a_trained_model_is_named_by_its_path(tmp_path, local_judge):
    out = tmp_path / "mine.json"
    corpus = tmp_path / "passages.txt"
    corpus.write_text(PASSAGE + "\n\nIn March the company ordered 12 trains from Alstom, which were delivered "
                      "to Leeds on a Friday. The trains were not new.\n")
    result = CliRunner().invoke(main, ["train-local-judge", "--corpus", str(corpus), "--seed", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"judge name local:{out}" in result.output
    model = SupportModel.from_json(out.read_text())
    assert model.training["n_pairs"] == 0 and model.training["seed"] == 1
    assert model.training["threshold_rule"] == "max balanced accuracy on the synthetic claims"
    judge = get_judge(f"local:{out}")
    assert judge.info().name == f"local:{out}"
    assert judge.support_model == model
    assert judge.info().fingerprint != local_judge.info().fingerprint
    assert judge.info().params["support_model_sha256"] == model.sha256[:16]


def test_train_local_judge_needs_inputs(tmp_path):
    result = CliRunner().invoke(main, ["train-local-judge", "--out", str(tmp_path / "m.json")])
    assert result.exit_code == 2 and "give --corpus and/or --labels" in result.output
    empty = tmp_path / "empty.txt"
    empty.write_text("Short.\n")
    result = CliRunner().invoke(main, ["train-local-judge", "--corpus", str(empty), "--out", str(tmp_path / "m.json")])
    assert result.exit_code == 2 and "no training examples" in result.output



def test_the_veto_lowers_support_only_where_it_decides():
    """A claim reaches the threshold exactly when its support does and its entailment reaches
    the veto; every claim the veto does not fail keeps its support (one below the threshold
    may have no entailment), so the support model still ranks them."""
    model = SupportModel(features=FEATURES[:1], mean=(0.0,), scale=(1.0,), coef=(1.0,), intercept=0.0,
                         threshold=0.6, entailment_veto=0.4)
    support = np.array([0.9, 0.9, 0.9, 0.5, 0.7])
    entailment = np.array([0.8, 0.4, 0.1, np.nan, 0.39])
    out = model.with_veto(support, entailment)
    assert list(out >= 0.6) == [True, True, False, False, False]
    assert list(out[[0, 1, 3]]) == [0.9, 0.9, 0.5] and out[2] < out[4] < 0.6  # the veto ranks what it fails
    assert out[2] >= 0.3  # above what the support model alone fails most claims at: a veto is no certainty
    again = SupportModel.from_json(model.to_json())
    assert again.entailment_veto == 0.4 and again.uses_entailment and not again.features_use_entailment
    plain = SupportModel.from_json(model.to_json().replace('"entailment_veto": 0.4', '"entailment_veto": null'))
    assert "entailment_veto" not in plain.to_json()  # a model without one hashes as before


def test_a_judge_named_with_an_entailment_threshold_runs_the_veto_and_names_what_decided(local_judge):
    judge = get_judge("local:minilm-l6?entailment_threshold=0.999999")
    assert judge.cross_encoder is not None and judge.entailment_veto == 0.999999
    assert judge.info().fingerprint != local_judge.info().fingerprint
    (verdicts,) = judge.verify([VerifyItem(passages=[PASSAGE], claims=[
        "The company adopted the name Northwind Rail in 2003.",  # a context sentence word for word: entailed
        "In 2003 the company took on the name Northwind Rail."])])
    copied, paraphrase = verdicts
    assert copied.value and "entailment 1.00" in copied.reason
    alone = local_judge.verify([VerifyItem(passages=[PASSAGE], claims=[paraphrase_claim := "In 2003 the company "
                                                                        "took on the name Northwind Rail."])])[0][0]
    assert paraphrase_claim and alone.value  # the support model alone passes it
    assert not paraphrase.value and paraphrase.reason.startswith("unsupported: not entailed by")
    assert paraphrase.score < judge.support_threshold <= alone.score


def test_train_local_judge_vetoes_at_the_cross_encoders_confident_cut(tmp_path):
    """By default, with labelled pairs or a corpus alone: the veto is the cut the cross-encoder's
    own validation on rewrite/edit twins recorded (no labelled source chooses it), as in the
    shipped model; --no-veto trains a model without one."""
    from mlflow_rag_eval.judges.local_model.cross_encoder import load_cross_encoder

    confident = load_cross_encoder().meta["validation"]["confident"]
    assert confident["rewrites_failed"] <= 0.005 and confident["edits_caught"] > 0.5
    assert load_support_model().entailment_veto == confident["veto"]
    for name, inputs in (("labelled", ["--corpus", str(CORPUS), "--labels", str(PAIRS[-1])]),
                         ("corpus", ["--corpus", str(CORPUS)])):
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(main, ["train-local-judge", *inputs, "--out", str(out)])
        assert result.exit_code == 0, result.output
        model = SupportModel.from_json(out.read_text())
        assert model.entailment_veto == confident["veto"] and "entailment" not in model.features
        assert "0.5% of the validation's faithful rewrites" in model.training["veto_rule"]
        assert f"entailment veto {model.entailment_veto:.3f}" in result.output
        assert get_judge(f"local:{out}").entailment_veto == confident["veto"]
    plain = tmp_path / "plain.json"
    result = CliRunner().invoke(main, ["train-local-judge", "--corpus", str(CORPUS), "--no-veto", "--out", str(plain)])
    assert result.exit_code == 0, result.output
    assert SupportModel.from_json(plain.read_text()).entailment_veto is None
