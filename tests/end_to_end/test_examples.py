"""The full-suite example (ours + ragas + deepeval through mlflow.evaluate) runs end to end.

Its default judge is SmolLM2 in process, minutes per row on two cores; here it runs against the
package's loopback fake judge server, which checks the wiring (every metric of the three
libraries gets its key, through one judge) and says nothing of quality.
"""

from __future__ import annotations

import importlib.util

from conftest import ROOT, figures_of

from mlflow_rag_eval.keys import metric_key
from mlflow_rag_eval.testing import FakeJudgeServer


def test_full_suite_example_runs_ours_ragas_and_deepeval_on_one_judge(tracking_uri, capsys):
    spec = importlib.util.spec_from_file_location("full_suite", ROOT / "examples" / "full_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with FakeJudgeServer() as server:
        result = module.main(["--rows", "2", "--tracking-uri", tracking_uri,
                              "--judge", f"openai:/fake-judge?base_url={server.base_url}"])
    figures = figures_of(result)  # the counts: the run's rows table
    for name in module.OURS + module.THEIRS:
        key = metric_key(name)
        assert figures[f"{key}/n_scored"] + figures[f"{key}/n_error"] == 2, key
    for key in ("faithfulness", "context_recall", "ndcg_at_10"):
        assert figures[f"{key}/n_scored"] == 2
    out = capsys.readouterr().out
    assert "external:ragas" in out and "external:deepeval" in out
