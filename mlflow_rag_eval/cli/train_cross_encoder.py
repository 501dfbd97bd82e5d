"""``mlflow-rag-eval train-cross-encoder``: the local judge's entailment cross-encoder."""

from __future__ import annotations

from pathlib import Path

import click

from mlflow_rag_eval.cli._main import UNUSABLE, _one_line, main


@main.command("train-cross-encoder")
@click.option("--pairs", "pair_files", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Entailment pairs, JSONL (.gz) with claim, premise, label (0/1), source, and optionally group "
                   "(a rewrite and its edit: one batch, ranked). Repeatable.")
@click.option("--validation", "validation_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Rewrite/edit twins (pairs sharing a group) the threshold is chosen on; recorded in the JSON.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the shuffles and the head's start.")
@click.option("--epochs", type=int, default=3, show_default=True, help="Passes over the pairs.")
@click.option("--frozen-layers", type=int, default=3, show_default=True,
              help="Bottom layers of the embedding model kept as they are (their output computed once).")
@click.option("--rank-weight", type=float, default=1.0, show_default=True,
              help="Weight of the ranking loss (a group's entailed pair above its other) beside the classification.")
@click.option("--max-per-source", type=int, default=None,
              help="At most N pairs of each source (the first in file order): the training time's lever.")
@click.option("--limit", type=int, default=None, help="Train on the first N pairs only (a quick check).")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="Where the bottom layers' states and a checkpoint every ~10 minutes are kept; the same command "
                   "run again with the same --work-dir resumes from the last checkpoint.")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Where to write the weights (.safetensors; the .json beside it records how).")
def train_cross_encoder_command(pair_files, validation_file, seed, epochs, frozen_layers, rank_weight, max_per_source,
                                limit, work_dir, out) -> None:
    """Fine-tune the local judge's cross-encoder (the top layers of its embedding model and a
    head) on entailment pairs; needs torch (the [train] extra). Name it in a judge with
    local:minilm-l6?cross_encoder=OUT beside a support model trained on it.

    Exit code 2: unreadable pairs, or torch missing.
    """
    from mlflow_rag_eval.judges.local_model.cross_training import (
        estimate_seconds,
        load_entailment_pairs,
        per_source,
        train_cross_encoder,
    )

    try:
        pairs = per_source([p for f in pair_files for p in load_entailment_pairs(f)], max_per_source)[:limit]
        validation = load_entailment_pairs(validation_file) if validation_file else ()
        click.echo(f"{len(pairs)} pairs, {epochs} epoch(s): about {estimate_seconds(len(pairs), epochs) / 60:.0f} min",
                   err=True)
        selection = {"files": [Path(f).name for f in pair_files], "max_per_source": max_per_source, "limit": limit,
                     "validation": Path(validation_file).name if validation_file else None}
        train_cross_encoder(pairs, out, seed=seed, epochs=epochs, frozen_layers=frozen_layers, rank_weight=rank_weight,
                            selection=selection, validation=validation, work_dir=work_dir,
                            log=lambda line: click.echo(line, err=True))
    except (ValueError, UnicodeDecodeError) as exc:
        click.echo(f"cannot train: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    except ModuleNotFoundError as exc:
        click.echo(f"cannot train: {exc.name} is missing; pip install 'mlflow-rag-eval[train]'", err=True)
        raise SystemExit(UNUSABLE) from None
