"""Judge panels (judges/providers/panel.py, stats/agreement.py, stats.krippendorff_alpha): scripted members that
disagree in known ways; the aggregate, the agreement and the disagreement rows as computed by hand."""

from __future__ import annotations

import json
import re

import mlflow
import numpy as np
import pandas as pd
import pytest

from mlflow_rag_eval._util.text import split_sentences
from mlflow_rag_eval.evaluation.engine import evaluate_records
from mlflow_rag_eval.judges import get_judge
from mlflow_rag_eval.judges.base import VerifyItem
from mlflow_rag_eval.judges.cache import JudgeCache
from mlflow_rag_eval.judges.llm.chat import PermanentError
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.providers.panel import PanelJudge, parse_panel_members
from mlflow_rag_eval.judges.providers.scripted import ScriptedBackend
from mlflow_rag_eval.metrics.rubric import rubric
from mlflow_rag_eval.records import Context, RagRecord
from mlflow_rag_eval.report import render_report, worst_rows
from mlflow_rag_eval.stats import alpha_ci, krippendorff_alpha, resample_indices

T, F = True, False


# -- scripted members ---------------------------------------------------------------------------
def _says(letter: str, text: str) -> bool:
    """Member ``letter`` says yes to a text whose last word holds its letter ("claim AB." -> A, B)."""
    words = text.rstrip(".?! ").split()
    return bool(words) and letter in words[-1]


def member(letter: str, *, fails_on: str | None = None, cache=False) -> LLMJudge:
    """A scripted judge that says yes where the last word holds ``letter``, and fails (a
    permanent provider error) on any text holding ``fails_on``."""

    def broken(*texts):
        return fails_on is not None and any(fails_on in t for t in texts)

    def claims_verdicts(v):
        claims = split_sentences(v["text"])
        if broken(v["text"]):
            return PermanentError("BadRequest", f"member {letter} is down")
        return {"claims": [{"claim": c, "supported": _says(letter, c), "reason": f"rule {letter}"} for c in claims]}

    def verify(v):
        if broken(*v["claims"]):
            return PermanentError("BadRequest", f"member {letter} is down")
        return {"verdicts": [{"index": i, "verdict": _says(letter, c), "reason": f"rule {letter}"}
                             for i, c in enumerate(v["claims"])]}

    def rate_relevance(v):
        if broken(v["question"]):
            return PermanentError("BadRequest", f"member {letter} is down")
        return {"verdicts": [{"index": i, "verdict": _says(letter, p), "reason": f"rule {letter}"}
                             for i, p in enumerate(v["passages"])]}

    def is_abstention(v):
        return {"abstains": _says(letter, v["answer"]), "reason": f"rule {letter}"}

    def grade(v):  # the answer ends in e.g. "A5B2C4": member A grades 5
        found = re.search(rf"{letter}(\d)", v["fields"]["answer"])
        return {"steps": ["read"], "score": int(found.group(1)), "reason": f"rule {letter}"}

    script = {"claims_verdicts": claims_verdicts, "verify": verify, "rate_relevance": rate_relevance,
              "is_abstention": is_abstention, "grade": grade}
    return LLMJudge(ScriptedBackend(script, model=f"juror-{letter.lower()}"), cache=cache, max_retries=0)


def panel(*letters: str, **failing: str) -> PanelJudge:
    return PanelJudge([member(x, fails_on=failing.get(x)) for x in letters])


def record(answer: str, question: str = "q?", contexts=(), **kw) -> RagRecord:
    return RagRecord(question=question, answer=answer,
                     contexts=[Context(id=f"c{i}", text=t) for i, t in enumerate(contexts)], **kw)


# Four answers, three members. Votes per claim (A, B, C), as _says decides them:
#   row 0: "First claim ABC." (T,T,T)   "Second claim AB." (T,T,F)
#   row 1: "Only claim A."    (T,F,F)
#   row 2: "One BC."          (F,T,T)   "Two C."           (F,F,T)
#   row 3: "Four ABC."        (T,T,T)
ANSWERS = ["First claim ABC. Second claim AB.", "Only claim A.", "One BC. Two C.", "Four ABC."]
VOTES = [[(T, T, T), (T, T, F)], [(T, F, F)], [(F, T, T), (F, F, T)], [(T, T, T)]]


@pytest.fixture
def faithfulness_run():
    return evaluate_records([record(a) for a in ANSWERS], ["faithfulness"], panel("A", "B", "C"))


# -- Krippendorff's alpha ------------------------------------------------------------------------
def test_alpha_by_hand_three_raters_four_items():
    # Nominal alpha = 1 - (n - 1) * sum_u W_u / (m_u - 1) / (n^2 - sum_c n_c^2), W_u the ordered
    # pairs of votes in unit u that differ. Units: TTT, TTF, FFF, TFF; n = 12 votes, 6 T and 6 F;
    # W = 0, 2*2*1, 0, 2*1*2 (split 2-1: 4 ordered pairs differ), each over m - 1 = 2.
    units = [[T, T, T], [T, T, F], [F, F, F], [T, F, F]]
    observed = (0 + 4 + 0 + 4) / 2
    expected = 12**2 - 6**2 - 6**2
    assert krippendorff_alpha(units) == pytest.approx(1 - 11 * observed / expected)  # 7/18
    assert krippendorff_alpha(units) == pytest.approx(7 / 18)


def test_alpha_counts_decisions_with_a_missing_vote_and_drops_lone_votes():
    # (T, None, T) is a unit of 2; (None, F, None) pairs with nothing and is left out.
    units = [[T, None, T], [T, F, F], [None, F, None]]
    # n = 5 votes (T, T, T, F, F); W = 0 and 4 over m - 1 = 1 and 2
    assert krippendorff_alpha(units) == pytest.approx(1 - 4 * (0 + 4 / 2) / (25 - 9 - 4))


def test_interval_alpha_by_hand():
    # interval distance (a - b)^2: units (1, 2) and (3, 3.5); n = 4
    # within: 2*(1)^2 / 1 + 2*(0.5)^2 / 1 = 2.5; pooled: 2 * sum over pairs i<j of (x_i - x_j)^2
    pooled = 2 * ((1 - 2) ** 2 + (1 - 3) ** 2 + (1 - 3.5) ** 2 + (2 - 3) ** 2 + (2 - 3.5) ** 2 + (3 - 3.5) ** 2)
    assert krippendorff_alpha([[1.0, 2.0], [3.0, 3.5]], "interval") == pytest.approx(1 - 3 * 2.5 / pooled)


def test_alpha_is_none_when_undefined_never_nan():
    assert krippendorff_alpha([[T, T], [T, T, T]]) is None  # no variation at all
    assert krippendorff_alpha([[T], [F]]) is None  # no unit with two votes
    assert krippendorff_alpha([]) is None
    assert alpha_ci([[[T, T]], [[T, T]]]) == (None, None)
    with pytest.raises(ValueError, match="level"):
        krippendorff_alpha([[1, 2]], "ordinal")


def test_alpha_agrees_with_fleiss_kappa_from_statsmodels():
    """An independent implementation: with every rater on every item, nominal alpha is
    1 - (1 - kappa) * (n - 1) / n for n votes in all (Fleiss' kappa)."""
    inter_rater = pytest.importorskip("statsmodels.stats.inter_rater")
    for seed, shape, k in [(1, (30, 4), 2), (2, (50, 3), 3), (3, (12, 5), 2)]:
        data = np.random.default_rng(seed).integers(0, k, shape)
        kappa = inter_rater.fleiss_kappa(inter_rater.aggregate_raters(data)[0])
        n = data.size
        assert krippendorff_alpha(data.tolist()) == pytest.approx(1 - (1 - kappa) * (n - 1) / n, abs=1e-12)


def test_alpha_ci_resamples_rows_seeded():
    groups = [[[T, T, F], [T, T, T]], [[F, F, F]], [[T, F, F]], [[T, T, T], [F, T, F]], [[F, F, T]]]
    alpha, ci = alpha_ci(groups)
    assert alpha == pytest.approx(krippendorff_alpha([u for g in groups for u in g]))
    assert ci is not None and ci[0] < alpha < ci[1]
    assert alpha_ci(groups) == (alpha, ci)  # seeded
    # the same as resampling rows one by one, alpha over each resample's decisions, and the
    # 2.5% and 97.5% quantiles of the defined ones
    draws = [krippendorff_alpha([u for i in idx for u in groups[i]]) for idx in resample_indices(len(groups), 1000)]
    assert ci == pytest.approx(tuple(np.quantile([a for a in draws if a is not None], [0.025, 0.975])))


# -- names ---------------------------------------------------------------------------------------
def test_panel_names_split_on_top_level_commas():
    assert parse_panel_members("panel:scripted,local:minilm-l6,openai:/m?base_url=http%3A//h%2Cx") == [
        "scripted", "local:minilm-l6", "openai:/m?base_url=http%3A//h%2Cx"]
    for bad in ("panel:", "panel:scripted,,scripted", "panel:scripted,"):
        with pytest.raises(ValueError, match="empty member"):
            parse_panel_members(bad)
    with pytest.raises(ValueError, match="do not nest"):
        get_judge("panel:scripted,panel:scripted")


def test_every_way_of_naming_a_panel_builds_the_same_judge():
    by_name = get_judge("panel:scripted,scripted?")
    by_list = get_judge(["scripted", "scripted"])
    by_members = get_judge("panel", members=["scripted", "scripted"])
    assert isinstance(by_name, PanelJudge) and isinstance(by_list, PanelJudge) and isinstance(by_members, PanelJudge)
    assert by_name.info().name == by_list.info().name == "panel:scripted,scripted"
    assert by_name.info().fingerprint == by_list.info().fingerprint == by_members.info().fingerprint
    with pytest.raises(ValueError, match="at least 2 members"):
        get_judge(["scripted"])


def test_fingerprint_changes_with_any_member_and_with_their_order():
    a, b, c = member("A"), member("B"), member("C")
    base = PanelJudge([a, b, c]).info()
    assert PanelJudge([a, b, member("C")]).info().fingerprint != base.fingerprint  # another script
    assert PanelJudge([b, a, c]).info().fingerprint != base.fingerprint  # another extractor
    assert PanelJudge([a, b, c]).info().fingerprint == base.fingerprint
    assert [m.name for m in base.members] == ["scripted:/juror-a", "scripted:/juror-b", "scripted:/juror-c"]
    assert [m.fingerprint for m in base.members] == [j.info().fingerprint for j in (a, b, c)]


# -- aggregation ---------------------------------------------------------------------------------
def test_majority_per_claim_and_the_members_votes_on_each(faithfulness_run):
    (m,) = faithfulness_run.metrics
    # majority per claim: row 0 T,T; row 1 F; row 2 T,F; row 3 T
    assert [r.value for r in m.rows] == [2 / 2, 0 / 1, 1 / 2, 1 / 1]
    assert [[tuple(c["votes"]) for c in r.details["claims"]] for r in m.rows] == VOTES
    assert m.rows[0].details["claims"][1]["reason"].startswith("2 of 3 members say yes")
    assert m.rows[1].details["claims"][0]["reason"].startswith("2 of 3 members say no")


def test_agreement_and_disagreement_rows_as_computed_by_hand(faithfulness_run):
    (m,) = faithfulness_run.metrics
    # units TTT, TTF, TFF, FTT, FFT, TTT: n = 18 votes, 12 T and 6 F; the four 2-1 splits have
    # 4 differing ordered pairs each, over m - 1 = 2
    alpha = 1 - (18 - 1) * (4 * 4 / 2) / (18**2 - 12**2 - 6**2)  # = 1/18
    agreement = m.agreement
    assert agreement.level == "nominal" and agreement.n_decisions == 6 and agreement.n_rows == 4
    assert agreement.alpha == pytest.approx(alpha)
    assert agreement.alpha == pytest.approx(krippendorff_alpha([u for row in VOTES for u in row]))
    assert (agreement.ci_low, agreement.ci_high) == pytest.approx(
        alpha_ci([[list(u) for u in row] for row in VOTES])[1])
    metrics = faithfulness_run.aggregates()
    assert metrics["faithfulness/panel_alpha"] == pytest.approx(alpha)
    assert metrics["faithfulness/panel_alpha_ci_low"] == agreement.ci_low
    assert metrics["faithfulness/panel_alpha_ci_high"] == agreement.ci_high

    # disagreement of a row: mean over its claims of the share not with the most common vote:
    # row 0 (0 + 1/3) / 2, row 1 1/3, row 2 (1/3 + 1/3) / 2, row 3 0. Of 4 rows, the top
    # ceil(0.1 * 4) = 1, and every row tied with it: rows 1 and 2.
    worst = worst_rows(faithfulness_run)["metrics"]["faithfulness"]
    assert worst["panel"]["members"] == ["scripted:/juror-a", "scripted:/juror-b", "scripted:/juror-c"]
    assert worst["panel"]["krippendorff_alpha"] == pytest.approx(alpha)
    assert [(d["row"], d["disagreement"]) for d in worst["disagreements"]] == [(1, pytest.approx(1 / 3)),
                                                                              (2, pytest.approx(1 / 3))]
    assert [[(c["claim"], c["votes"]) for c in d["decisions"]] for d in worst["disagreements"]] == [
        [("Only claim A.", [T, F, F])], [("One BC.", [F, T, T]), ("Two C.", [F, F, T])]]
    everything = worst_rows(faithfulness_run, fraction=1.0)["metrics"]["faithfulness"]["disagreements"]
    assert [(d["row"], d["disagreement"]) for d in everything] == [
        (1, pytest.approx(1 / 3)), (2, pytest.approx(1 / 3)), (0, pytest.approx(1 / 6))]  # row 3 agrees


def test_a_tie_is_a_named_failure_with_the_votes_kept():
    result = evaluate_records([record("Split claim A."), record("Agreed AB.")], ["faithfulness"], panel("A", "B"))
    tie, agreed = result.metrics[0].rows
    assert tie.error_kind == "PanelTie" and tie.value is None
    assert "claim 1: scripted:/juror-a yes, scripted:/juror-b no" in tie.error
    assert tie.details["panel_votes"] == [{"claim": "Split claim A.", "votes": [T, F], "decided": False}]
    assert agreed.value == 1.0
    # the tied row counts in the agreement: units (T, F) and (T, T); n = 4, 3 T and 1 F
    assert result.metrics[0].agreement.alpha == pytest.approx(1 - 3 * (2 / 1) / (16 - 9 - 1))
    worst = worst_rows(result)["metrics"]["faithfulness"]
    assert [(d["row"], d["error"].split(":")[0]) for d in worst["disagreements"]] == [(0, "PanelTie")]


def test_failed_members_majority_of_the_whole_panel():
    judge = panel("A", "B", "C", B="Cracked", C="Broken")
    result = evaluate_records(
        [record("Broken AB."), record("Broken A."), record("Cracked Broken A."), record("Fine AC.")],
        ["faithfulness"], judge)
    decided, tie, lone, fine = result.metrics[0].rows
    # C failed, A and B say yes: 2 of 3 is a majority of the panel, and the reason says C failed
    assert decided.value == 1.0
    assert decided.details["claims"][0]["votes"] == (T, T, None)
    assert "2 of 3 members say yes; scripted:/juror-c failed (BadRequest)" in decided.details["claims"][0]["reason"]
    assert tie.error_kind == "PanelTie"  # A yes, B no, C failed
    assert lone.error_kind == "PanelNoMajority"  # A alone: 1 of 3 is no majority
    assert lone.details["panel_votes"][0]["votes"] == [T, None, None]
    assert fine.value == 1.0 and fine.details["claims"][0]["votes"] == (T, F, T)


def test_every_member_failing_is_a_named_failure_listing_them():
    judge = panel("A", "B", A="doomed", B="doomed")
    result = evaluate_records([record("x", question="doomed?", contexts=["p AB."]),
                               record("x", question="fine?", contexts=["p A.", "q AB."])],
                              ["context_precision"], judge)
    failed, fine = result.metrics[0].rows
    assert failed.error_kind == "PanelFailure"
    assert "every member failed: scripted:/juror-a: BadRequest" in failed.error and "scripted:/juror-b" in failed.error
    assert fine.error_kind == "PanelTie"  # passage 1: A yes, B no


def test_the_first_member_extracts_the_claims_the_others_verify():
    judge = panel("A", "B", "C")
    evaluate_records([record("One AB. Two C.")], ["faithfulness"], judge)
    a, b, c = (m.backend.requests for m in judge.members)
    assert [r.template_id for r in a] == ["claims_verdicts"]
    assert [r.template_id for r in b] == [r.template_id for r in c] == ["verify"]
    assert b[0].variables["claims"] == c[0].variables["claims"] == ["One AB.", "Two C."]


def test_abstention_verdicts_and_rubric_scores():
    judge = panel("A", "B", "C")
    rows = [record("I think AB", answerable=False), record("Sure C", answerable=False)]
    result = evaluate_records(rows, ["abstention"], judge)
    assert [r.value for r in result.metrics[0].rows] == [1.0, 0.0]
    assert [r.details["votes"] for r in result.metrics[0].rows] == [[T, T, F], [F, F, T]]

    scale = rubric("clarity", "clear?", ["read"], low=1, high=5, fields=("answer",))
    graded = evaluate_records([record("ok A5B3C4"), record("ok A1B1C2")], [scale], judge).metrics[0]
    # mean of the members' normalised grades (g - 1) / 4
    assert [r.value for r in graded.rows] == pytest.approx([(4 + 2 + 3) / 12, (0 + 0 + 1) / 12])
    assert graded.rows[0].details["votes"] == pytest.approx([1.0, 0.5, 0.75])
    assert graded.agreement.level == "interval"
    assert graded.agreement.alpha == pytest.approx(krippendorff_alpha(
        [[1.0, 0.5, 0.75], [0.0, 0.0, 0.25]], "interval"))


def test_similarity_is_the_mean_of_the_members():
    class Fixed(LLMJudge):
        def __init__(self, value, model):
            super().__init__(ScriptedBackend(model=model), cache=False)
            self.value = value

        def similarity(self, pairs):
            return [self.value for _ in pairs]

    judge = PanelJudge([Fixed(0.2, "s1"), Fixed(0.5, "s2"), Fixed(0.8, "s3")])
    (score,) = judge.similarity([("a", "b")])
    assert score == pytest.approx((0.2 + 0.5 + 0.8) / 3) and score.votes == (0.2, 0.5, 0.8)


def test_members_share_one_cache_without_sharing_answers(tmp_path):
    """One cache for every member: the key holds the model, so each member finds its own
    replies (the votes still differ member by member) and a second pass calls no provider."""
    cache = JudgeCache(tmp_path / "cache.sqlite")
    judge = PanelJudge([member(x, cache=cache) for x in ("A", "B", "C")])
    rows = [record(a) for a in ANSWERS]
    before = evaluate_records(rows, ["faithfulness"], judge)
    calls = judge.usage()["provider_calls"]
    after = evaluate_records(rows, ["faithfulness"], judge)
    assert [[tuple(c["votes"]) for c in r.details["claims"]] for r in after.metrics[0].rows] == VOTES
    assert [r.details for r in after.metrics[0].rows] == [r.details for r in before.metrics[0].rows]
    usage = judge.usage()
    assert usage["provider_calls"] == calls == 4 + 4 + 4  # one call per row and member
    assert usage["cache_hits"] == calls


def test_usage_is_summed_over_members(faithfulness_run):
    judge = panel("A", "B")
    evaluate_records([record(a) for a in ANSWERS], ["faithfulness"], judge)
    usage = judge.usage()
    assert usage["provider_calls"] == sum(m.usage()["provider_calls"] for m in judge.members) == 8
    assert usage["templates"] == {"claims_verdicts@v1": 4, "verify@v1": 4}
    assert [m["name"] for m in usage["members"]] == ["scripted:/juror-a", "scripted:/juror-b"]


# -- on a run --------------------------------------------------------------------------------------
def test_lineage_agreement_and_disagreements_on_an_mlflow_run(tracking_uri):
    judge = panel("A", "B", "C")
    df = pd.DataFrame({"question": ["q?"] * 4, "answer": ANSWERS, "contexts": [["ctx"]] * 4})
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(data=df, model_type="rag", evaluators="rag",
                                        evaluator_config={"judge": judge, "metrics": ["faithfulness"]})
    run_id = run.info.run_id
    alpha = 1 - 17 * 8 / 144
    data = mlflow.MlflowClient().get_run(run_id).data
    # The agreement describes the judge: in the lineage (below) and the report, not a run metric
    # (run_metrics="all" logs it as one, as runs did before).
    assert "faithfulness/mean" in result.metrics and not any("panel" in k for k in data.metrics)
    with mlflow.start_run() as every:
        mlflow.models.evaluate(data=df, model_type="rag", evaluators="rag",
                               evaluator_config={"judge": judge, "metrics": ["faithfulness"], "run_metrics": "all"})
    logged = mlflow.MlflowClient().get_run(every.info.run_id).data.metrics
    assert logged["faithfulness/panel_alpha"] == pytest.approx(alpha)
    assert {"faithfulness/panel_alpha_ci_low", "faithfulness/panel_alpha_ci_high"} <= set(logged)
    names = ["scripted:/juror-a", "scripted:/juror-b", "scripted:/juror-c"]
    assert data.params["rag_eval.judge"] == "panel:" + ",".join(names)
    assert json.loads(data.params["rag_eval.judge.members"]) == names
    assert json.loads(data.params["rag_eval.judge.member_fingerprints"]) == [m.info().fingerprint
                                                                             for m in judge.members]

    def artifact(path):
        return mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)

    lineage = json.load(open(artifact("rag_eval/judge_lineage.json")))
    assert [m["name"] for m in lineage["judge"]["members"]] == names
    assert [m["fingerprint"] for m in lineage["judge"]["members"]] == [m.info().fingerprint for m in judge.members]
    assert lineage["judge"]["fingerprint"] == data.params["rag_eval.judge_fingerprint"]
    assert lineage["panel_agreement"]["faithfulness"]["krippendorff_alpha"] == pytest.approx(alpha)
    worst = json.load(open(artifact("rag_eval/worst_rows.json")))
    assert [d["row"] for d in worst["metrics"]["faithfulness"]["disagreements"]] == [1, 2]
    page = open(artifact("rag_eval/report.html")).read()
    assert "Judge panel" in page and "Only claim A." in page and "scripted:/juror-c" in page


def test_report_without_a_panel_has_no_panel_section():
    result = evaluate_records([record("One claim.", contexts=["One claim."])], ["faithfulness"], "scripted")
    assert result.metrics[0].agreement is None
    assert not any("panel" in k for k in result.aggregates())
    worst = worst_rows(result)
    assert "disagreements" not in worst["metrics"]["faithfulness"]
    from mlflow_rag_eval.tracking.run_logging import lineage

    doc = lineage(result)
    assert "panel_agreement" not in doc and "members" not in doc["judge"]
    assert 'id="panel"' not in render_report(result, doc)


def test_verify_directly_returns_verdicts_with_votes():
    judge = panel("A", "B", "C")
    (verdicts,) = judge.verify([VerifyItem(["p"], ["x AB.", "y C."])])
    assert [(v.value, v.votes) for v in verdicts] == [(T, (T, T, F)), (F, (F, F, T))]


def test_genai_scorers_log_the_same_agreement_and_members(tracking_uri):
    """The genai route (``mlflow.genai.evaluate`` with our scorers) logs what the evaluator
    plugin logs for the same rows: the panel's alpha and its members."""
    from mlflow_rag_eval.routes.scorers import rag_scorers

    judge = panel("A", "B", "C")
    rows = [{"inputs": {"question": "q?"}, "outputs": {"answer": a, "contexts": ["ctx"]}} for a in ANSWERS]
    result = mlflow.genai.evaluate(data=rows, scorers=rag_scorers(["faithfulness"], judge))
    data = mlflow.MlflowClient().get_run(result.run_id).data
    lineage = json.loads(mlflow.artifacts.load_text(f"runs:/{result.run_id}/rag_eval/judge_lineage.json"))
    alpha = lineage["panel_agreement"]["faithfulness"]["krippendorff_alpha"]
    assert alpha == pytest.approx(1 - 17 * 8 / 144)  # 1/18, as by hand above
    assert json.loads(data.params["rag_eval.judge.members"]) == [m.info().name for m in judge.members]
