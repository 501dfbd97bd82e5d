"""The promotion gate: judge a registered model version against a policy and the champion.

Steps of :func:`gate`:

1. find the candidate version's evaluation runs (:func:`~mlflow_rag_eval.tracking.search.evaluation_runs`:
   ``mv.run_id`` and its logged model's runs in that model's experiment, known by their params
   and run inputs, never by tags), on the policy's ``dataset_digest`` (by param); none -> exit 2.
   The one judged is the newest (``evidence: version-run``: the run the version was registered
   from), whatever its state: deleted, FAILED, KILLED, still RUNNING or SCHEDULED -> exit 2
   naming it (an older finished run is not judged in its place: deleting or failing the newest
   evaluation would choose the evidence); so is one that started after the gate's clock (beyond
   :data:`~mlflow_rag_eval.gate.selection.CLOCK_SKEW_S`), unless it is deleted. Under the
   default ``evidence: agreeing``, the other finished evaluations by the same judge must agree
   with it, else exit 2 naming the runs (:mod:`~mlflow_rag_eval.gate.selection`);
2. find the champion (the version holding ``champion_alias``). When no version holds it but the
   gate gave the alias to a version (registered model tag ``rag_eval.gate.alias.<alias>``), that
   version was deleted or the alias removed: exit 2 unless ``first_version`` (fail closed).
   Otherwise, if the model has no alias at all (or the caller says ``first_version``), the candidate is
   a first version, judged on required metrics, rows, error rate, floors/ceilings and
   calibration only; if the model has other aliases, the alias is taken for a typo and the
   input is unusable (exit 2, naming the aliases that exist), because a mistyped alias would
   otherwise skip the regression check and promote a worse version. The champion's
   evaluation must be on the candidate's dataset digest (else exit 2); among those, the one
   judged by the same judge is preferred, chosen and checked by the same evidence rule as the
   candidate's. With a champion and no ``max_regression``, the candidate is refused unless the
   policy says ``regression: none``;
3. a different judge fingerprint or prompts version refuses the candidate (exit 1, "judge
   changed") unless ``allow_judge_change``, which the decision then records;
4. the evidence (:mod:`~mlflow_rag_eval.gate.evidence`): each run's rows table, slices and
   lineage checked against the digests sealed in its params, the table's trace ids against the
   run's traces, the directions taken from the metric registry; anything else -> exit 2. The
   figures: each figure the checks read (per gated metric ``n_scored``, ``n_error``,
   ``mean``; the statistics its floors and ceilings name) is recomputed from the run's per-row
   table (:func:`~mlflow_rag_eval.gate.checks.verified_figures`), for the candidate and the
   champion; a logged figure that disagrees (beyond float noise), or is infinite, -> exit 2:
   run metrics can be overwritten by anyone who can write to the run, the table is what was
   evaluated. The sha256 of each table is recorded (``rows_table_sha256``);
5. the checks, on those figures: metric checks, per-slice limits (read from the candidate's
   sealed ``rag_eval/slices.json``), the paired regression rule vs the champion, calibration
   (recomputed from its labels); PPI figures are recomputed from the runs' human labels;
6. record (``record=True``): ``rag_eval/gate_decision.json`` (and a timestamped copy under
   ``rag_eval/gate_decisions/``) and ``rag_eval.gate*`` tags on the candidate's evaluation run;
   model-version tags ``rag_eval.gate`` (failed; on a pass ``pending`` until the alias moved, then
   ``passed``, or ``aborted``), ``rag_eval.gate_run_id``,
   ``rag_eval.gate_policy_sha256``, ``rag_eval.gate_decided_at``; on a pass, alias
   ``previous_<alias>`` to the old champion, then ``<alias>`` to the candidate, and the registered
   model tag ``rag_eval.gate.alias.<alias>``. On a fail the aliases stay. All of it under the
   model's promotion lease, and only if the alias still points where the decision read it, re-read
   right before the move (:func:`~mlflow_rag_eval.gate.promotion.record_decision`): else exit 2
   naming who holds it now; the alias is never overwritten.
   Unusable input (exit 2) records nothing: no decision was made.

Exit codes: 0 passed, 1 refused, 2 unusable input (bad or empty policy, missing version or
evaluation, an evaluation run that is not finished and live, a run whose metrics disagree with
its rows table, unknown alias, unreadable run or tag, dataset digest mismatch).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_rag_eval.gate.checks import (
    AlteredRun,
    Check,
    calibration_check,
    metric_checks,
    regression_check,
    regression_p_values,
    slice_checks,
    table,
    verified_figures,
)
from mlflow_rag_eval.gate.evidence import recompute_ppi, verify_evidence
from mlflow_rag_eval.gate.policy import GatePolicy, PolicyError, load_policy
from mlflow_rag_eval.gate.promotion import (
    DECISION_FILE,
    DECISIONS_DIR,
    PromotionConflict,
    promotion_lease,
    record_decision,
)
from mlflow_rag_eval.gate.selection import (
    Unusable,
    dated,
    judged_run,
    peers,
    refuse_disagreeing,
    refuse_future,
    refuse_unusable,
)
from mlflow_rag_eval.tracking import search as lookup

__all__ = ["DECISION_FILE", "DECISIONS_DIR", "GateDecision", "gate"]



@dataclass
class GateDecision:
    """The outcome of :func:`gate`, as printed, logged and returned."""

    model: str
    candidate_version: str
    passed: bool
    exit_code: int  # 0 passed, 1 refused, 2 unusable input
    reasons: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    champion_alias: str = "champion"
    champion_version: str | None = None
    candidate_run_id: str | None = None
    champion_run_id: str | None = None
    comparison: dict[str, Any] | None = None
    policy_hash: str | None = None
    policy: dict[str, Any] | None = None
    allow_judge_change: bool = False
    #: the judge's name (``rag_eval.judge``) of the candidate's (and the champion's) evaluation
    judges: dict[str, str | None] = field(default_factory=dict)
    judge_fingerprints: dict[str, str | None] = field(default_factory=dict)
    prompts_versions: dict[str, str | None] = field(default_factory=dict)
    dataset_digest: str | None = None
    #: sha256 of the bytes of the candidate's (and the champion's) ``eval_results_table.json``:
    #: the rows the figures of this decision were recomputed from
    rows_table_sha256: dict[str, str | None] = field(default_factory=dict)
    decided_at: str = ""
    #: the version holding ``champion_alias`` when the gate read it (the candidate itself, when
    #: it already holds it; None when no version does)
    alias_holder: str | None = None
    #: which comparison with the champion ran (the header's ``regression:`` line)
    regression: str = ""

    @property
    def verdict(self) -> str:
        return {0: "passed", 1: "failed"}.get(self.exit_code, "unusable input")

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["verdict"] = self.verdict
        out["schema_version"] = 1
        return out

    def champion_line(self) -> str:
        """Who holds the champion alias, as the header says it."""
        alias = self.champion_alias
        if self.champion_version is not None:
            run = f"; run {self.champion_run_id}" if self.champion_run_id else ""
            return f"v{self.champion_version} (holds alias {alias!r}{run})"
        if self.alias_holder is not None and self.alias_holder == self.candidate_version:
            return f"none to compare with: the candidate v{self.candidate_version} already holds alias {alias!r}"
        if self.alias_holder is not None:
            return f"v{self.alias_holder} holds alias {alias!r} (not compared: the gate stopped before)"
        return f"none (first version: no version holds alias {alias!r})"

    def to_text(self) -> str:
        lines = [
            f"GATE {self.verdict.upper()}: {self.model} v{self.candidate_version} (exit {self.exit_code})",
            f"candidate run: {self.candidate_run_id or '-'}   champion: {self.champion_line()}",
            f"dataset digest: {self.dataset_digest or '-'}   judge: {self.judges.get('candidate') or '-'} "
            f"(fingerprint {self.judge_fingerprints.get('candidate') or '-'}, "
            f"prompts {self.prompts_versions.get('candidate') or '-'})"
            + ("   allow_judge_change: yes" if self.allow_judge_change else ""),
            f"policy sha256: {self.policy_hash or '-'}",
        ]
        if self.regression:
            lines.insert(3, f"regression check: {self.regression}")
        if self.checks:
            lines += ["", table(self.checks)]
        details = [f"  {c.metric} {c.label}: {c.detail}" for c in self.checks if c.detail]
        if details:
            lines += ["", "details:", *details]
        if self.reasons:
            lines += ["", "reasons:", *(f"  - {r}" for r in self.reasons)]
        if self.notes:
            lines += ["", "notes:", *(f"  - {n}" for n in self.notes)]
        return "\n".join(lines)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def gate(model: str, candidate_version: str | int, policy: GatePolicy | dict | str | Path, *,
         champion_alias: str = "champion", allow_judge_change: bool = False, first_version: bool = False,
         client=None, record: bool = True) -> GateDecision:
    """Decide whether ``model`` version ``candidate_version`` may take ``champion_alias``.

    See the module docstring for the steps and :mod:`mlflow_rag_eval.gate.policy` for the
    regression rule. Never raises on bad input (policy, versions, aliases, runs, tags that the
    tracking store cannot search for): the decision has ``exit_code`` 2 and a reason.

    Args:
        policy: a :class:`GatePolicy`, a mapping, or a YAML file path.
        allow_judge_change: gate even if the judge or its prompts differ from the champion's
            evaluation (recorded in the decision).
        first_version: no version holds ``champion_alias`` yet, although the model has other
            aliases: judge the candidate as a first version (without it, a missing alias on a
            model with aliases is taken for a typo: exit 2).
        record: write the decision to MLflow and move aliases (False: a dry run).
    """
    import mlflow

    decision = GateDecision(model, str(candidate_version), False, 2, champion_alias=champion_alias,
                            allow_judge_change=allow_judge_change, decided_at=_now())
    try:
        client = client or mlflow.MlflowClient()  # a tracking URI it cannot use raises here
        champion = _decide(decision, policy, client, first_version)
    except Unusable as exc:
        decision.reasons.append(str(exc))
        return decision
    except (lookup.UnsearchableValue, mlflow.exceptions.MlflowException) as exc:
        # What the store could not find or search for (a quote in a tag value, a run or
        # version gone meanwhile, the store refusing a query): no decision was made.
        message = exc.message if isinstance(exc, mlflow.exceptions.MlflowException) else str(exc)
        decision.reasons.append(f"cannot read the registry or an evaluation run: {' '.join(str(message).split())}")
        return decision
    if record:  # unusable input (exit 2) returned above: it records nothing
        try:
            with promotion_lease(client, decision.model, decision.candidate_version, notes=decision.notes):
                record_decision(client, decision, champion)
        except PromotionConflict as exc:  # another gate or a person moved the alias: this decision is stale
            done = (f"the alias was not moved; v{decision.candidate_version} is tagged rag_eval.gate=aborted"
                    if exc.recorded else "this decision was not recorded")
            decision.reasons = [f"{exc}; {done}: gate v{decision.candidate_version} again"]
            decision.passed, decision.exit_code = False, 2
        except mlflow.exceptions.MlflowException as exc:
            decision.reasons = [f"cannot record the decision: {' '.join(str(exc.message).split())}"]
            decision.passed, decision.exit_code = False, 2
    return decision


def _decide(decision: GateDecision, policy, client, first_version: bool):
    """Fill ``decision`` with its checks and verdict (exit 0/1); returns the champion version.
    Raises :class:`Unusable` for input it cannot decide on."""
    try:
        policy = load_policy(policy)
    except PolicyError as exc:
        raise Unusable(str(exc)) from None
    decision.policy, decision.policy_hash = policy.as_dict(), policy.policy_hash
    if policy.model is not None and policy.model != decision.model:
        raise Unusable(f"the policy is for model {policy.model!r}, not {decision.model!r}")
    mv, candidate_run, candidate_peers = _candidate(decision, policy, client)
    champion, champion_run, champion_peers = _champion(decision, policy, client, mv, candidate_run, first_version)
    candidate, champion_eval = _evaluations(decision, policy, client,
                                            {"candidate": candidate_run, "champion": champion_run},
                                            {"candidate": candidate_peers, "champion": champion_peers})
    figures = _verified(decision, policy, candidate, champion_eval)
    _refuse_misnamed(policy, candidate)
    identity = candidate.identity
    decision.judges["candidate"] = candidate.params.get("rag_eval.judge")
    decision.judge_fingerprints["candidate"] = identity["judge fingerprint"]
    decision.prompts_versions["candidate"] = identity["prompts version"]
    checks = metric_checks(figures, policy) + _stored_rows_check(candidate_run)
    if policy.slice_floors or policy.slice_ceilings:
        checks += slice_checks(candidate.slices, policy)
    if champion_eval is not None:
        checks = _champion_checks(decision, policy, checks, champion_eval, candidate)
    checks += _regression_stated(decision, policy)
    checks += _calibration_checks(client, policy, identity)
    order = {m: i for i, m in enumerate(["*", *policy.gated_metrics])}
    decision.checks = sorted(checks, key=lambda c: order.get(c.metric, len(order)))  # stable: by metric
    decision.reasons = [c.reason for c in decision.checks if not c.passed]
    decision.passed = not decision.reasons
    decision.exit_code = 0 if decision.passed else 1
    return champion


def _candidate(decision: GateDecision, policy: GatePolicy, client):
    """The candidate's model version, the evaluation run judged (by the policy's ``evidence``
    rule, on its ``dataset_digest``), and the runs that must agree with it."""
    import mlflow

    model, version = decision.model, decision.candidate_version
    try:
        mv = client.get_model_version(model, str(version))
    except mlflow.exceptions.MlflowException as exc:
        raise Unusable(f"model version {model} v{version} not found: {exc.message}") from None
    runs = dated(lookup.evaluation_runs(client, mv, policy.dataset_digest))
    run = judged_run(runs, mv, policy.evidence, model)
    if run is None:
        on = f" on dataset digest {policy.dataset_digest}" if policy.dataset_digest else ""
        raise Unusable(f"no evaluation run{on} for {model} v{mv.version} (logged model "
                       f"{lookup.model_id_of(mv) or '-'}, run {mv.run_id or '-'}); evaluate it first")
    decision.candidate_run_id = run.info.run_id
    what = f"the {_which(policy)} evaluation run {run.info.run_id} of {model} v{mv.version}"
    refuse_unusable(run, what, mv.version)
    refuse_future(run, what)
    decision.dataset_digest = run.data.params.get("rag_eval.dataset_digest")
    return mv, run, peers(runs, run, policy.evidence)


def _which(policy: GatePolicy) -> str:
    """The run judged, as a reason names it: ``newest``, or ``registered`` (``version-run``)."""
    return "registered" if policy.evidence == "version-run" else "newest"


def _champion(decision: GateDecision, policy: GatePolicy, client, mv, candidate_run, first_version: bool):
    """The champion version, its evaluation judged on the candidate's dataset, and the runs that
    must agree with it ((None, None, []) for a first version)."""
    champion = _champion_version(decision, client, mv, first_version)
    if champion is None:
        return None, None, []
    model = decision.model
    decision.champion_version = str(champion.version)
    digest = decision.dataset_digest
    runs = dated(lookup.evaluation_runs(client, champion, digest))
    if not runs:
        others = {r.data.params.get("rag_eval.dataset_digest") for r in lookup.evaluation_runs(client, champion)}
        raise Unusable(
            f"dataset digest mismatch: the champion v{champion.version} has no evaluation on the "
            f"candidate's dataset {digest} (its evaluations: {sorted(d for d in others if d) or 'none'}); "
            "evaluate both on the same golden set")
    fp = candidate_run.data.params.get("rag_eval.judge_fingerprint")
    same_judge = [r for r in runs if r.data.params.get("rag_eval.judge_fingerprint") == fp]
    champion_run = judged_run(same_judge or runs, champion, policy.evidence, model)
    if champion_run is None:  # version-run: its own run is by another judge
        champion_run = judged_run(runs, champion, policy.evidence, model)
    decision.champion_run_id = champion_run.info.run_id
    what = f"the champion's evaluation run {champion_run.info.run_id} of {model} v{champion.version}"
    refuse_unusable(champion_run, what, champion.version)
    refuse_future(champion_run, what)
    return champion, champion_run, peers(runs, champion_run, policy.evidence)


def _champion_version(decision: GateDecision, client, mv, first_version: bool):
    """The version holding the champion alias, None for a first version (or when the candidate
    holds it); the holder is recorded either way (``alias_holder``)."""
    model, alias = decision.model, decision.champion_alias
    champion = lookup.champion_version(client, model, alias)
    decision.alias_holder = None if champion is None else str(champion.version)
    recorded = lookup.gated_alias_holder(client, model, alias) if champion is None else None
    if recorded is not None and not first_version:
        raise Unusable(
            f"no version holds alias {alias!r} of {model!r}, but the gate gave it to v{recorded} (registered model "
            f"tag {lookup.GATED_ALIAS_TAG}.{alias}): v{recorded} was deleted or the alias removed, and judging the "
            "candidate as a first version would skip the comparison with the champion; set the alias on the "
            "version that is the champion now (MlflowClient().set_registered_model_alias), or pass "
            "first_version / --first-version to promote without comparing")
    if champion is None:
        others = sorted(a for a in lookup.model_aliases(client, model) if a != alias)
        if others and not first_version:
            raise Unusable(
                f"alias {alias!r} is not set on model {model!r}, whose aliases are "
                f"{', '.join(others)}: a mistyped alias would skip the comparison with the champion; "
                "name the alias that marks the champion, or, if no version has held it yet, "
                "pass first_version / --first-version")
    elif first_version:  # the candidate itself holding the alias is no first version either
        itself = " (the candidate itself)" if str(champion.version) == str(mv.version) else ""
        raise Unusable(f"first_version was asked, but v{champion.version}{itself} holds alias {alias!r}")
    if champion is not None and str(champion.version) == str(mv.version):
        decision.notes.append(f"v{mv.version} already holds alias {alias!r}: no champion to compare with")
        return None
    if champion is None:
        asked = " (first_version asked by the caller)" if first_version else ""
        decision.notes.append(f"no champion under alias {alias!r}{asked}: judged on required "
                              "metrics, rows, error rate, floors/ceilings and calibration only")
    return champion


def _evaluations(decision: GateDecision, policy: GatePolicy, client, judged: dict, others: dict):
    """The per-row evaluations of the candidate and (if any) the champion, each checked
    against its seal and its traces, with the directions of the metric registry
    (:func:`~mlflow_rag_eval.gate.evidence.verify_evidence`); the other evaluations of each
    (``others``, under ``evidence: agreeing``) checked the same way, and refused when they
    disagree with the one judged (:func:`~mlflow_rag_eval.gate.selection.refuse_disagreeing`).

    ``judged``: ``{"candidate": run, "champion": run or None}``; ``others``: the same keys,
    each a list of runs."""
    loaded = {}
    for who, run in judged.items():
        if run is None:
            loaded[who] = None
            continue
        loaded[who] = _verified_evaluation(decision, policy, client, run)
        version = decision.candidate_version if who == "candidate" else decision.champion_version
        peers_loaded = [_verified_evaluation(decision, policy, client, peer, notes=False) for peer in others[who]]
        refuse_disagreeing(loaded[who], peers_loaded, policy.gated_metrics, policy.regression_test.confidence,
                           f"{decision.model} v{version} (the {who})")
    candidate, champion = loaded["candidate"], loaded["champion"]
    ppi = _ppi_metrics(policy)
    if ppi:
        confidence = policy.regression_test.confidence
        candidate, notes = recompute_ppi(client, candidate, ppi, confidence)
        decision.notes += notes
        if champion is not None:
            champion, notes = recompute_ppi(client, champion, ppi, confidence)
            decision.notes += notes
    return candidate, champion


def _verified_evaluation(decision: GateDecision, policy: GatePolicy, client, run, *, notes: bool = True):
    """One run's per-row evaluation, checked against its seal and traces (exit 2 otherwise)."""
    import mlflow

    from mlflow_rag_eval.compare import NotComparable, load_evaluation

    try:
        evaluation = load_evaluation(run.info.run_id, client)
    except (NotComparable, OSError, mlflow.exceptions.MlflowException) as exc:
        raise Unusable(f"cannot read an evaluation run: {exc}") from None
    try:
        evaluation, found = verify_evidence(client, run, evaluation, require_seal=policy.require_seal,
                                            require_traces=policy.require_traces)
    except AlteredRun as exc:
        raise Unusable(str(exc)) from None
    if notes:
        decision.notes += found
    return evaluation


def _ppi_metrics(policy: GatePolicy) -> list[str]:
    """The metrics whose PPI figures the policy decides on: floors and ceilings on ``ppi_*``,
    and the judge-graded regression metrics under ``decide_on: ppi``."""
    from mlflow_rag_eval.keys import PPI_STATS, split_aggregate_key
    from mlflow_rag_eval.metrics import is_judge_graded

    named = [split_aggregate_key(k) for k in (*policy.floors, *policy.ceilings)]
    out = [m for m, stat in named if stat in PPI_STATS]
    if policy.regression_test.decide_on == "ppi":
        out += [m for m in policy.max_regression if is_judge_graded(m)]
    return list(dict.fromkeys(out))


def _verified(decision: GateDecision, policy: GatePolicy, candidate, champion) -> dict[str, float]:
    """The candidate's figures recomputed from its rows table (see
    :func:`~mlflow_rag_eval.gate.checks.verified_figures`), the champion's checked the same way
    (its counts and means; the floors are the candidate's), and each table's digest recorded."""
    decision.rows_table_sha256["candidate"] = candidate.table_sha256
    if champion is not None:
        decision.rows_table_sha256["champion"] = champion.table_sha256
    try:
        if champion is not None:
            verified_figures(champion, policy.gated_metrics)
        return verified_figures(candidate, policy.gated_metrics, [*policy.floors, *policy.ceilings])
    except AlteredRun as exc:
        raise Unusable(str(exc)) from None


def _refuse_misnamed(policy: GatePolicy, candidate) -> None:
    """Exit 2 for a gated metric the evaluation did not log when it logged one of a close name
    (``politness`` for a rubric ``politeness``): a typo in the policy, not a failing candidate.
    Names of built-in metrics were checked when the policy was loaded."""
    import difflib

    logged = candidate.metric_keys()
    for metric in policy.gated_metrics:
        if metric in logged:
            continue
        close = difflib.get_close_matches(metric, logged, n=1, cutoff=0.8)
        if close:
            raise Unusable(f"gate policy: the policy names metric {metric!r}, which run {candidate.run_id} did not "
                           f"evaluate (did you mean {close[0]!r}?): the policy cannot be used as written; "
                           "fix the name")


def _regression_stated(decision: GateDecision, policy: GatePolicy) -> list[Check]:
    """Which comparison with the champion ran, for the header (``decision.regression``); and a
    failed check when a champion exists and the policy has no regression check without saying
    ``regression: none``: a policy of floors alone would promote a version worse than the
    champion, with nothing said."""
    tested = list(policy.max_regression)
    if decision.champion_version is None:
        holder = decision.alias_holder
        decision.regression = ("none: the candidate already holds the alias" if holder == decision.candidate_version
                               else "none: no champion to compare with")
        return []
    if tested:
        decision.regression = (f"vs v{decision.champion_version} on {', '.join(tested)} "
                               f"(decide_on {policy.regression_test.decide_on})")
        return []
    if policy.regression == "none":
        decision.regression = f"none: the policy says regression: none (champion v{decision.champion_version})"
        return []
    decision.regression = "none: the policy has no max_regression"
    return [Check("*", "regression", "none", "max_regression", False,
                  f"v{decision.champion_version} holds alias {decision.champion_alias!r}, but the policy has no "
                  "regression check (max_regression): floors alone would promote a version worse than the "
                  "champion; add max_regression for the metrics that matter, or state regression: none to "
                  "promote without comparing")]


def _stored_rows_check(candidate_run) -> list[Check]:
    """A run whose rows the store partly lost (tag ``rag_eval.rows_lost``, set by the genai
    route): its aggregates cover a subset of what was evaluated."""
    lost = candidate_run.data.tags.get("rag_eval.rows_lost")
    if not lost:
        return []
    return [Check("*", "rows stored", int(lost), 0, False,
                  f"{lost} evaluated row(s) of run {candidate_run.info.run_id} are missing from the "
                  "tracking store (tag rag_eval.rows_lost): re-run the evaluation")]


def _champion_checks(decision: GateDecision, policy: GatePolicy, checks: list[Check], champion_eval,
                     candidate) -> list[Check]:
    """The judge-identity check, then the paired regression checks against the champion;
    every check gets its direction-adjusted delta vs the champion where one was computed."""
    from mlflow_rag_eval.compare import compare_evaluations

    identity, champ = candidate.identity, champion_eval.identity
    decision.judges["champion"] = champion_eval.params.get("rag_eval.judge")
    decision.judge_fingerprints["champion"] = champ["judge fingerprint"]
    decision.prompts_versions["champion"] = champ["prompts version"]
    changed = [f"{what} {champ[what]} -> {identity[what]}" for what in ("judge fingerprint", "prompts version")
               if champ[what] != identity[what]]
    if changed and not decision.allow_judge_change:
        return checks + [Check("*", "judge", identity["judge fingerprint"], champ["judge fingerprint"], False,
                               f"judge changed since the champion's evaluation ({'; '.join(changed)}): "
                               "scores are not comparable; re-evaluate the champion with this judge, "
                               "or pass allow_judge_change / --allow-judge-change")]
    if changed:
        decision.notes.append(f"judge changed ({'; '.join(changed)}), allowed by the caller: "
                              "deltas may come from the judge, not the pipeline")
    comparison = compare_evaluations(champion_eval, candidate, allow_judge_change=decision.allow_judge_change)
    decision.comparison = comparison.as_dict()
    by_metric = {d.metric: d for d in comparison.deltas}
    p_values = regression_p_values(champion_eval, candidate, by_metric, policy)
    checks = checks + [regression_check(m, champion_eval, candidate, by_metric.get(m), policy, p_values[m])
                       for m in policy.max_regression]
    adjusted = {d.metric: (d.delta if d.greater_is_better else -d.delta)
                for d in comparison.deltas if d.delta is not None}
    # The paired delta is of the metric's mean: it belongs to the checks of the mean only. A
    # slice's check gets none (the run's delta is not the slice's), nor do the checks of rows
    # scored, the error rate or another statistic (their own figures are not the mean's).
    return [c if c.delta is not None or c.slice or c.metric not in adjusted or c.kind not in _MEAN_CHECKS
            else dataclasses.replace(c, delta=adjusted[c.metric]) for c in checks]


#: the checks whose figure is the metric's mean, which the paired delta vs the champion is of
_MEAN_CHECKS = frozenset({"floor mean", "ceiling mean"})


def _calibration_checks(client, policy: GatePolicy, identity: dict) -> list[Check]:
    """Each judge-graded gated metric needs a calibration of this judge and prompts version."""
    from mlflow_rag_eval.metrics import is_judge_graded

    if not policy.calibration.required:
        return []
    fp, prompts = identity["judge fingerprint"], identity["prompts version"]
    checks = []
    for metric in policy.gated_metrics:
        if is_judge_graded(metric):
            run = lookup.find_calibration(client, metric, fp, prompts) if fp and prompts else None
            checks.append(calibration_check(metric, run, fp, policy, _recomputed(client, run)))
    return checks


def _recomputed(client, run):
    """The calibration ``run`` recomputed from its labels, or why it cannot be (None: no run)."""
    import mlflow

    from mlflow_rag_eval.calibration.calibrate import recompute_calibration

    if run is None:
        return None
    try:
        return recompute_calibration(run, client)
    except (ValueError, KeyError, OSError, mlflow.exceptions.MlflowException) as exc:
        return " ".join(str(getattr(exc, "message", exc)).split())
