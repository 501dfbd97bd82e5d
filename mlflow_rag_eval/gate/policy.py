"""The gate policy: what a candidate model version must meet to take the champion alias.

One YAML file per registered model::

    model: rag-pipeline            # optional; must match the model being gated
    dataset_digest: 3f2a...        # optional; pin the golden set (default: the candidate's latest)
    require_metrics: [faithfulness, context_recall]
    min_scored_rows: 30            # per gated metric (default 30)
    max_error_rate: 0.05           # n_error / (n_scored + n_error), per gated metric (default 0.05)
    floors:                        # lower limits on logged aggregates
      faithfulness/mean: 0.85
      faithfulness/p10: 0.5
    ceilings:                      # upper limits, for lower-is-better metrics
      false_abstention/mean: 0.1
    max_regression:                # largest allowed drop of the paired mean vs the champion
      faithfulness: 0.03
      ndcg@10: 0.02
    regression_test: {confidence: 0.95, decide_on: point}
    calibration: {required: true, min_labels: 50, min_spearman: 0.7}

The *gated metrics* are ``require_metrics`` plus every metric named in ``floors``,
``ceilings`` and ``max_regression``: a limit on a metric requires it. Row counts, error rate and
calibration apply to each gated metric. A policy must gate at least one metric: an empty policy
file (or one of only defaults) would pass any version, regressions included, so it is refused.

Defaults, when the policy leaves them out; both bound what the other checks can see:

* ``max_error_rate: 0.05``. Rows the judge failed on carry no score, and the regression rule
  pairs only rows scored in both runs: a candidate whose judge failed on half its rows would
  be compared on the half that worked, and pass. At most one failed row in twenty keeps a
  floor or a delta about (nearly) the whole golden set; ``1.0`` turns the check off, which a
  policy must then say. A run that did not log ``<metric>/n_error`` fails the check (its
  error rate is unknown), never passes it silently.
* ``min_scored_rows: 30``. Below about 30 scored rows, a mean of scores in [0, 1] has a 95%
  interval wider than +-0.18 (binary scores at 0.5: 1.96 * sqrt(0.25 / 30)) and the
  percentile bootstrap behind the regression CI is unstable, so floors and tolerances of a
  few hundredths would decide on noise. A smaller golden set is allowed, but its policy must
  say so (``min_scored_rows: 10``), and the decision records the figure.

Regression rule: a metric regresses when the paired mean delta over the rows both runs scored
(candidate - champion, sign flipped for lower-is-better metrics) is below
``-max_regression[metric]``. With ``decide_on: point`` (default) the point estimate decides;
with ``decide_on: ci_low`` the lower bound of the two-sided bootstrap CI at ``confidence``
decides (stricter: the candidate must show, not merely suggest, that it did not drop by more
than the tolerance). Either way the CI and the Wilcoxon p-value are reported.

Why ``point`` by default: golden sets are small (tens to a few hundred rows) and the bootstrap
CI of a paired mean is often wider than any useful tolerance, so ``ci_low`` would refuse an
unchanged pipeline. The tolerance is the noise budget; the CI and p shown beside it tell a
reviewer whether a refused drop is real or noise.

Metric names are typed as users know them (``ndcg@10``) and stored as MLflow keys
(``ndcg_at_10``). Every metric of this package scores rows in [0, 1], so floors and ceilings
on ``mean``/``median``/``p10``/``ci_low``/``ci_high`` must lie in [0, 1].
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlflow_rag_eval.results import metric_key

__all__ = ["CalibrationRequirement", "GatePolicy", "PolicyError", "RegressionTest", "load_policy"]

#: Aggregates a floor or ceiling may name: the per-run statistics the logger writes.
STATS = ("mean", "median", "p10", "ci_low", "ci_high")
_TOP_KEYS = {
    "model", "dataset_digest", "require_metrics", "min_scored_rows", "max_error_rate", "floors",
    "ceilings", "max_regression", "regression_test", "calibration",
}


class PolicyError(ValueError):
    """The policy cannot be used: the message names the key at fault."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"gate policy: {key}: {message}")


@dataclass(frozen=True)
class RegressionTest:
    """How a drop vs the champion is decided (see the module docstring)."""

    confidence: float = 0.95
    decide_on: str = "point"  # "point" | "ci_low"


@dataclass(frozen=True)
class CalibrationRequirement:
    """The judge must have been checked against human labels on each judge-graded metric."""

    required: bool = True
    min_labels: int = 50
    min_spearman: float = 0.7


@dataclass(frozen=True)
class GatePolicy:
    """A parsed, validated policy. Build it with :func:`load_policy`."""

    model: str | None = None
    dataset_digest: str | None = None
    require_metrics: tuple[str, ...] = ()
    min_scored_rows: int = 30
    max_error_rate: float = 0.05
    floors: Mapping[str, float] = field(default_factory=dict)
    ceilings: Mapping[str, float] = field(default_factory=dict)
    max_regression: Mapping[str, float] = field(default_factory=dict)
    regression_test: RegressionTest = RegressionTest()
    calibration: CalibrationRequirement = CalibrationRequirement()

    @property
    def gated_metrics(self) -> list[str]:
        """Metric keys the policy gates on, in first-mention order."""
        keys = list(self.require_metrics)
        keys += [k.rsplit("/", 1)[0] for k in (*self.floors, *self.ceilings)]
        keys += list(self.max_regression)
        return list(dict.fromkeys(keys))

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["require_metrics"] = list(self.require_metrics)
        for name in ("floors", "ceilings", "max_regression"):
            out[name] = dict(sorted(getattr(self, name).items()))
        return out

    @property
    def policy_hash(self) -> str:
        """sha256 of the canonical JSON of the parsed policy (defaults filled, keys sorted)."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def load_policy(source: GatePolicy | Mapping[str, Any] | str | Path) -> GatePolicy:
    """A :class:`GatePolicy` from a YAML file, a mapping, or a policy (returned as is).

    Raises:
        PolicyError: unreadable or empty file (not UTF-8, not YAML), unknown key (at any level),
            wrong type or impossible value, or no gated metric; the message names the key or
            the file.
    """
    if isinstance(source, GatePolicy):
        return _check_gates_something(source)
    if isinstance(source, (str, Path)):
        import yaml

        path = Path(source)
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as exc:
            raise PolicyError(str(path), f"cannot read the policy file ({exc.strerror or exc})") from None
        except UnicodeDecodeError as exc:
            raise PolicyError(str(path), f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                         f"{exc.start}); save the policy as UTF-8") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PolicyError(str(path), "not valid YAML: " + " ".join(str(exc).split())) from None
        if data is None:
            raise PolicyError(str(path), "the policy file is empty: a gate on nothing would pass any "
                                         "version; name the metrics in require_metrics, floors, "
                                         "ceilings or max_regression")
        source = data
    if not isinstance(source, Mapping):
        raise PolicyError("<policy>", f"must be a mapping of keys to values, got {type(source).__name__}")
    return _check_gates_something(_parse(source))


def _check_gates_something(policy: GatePolicy) -> GatePolicy:
    if not policy.gated_metrics:
        raise PolicyError("require_metrics", "the policy gates no metric, so it would pass any version; "
                                             "name the metrics in require_metrics, floors, ceilings or "
                                             "max_regression")
    return policy


def _unknown(keys, known: set[str], where: str) -> None:
    extra = sorted(str(k) for k in keys if k not in known)
    if extra:
        raise PolicyError(f"{where}{extra[0]}", f"unknown key; known: {sorted(known)}")


def _number(value: Any, key: str, *, low: float | None = None, high: float | None = None,
            open_low: bool = False, open_high: bool = False) -> float:
    # bool is an int to Python; "true" as a threshold is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(key, f"must be a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise PolicyError(key, f"must be finite, got {value}")
    too_low = low is not None and (value <= low if open_low else value < low)
    too_high = high is not None and (value >= high if open_high else value > high)
    if too_low or too_high:
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        span = f"{lo}{'-inf' if low is None else low:g}, {'inf' if high is None else high:g}{hi}"
        raise PolicyError(key, f"must be in {span}, got {value:g}")
    return value


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(key, f"must be a non-empty string, got {value!r}")
    return value.strip()


def _mapping(value: Any, key: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise PolicyError(key, f"must be a mapping, got {type(value).__name__}")
    return value


def _direction(name: str) -> bool | None:
    """greater_is_better of a built-in metric; None for a name only the evaluation knows."""
    if ":" in name:
        return None  # namespaced adapters import their library on resolution
    from mlflow_rag_eval.metrics import resolve_metric

    try:
        return resolve_metric(re.sub(r"_at_(\d+)$", r"@\1", name)).greater_is_better
    except (ValueError, TypeError):
        return None


def _limits(raw: Any, key: str, *, floors: bool) -> dict[str, float]:
    out = {}
    for name, value in _mapping(raw, key).items():
        item = f"{key}.{name}"
        metric, sep, stat = str(name).rpartition("/")
        if not sep or not metric:
            raise PolicyError(item, f"name an aggregate as <metric>/<stat>, stat one of {list(STATS)}")
        if stat not in STATS:
            raise PolicyError(item, f"unknown statistic {stat!r}; one of {list(STATS)}")
        greater_is_better = _direction(metric)
        if floors and greater_is_better is False:
            raise PolicyError(item, f"{metric} is lower-is-better: put its limit under ceilings")
        if not floors and greater_is_better is True:
            raise PolicyError(item, f"{metric} is higher-is-better: put its limit under floors")
        out[f"{metric_key(metric)}/{stat}"] = _number(value, item, low=0.0, high=1.0)
    return out


def _parse(data: Mapping[str, Any]) -> GatePolicy:
    _unknown(data, _TOP_KEYS, "")
    kwargs: dict[str, Any] = {}
    for key in ("model", "dataset_digest"):
        if data.get(key) is not None:
            kwargs[key] = _string(data[key], key)
    # A digest is searched for as a tag value, and MLflow's filters have no escape for quotes.
    if "dataset_digest" in kwargs and not re.fullmatch(r"[\w.:+-]+", kwargs["dataset_digest"]):
        raise PolicyError("dataset_digest", "must be a dataset digest (letters, digits and . : + - _), "
                                            f"got {kwargs['dataset_digest']!r}")
    if "require_metrics" in data:
        names = data["require_metrics"]
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise PolicyError("require_metrics", f"must be a list of metric names, got {type(names).__name__}")
        kwargs["require_metrics"] = tuple(
            dict.fromkeys(metric_key(_string(n, f"require_metrics[{i}]")) for i, n in enumerate(names))
        )
    if "min_scored_rows" in data:
        value = data["min_scored_rows"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError("min_scored_rows", f"must be an integer, got {type(value).__name__} ({value!r})")
        if value < 0:
            raise PolicyError("min_scored_rows", f"must be >= 0, got {value}")
        kwargs["min_scored_rows"] = value
    if "max_error_rate" in data:  # null is refused, not read as "no limit": write 1.0 for that
        kwargs["max_error_rate"] = _number(data["max_error_rate"], "max_error_rate", low=0.0, high=1.0)
    if "floors" in data:
        kwargs["floors"] = _limits(data["floors"], "floors", floors=True)
    if "ceilings" in data:
        kwargs["ceilings"] = _limits(data["ceilings"], "ceilings", floors=False)
    if "max_regression" in data:
        kwargs["max_regression"] = {
            metric_key(str(name)): _number(value, f"max_regression.{name}", low=0.0, high=1.0)
            for name, value in _mapping(data["max_regression"], "max_regression").items()
        }
    if "regression_test" in data:
        raw = _mapping(data["regression_test"], "regression_test")
        _unknown(raw, {"confidence", "decide_on"}, "regression_test.")
        decide_on = raw.get("decide_on", "point")
        if decide_on not in ("point", "ci_low"):
            raise PolicyError("regression_test.decide_on", f"must be 'point' or 'ci_low', got {decide_on!r}")
        confidence = _number(raw.get("confidence", 0.95), "regression_test.confidence",
                             low=0.0, high=1.0, open_low=True, open_high=True)
        kwargs["regression_test"] = RegressionTest(confidence=confidence, decide_on=decide_on)
    if "calibration" in data:
        raw = _mapping(data["calibration"], "calibration")
        _unknown(raw, {"required", "min_labels", "min_spearman"}, "calibration.")
        required = raw.get("required", True)
        if not isinstance(required, bool):
            raise PolicyError("calibration.required", f"must be true or false, got {required!r}")
        min_labels = raw.get("min_labels", 50)
        if isinstance(min_labels, bool) or not isinstance(min_labels, int):
            raise PolicyError("calibration.min_labels", f"must be an integer, got {min_labels!r}")
        if min_labels < 1:
            raise PolicyError("calibration.min_labels", f"must be >= 1, got {min_labels}")
        min_spearman = _number(raw.get("min_spearman", 0.7), "calibration.min_spearman", low=-1.0, high=1.0)
        kwargs["calibration"] = CalibrationRequirement(required, min_labels, min_spearman)
    return GatePolicy(**kwargs)
