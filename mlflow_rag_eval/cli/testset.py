"""``mlflow-rag-eval testset``: a golden set generated from a corpus."""

from __future__ import annotations

import click

from mlflow_rag_eval.cli._main import UNUSABLE, _one_line, main
from mlflow_rag_eval.cli._options import (
    _judge,
    _judge_limit_options,
    _tracking_option,
    _use_store,
)


@main.command("testset")
@click.option("--corpus", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Passages, JSONL: id and text required, title and metadata (tags, topic) optional.")
@click.option("--judge", required=True,
              help="The judge that writes and checks the questions: an LLM judge name, or 'scripted' "
                   "(deterministic rules, offline). The embedded local judge cannot write text.")
@click.option("--n", "n", type=int, default=100, show_default=True, help="Questions wanted.")
@click.option("--mix", default="0.5,0.25,0.25", show_default=True,
              help="Shares of single-passage, two-passage and unanswerable questions.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the passage sampling.")
@click.option("--oversample", type=float, default=1.25, show_default=True,
              help="Candidates written per wanted question, so drops can be made up.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write the golden set (JSONL).")
@click.option("--log-as", "log_as", default=None,
              help="Also log the set in MLflow under this name (a run with the set as a dataset input, and an "
                   "MLflow evaluation dataset where the store has them).")
@click.option("--experiment", default=None, help="Experiment to log in (default: the active one).")
@_tracking_option
@_judge_limit_options
def testset_command(corpus, judge, n, mix, seed, oversample, out, log_as, experiment, tracking_uri,
                    judge_options) -> None:
    """Write a golden set from your documents: questions one passage answers, questions that need
    two, and questions the corpus cannot answer, each checked by the judge; prints what was
    dropped and why, and the set's digest (the rag_eval.dataset_digest of every run on it).

    Exit code 2: unreadable corpus, bad --mix, or a judge that cannot write text.
    """
    from mlflow_rag_eval.golden import generate_golden_set, load_passages
    from mlflow_rag_eval.judges import JudgeCapabilityError

    try:
        shares = tuple(float(x) for x in mix.split(","))
        golden = generate_golden_set(load_passages(corpus), _judge(judge, judge_options), n=n, mix=shares, seed=seed,
                                     oversample=oversample)
    except (ValueError, JudgeCapabilityError) as exc:
        click.echo(f"cannot write a golden set: {_one_line(exc)}", err=True)
        raise SystemExit(UNUSABLE) from None
    golden.to_jsonl(out)
    click.echo(golden.report.to_text())
    click.echo(f"wrote {out}: {len(golden.rows)} questions, digest {golden.digest}")
    if log_as:
        from mlflow_rag_eval.golden import log_golden_set

        _use_store(tracking_uri, experiment)
        logged = log_golden_set(golden, log_as)
        where = (f"MLflow evaluation dataset {logged.dataset_id}" if logged.dataset_id
                 else f"run {logged.run_id} (this store has no evaluation datasets)")
        click.echo(f"logged as {log_as!r}: {where}")
