"""Golden sets written from the example corpus by the scripted judge: three question kinds,
checked references, a drop report that accounts for every candidate, and one digest shared by
the logged set and every run evaluated on it."""

from __future__ import annotations

import json
from collections import Counter

import mlflow
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import PINNED_PROMPTS_VERSION, ROOT

from mlflow_rag_eval._util.text import content_tokens, split_sentences
from mlflow_rag_eval.cli import main
from mlflow_rag_eval.golden import (
    GOLDEN_PROMPTS,
    GOLDEN_PROMPTS_VERSION,
    QUESTION_TYPES,
    generate_golden_set,
    load_passages,
    log_golden_set,
)
from mlflow_rag_eval.judges import JudgeCapabilityError
from mlflow_rag_eval.judges.llm.chat import PermanentError
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.prompts import PROMPTS_VERSION
from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend
from mlflow_rag_eval.records import dataset_digest, records_from_frame

CORPUS = ROOT / "examples" / "rag_pipeline" / "data" / "corpus.jsonl"


@pytest.fixture(scope="module")
def passages():
    return load_passages(CORPUS)


@pytest.fixture(scope="module")
def golden(passages):
    return generate_golden_set(passages, LLMJudge(ScriptedBackend(), name="scripted", cache=False), n=40, seed=0)


def _drops(report, kind):
    return sum(d.question_type == kind for d in report.drops)


def test_three_kinds_with_graded_ids_and_provenance(golden, passages):
    by_id = {p.id: p for p in passages}
    kinds = Counter(r.metadata.question_type for r in golden.rows)
    assert set(kinds) == set(QUESTION_TYPES)
    assert all(kinds[k] <= golden.report.requested[k] for k in QUESTION_TYPES)
    for row in golden.rows:
        meta = row.metadata
        assert meta.provenance.prompts_version == GOLDEN_PROMPTS_VERSION
        assert meta.provenance.template == GOLDEN_PROMPTS[f"golden_{meta.question_type}"].ref
        assert all(pid in by_id for pid in meta.provenance.passages)
        assert meta.difficulty in {"easy", "medium", "hard"} and meta.tags
        sources = {pid for pid, grade in row.relevant_ids.items() if grade == 2}
        if meta.question_type == "unanswerable":
            assert not row.answerable and row.relevant_ids == {}
            continue
        assert row.answerable
        n_sources = 1 if meta.question_type == "single" else 2
        assert sources == set(meta.provenance.passages) and len(sources) == n_sources
        assert set(row.relevant_ids.values()) <= {1, 2}
        # Every kept reference is supported by its passages: with the scripted rules a
        # reference is made of sentences of the source passages, verbatim.
        for sentence in split_sentences(row.reference):
            assert any(sentence in by_id[pid].text for pid in sources), sentence
    assert {r.metadata.difficulty for r in golden.rows if r.metadata.question_type == "multi"} == {"hard"}


def test_unanswerable_questions_are_not_answered_by_any_passage(golden, passages):
    # The scripted answerability rule, checked over the whole corpus (the generator only
    # asked about the nearest passages): no passage holds 60% of the question's words.
    for row in golden.rows:
        if row.answerable:
            continue
        words = content_tokens(row.question)
        best = max(sum(w in set(content_tokens(p.text)) for w in words) / len(words) for p in passages)
        assert best < 0.6, row.question


def test_the_report_accounts_for_every_candidate(golden):
    report = golden.report
    for kind in QUESTION_TYPES:
        assert report.generated[kind] == report.kept[kind] + _drops(report, kind) + report.unused[kind]
    # The example corpus covers some of the scripted generator's "absent" aspects: the judge
    # catches those and says why.
    assert report.drop_counts()["answerable_from_corpus"]["unanswerable"] >= 1
    text = report.to_text()
    assert "answerable_from_corpus" in text and "unused" in text


def test_bad_candidates_are_dropped_with_their_reason(passages):
    invented = iter(range(1000))

    def single(v):  # every other reference invents a figure the passage does not hold
        i = next(invented)
        sentence = split_sentences(v["passages"][0])[0]
        if i % 2:
            return {"question": f"Question {i} about {sentence[:30]}?", "reference": "It costs 987 euros.",
                    "topic": "fares"}
        return {"question": f"What does this say: {sentence}?", "reference": sentence, "topic": "fares"}

    script = {
        "golden_single": single,
        "golden_multi": [PermanentError("refusal", "I cannot help with that")] * 3,
        # the same question for every candidate: all but the first are near-duplicates
        "golden_unanswerable": {"question": "Do trains run on the moon?", "topic": "space"},
    }
    judge = LLMJudge(ScriptedBackend(script), name="scripted-bad", cache=False)
    golden = generate_golden_set(passages, judge, n=8, mix=(0.5, 0.25, 0.25), seed=1)
    counts = golden.report.drop_counts()
    assert counts["reference_unsupported"]["single"] >= 1
    assert counts["judge_failure"] == {"multi": 3}
    assert counts["near_duplicate"]["unanswerable"] == golden.report.generated["unanswerable"] - 1
    unsupported = [d for d in golden.report.drops if d.reason == "reference_unsupported"]
    assert all("987" in d.detail for d in unsupported)
    assert all("987" not in r.reference for r in golden.rows)
    assert {r.metadata.question_type for r in golden.rows} == {"single", "unanswerable"}


def test_the_local_judge_cannot_write_questions(passages, local_judge):
    with pytest.raises(JudgeCapabilityError, match="cannot write questions"):
        generate_golden_set(passages, local_judge, n=3)


def test_golden_templates_do_not_move_the_judge_fingerprint():
    # Writing questions never changes a verdict: calibration records stay paired.
    from mlflow_rag_eval.judges.prompts import PROMPTS

    assert not set(GOLDEN_PROMPTS) & set(PROMPTS)
    judge = LLMJudge(ScriptedBackend(), name="scripted", cache=False)
    # the judge's own templates keep the version test_prompt_injection.py pins
    assert judge.info().prompts_version == PROMPTS_VERSION == PINNED_PROMPTS_VERSION


def test_replies_are_cached_under_the_template(passages, tmp_path):
    from mlflow_rag_eval.judges.cache import JudgeCache

    cache = JudgeCache(tmp_path / "cache")
    first = LLMJudge(ScriptedBackend(), name="scripted", cache=cache)
    a = generate_golden_set(passages[:12], first, n=6, seed=3)
    again = LLMJudge(ScriptedBackend(), name="scripted", cache=cache)
    b = generate_golden_set(passages[:12], again, n=6, seed=3)
    assert first.calls > 0 and again.calls == 0
    assert a.to_dicts() == b.to_dicts() and a.digest == b.digest


def test_logged_set_and_runs_on_it_share_one_digest(golden, tracking_uri):
    from mlflow.genai.datasets import get_dataset

    logged = log_golden_set(golden, "northwind")
    assert logged.digest == golden.digest and logged.run_id is None  # sqlite holds evaluation datasets
    dataset = get_dataset(dataset_id=logged.dataset_id)
    assert dataset.name == "northwind" and dataset.tags["rag_eval.dataset_digest"] == golden.digest
    assert json.loads(dataset.tags["rag_eval.dropped"]) == golden.report.drop_counts()
    assert mlflow.get_experiment_by_name("tests").experiment_id in dataset.experiment_ids
    records = dataset.to_df()
    assert sorted(records["inputs"].map(lambda x: x["question"])) == sorted(r.question for r in golden.rows)
    by_question = {r.question: r for r in golden.rows}
    for inputs, expectations, tags in zip(records["inputs"], records["expectations"], records["tags"]):
        row = by_question[inputs["question"]]
        assert expectations == {"expected_response": row.reference, "relevant_ids": row.relevant_ids,
                                "answerable": row.answerable}
        assert tags["question_type"] == row.metadata.question_type

    # An evaluation on the set (static answers: the reference, or an abstention) names the digest.
    frame = golden.to_frame()
    frame["answer"] = [r.reference for r in golden.rows]
    frame["contexts"] = [[{"id": pid, "text": "x"} for pid in r.relevant_ids] or [{"id": "p001", "text": "x"}]
                         for r in golden.rows]
    with mlflow.start_run() as eval_run:
        mlflow.models.evaluate(data=frame, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": "scripted", "metrics": ["hit@5"]})
    params = mlflow.MlflowClient().get_run(eval_run.info.run_id).data.params
    assert params["rag_eval.dataset_digest"] == golden.digest


def test_the_same_set_logged_twice_is_one_dataset(golden, passages, tracking_uri):
    """Issue 37: a second `make demo` made a second evaluation dataset of the same name. The
    same set (name and digest) logged again reuses it; another set of that name is a new one."""
    from mlflow.genai.datasets import get_dataset, search_datasets

    experiment_id = mlflow.get_experiment_by_name("tests").experiment_id
    first = log_golden_set(golden, "northwind")
    again = log_golden_set(golden, "northwind")
    assert again.dataset_id == first.dataset_id
    named = [d for d in search_datasets(experiment_ids=[experiment_id], filter_string="name = 'northwind'")]
    assert [d.dataset_id for d in named] == [first.dataset_id]
    assert len(get_dataset(dataset_id=first.dataset_id).to_df()) == len(golden.rows)  # no row merged twice
    other = generate_golden_set(passages, LLMJudge(ScriptedBackend(), name="scripted", cache=False), n=20, seed=1)
    assert other.digest != golden.digest
    assert log_golden_set(other, "northwind").dataset_id != first.dataset_id


def test_genai_evaluate_reads_the_logged_dataset_and_names_its_digest(golden, tracking_uri):
    """mlflow.genai.evaluate on the evaluation dataset as MLflow holds it: our scorers read its
    expectations (expected_response, relevant_ids, answerable) and the run names the digest."""
    from mlflow.genai.datasets import get_dataset

    from mlflow_rag_eval.routes.scorers import rag_scorers

    dataset = get_dataset(dataset_id=log_golden_set(golden, "northwind").dataset_id)
    by_question = {r.question: r for r in golden.rows}

    def predict_fn(question):  # retrieves exactly the graded passages, best first
        ids = sorted(by_question[question].relevant_ids, key=lambda i: -by_question[question].relevant_ids[i])
        return {"answer": "I don't know.", "contexts": [{"id": i, "text": "x"} for i in ids]}

    result = mlflow.genai.evaluate(data=dataset, predict_fn=predict_fn, scorers=rag_scorers(["ndcg@10"]))
    run = mlflow.MlflowClient().get_run(result.run_id)
    assert run.data.params["rag_eval.dataset_digest"] == golden.digest
    assert run.data.metrics["ndcg_at_10/mean"] == 1.0


def test_cli_writes_the_set_and_refuses_a_judge_that_cannot_write(tmp_path):
    out = tmp_path / "golden.jsonl"
    runner = CliRunner()
    result = runner.invoke(main, ["testset", "--corpus", str(CORPUS), "--judge", "scripted", "--n", "12",
                                  "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(rows) <= 12
    assert "question type" in result.output and "digest" in result.output
    # relevant ids as {"id", "grade"} lists, the form MLflow reads in linear time (not {id: grade})
    assert all(isinstance(r["relevant_ids"], list) and all(set(g) == {"id", "grade"} for g in r["relevant_ids"])
               for r in rows)
    digest = result.output.split("digest ")[1].split()[0]
    read = pd.read_json(out, lines=True, dtype=False).assign(contexts=[[] for _ in rows])
    assert dataset_digest(records_from_frame(read, require_answer=False)) == digest  # the file is the set
    refused = runner.invoke(main, ["testset", "--corpus", str(CORPUS), "--judge", "local:minilm-l6",
                                   "--out", str(tmp_path / "x.jsonl")])
    assert refused.exit_code == 2 and "cannot write questions" in refused.output


def test_a_file_store_keeps_a_run_with_the_set_as_input_and_artifact(golden, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 refuses file stores otherwise
    mlflow.set_tracking_uri(f"file://{tmp_path / 'mlruns'}")
    try:
        logged = log_golden_set(golden, "northwind", experiment_id="0")
        client = mlflow.MlflowClient()
        run = client.get_run(logged.run_id)
        rows_file = client.download_artifacts(logged.run_id, "rag_eval/golden_set.jsonl", str(tmp_path))
        report_file = client.download_artifacts(logged.run_id, "rag_eval/golden_set_report.json", str(tmp_path))
    finally:
        mlflow.set_tracking_uri(None)
    assert logged.dataset_id is None
    assert run.data.tags["rag_eval.dataset_digest"] == golden.digest and run.info.status == "FINISHED"
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.digest == golden.digest and dataset_input.dataset.name == "northwind"
    assert run.data.metrics["golden_set/n_rows"] == len(golden.rows)
    assert [json.loads(line) for line in open(rows_file)] == golden.to_records()
    report = json.load(open(report_file))
    assert report["digest"] == golden.digest and len(report["drops"]) == len(golden.report.drops)
