"""Which evaluation runs are a version's evidence, which one the gate judges, and when two of
them disagree.

A version's evaluations are found by what MLflow lets no one change
(:func:`~mlflow_rag_eval.tracking.search.evaluation_runs`: the version's ``run_id``, the runs
whose params mark them as evaluations and whose inputs name the version's logged model), never
by tags. More than one run may evaluate the same model on the same golden set: an evaluation
repeated, or one logged by anyone who can write to the experiment, through the public API, from
answers the version never gave. The policy's ``evidence`` key says which counts:

* ``agreeing`` (the default): every finished, live evaluation of the version on the golden set
  by the same judge (fingerprint and prompts version) must agree with the newest, which is the
  one judged. Two evaluations disagree when, on a gated metric, the paired difference of their
  row scores is beyond noise: its bootstrap CI (at the policy's ``confidence``) excludes 0, or
  every row moved by the same non-zero amount. Disagreeing evidence is refused (exit 2, naming
  the runs), not resolved by recency: to pass, a forger must log an evaluation that agrees with
  the version's own, which changes nothing the gate decides;
* ``version-run``: only the run the version was registered from (``mv.run_id``, which no one
  can change after registration) counts; a version registered from elsewhere is refused.
  Trusts whoever registered the version;
* ``newest``: the newest evaluation counts, whatever the others say (the gate's rule before
  this one). Trusts every writer of the model's experiment.

Whatever the rule, the run judged must be finished and live, and must not start after the
gate's clock (:func:`refuse_unusable`, :func:`refuse_future`).
"""

from __future__ import annotations

import datetime as _dt
import time

from mlflow_rag_eval import stats
from mlflow_rag_eval.tracking import search as lookup

__all__ = ["CLOCK_SKEW_S", "Unusable", "dated", "judged_run", "peers", "refuse_disagreeing", "refuse_future",
           "refuse_unusable"]

#: how far ahead of the gate's clock a run may have started (clocks of two machines disagree)
CLOCK_SKEW_S = 60


class Unusable(Exception):
    """The gate cannot decide on this input (exit 2); the message says why."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _in_future(run) -> bool:
    return (run.info.start_time or 0) > (time.time() + CLOCK_SKEW_S) * 1000


def dated(runs: list) -> list:
    """``runs`` (newest first) without the deleted ones dated in the future: a run dated ahead of
    the gate's clock would be the newest for as long as the date is ahead, so deleting it is how
    its owner lets the gate judge the others."""
    return [r for r in runs if not (_in_future(r) and r.info.lifecycle_stage != "active")]


def refuse_future(run, what: str) -> None:
    """Exit 2 for a run that started after the gate's clock (beyond :data:`CLOCK_SKEW_S`): the
    newest run is the one judged, and a start time set ahead would choose the evidence."""
    if _in_future(run):
        started = _dt.datetime.fromtimestamp(run.info.start_time / 1000, _dt.timezone.utc).isoformat(timespec="seconds")
        raise Unusable(f"{what} started at {started}, after this gate's clock ({_now()[:19]}Z): a run dated in "
                       "the future would be the newest, and judged, until that date; fix the clock of the "
                       "machine that evaluated it, delete the run (MlflowClient().delete_run) and evaluate again")


def refuse_unusable(run, what: str, version) -> None:
    """Exit 2 when ``run`` is not a finished, live run: its table and figures may be partial
    (RUNNING: killed before it ended), or someone said they do not count (deleted, FAILED)."""
    state = lookup.unusable_state(run)
    if state is None:
        return
    way_out = {"deleted": f"restore it (MlflowClient().restore_run) or evaluate v{version} again",
               "RUNNING": f"wait for it to end, or evaluate v{version} again if its process died",
               "SCHEDULED": f"wait for it to end, or evaluate v{version} again if its process died"}
    key = "deleted" if run.info.lifecycle_stage != "active" else run.info.status
    raise Unusable(f"{what} is {state}: the gate decides only on finished, live evaluation runs; "
                   f"{way_out.get(key, f'evaluate v{version} again')}")


def judged_run(runs: list, mv, rule: str, model: str):
    """The run the gate judges among ``runs`` (the version's evaluations, newest first): under
    ``version-run`` only ``mv.run_id``, else the newest. None when there is none.

    Raises:
        Unusable: ``version-run``, and the version was not registered from one of ``runs``.
    """
    if rule != "version-run":
        return runs[0] if runs else None
    own = [r for r in runs if r.info.run_id == mv.run_id]
    if own:
        return own[0]
    if runs:
        raise Unusable(
            f"the policy says evidence: version-run, but {model} v{mv.version} was not registered from one of its "
            f"evaluation runs (its run_id: {mv.run_id or 'none'}; its evaluations: "
            f"{', '.join(r.info.run_id for r in runs)}): register the version from its evaluation run "
            "(MlflowClient().create_model_version(..., run_id=<evaluation run>)), or choose another evidence rule")
    return None


def _identity(run) -> tuple:
    params = run.data.params
    return (params.get("rag_eval.dataset_digest"), params.get("rag_eval.judge_fingerprint"),
            params.get("rag_eval.prompts_version"))


def peers(runs: list, judged, rule: str) -> list:
    """The runs that must agree with ``judged`` under ``rule``: under ``agreeing``, the other
    finished, live evaluations on its golden set by its judge and prompts; none otherwise."""
    if rule != "agreeing":
        return []
    return [r for r in runs if r.info.run_id != judged.info.run_id and lookup.unusable_state(r) is None
            and _identity(r) == _identity(judged)]


def _disagreement(judged, peer, metric: str, confidence: float) -> str | None:
    """Why two evaluations of one model disagree on ``metric`` beyond noise, or None."""
    from mlflow_rag_eval.compare import paired_scores

    if metric not in judged.metric_keys() or metric not in peer.metric_keys():
        return None
    own, other = paired_scores(judged, peer, metric)
    if not len(own):
        return None
    diff = other - own
    mean_own, mean_other = float(own.mean()), float(other.mean())
    shown = f"{metric} mean {mean_own:.3f} vs {mean_other:.3f} over {len(own)} rows scored in both"
    if stats.all_equal(diff):
        return None if abs(float(diff[0])) <= 1e-9 else f"{shown} (every row differs by {float(diff[0]):+.3f})"
    ci = stats.paired_difference_ci(own, other, confidence=confidence)
    if ci is None or ci[0] <= 0.0 <= ci[1]:
        return None
    return f"{shown} (paired difference {float(diff.mean()):+.3f}, {confidence:.0%} CI [{ci[0]:+.3f}, {ci[1]:+.3f}])"


def refuse_disagreeing(judged, others: list, metrics, confidence: float, what: str) -> None:
    """Exit 2 when an evaluation of ``others`` (loaded and verified, as ``judged``) disagrees
    with ``judged`` on a metric of ``metrics`` beyond noise (see the module docstring).

    Raises:
        Unusable: naming both runs, the metric and both figures, and the ways out.
    """
    for other in others:
        for metric in metrics:
            why = _disagreement(judged, other, metric, confidence)
            if why:
                raise Unusable(
                    f"the evaluations of {what} disagree: run {judged.run_id} (the newest) and run {other.run_id} "
                    f"give {why}. Both evaluated the same model on the same golden set with the same judge; "
                    "anyone who can write to the experiment can log an evaluation, so the gate does not pick one "
                    "by date: delete the one that is not the version's (MlflowClient().delete_run), or set "
                    "evidence: version-run (only the run the version was registered from) or evidence: newest "
                    "in the policy")
