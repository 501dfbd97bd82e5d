"""The local judge's cross-encoder: the numpy forward pass, windows over long texts, the shipped
artifact against the inputs it records, and the training recipe on a slice."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT

from mlflow_rag_eval.judges.local_model.cross_encoder import (
    CrossEncoder,
    _windows,
    default_cross_encoder_path,
    load_cross_encoder,
)
from mlflow_rag_eval.judges.local_model.cross_training import (
    load_entailment_pairs,
    pairs_digest,
    per_source,
    write_safetensors,
)
from mlflow_rag_eval.judges.local_model.embedding import load_model, model_files_sha256, resolve_model_path
from mlflow_rag_eval.judges.local_model.encoder import read_safetensors

PAIRS = ROOT / "training_data" / "entailment_pairs.jsonl.gz"


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """A cross-encoder whose top layers are the base model's own (nothing fine-tuned) and whose
    head is random: its logits must be the full model's [CLS] state through that head."""
    base_path = resolve_model_path("minilm-l6")
    weights = read_safetensors(f"{base_path}/model.safetensors")
    rng = np.random.default_rng(0)
    tensors = {k: v.astype(np.float16) for k, v in weights.items() if k.startswith(("encoder.layer.4.", "encoder.layer.5."))}
    tensors |= {"head.dense.weight": rng.normal(0, 0.05, (384, 384)).astype(np.float16),
                "head.dense.bias": np.zeros(384, np.float16),
                "head.out.weight": rng.normal(0, 0.05, (1, 384)).astype(np.float16),
                "head.out.bias": np.zeros(1, np.float16)}
    path = tmp_path_factory.mktemp("ce") / "untrained.safetensors"
    write_safetensors(path, tensors)
    path.with_suffix(".json").write_text(json.dumps({"frozen_layers": 4, "max_claim_tokens": 8,
                                                     "max_premise_tokens": 16}))
    return CrossEncoder(path), {k: v.astype(np.float32) for k, v in read_safetensors(path).items()}


def test_the_forward_pass_is_the_whole_model_on_the_pair(untrained):
    ce, w = untrained
    base = load_model(resolve_model_path("minilm-l6"))
    claim, premise = "Revenue fell.", "Revenue rose 12% in the third quarter."
    (ids, types), = ce.inputs([(claim, premise)])[0][0]
    assert ids[0] == ce.cls and ids.count(ce.sep) == 2 and types[-1] == 1 and types[0] == 0
    # the base model's layers 4 and 5 at float16 precision, as the artifact holds them
    states = base._forward(np.array([ids]), np.ones((1, len(ids)), np.float32), types=np.array([types]),
                           layers=base.layers[:4])
    states = base._forward(np.array([ids]), np.ones((1, len(ids)), np.float32), layers=ce.top, states=states)
    pooled = np.tanh(states[0, 0] @ w["head.dense.weight"].T + w["head.dense.bias"])
    expected = pooled @ w["head.out.weight"][0] + w["head.out.bias"][0]
    assert ce.logits([(ids, types)])[0] == pytest.approx(expected, abs=1e-5)
    # batched with a longer pair (padding), the same logit
    long = ce.inputs([("A much longer claim about revenue in the quarter.", premise * 2)])[0][0][0]
    assert ce.logits([long, (ids, types)])[1] == pytest.approx(expected, abs=1e-5)


def test_long_texts_are_read_as_windows_not_cut(untrained):
    ce, _ = untrained
    assert _windows(list(range(10)), 4) == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert _windows(list(range(3)), 4) == [[0, 1, 2]]
    premise = " ".join(f"Sentence {k} is about item {k}." for k in range(12))
    windows = ce.inputs([("Item three.", premise)])[0]
    assert len(windows) == 1 and len(windows[0]) > 2  # every part of the premise is read
    p = ce.entailment([("Item three.", premise)])[0]
    flat = ce.logits(windows[0])
    assert p == pytest.approx(1 / (1 + np.exp(-flat.max())))  # the best premise window
    claim = " ".join(["word"] * 20)
    claim_windows = ce.inputs([(claim, "Short premise.")])[0]
    assert len(claim_windows) > 1  # a long claim: every part judged, the worst counts
    logits = [ce.logits(row)[0] for row in claim_windows]
    assert ce.entailment([(claim, "Short premise.")])[0] == pytest.approx(1 / (1 + np.exp(-min(logits))))


def test_the_shipped_artifact_records_the_inputs_it_was_made_from():
    """What `make cross-encoder` rebuilds from: the committed pairs (as the Makefile selects
    them) and the shipped MiniLM."""
    path = default_cross_encoder_path()
    meta = json.loads(path.with_suffix(".json").read_text())
    selection = meta["training"]["selection"]
    assert selection["files"] == [PAIRS.name] and selection["limit"] is None
    pairs = per_source(load_entailment_pairs(PAIRS), selection["max_per_source"])
    assert meta["training"]["pairs_digest"] == pairs_digest(pairs)
    assert meta["training"]["n_pairs"] == len(pairs)
    assert meta["base_model_sha256"] == model_files_sha256(resolve_model_path("minilm-l6"))
    assert path.stat().st_size <= 25e6 and meta["dtype"] == "float16"
    weights = read_safetensors(path)
    assert {k for k in weights if not k.startswith("head.")} == {
        k for k in read_safetensors(f"{resolve_model_path('minilm-l6')}/model.safetensors")
        if any(k.startswith(f"encoder.layer.{i}.") for i in range(meta["frozen_layers"], 6))}


def test_the_recipe_on_a_slice_is_deterministic_and_learns(tmp_path):
    """The shipped recipe (3 trainable layers, rewrite/edit twins ranked) on a slice of the
    committed pairs, twice: the same bytes; its logits move towards the labels it was trained
    on; the threshold is chosen on validation twins and recorded."""
    from mlflow_rag_eval.judges.local_model.cross_training import train_cross_encoder

    pairs = _slice()
    outs = []
    for k in range(2):
        out = tmp_path / f"ce{k}.safetensors"
        meta = train_cross_encoder(pairs, out, epochs=4, seed=3, threads=1, validation=pairs[:16], log=lambda _: None)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert meta["training"]["pairs_digest"] == pairs_digest(pairs) and meta["training"]["seed"] == 3
    assert meta["frozen_layers"] == 3 and meta["training"]["groups"] > 0
    assert 0 < meta["validation"]["threshold"] < 1 and meta["validation"]["n_entailed"] == 8
    trained = CrossEncoder(tmp_path / "ce0.safetensors")
    p = trained.entailment([(x.claim, x.premise) for x in pairs])
    y = np.array([x.label for x in pairs])
    assert p[y == 1].mean() > p[y == 0].mean()


def _slice():
    """32 rewrite/edit twins of the example corpus's sentences (as ``make entailment-pairs``
    makes them) and 64 entailment pairs of the committed file."""
    from mlflow_rag_eval._util.text import split_sentences
    from mlflow_rag_eval.judges.local_model.cross_training import EntailmentPair
    from mlflow_rag_eval.judges.local_model.rewrites import rewrite_edit_pairs

    corpus = [json.loads(line)["text"] for line in (ROOT / "examples/rag_pipeline/data/corpus.jsonl").open()]
    twins = []
    for g, pair in enumerate(rewrite_edit_pairs([split_sentences(p) for p in corpus], seed=0)[:32]):
        twins += [EntailmentPair(pair.rewrite, pair.premise, 1, "rewrites", pair.rewrite_kind, g),
                  EntailmentPair(pair.edit, pair.premise, 0, "rewrites", pair.edit_kind, g)]
    return twins + [p for p in load_entailment_pairs(PAIRS) if p.group < 0][::1000][:64]


def test_a_stopped_run_resumes_from_its_checkpoint_to_the_same_bytes(tmp_path):
    """Stopped after a checkpoint (here, every step), the same command goes on from it: the
    bottom states are read back, not recomputed, and the result is the uninterrupted run's."""
    import subprocess
    import sys
    import time

    pairs = _slice()
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps({"claim": p.claim, "premise": p.premise, "label": p.label, "source": p.source,
                                          "group": p.group}) + "\n" for p in pairs))
    script = ("import sys; from mlflow_rag_eval.judges.local_model.cross_training import *; "
              f"train_cross_encoder(load_entailment_pairs({str(source)!r}), sys.argv[1], epochs=6, seed=1, threads=1, "
              "work_dir=sys.argv[2], checkpoint_seconds=0, log=lambda line: print(line, flush=True))")
    whole = subprocess.run([sys.executable, "-c", script, tmp_path / "whole.safetensors", tmp_path / "w1"],
                           capture_output=True, text=True, check=True)
    assert "resumed" not in whole.stdout
    run = subprocess.Popen([sys.executable, "-c", script, tmp_path / "cut.safetensors", tmp_path / "w2"],
                           stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "w2").glob("checkpoint-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    run.kill()
    run.wait()
    assert not (tmp_path / "cut.safetensors").exists()  # stopped before the end
    again = subprocess.run([sys.executable, "-c", script, tmp_path / "cut.safetensors", tmp_path / "w2"],
                           capture_output=True, text=True, check=True)
    assert "bottom states read from" in again.stdout and "resumed from" in again.stdout
    assert (tmp_path / "cut.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()


def test_the_shipped_cross_encoder_ranks_a_paraphrase_above_a_changed_word():
    """The cross-encoder alone (the support model combines it with the lexical features and
    sets the threshold): a paraphrase of the context is more entailed than the context with one
    word changed — a place, a colour, an inserted "not", a country."""
    ce = load_cross_encoder()
    cases = [
        ("The meeting is on Tuesday in Berlin.", "The meeting takes place in Berlin on Tuesday.",
         "The meeting is on Tuesday in Paris."),
        ("The walls of the kitchen are painted blue.", "The kitchen has blue walls.",
         "The walls of the kitchen are painted green."),
        ("Pets are allowed in the hotel rooms.", "The hotel allows pets in its rooms.",
         "Pets are not allowed in the hotel rooms."),
        ("The wine is imported from Italy.", "Italy is where the wine is imported from.",
         "The wine is imported from Spain."),
    ]
    p = ce.entailment([(claim, context) for context, *claims in cases for claim in claims]).reshape(-1, 2)
    assert (p[:, 0] > p[:, 1] + 0.1).all(), p


def test_a_support_model_trained_on_the_cross_encoder_runs_it_and_names_it(tmp_path):
    """`train-local-judge --cross-encoder`: the model reads the entailment feature, the judge
    runs the cross-encoder for it, fingerprints its weights, and refuses another cross-encoder."""
    from click.testing import CliRunner

    from mlflow_rag_eval.cli import main
    from mlflow_rag_eval.judges import get_judge
    from mlflow_rag_eval.judges.base import VerifyItem
    from mlflow_rag_eval.judges.local_model.support_model import SupportModel

    corpus = tmp_path / "passages.txt"
    corpus.write_text("Northwind Rail was founded in 1994 as Northwind Regional Railways. The company adopted the "
                      "name Northwind Rail in 2003.\n\nIn March the company ordered 12 trains from Alstom, which were "
                      "delivered to Leeds on a Friday. The trains were not new.\n")
    out = tmp_path / "mine.json"
    result = CliRunner().invoke(main, ["train-local-judge", "--corpus", str(corpus), "--cross-encoder", "--out",
                                       str(out)])
    assert result.exit_code == 0, result.output
    model = SupportModel.from_json(out.read_text())
    assert model.uses_entailment and model.training["cross_encoder_sha256"] == load_cross_encoder().sha256[:16]
    judge = get_judge(f"local:{out}")
    assert judge.cross_encoder is load_cross_encoder()
    assert judge.info().params["cross_encoder_sha256"] == load_cross_encoder().sha256[:16]
    (verdicts,) = judge.verify([VerifyItem(passages=["The company adopted the name Northwind Rail in 2003."],
                                           claims=["In 2003 the company took the name Northwind Rail."])])
    assert 0.0 <= verdicts[0].score <= 1.0
    assert get_judge("local:minilm-l6").cross_encoder is load_cross_encoder()  # the shipped model's veto runs it
    assert get_judge("local:minilm-l6?entailment_threshold=0").cross_encoder is None  # no veto: never run
    other = tmp_path / "other.safetensors"
    other.write_bytes(default_cross_encoder_path().read_bytes())
    other.with_suffix(".json").write_text(default_cross_encoder_path().with_suffix(".json").read_text() + " ")
    with pytest.raises(ValueError, match="trained on the cross-encoder"):
        get_judge(f"local:{out}", cross_encoder=str(other))
