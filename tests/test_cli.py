"""The command line on bad input: one line on stderr and exit 2 from every command, never a
traceback; a bug (an exception no input explains) shows its traceback and exits 3, which no
caller can take for a verdict (0 passed, 1 refused, 2 unusable input)."""
from __future__ import annotations

import json

import click
import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner

from mlflow_rag_eval.cli import main


def _invoke(*args, **kwargs):
    result = CliRunner().invoke(main, list(args), **kwargs)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
        result.exc_info  # nothing escapes the group
    return result


def _one_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.fixture
def evaluated_run(tracking_uri, local_judge, monkeypatch) -> str:
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # MLflow's own stderr lines
    data = pd.DataFrame({"question": ["How much is a bike?"], "answer": ["5 euros."],
                         "contexts": [["Bikes cost 5 euros."]], "relevant_ids": [["x"]]})
    with mlflow.start_run() as run:
        mlflow.models.evaluate(data=data, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": local_judge, "metrics": ["faithfulness"]})
    return run.info.run_id


def test_compare_on_an_unknown_run_id_is_one_line_and_exit_2(tracking_uri, evaluated_run):
    unknown = "0" * 32
    for a, b in ((unknown, evaluated_run), (evaluated_run, unknown), ("not-a-run", "nor-this")):
        result = _invoke("compare", a, b, "--no-log", "--tracking-uri", tracking_uri)
        assert result.exit_code == 2, result.output
        line = _one_line(result)
        assert "compare:" in line and ("not found" in line or "not-a-run" in line), line


def test_commands_are_quiet_unless_verbose_and_leave_the_callers_settings(tracking_uri, evaluated_run, monkeypatch):
    """No "Downloading artifacts" bars from MLflow (six for one compare, before the package read
    its own artifacts without them), not even with -v: -v shows MLflow's own output, and these
    reads are the package's; the environment and the mlflow logger are the caller's again
    afterwards."""
    import logging
    import os

    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")  # the fixture's, to evaluate quietly
    env, level = dict(os.environ), logging.getLogger("mlflow").level
    quiet = _invoke("compare", evaluated_run, evaluated_run, "--no-log", "--tracking-uri", tracking_uri)
    assert quiet.exit_code == 0, quiet.output
    assert "Downloading artifacts" not in quiet.output and "faithfulness" in quiet.output
    assert dict(os.environ) == env and logging.getLogger("mlflow").level == level
    loud = _invoke("-v", "compare", evaluated_run, evaluated_run, "--no-log", "--tracking-uri", tracking_uri)
    assert loud.exit_code == 0 and "faithfulness" in loud.output, loud.output
    assert "Downloading artifacts" not in loud.output


def test_compare_on_a_run_that_is_no_evaluation_is_not_comparable(tracking_uri, evaluated_run):
    with mlflow.start_run() as plain:
        mlflow.log_param("x", 1)
    result = _invoke("compare", evaluated_run, plain.info.run_id, "--no-log", "--tracking-uri", tracking_uri)
    assert result.exit_code == 2
    assert _one_line(result) == f"not comparable: run {plain.info.run_id} holds no rag evaluation"


def test_an_unreachable_tracking_server_is_exit_2(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    policy = tmp_path / "gate.yaml"
    policy.write_text("require_metrics: [faithfulness]\n")
    uri = "http://127.0.0.1:9"  # discard port: nothing listens
    try:
        for args in (["compare", "a" * 32, "b" * 32, "--no-log"],
                     ["gate", "--model", "m", "--candidate", "1", "--policy", str(policy)]):
            result = _invoke(*args, "--tracking-uri", uri)
            assert result.exit_code == 2, result.output
            assert "Traceback" not in result.output and "127.0.0.1" in result.output, result.output
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.parametrize("command", [
    ["compare", "a" * 32, "b" * 32, "--no-log"],
    ["gate", "--model", "m", "--candidate", "1", "--policy", "{policy}"],
    ["ppi", "--run", "a" * 32],
    ["calibrate", "--run", "a" * 32],
    ["evaluate", "--data", "{data}", "--metrics", "mrr"],
])
def test_a_tracking_server_that_cannot_be_reached_is_named_at_once(command, tmp_path, monkeypatch):
    """With MLflow's own retries (minutes on a dead server, then "model version not found"):
    one request first, and one line saying the server cannot be reached."""
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    policy, data = tmp_path / "gate.yaml", tmp_path / "rows.jsonl"
    policy.write_text("require_metrics: [faithfulness]\n")
    _write_rows(_rows(), data)
    args = [a.format(policy=policy, data=data) for a in command]
    try:
        result = _invoke(*args, "--tracking-uri", "http://127.0.0.1:9")  # discard port: nothing listens
    finally:
        mlflow.set_tracking_uri(None)
    assert result.exit_code == 2, result.output
    assert _one_line(result).endswith("cannot reach the tracking server at http://127.0.0.1:9 within 10 s "
                                      "(ConnectionError); check the address and that the server runs"), result.output


def test_a_tracking_server_that_never_answers_is_named_after_the_reach_timeout(tmp_path, monkeypatch):
    import socket

    import mlflow_rag_eval.cli._options as cli

    monkeypatch.setattr(cli, "REACH_TIMEOUT_S", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections, never answers
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        try:
            result = _invoke("compare", "a" * 32, "b" * 32, "--no-log", "--tracking-uri", uri)
        finally:
            mlflow.set_tracking_uri(None)
    assert result.exit_code == 2 and f"cannot reach the tracking server at {uri} within 0.5 s (ReadTimeout)" in \
        result.output, result.output


def test_a_damaged_store_is_reported_as_the_stores_problem_not_our_bug(tmp_path):
    """A store left half-migrated (a kill inside MLflow's own migrations: a table gone, the
    schema version back at the first revision) fails inside MLflow's migrations with a bare
    SQLAlchemy error: exit 2 and one line naming the store, not "internal error (a bug in
    mlflow-rag-eval)" and exit 3."""
    import shutil
    import sqlite3

    made = tmp_path / "made.db"
    run_id = mlflow.MlflowClient(f"sqlite:///{made}").create_run("0").info.run_id
    damaged = tmp_path / "damaged.db"  # a path this process never opened: MLflow migrates it anew
    shutil.copy(made, damaged)
    with sqlite3.connect(damaged) as db:
        db.execute("DROP TABLE tags")
        db.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
    try:
        result = _invoke("compare", run_id, run_id, "--no-log", "--tracking-uri", f"sqlite:///{damaged}")
    finally:
        mlflow.set_tracking_uri(None)
    assert result.exit_code == 2, result.output
    assert "the tracking store failed (OperationalError" in result.output, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output


def test_a_bad_tracking_uri_is_exit_2(tmp_path):
    policy = tmp_path / "gate.yaml"
    policy.write_text("require_metrics: [faithfulness]\n")
    try:
        result = _invoke("gate", "--model", "m", "--candidate", "1", "--policy", str(policy),
                         "--tracking-uri", "nosuchscheme://x")
    finally:
        mlflow.set_tracking_uri(None)
    assert result.exit_code == 2 and "nosuchscheme" in _one_line(result)


def test_cache_info_on_a_folder_is_a_usage_error(tmp_path):
    result = _invoke("cache", "info", "--path", str(tmp_path))
    assert result.exit_code == 2 and "is a directory" in result.output and "Traceback" not in result.output


def test_usage_errors_stay_clicks_exit_2():
    result = _invoke("compare", "only-one-run")
    assert result.exit_code == 2 and "Missing argument" in result.output


def test_a_bug_shows_its_traceback_and_exits_3(monkeypatch, tracking_uri):
    import mlflow_rag_eval.compare as comparison

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for -: 'str' and 'float'")

    monkeypatch.setattr(comparison, "compare_runs", broken)
    result = _invoke("compare", "a", "b", "--no-log", "--tracking-uri", tracking_uri)
    assert result.exit_code == 3
    assert "Traceback" in result.output and "TypeError: unsupported operand" in result.output
    assert "internal error (a bug in mlflow-rag-eval" in result.output


@pytest.mark.parametrize("exc, code", [
    (ValueError("bad value"), 2), (OSError(2, "No such file or directory"), 2), (KeyError("x"), 3),
    (AttributeError("x"), 3), (RuntimeError("x"), 3),
])
def test_which_exceptions_are_input_errors(exc, code):
    from mlflow.exceptions import MlflowException

    from mlflow_rag_eval.cli._main import _is_input_error
    from mlflow_rag_eval.judges.base import JudgeCapabilityError, JudgeUnreachable

    assert _is_input_error(exc) is (code == 2)
    assert _is_input_error(MlflowException("Run 'x' not found"))
    assert _is_input_error(JudgeUnreachable("no route")) and _is_input_error(JudgeCapabilityError("no grade"))


def _rows() -> pd.DataFrame:
    return pd.DataFrame({
        "question": ["How much is a bike ticket?", "Can dogs travel?", "Is there wifi?", "Where is the office?"],
        "answer": ["A bike ticket costs 5 euros.", "Dogs travel free.", "I don't know.", "Halden."],
        "contexts": [[{"id": "p1", "text": "A bike ticket costs 5 euros."}], [{"id": "p2", "text": "Dogs travel free."}],
                     [{"id": "p3", "text": "Seats recline."}], [{"id": "p4", "text": "The office is in Halden."}]],
        "relevant_ids": [[{"id": "p1", "grade": 2}], [{"id": "p9", "grade": 1}], [], [{"id": "p4", "grade": 2}]],
        "metadata": [{"difficulty": "easy"}, {"difficulty": "hard"}, {"difficulty": "hard"}, {"difficulty": "easy"}],
    })


def _write_rows(rows: pd.DataFrame, path) -> None:
    """Rows as a data file of ``path``'s format (in CSV, lists and dicts as JSON text)."""
    if path.suffix == ".parquet":
        rows.to_parquet(path)
    elif path.suffix == ".csv":
        structured = ["contexts", "relevant_ids", "metadata"]
        rows.assign(**{c: rows[c].map(json.dumps) for c in structured}).to_csv(path, index=False)
    else:
        rows.to_json(path, orient="records", lines=True)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_evaluate_logs_an_evaluation_run_with_slices(tracking_uri, tmp_path, suffix):
    path = tmp_path / f"rows{suffix}"
    rows = _rows()
    _write_rows(rows, path)
    result = CliRunner().invoke(main, ["evaluate", "--data", str(path), "--metrics", "hit@5,mrr",
                                       "--judge", "scripted", "--slice-by", "difficulty", "--run-name", "cli-eval",
                                       "--run-metrics", "all"])  # every statistic, the slices' too
    assert result.exit_code == 0, result.output
    run = mlflow.MlflowClient().get_run(result.stdout.strip().splitlines()[-1])  # the run id, last
    assert run.info.run_name == "cli-eval" and run.data.tags["mlflow.runType"] == "genai_evaluate"
    metrics = run.data.metrics
    # p1 and p4 retrieved first (1.0), p9 never (0.0); the empty row is not applicable
    assert metrics["hit_at_5/mean"] == pytest.approx(2 / 3) and metrics["hit_at_5/n_scored"] == 3
    assert metrics["hit_at_5/slice/difficulty/easy/mean"] == 1.0
    assert metrics["hit_at_5/slice/difficulty/hard/mean"] == 0.0
    assert len(mlflow.MlflowClient().search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)) == 4
    # the Evaluation runs page names the dataset: the file, by reference, with the rows' digest
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == f"golden-{run.data.params['rag_eval.dataset_digest'][:8]}"
    assert dataset_input.dataset.digest == run.data.params["rag_eval.dataset_digest"]
    assert json.loads(dataset_input.dataset.source) == {"uri": str(path.resolve())}
    assert dataset_input.dataset.source_type == "local"


def test_a_csv_file_evaluates_like_the_same_rows_in_jsonl(tracking_uri, tmp_path):
    """Its contexts, relevant ids and metadata cells are JSON text: decoded, the same records."""
    digests = []
    for suffix in (".jsonl", ".csv"):
        path = tmp_path / f"rows{suffix}"
        _write_rows(_rows(), path)
        result = CliRunner().invoke(main, ["evaluate", "--data", str(path), "--metrics", "faithfulness,mrr",
                                           "--judge", "scripted", "--slice-by", "difficulty"])
        assert result.exit_code == 0, result.output
        run = mlflow.MlflowClient().get_run(result.stdout.strip().splitlines()[-1])
        digests.append((run.data.params["rag_eval.dataset_digest"], run.data.metrics))
    assert digests[0] == digests[1]


def test_a_csv_cell_that_is_not_json_is_refused_naming_it(tracking_uri, tmp_path):
    path = tmp_path / "rows.csv"
    _write_rows(_rows(), path)
    text = path.read_text().replace('[{""id"": ""p2""', '[{""id"" ""p2""', 1)  # a missing colon
    path.write_text(text)
    result = CliRunner().invoke(main, ["evaluate", "--data", str(path), "--metrics", "mrr"])
    assert result.exit_code == 2, result.output
    assert "row 1, column 'contexts': a CSV cell of a list or dict field must be JSON" in result.output
    assert mlflow.search_runs().empty


def test_evaluate_sets_an_llm_judges_limits_from_the_command_line(tracking_uri, tmp_path, monkeypatch):
    """--timeout, --deadline, --rate-limit and --concurrency reach the judge: a server that takes
    3 s a reply times the row out under --deadline 1 (the defaults, 60 s and 120 s, would wait
    and score it), and the lineage holds the rate limit."""
    from mlflow_rag_eval.testing import FakeJudgeServer, Reply

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    path = tmp_path / "rows.jsonl"
    _write_rows(_rows().head(1), path)
    with FakeJudgeServer(reply=Reply(delay=3.0)) as server:
        result = CliRunner().invoke(main, [
            "evaluate", "--data", str(path), "--metrics", "faithfulness",
            "--judge", f"openai:/m?base_url={server.base_url}",
            "--timeout", "0.5", "--deadline", "1", "--rate-limit", "5", "--concurrency", "1"])
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip().splitlines()[-1]
    client = mlflow.MlflowClient()
    from mlflow_rag_eval.compare import load_evaluation

    assert load_evaluation(run_id, client).figures()["faithfulness/n_error"] == 1  # counts: the rows table's
    lineage = json.loads(open(client.download_artifacts(run_id, "rag_eval/judge_lineage.json", str(tmp_path))).read())
    assert lineage["judge"]["params"]["rate_limit"] == 5.0, lineage["judge"]


def test_judge_limits_are_refused_for_a_judge_that_calls_no_provider(tracking_uri, tmp_path):
    path = tmp_path / "rows.jsonl"
    _write_rows(_rows(), path)
    result = CliRunner().invoke(main, ["evaluate", "--data", str(path), "--metrics", "faithfulness",
                                       "--timeout", "5"])
    assert result.exit_code == 2 and "timeout" in result.output, result.output
    assert mlflow.search_runs().empty


def test_evaluate_refuses_a_bad_cell_naming_it_and_logs_nothing(tracking_uri, tmp_path):
    rows = _rows()
    rows.loc[2, "answer"] = None
    path = tmp_path / "rows.jsonl"
    rows.to_json(path, orient="records", lines=True)
    runner = CliRunner()
    result = runner.invoke(main, ["evaluate", "--data", str(path), "--metrics", "hit@5"])
    assert result.exit_code == 2 and "row 2, column 'answer'" in result.output
    assert mlflow.search_runs().empty
    bad = runner.invoke(main, ["evaluate", "--data", str(path), "--col", "question"])
    assert bad.exit_code == 2 and "FIELD=COLUMN" in bad.output


def test_a_dataset_input_names_s3a_data_as_its_s3_object_and_never_fails_the_run(tracking_uri, caplog):
    from mlflow_rag_eval.tracking.run_logging import log_dataset_input

    client = mlflow.MlflowClient()
    with mlflow.start_run() as run:
        log_dataset_input(run.info.run_id, "s3a://bucket/evals/rows.parquet/", "abc123")
    (logged,) = client.get_run(run.info.run_id).inputs.dataset_inputs
    assert (logged.dataset.name, logged.dataset.digest, logged.dataset.source_type) == ("golden-abc123", "abc123", "s3")
    assert json.loads(logged.dataset.source) == {"uri": "s3://bucket/evals/rows.parquet"}
    with mlflow.start_run() as run, caplog.at_level("WARNING"):
        log_dataset_input(run.info.run_id, "gopher://host/rows", "abc123")
    assert client.get_run(run.info.run_id).inputs.dataset_inputs == []
    assert "no MLflow dataset input for gopher://host/rows" in caplog.text


def test_sqlalchemy_too_new_for_the_mlflow_release_is_named_with_the_pin():
    """Issue 37: MLflow 3.6 with SQLAlchemy 2.1 was reported as `internal error (a bug in
    mlflow-rag-eval ...)`, exit 3. MLflow 3.4-3.8's mlflow/store/db/utils.py runs
    `from sqlalchemy.pool import FallbackAsyncAdaptedQueuePool`, which SQLAlchemy 2.1 removed
    (reproduced in a venv with mlflow==3.6.0 and sqlalchemy==2.1.9: an ImportError with name
    'sqlalchemy.pool'). This venv's SQLAlchemy is 2.1 too, so the command below raises that very
    exception through Python's import system, and the CLI's own group classifies it."""
    import sqlalchemy

    from mlflow_rag_eval.cli._main import _Main

    if not sqlalchemy.__version__.startswith("2.1"):
        pytest.skip(f"needs SQLAlchemy 2.1 (the class is there in {sqlalchemy.__version__})")

    @click.group(cls=_Main)
    def group():
        pass

    @group.command()
    def open_store():
        from sqlalchemy.pool import FallbackAsyncAdaptedQueuePool  # noqa: F401 - what MLflow 3.6 imports

    result = CliRunner().invoke(group, ["open-store"])
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert "cannot import name 'FallbackAsyncAdaptedQueuePool' from 'sqlalchemy.pool'" in result.output
    assert "MLflow 3.4 to 3.8 need SQLAlchemy<2.1" in result.output and "pip install 'SQLAlchemy<2.1'" in result.output

    @group.command()
    def our_bug():
        from mlflow_rag_eval.records import no_such_name  # noqa: F401

    result = CliRunner().invoke(group, ["our-bug"])
    assert result.exit_code == 3 and "internal error" in result.output  # our own import: still a bug


#: the [loggers] part of MLflow 3.6's mlflow/store/db_migrations/alembic.ini, which that
#: release's migrations env.py hands to logging.config.fileConfig on every fresh SQL store
_MLFLOW_36_ALEMBIC_LOGGING = """
[loggers]
keys = root,sqlalchemy,alembic
[handlers]
keys = console
[formatters]
keys = generic
[logger_root]
level = WARN
handlers = console
qualname =
[logger_sqlalchemy]
level = WARN
handlers =
qualname = sqlalchemy.engine
[logger_alembic]
level = INFO
handlers =
qualname = alembic
[handler_console]
class = StreamHandler
args = (sys.stderr,)
level = NOTSET
formatter = generic
[formatter_generic]
format = %(asctime)s %(levelname)-5.5s [%(name)s] %(message)s
"""


def test_a_fresh_store_on_an_old_mlflow_prints_no_alembic_info_lines(tmp_path):
    """Issue 37: ~45 "INFO [alembic.runtime.migration] Running upgrade ..." lines on a fresh
    store with MLflow 3.6 (seen there: 44 alembic lines and 3 "Migration complete!" of the
    migration scripts' own loggers, which set themselves to INFO). This venv's MLflow no longer
    runs fileConfig, so the command replays what 3.6 does: fileConfig on its alembic.ini, then
    the migration loggers' INFO lines. A warning still passes; outside a command, nothing is
    filtered; -v shows them."""
    import logging
    import logging.config

    from mlflow_rag_eval.cli._main import _Main

    ini = tmp_path / "alembic.ini"
    ini.write_text(_MLFLOW_36_ALEMBIC_LOGGING)
    # alembic loads a script as a module named after its file, non-word characters as "_"
    script = "89d4b8295536_create_latest_metrics_table_py"
    touched = [logging.getLogger(n) for n in ("", "alembic", "sqlalchemy.engine", script)]
    saved = [(lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in touched]

    @click.group(cls=_Main)
    @click.option("-v", "--verbose", is_flag=True)
    def group(verbose):
        pass

    @group.command()
    def fresh_store():
        logging.config.fileConfig(ini, disable_existing_loggers=False)  # MLflow 3.6's env.py
        logging.getLogger("alembic.runtime.migration").info("Running upgrade  -> 451aebb31d03, add metric step")
        migration = logging.getLogger(script)
        migration.setLevel(logging.INFO)  # as the script does at import
        migration.info("Migration complete!")
        logging.getLogger("alembic.runtime.migration").warning("a warning from alembic")

    try:
        quiet = CliRunner().invoke(group, ["fresh-store"])
        assert quiet.exit_code == 0, quiet.output
        assert "Running upgrade" not in quiet.output and "Migration complete!" not in quiet.output, quiet.output
        assert "a warning from alembic" in quiet.output
        assert not logging.getLogger("alembic.runtime.migration").filters  # removed after the command
        verbose = CliRunner().invoke(group, ["-v", "fresh-store"])
        assert "Running upgrade" in verbose.output and "Migration complete!" in verbose.output
    finally:
        for lg, (level, handlers, propagate, disabled) in zip(touched, saved):
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, disabled
