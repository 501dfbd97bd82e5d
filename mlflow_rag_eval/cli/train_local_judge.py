"""``mlflow-rag-eval train-local-judge``: the local judge's support model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from mlflow_rag_eval.cli._main import UNUSABLE, _one_line, main


@main.command("train-local-judge")
@click.option("--corpus", "corpora", multiple=True, type=click.Path(exists=True),
              help="Passages to make synthetic examples from: a folder of .txt/.md files, a JSONL file "
                   "(field text, context or passage) or a text file (passages split by blank lines). Repeatable.")
@click.option("--labels", "labels", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Human-labelled pairs, JSONL with context, answer, label (0/1). Repeatable.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic examples.")
@click.option("--per-passage", type=int, default=4, show_default=True,
              help="Sentences drawn per passage for synthetic examples.")
@click.option("--synthetic-weight", type=float, default=0.05, show_default=True,
              help="Total weight of a source's synthetic examples against its labelled pairs (1).")
@click.option("--answer-corruption-weight", type=float, default=0.05, show_default=True,
              help="Total weight of a source's corrupted sentences of answers labelled 1 (negatives) against its "
                   "labelled pairs (1); 0: none.")
@click.option("--cross-encoder", "use_cross_encoder", is_flag=True,
              help="Read the cross-encoder's entailment of each claim as one more feature of the model, instead of "
                   "as a veto over it.")
@click.option("--veto/--no-veto", default=True, show_default=True,
              help="The shipped cross-encoder vetoes the model where it is confident (a claim it finds not entailed "
                   "below the cut that fails at most 0.5% of faithful rewrites in its validation is unsupported "
                   "whatever its support), as in the shipped judge. Off with --cross-encoder and "
                   "--train-cross-encoder, which read the cross-encoder as a feature instead.")
@click.option("--train-cross-encoder", "adapt_cross_encoder", is_flag=True,
              help="Also fine-tune a cross-encoder on one-word edits of your corpus and your labelled pairs, "
                   "beside the shipped pairs (needs torch: the [train] extra); its cost is printed first. "
                   "Written beside --out as OUT.cross_encoder.safetensors.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write the model JSON.")
@click.option("--features-out", type=click.Path(dir_okay=False),
              help="Also write every feature row computed (.npz, by a digest of each claim and its passages, with "
                   "the encoder that computed them and the model's training record): a retraining that reads it "
                   "checks a share of the rows and runs the encoder for nothing else.")
def train_local_judge(corpora, labels, seed, per_passage, synthetic_weight, answer_corruption_weight,
                      use_cross_encoder, veto, adapt_cross_encoder, out, features_out) -> None:
    """Train the local judge's support model and write it as JSON; use it as the judge local:OUT.

    With --cross-encoder the support model also reads the shipped cross-encoder's entailment;
    with --train-cross-encoder a cross-encoder adapted to your corpus is trained first and read.

    Exit code 2: no corpus or labels, or no training example in them.
    """
    from mlflow_rag_eval.judges.local_model.cross_encoder import load_cross_encoder
    from mlflow_rag_eval.judges.local_model.training import (
        FeatureTable,
        load_corpus,
        load_pairs,
        train_support_model,
    )

    if not corpora and not labels:
        click.echo("cannot train: give --corpus and/or --labels", err=True)
        raise SystemExit(UNUSABLE)
    try:
        passages = [p for c in corpora for p in load_corpus(c)]
        pairs = [p for f in labels for p in load_pairs(f)]
        cross_encoder, cross_encoder_path = None, None
        if adapt_cross_encoder:
            cross_encoder_path = str(_adapt_cross_encoder(passages, pairs, out, seed))
        veto = veto and not (use_cross_encoder or adapt_cross_encoder)  # read as a feature instead
        if use_cross_encoder or adapt_cross_encoder or veto:
            cross_encoder = load_cross_encoder(cross_encoder_path)
        table = FeatureTable() if features_out else None
        model = train_support_model(passages, pairs, seed=seed, per_passage=per_passage,
                                    synthetic_weight=synthetic_weight,
                                    answer_corruption_weight=answer_corruption_weight, cross_encoder=cross_encoder,
                                    veto=veto, feature_table=table)
    except (ValueError, UnicodeDecodeError, FileNotFoundError) as exc:
        click.echo(f"cannot train: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    if adapt_cross_encoder:  # the judge finds it beside the model
        model = dataclasses.replace(model, training={**model.training,
                                                     "cross_encoder_file": Path(cross_encoder_path).name})
    Path(out).write_text(model.to_json())
    if table is not None:
        table.save(features_out, training=model.training)
    t = model.training
    click.echo(f"wrote {out}: {t['n_synthetic']} synthetic examples from {t['n_passages']} passages, "
               f"{t['n_pairs']} labelled pairs, {t['n_answer_corruptions']} corrupted answer sentences; "
               f"threshold {model.threshold:.3f}"
               + (f", entailment veto {model.entailment_veto:.3f}" if model.entailment_veto is not None else "")
               + f"; judge name local:{out}")


def _adapt_cross_encoder(passages, pairs, out, seed) -> Path:
    """The shipped cross-encoder fine-tuned further on one-word edits of the user's passages and
    the user's labelled pairs (their answers' sentences against their best windows); the cost is
    printed before the work starts."""
    from mlflow_rag_eval.judges.local_model.cross_encoder import default_cross_encoder_path
    from mlflow_rag_eval.judges.local_model.cross_training import estimate_seconds, train_cross_encoder, user_pairs

    training = user_pairs(passages, pairs, seed=seed)
    if not training:
        raise ValueError("no sentence of five words or more in the corpus or the labelled pairs to adapt on")
    click.echo(f"adapting the shipped cross-encoder on {len(training)} pairs from your data (1 epoch): about "
               f"{estimate_seconds(len(training), 1) / 60:.1f} min on this machine's cores", err=True)
    path = Path(out).with_suffix(".cross_encoder.safetensors")
    train_cross_encoder(training, path, seed=seed, epochs=1, lr=2e-5, head_lr=2e-4,
                        start_from=default_cross_encoder_path(), log=lambda line: click.echo(line, err=True))
    return path
