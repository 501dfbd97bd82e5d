"""Statistics, in one place: bootstrap CIs, paired deltas, the Wilcoxon test and Holm's
correction, Krippendorff's alpha (:mod:`.inference`, re-exported here); a judge panel's
agreement on logged rows (:mod:`.agreement`); the PPI++ closed form (:mod:`.ppi`).

No MLflow, no judge: everything above may import this package.
"""

from mlflow_rag_eval.stats.inference import (
    ALPHA_CI_RESAMPLES,
    ALPHA_LEVELS,
    MEAN_CI_RESAMPLES,
    PAIRED_CI_RESAMPLES,
    SEED,
    PairedDelta,
    all_equal,
    alpha_ci,
    ci_missing,
    holm,
    krippendorff_alpha,
    mean_ci,
    pair_rows,
    paired_delta,
    paired_difference_ci,
    percentile_interval,
    regression_p,
    resample_indices,
    row_keys,
    wilcoxon_p,
)

__all__ = [
    "ALPHA_CI_RESAMPLES", "ALPHA_LEVELS", "MEAN_CI_RESAMPLES", "PAIRED_CI_RESAMPLES", "SEED", "PairedDelta",
    "all_equal", "alpha_ci", "ci_missing", "holm", "krippendorff_alpha", "mean_ci", "pair_rows", "paired_delta",
    "paired_difference_ci", "percentile_interval", "regression_p", "resample_indices", "row_keys", "wilcoxon_p",
]
