"""The gate policy: what a candidate model version must meet to take the champion alias.

One YAML file per registered model::

    model: rag-pipeline            # optional; must match the model being gated
    dataset_digest: 3f2a...        # optional; pin the golden set (default: the candidate's latest)
    require_metrics: [faithfulness, context_recall]
    min_scored_rows: 30            # per gated metric (default 30)
    max_error_rate: 0.05           # n_error / (n_scored + n_error), per gated metric (default 0.05)
    floors:                        # lower limits on logged aggregates
      faithfulness/mean: 0.85
      faithfulness/worst10_mean: 0.5   # the mean of the worst 10% of the rows
    ceilings:                      # upper limits, for lower-is-better metrics
      false_abstention/mean: 0.1
    slice_floors:                  # floors per slice: field -> value -> <metric>/<stat>: limit
      difficulty:
        hard: {faithfulness/mean: 0.6}
      tags:
        "*": {faithfulness/mean: 0.5}   # every slice of the field
    slice_ceilings: {}             # the same, for lower-is-better metrics
    slice_min_scored_rows: 10      # per slice with a limit (default: min_scored_rows)
    max_regression:                # largest allowed drop of the paired mean vs the champion
      faithfulness: 0.03
      ndcg@10: 0.02
    regression_test: {confidence: 0.95, decide_on: point, correction: holm}
    calibration: {required: true, min_labels: 50, min_spearman: 0.7}

The *gated metrics* are ``require_metrics`` plus every metric named in ``floors``,
``ceilings``, ``max_regression``, ``slice_floors`` and ``slice_ceilings``: a limit on a metric
requires it. Row counts, error rate and
calibration apply to each gated metric. A policy must gate at least one metric: an empty policy
file (or one of only defaults) would pass any version, regressions included, so it is refused.

Defaults, when the policy leaves them out; both bound what the other checks can see:

* ``max_error_rate: 0.05``. Rows the judge failed on carry no score, and the regression rule
  pairs only rows scored in both runs: a candidate whose judge failed on half its rows would
  be compared on the half that worked, and pass. At most one failed row in twenty keeps a
  floor or a delta about (nearly) the whole golden set; ``1.0`` turns the check off, which a
  policy must then say. The failed rows are counted in the run's rows table, whatever the
  run logged as metrics; figures without ``<metric>/n_error`` (a mapping given to
  ``assert_metrics_meet``) fail the check (the error rate is unknown), never pass it silently.
* ``min_scored_rows: 30``. Below about 30 scored rows, a mean of scores in [0, 1] has a 95%
  interval wider than +-0.18 (binary scores at 0.5: 1.96 * sqrt(0.25 / 30)) and the
  bootstrap behind the regression CI is unstable, so floors and tolerances of a
  few hundredths would decide on noise. A smaller golden set is allowed, but its policy must
  say so (``min_scored_rows: 10``), and the decision records the figure.

Regression rule: a metric regresses when the paired mean delta over the rows both runs scored
(candidate - champion, sign flipped for lower-is-better metrics) is below
``-max_regression[metric]``. With ``decide_on: point`` (default) the point estimate decides;
with ``decide_on: ci_low`` the lower bound of the two-sided BCa bootstrap CI at ``confidence``
(:func:`mlflow_rag_eval.stats.paired_difference_ci`) decides (stricter: the candidate must show,
not merely suggest, that it did not drop by more than the tolerance). Where no CI can be
computed, ``ci_low`` decides on the paired delta when every pair differs by the same amount,
and refuses a single pair, which cannot bound a drop. Either way the CI (or why there is none)
and the Wilcoxon p-value are reported.

Why ``point`` by default: golden sets are small (tens to a few hundred rows) and the bootstrap
CI of a paired mean is often wider than any useful tolerance, so ``ci_low`` would refuse an
unchanged pipeline. The tolerance is the noise budget; the CI and p shown beside it tell a
reviewer whether a refused drop is real or noise.

``decide_on: test`` decides by a hypothesis test of the mean instead: a metric regresses when
the one-sided paired t-test of ``mean(delta) < -max_regression`` (on the direction-adjusted
paired differences, :func:`mlflow_rag_eval.stats.regression_p`) rejects at ``1 - confidence``,
after the correction, or when the paired bootstrap CI lies wholly below ``-max_regression`` (a
drop the CI shows is refused whatever the p-value says; with ``correction: holm`` over ``m``
metrics that CI is at ``1 - (1 - confidence) / m``, so the CI rule keeps the family-wise rate). A no-change
candidate is then refused only by chance at that rate, and a drop must be shown, not merely
observed, to refuse. (A rank test would test the median: a drop of 1 on a few rows, the rest
unchanged, has a median of 0.) ``correction: holm``
(default) adjusts the regression p-values of the metrics gated together by Holm's step-down
method: testing ten metrics at 5% each would refuse an unchanged pipeline in about 40% of
gates, Holm keeps the rate at 5% (``bench/multiple_comparisons.py``). ``correction: none``
decides on each metric's raw p. Every regression check reports both p-values, whatever
``decide_on`` is.

``decide_on: ppi`` decides a judge-graded metric on what people would score rather than on the
judge: each run carries its PPI++ estimate of the metric's mean (``mlflow-rag-eval ppi``, from
human labels on a random sample of its rows, :mod:`mlflow_rag_eval.stats.ppi`), and the metric
regresses when the lower bound of the CI (at ``confidence``) of the difference of the two
estimates is below ``-max_regression`` (:func:`mlflow_rag_eval.stats.ppi.ppi_difference`). A run
without the estimate fails the check, naming the command. Metrics the judge does not grade
(retrieval) decide on the paired delta, as with ``point``.

Per-slice limits (``slice_floors``, ``slice_ceilings``) apply to a run evaluated with
``slice_by`` (:mod:`mlflow_rag_eval.evaluation.slices`) and are read from its ``rag_eval/slices.json``:

* a field is a ``slice_by`` field; a value is a slice label as the slicing writes it (a YAML
  number or boolean key is read as that label: ``3`` -> ``"3"``, ``true`` -> ``"True"``);
* ``"*"`` is every slice of the field the run has; a named value's limits replace ``"*"``'s
  for the same ``<metric>/<stat>``, and ``"*"``'s other limits still apply to it;
* nothing passes by absence: a limit on a field the run was not sliced by, on a value the run
  has no slice of, or ``"*"`` on a field with no slice at all, is a failed check, as is a
  statistic the slice could not compute (no scored row, a CI of one row). A metric the run did
  not evaluate is reported once, as a missing required metric;
* each slice with a limit must have ``slice_min_scored_rows`` scored rows of the metric
  (default: ``min_scored_rows``), for the reason given above: slices are smaller than the run,
  and a floor on a handful of rows decides on noise. A policy that means to limit small slices
  says so (``slice_min_scored_rows: 10``); the check reports n either way. Slices are not
  checked for their error rate: the run's ``max_error_rate`` bounds every metric's.

Metric names are typed as users know them (``ndcg@10``) and stored as MLflow keys
(``ndcg_at_10``, see :mod:`mlflow_rag_eval.keys`). Every metric of this package scores rows in
[0, 1], so floors and ceilings on ``mean``/``median``/``p10``/``worst10_mean``/``ci_low``/``ci_high``
must lie in [0, 1]. A floor on ``ci_low`` fails when the run has no CI (one scored row, or all equal).
To guard the worst rows, limit ``worst10_mean`` (the mean of the worst ``ceil(n / 10)`` scored
rows: the lowest of a greater-is-better metric, the highest of a lower-is-better one, under
``ceilings``), not ``p10``: the 10th percentile interpolates between the sorted rows, so with
rows ``[0, 0.76]`` and eighteen at 1 it reads 0.976 while ``worst10_mean`` reads 0.38.
Floors may also name the PPI estimate (``ppi_mean``, ``ppi_ci_low``, ``ppi_ci_high``) that
:func:`mlflow_rag_eval.stats.ppi.ppi_from_run` logs once reviewers labelled some of the run's rows:
``faithfulness/ppi_ci_low: 0.8`` asks that people, not the judge, would likely score the
metric at 0.8 or more. A run without it fails that floor, like any missing statistic.

A champion present and no ``max_regression``: the gate refuses the candidate (a failed check
naming why) unless the policy says ``regression: none``; a policy of floors alone would otherwise
promote a version worse than the champion with nothing said. The decision's header says which
comparison ran (``regression check:``).

A metric or statistic name that the metric registry does not know but is close to one of its
names (``faithfulnes/mean``, ``faithfulness/maen``) is refused as an unusable policy (exit 2,
with the close name); a name close to nothing may be a rubric's or an adapter's, and is checked
against what the evaluation logged (a close name there is refused the same way).

``evidence`` picks which evaluation of a version counts when it has several
(:mod:`mlflow_rag_eval.gate.selection`): ``agreeing`` (default: they must agree, beyond noise),
``version-run`` (only the run the version was registered from) or ``newest``.

Evaluation runs logged before evaluations were sealed (no ``rag_eval.seal.*`` params, see
:mod:`mlflow_rag_eval.gate.evidence`) still gate, with a one-line notice in the decision;
``require_seal: true`` refuses them (exit 2). A sealed run whose rows' traces were deleted (a
retention job) gates with a note counting them; ``require_traces: true`` refuses it (exit 2).

A policy file must be a regular file once symlinks are resolved (a FIFO, a device such as
``/dev/zero`` or a folder is refused, naming what it is), of at most 1 MB
(:data:`~mlflow_rag_eval.gate.policy_file.MAX_POLICY_BYTES`), read within :data:`~mlflow_rag_eval.gate.policy_file.POLICY_READ_DEADLINE_S` seconds.

A policy file is read strictly: a key given twice in one mapping (YAML would keep the last one,
silently: a second, lower floor would replace the one a reviewer reads) and any YAML anchor or
alias (a policy has no use for them, and nested aliases expand to gigabytes) are refused,
naming the key and its line, before anything is built.

The policy is a pydantic model (:class:`GatePolicy`, unknown keys forbidden at every level);
its JSON schema ships beside this module as ``policy.schema.json``, for editors: put
``# yaml-language-server: $schema=<path to policy.schema.json>`` at the top of a policy file.
After changing the model, regenerate it: ``python -c "from mlflow_rag_eval.gate.policy import
write_json_schema; write_json_schema()"``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mlflow_rag_eval._util.text import did_you_mean
from mlflow_rag_eval.gate.policy_file import PolicyError, dotted, read_policy_text
from mlflow_rag_eval.keys import (
    AGGREGATES,
    PPI_STATS,
    aggregate_key,
    display_name,
    is_namespaced,
    is_slice_key,
    metric_key,
)

__all__ = [
    "CalibrationRequirement", "GatePolicy", "PolicyError", "RegressionTest", "SCHEMA_FILE", "load_policy",
    "policy_json_schema", "write_json_schema",
]

#: Aggregates a floor or ceiling may name: the per-run statistics the logger writes, and the
#: PPI estimate :func:`mlflow_rag_eval.stats.ppi.ppi_from_run` adds once humans labelled some rows.
STATS = (*AGGREGATES, *PPI_STATS)
#: the JSON schema of a policy file, generated from :class:`GatePolicy`
SCHEMA_FILE = Path(__file__).with_name("policy.schema.json")
# A digest is searched for as a tag value, and MLflow's filters have no escape for quotes.
_DIGEST = r"^[\w.:+-]+$"
_AGGREGATE = rf"^.+/({'|'.join(STATS)})$"
#: what a pattern means, for the error message
_PATTERNS = {_DIGEST: "a dataset digest (letters, digits and . : + - _)"}


# bool is an int to Python; "true" as a threshold is a typo, not 1: numbers are strict.
_Text = Annotated[str, Strict(), StringConstraints(strip_whitespace=True, min_length=1)]
_Unit = Annotated[float, Strict(), Field(ge=0.0, le=1.0, allow_inf_nan=False)]
_Limits = Annotated[
    dict[Annotated[str, StringConstraints(pattern=_AGGREGATE)], _Unit],
    Field(default_factory=dict, json_schema_extra={"additionalProperties": False}),
]
_SliceLimits = Annotated[
    dict[str, dict[str, Annotated[dict[Annotated[str, StringConstraints(pattern=_AGGREGATE)], _Unit],
                                   Field(json_schema_extra={"additionalProperties": False})]]],
    Field(default_factory=dict),
]
#: in slice_floors / slice_ceilings, the value that stands for every slice of a field
EVERY_SLICE = "*"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegressionTest(_Strict):
    """How a drop vs the champion is decided (see the module docstring)."""

    confidence: Annotated[float, Strict(), Field(gt=0.0, lt=1.0, allow_inf_nan=False)] = Field(
        0.95, description="Level of the two-sided paired bootstrap CI shown (and used by decide_on: ci_low).")
    decide_on: Literal["point", "ci_low", "test", "ppi"] = Field(
        "point", description="point: the paired mean delta decides; ci_low: the CI's lower bound decides (stricter); "
                             "test: the one-sided regression test decides, at 1 - confidence after the correction; "
                             "ppi: for judge-graded metrics, the lower bound of the CI of the difference of the two "
                             "runs' PPI estimates (human labels correcting the judge) decides; others decide on point.")
    correction: Literal["holm", "none"] = Field(
        "holm", description="Multiple-comparison correction of the regression p-values across the metrics gated "
                            "together (reported always; decides with decide_on: test).")


class CalibrationRequirement(_Strict):
    """The judge must have been checked against human labels on each judge-graded metric."""

    required: Annotated[bool, Strict()] = Field(True, description="Refuse judge-graded metrics without a calibration.")
    min_labels: Annotated[int, Strict(), Field(ge=1)] = Field(50, description="Fewest labels a calibration may have.")
    min_spearman: Annotated[float, Strict(), Field(ge=-1.0, le=1.0, allow_inf_nan=False)] = Field(
        0.7, description="Lowest Spearman rho between the judge's scores and the labels.")


class GatePolicy(_Strict):
    """A parsed, validated policy. Build it with :func:`load_policy` (from a file or a mapping)."""

    model_config = ConfigDict(
        title="mlflow-rag-eval gate policy",
        json_schema_extra={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "description": "What a candidate model version must meet to take the champion alias "
                           "(mlflow-rag-eval gate --policy FILE). Unknown keys are refused at every level.",
        },
    )

    model: _Text | None = Field(
        None, description="The registered model this policy is for; must match the model gated.")
    dataset_digest: Annotated[str, Strict(), StringConstraints(strip_whitespace=True, min_length=1,
                                                              pattern=_DIGEST)] | None = Field(
        None, description="Pin the golden set (default: the candidate's latest evaluation).")
    require_metrics: tuple[_Text, ...] = Field(
        (), description="Metrics the evaluation must have logged (ndcg@10 or ndcg_at_10).")
    min_scored_rows: Annotated[int, Strict(), Field(ge=0)] = Field(
        30, description="Fewest scored rows per gated metric.")
    max_error_rate: _Unit = Field(
        0.05, description="Largest n_error / (n_scored + n_error) per gated metric; 1.0 turns it off.")
    floors: _Limits = Field(description="Lower limits on logged aggregates: <metric>/<stat>: value.")
    ceilings: _Limits = Field(description="Upper limits, for lower-is-better metrics: <metric>/<stat>: value.")
    max_regression: Annotated[dict[str, _Unit], Field(default_factory=dict)] = Field(
        description="Largest allowed drop of the paired mean vs the champion, per metric.")
    slice_floors: _SliceLimits = Field(
        description="Lower limits per slice: <slice_by field>: <value or *>: <metric>/<stat>: value.")
    slice_ceilings: _SliceLimits = Field(
        description="Upper limits per slice, for lower-is-better metrics: <field>: <value or *>: <metric>/<stat>: "
                    "value.")
    slice_min_scored_rows: Annotated[int, Strict(), Field(ge=0)] | None = Field(
        None, description="Fewest scored rows of a slice with a limit (default: min_scored_rows).")
    regression_test: RegressionTest = RegressionTest()
    calibration: CalibrationRequirement = CalibrationRequirement()
    regression: Literal["none"] | None = Field(
        None, description="none: promote over a champion without comparing with it. Without it, a policy with no "
                          "max_regression refuses a candidate when a champion exists: a policy that forgot the "
                          "regression check would promote a worse version silently.")
    evidence: Literal["agreeing", "version-run", "newest"] = Field(
        "agreeing", description="Which evaluation of a version counts. agreeing: all finished evaluations of it on "
                                "the golden set by the same judge must agree (else exit 2), the newest is judged; "
                                "version-run: only the run the version was registered from; newest: the newest, "
                                "whatever the others say.")
    require_traces: Annotated[bool, Strict()] = Field(
        False, description="Refuse evaluation runs whose rows' traces were deleted (a retention job); false: a "
                           "sealed run passes with a note counting them.")
    require_seal: Annotated[bool, Strict()] = Field(
        False, description="Refuse evaluation runs logged before evaluations were sealed (no rag_eval.seal.* "
                           "params); false: they gate, with a notice.")

    @field_validator("floors", "ceilings", "max_regression", mode="before")
    @classmethod
    def _names(cls, value: Any, info: ValidationInfo) -> Any:
        """Keys as text, floors and ceilings named <metric>/<stat> on the right side."""
        if not isinstance(value, Mapping):
            return value  # reported by the type check: must be a mapping
        value = {str(k): v for k, v in value.items()}
        for name in value:
            if info.field_name == "max_regression":
                _check_metric_name(name, f"max_regression.{name}")
            else:
                _check_limit_name(name, f"{info.field_name}.{name}", floors=info.field_name == "floors")
        return value

    @field_validator("floors", "ceilings", "max_regression")
    @classmethod
    def _as_keys(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        """Metric names as MLflow keys: ``ndcg@10/mean`` -> ``ndcg_at_10/mean``."""
        return _limit_keys(value, info.field_name, aggregates=info.field_name != "max_regression")

    @field_validator("slice_floors", "slice_ceilings", mode="before")
    @classmethod
    def _slice_names(cls, value: Any, info: ValidationInfo) -> Any:
        """Fields and values as text (values as the slicing labels them), limits named
        <metric>/<stat> on the right side."""
        from mlflow_rag_eval.evaluation.slices import slice_label

        if not isinstance(value, Mapping):
            return value
        out: dict[str, Any] = {}
        for field, by_value in value.items():
            field = str(field)
            if not field.strip():
                raise PolicyError(f"{info.field_name}.{field}", "name a slice_by field")
            if not isinstance(by_value, Mapping):
                out[field] = by_value  # reported by the type check
                continue
            out[field] = {}
            for label, limits in by_value.items():
                label = label if isinstance(label, str) else slice_label(label)
                where = f"{info.field_name}.{field}.{label}"
                if label in out[field]:
                    raise PolicyError(where, "the same slice twice")
                if isinstance(limits, Mapping):
                    limits = {str(k): v for k, v in limits.items()}
                    for name in limits:
                        _check_limit_name(name, f"{where}.{name}", floors=info.field_name == "slice_floors",
                                          under="slice_")
                out[field][label] = limits
        return out

    @field_validator("slice_floors", "slice_ceilings")
    @classmethod
    def _slice_keys(cls, value: dict[str, dict[str, dict[str, float]]], info: ValidationInfo):
        """Metric names as MLflow keys, as in floors and ceilings."""
        return {field: {label: _limit_keys(limits, f"{info.field_name}.{field}.{label}")
                        for label, limits in by_value.items()}
                for field, by_value in value.items()}

    @field_validator("require_metrics")
    @classmethod
    def _required_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, name in enumerate(value):
            _check_metric_name(name, f"require_metrics[{i}]")
        return tuple(dict.fromkeys(metric_key(name) for name in value))

    @model_validator(mode="after")
    def _gates_something(self) -> GatePolicy:
        if self.regression == "none" and self.max_regression:
            raise PolicyError("regression", "says none, but max_regression names "
                                            f"{', '.join(self.max_regression)}: keep one of the two")
        if not self.gated_metrics:
            raise PolicyError("require_metrics", "the policy gates no metric, so it would pass any version; "
                                                 "name the metrics in require_metrics, floors, ceilings or "
                                                 "max_regression")
        return self

    @property
    def gated_metrics(self) -> list[str]:
        """Metric keys the policy gates on, in first-mention order."""
        keys = list(self.require_metrics)
        keys += [k.rsplit("/", 1)[0] for k in (*self.floors, *self.ceilings)]
        keys += list(self.max_regression)
        keys += [k.rsplit("/", 1)[0] for by_field in (self.slice_floors, self.slice_ceilings)
                 for by_value in by_field.values() for limits in by_value.values() for k in limits]
        return list(dict.fromkeys(keys))

    def as_dict(self) -> dict[str, Any]:
        """The policy with defaults filled; the slice keys only when set and the correction
        only when not the default, so that the hash of a policy without them is what it was
        before they existed."""
        out = self.model_dump(mode="python")
        out["require_metrics"] = list(self.require_metrics)
        for name in ("floors", "ceilings", "max_regression"):
            out[name] = dict(sorted(getattr(self, name).items()))
        for name in ("slice_floors", "slice_ceilings"):
            if out[name]:
                out[name] = {f: {v: dict(sorted(limits.items())) for v, limits in sorted(by_value.items())}
                             for f, by_value in sorted(out[name].items())}
            else:
                del out[name]
        if out["slice_min_scored_rows"] is None:
            del out["slice_min_scored_rows"]
        for name in ("require_seal", "require_traces"):
            if not out[name]:
                del out[name]
        for name, default in (("regression", None), ("evidence", "agreeing")):
            if out[name] == default:  # the hash of a policy without the key is what it was before it existed
                del out[name]
        if out["regression_test"]["correction"] == "holm":
            # the default; with decide_on point or ci_low it only adds a column to the report
            del out["regression_test"]["correction"]
        return out

    @property
    def min_slice_rows(self) -> int:
        """Fewest scored rows of a slice with a limit: ``slice_min_scored_rows``, else
        ``min_scored_rows``."""
        return self.min_scored_rows if self.slice_min_scored_rows is None else self.slice_min_scored_rows

    @property
    def policy_hash(self) -> str:
        """sha256 of the canonical JSON of the parsed policy (defaults filled, keys sorted)."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _direction(name: str) -> bool | None:
    """greater_is_better of a built-in metric; None for a name only the evaluation knows."""
    if is_namespaced(name):
        return None  # namespaced adapters import their library on resolution
    from mlflow_rag_eval.metrics import resolve_metric

    try:
        return resolve_metric(display_name(name)).greater_is_better
    except (ValueError, TypeError):
        return None


def _check_metric_name(name: str, item: str) -> None:
    """Refuse a metric name the metric registry does not know but one of its names is close to
    (``faithfulnes``): a typo would otherwise gate on a metric no evaluation logs, and be
    reported as the candidate's failure, not the policy's. A name nothing is close to may be a
    rubric's or an adapter's, which the evaluation names; the gate checks it there."""
    if is_namespaced(name):
        return
    from mlflow_rag_eval.metrics import resolve_metric

    try:
        resolve_metric(display_name(name))
    except ValueError as exc:
        if "did you mean" in str(exc):
            raise PolicyError(item, str(exc).split("; known:")[0]) from None
    except TypeError:
        pass


def _limit_keys(value: dict[str, float], where: str, *, aggregates: bool = True) -> dict[str, float]:
    """Limits keyed by MLflow keys (``ndcg@10/mean`` -> ``ndcg_at_10/mean``; a metric name
    alone when not ``aggregates``); two names of one key are refused."""
    out: dict[str, float] = {}
    seen: dict[str, str] = {}
    for name, limit in value.items():
        if aggregates:
            metric, _, stat = name.rpartition("/")
            key = aggregate_key(metric, stat)
        else:
            key = metric_key(name)
        if key in seen:
            raise PolicyError(f"{where}.{name}", f"the same limit as {seen[key]} ({key})")
        seen[key], out[key] = name, limit
    return out


def _check_limit_name(name: str, item: str, *, floors: bool, under: str = "") -> None:
    metric, sep, stat = name.rpartition("/")
    if not sep or not metric:
        raise PolicyError(item, f"name an aggregate as <metric>/<stat>, stat one of {list(STATS)}")
    if is_slice_key(name):
        raise PolicyError(item, "a slice's limit goes under slice_floors / slice_ceilings: "
                                "<field>: <value>: <metric>/<stat>")
    if stat not in STATS:
        close = difflib.get_close_matches(stat, STATS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PolicyError(item, f"unknown statistic {stat!r}{hint}; one of {list(STATS)}")
    _check_metric_name(metric, item)
    greater_is_better = _direction(metric)
    if floors and greater_is_better is False:
        raise PolicyError(item, f"{metric} is lower-is-better: put its limit under {under}ceilings")
    if not floors and greater_is_better is True:
        raise PolicyError(item, f"{metric} is higher-is-better: put its limit under {under}floors")


def load_policy(source: GatePolicy | Mapping[str, Any] | str | Path) -> GatePolicy:
    """A :class:`GatePolicy` from a YAML file, a mapping, or a policy (returned as is).

    The file is read strictly (:func:`~mlflow_rag_eval.gate.policy_file.read_policy_text`): a key given twice in one mapping, or a YAML
    anchor or alias anywhere, is refused, naming the key and its line. JSON is YAML, so a JSON
    policy file is read by the same rules, duplicate keys included.

    Raises:
        PolicyError: unreadable or empty file (not UTF-8, not YAML), a duplicate key, an anchor
            or alias, unknown key (at any level), wrong type or impossible value, or no gated
            metric; the message names the key or the file.
    """
    if isinstance(source, GatePolicy):
        return source  # validated when it was made
    if isinstance(source, (str, Path)):
        path = Path(source)
        data = read_policy_text(path)
        if data is None:
            raise PolicyError(str(path), "the policy file is empty: a gate on nothing would pass any "
                                         "version; name the metrics in require_metrics, floors, "
                                         "ceilings or max_regression")
        source = data
    if not isinstance(source, Mapping):
        raise PolicyError("<policy>", f"must be a mapping of keys to values, got {type(source).__name__}")
    try:
        return GatePolicy.model_validate(dict(source))
    except ValidationError as exc:
        raise _policy_error(exc) from None


# -- pydantic's errors as PolicyError: the dotted key and a message a policy author can act on ---
def policy_json_schema() -> dict[str, Any]:
    """The JSON schema of a policy file (what ``policy.schema.json`` holds)."""
    return GatePolicy.model_json_schema(mode="validation")


def _node(loc: tuple) -> dict[str, Any]:
    """The schema of the value at ``loc`` (refs followed, the non-null member of an Optional)."""
    schema = policy_json_schema()

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        if "anyOf" in node:
            node = next(n for n in node["anyOf"] if n.get("type") != "null")
            return resolve(node)
        return node

    node = resolve(schema)
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, str) and part in node.get("properties", {}):
            node = node["properties"][part]
        elif "patternProperties" in node:
            node = next(iter(node["patternProperties"].values()))
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif "items" in node:
            node = node["items"]
        node = resolve(node)
    return node


def _span(node: dict[str, Any]) -> str:
    low, high = node.get("minimum", node.get("exclusiveMinimum")), node.get("maximum", node.get("exclusiveMaximum"))
    if high is None:
        return f"{'>=' if 'minimum' in node else '>'} {low:g}"
    lo = "[" if "minimum" in node else "("
    hi = "]" if "maximum" in node else ")"
    return f"in {lo}{'-inf' if low is None else format(low, 'g')}, {high:g}{hi}"


def _message(error: dict[str, Any]) -> str:
    kind, value, ctx, loc = error["type"], error.get("input"), error.get("ctx") or {}, error["loc"]
    got = f"{type(value).__name__} ({value!r})"
    if kind == "extra_forbidden":
        known = sorted(_node(loc[:-1]).get("properties", {}))
        return f"unknown key{did_you_mean(str(loc[-1]), known)}; known: {known}"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number, got {got}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {got}"
    if kind == "bool_type":
        return f"must be true or false, got {value!r}"
    if kind in ("string_type", "string_too_short"):
        return f"must be a non-empty string, got {value!r}"
    if kind == "string_pattern_mismatch":
        return f"must be {_PATTERNS.get(ctx.get('pattern'), 'text matching ' + str(ctx.get('pattern')))}, got {value!r}"
    if kind in ("tuple_type", "list_type"):
        return f"must be a list of metric names, got {type(value).__name__}"
    if kind in ("dict_type", "mapping_type", "model_type", "model_attributes_type"):
        return f"must be a mapping, got {type(value).__name__}"
    if kind == "finite_number":
        return f"must be finite, got {value}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"must be {_span(_node(loc))}, got {value:g}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {value!r}"
    return error["msg"]


def _policy_error(exc: ValidationError) -> PolicyError:
    """The first problem of a policy (unknown keys first, as their own typos explain the rest)."""
    errors = exc.errors(include_url=False)
    extra = sorted((e for e in errors if e["type"] == "extra_forbidden"), key=lambda e: [str(p) for p in e["loc"]])
    first = extra[0] if extra else errors[0]
    raised = (first.get("ctx") or {}).get("error")
    if isinstance(raised, PolicyError):
        return raised
    return PolicyError(dotted(first["loc"]), _message(first))


def write_json_schema(path: str | Path = SCHEMA_FILE) -> Path:
    """Write :func:`policy_json_schema` to ``path`` (by default the shipped ``policy.schema.json``)."""
    path = Path(path)
    path.write_text(json.dumps(policy_json_schema(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
