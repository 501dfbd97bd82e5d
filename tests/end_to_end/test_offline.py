"""Offline hygiene: an evaluation with the local judge opens no network connection and writes
nothing outside the tracking store and temp dirs; start-up loads nothing heavy."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

#: Modules that cost seconds to import: neither the package import nor --help may load them.
HEAVY = ("torch", "sentence_transformers", "transformers", "mlflow", "ragas", "deepeval")

SCRIPT = textwrap.dedent(
    """
    import socket

    def refuse(self, address, *args, **kwargs):
        if self.family != socket.AF_UNIX:
            raise AssertionError(f"network connection attempted to {address!r}")
        return real_connect(self, address, *args, **kwargs)

    real_connect = socket.socket.connect
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = lambda address, *a, **k: refuse(socket.socket(), address)

    import sys
    import mlflow_rag_eval
    assert "torch" not in sys.modules, "importing the package must not load torch"

    import mlflow
    import pandas as pd

    mlflow.set_tracking_uri("sqlite:///mlflow.db")
    df = pd.DataFrame({
        "question": ["How much does a bike ticket cost?"],
        "answer": ["A bike ticket costs 5 euros."],
        "contexts": [[{"id": "p1", "text": "Bikes travel for a flat fare of 5 euros."}]],
        "reference": ["5 euros."],
        "relevant_ids": [["p1"]],
    })
    with mlflow.start_run():
        result = mlflow.models.evaluate(data=df, model_type="rag", evaluators="rag")
    from mlflow_rag_eval.compare import load_evaluation

    assert "faithfulness/mean" in result.metrics
    assert load_evaluation(result.run_id).figures()["faithfulness/n_scored"] == 1
    print("OK")
    """
)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_evaluation_is_offline_and_writes_only_the_store(tmp_path):
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for d in (home, work, tmp):
        d.mkdir()
    env = {
        k: v for k, v in os.environ.items()
        # Other tests' MLflow state (tracking URI, experiment id) must not leak in.
        if not k.startswith(("MLFLOW_", "HF_HOME", "XDG_", "TRANSFORMERS_CACHE"))
    }
    env.update(HOME=str(home), TMPDIR=str(tmp), HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout
    # The user's cache dir is allowed (matplotlib, imported by MLflow's evaluation module,
    # keeps its font cache there); nothing else in the home directory is.
    assert {f for f in _files(home) if not f.startswith(".cache/")} == set()
    stray = {f for f in _files(work) if f != "mlflow.db" and not f.startswith("mlruns/")}
    assert stray == set()


STARTUP = textwrap.dedent(
    f"""
    import contextlib, io, sys
    import mlflow_rag_eval
    import mlflow_rag_eval.judges
    after_import = [m for m in {HEAVY!r} if m in sys.modules]
    sys.argv = ["mlflow-rag-eval", "--help"]
    from mlflow_rag_eval.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
    assert "Usage" in out.getvalue()
    print(after_import, [m for m in {HEAVY!r} if m in sys.modules])
    """
)


def test_import_and_help_load_no_heavy_module():
    proc = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[] []"


def test_help_answers_within_a_second_and_a_half():
    """The console script's --help, in a fresh process: median of three under 1.5 s."""
    script = Path(sys.executable).with_name("mlflow-rag-eval")
    argv = [str(script)] if script.exists() else [sys.executable, "-c", "from mlflow_rag_eval.cli import main; main()"]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        proc = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60)
        times.append(time.perf_counter() - start)
        assert proc.returncode == 0 and "Usage" in proc.stdout, proc.stderr[-2000:]
    assert statistics.median(times) < 1.5, times
