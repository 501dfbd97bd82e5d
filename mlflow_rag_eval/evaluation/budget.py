"""What an evaluation will cost before it asks a judge anything, and the cap that stops it.

One estimate for every route (the ``rag`` evaluator, ``evaluate --data``, ``evaluate
--traces``): per metric and row, the LLM calls its judge primitives make, the prompt tokens of
the very templates the judge renders (:mod:`mlflow_rag_eval.judges.prompts`, filled with the
row's own texts, the output schema included), a guess of the reply tokens, and their price from
the shipped price table (:func:`~mlflow_rag_eval.judges.llm.usage.load_price_table`). Tokens are
counted as OpenAI's rule of thumb counts them, one per four characters: no tokenizer is loaded
for an estimate. The local judge and the in-process backends (``scripted``, ``llamacpp``) call
no paid provider and cost 0.

It is an upper bound of what the run asks for, not of what it pays: replies already in the
judge cache cost nothing, and retries (a transient error, a reply that did not parse) cost
more. Metrics of other libraries (``ragas:``, ``deepeval:``) render their own prompts: they are
named as not estimated, never counted as free.

The cap holds call by call (:class:`Budget`, whose ledger is
:class:`~mlflow_rag_eval.judges.llm.spend.CostLedger`): while a run is scored its judges are
metered, so each provider call reserves what it may cost before it is sent and settles with
its usage; a call that does not fit is refused (``BudgetExhausted``: the row's error, never a
score) and the budget is stopped, with the reason. Between batches (or traces) a share whose
estimate does not fit is not started: its rows are left unscored.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlflow_rag_eval._util.summary_log import say
from mlflow_rag_eval._util.text import split_sentences
from mlflow_rag_eval.judges import Judge
from mlflow_rag_eval.judges.llm.judge import LLMJudge
from mlflow_rag_eval.judges.llm.spend import (
    IN_PROCESS_PROVIDERS,
    BudgetExhausted,
    CostLedger,
    prompt_tokens,
    reply_tokens,
)
from mlflow_rag_eval.judges.llm.usage import load_price_table
from mlflow_rag_eval.judges.prompts import PROMPTS, data_block, passages_block, render
from mlflow_rag_eval.metrics import Metric
from mlflow_rag_eval.records import RagRecord

__all__ = ["Budget", "BudgetExceeded", "BudgetExhausted", "Estimate", "check_max_cost", "estimate_cost",
           "llm_judges"]


class BudgetExceeded(ValueError):
    """An evaluation whose estimated cost is above its ``max_cost``: refused before any judge
    call (a ValueError: the configuration asks for more than it allows)."""


def check_max_cost(value: Any, where: str = "max_cost") -> float | None:
    """``value`` as a cap in US dollars (None: no cap); refused unless a number >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a number of US dollars >= 0, got {value!r}")
    return float(value)


def _prompt_tokens(template_id: str, **blocks: str) -> int:
    """The prompt tokens of ``template_id`` filled with ``blocks``, counted as each call counts
    them (:func:`~mlflow_rag_eval.judges.llm.spend.prompt_tokens`)."""
    template = PROMPTS[template_id]
    # Unused placeholders of a template are filled with "" (str.format ignores extra keys).
    return prompt_tokens(render(template, **blocks), template.json_schema)


_reply_tokens = reply_tokens


def _claims_calls(text: str, passages: Sequence[str], fuse: bool) -> list[tuple[int, int]]:
    """(prompt, reply) tokens of extracting ``text``'s claims and verifying them."""
    claims = max(len(split_sentences(text)), 1)
    if fuse:
        return [(_prompt_tokens("claims_verdicts", text=data_block("text", text), passages=passages_block(
            list(passages))), _reply_tokens("claims_verdicts", claims))]
    return [(_prompt_tokens("extract_claims", text=data_block("text", text)), _reply_tokens("extract_claims", claims)),
            (_prompt_tokens("verify", claims=data_block("claim", text), passages=passages_block(list(passages))),
             _reply_tokens("verify", claims))]


def _rate_call(question: str, passages: Sequence[str], reference: str | None) -> tuple[int, int]:
    blocks = {"question": data_block("question", question),
              "reference": data_block("reference", reference) if reference else "",
              "reference_clause": "", "passages": passages_block(list(passages))}
    return _prompt_tokens("rate_relevance", **blocks), _reply_tokens("rate_relevance", len(passages))


def _qa_block(record: RagRecord) -> dict[str, str]:
    return {"question": data_block("question", record.question), "answer": data_block("answer", record.answer)}


def _sentences(passages: Sequence[str]) -> list[str]:
    return [s for p in passages for s in (split_sentences(p) or ([p] if p.strip() else []))]


def _row_calls(metric: Metric, record: RagRecord, fuse: bool) -> list[tuple[int, int]] | None:
    """The (prompt, reply) tokens of each call ``metric`` makes on ``record``; None when this
    module cannot tell (another library's metric, a primitive it does not know)."""
    name, passages = metric.name, record.context_texts
    if name == "faithfulness":
        return _claims_calls(record.answer, passages, fuse)
    if name == "context_recall":
        return _claims_calls(record.reference or "", passages, fuse)
    if name == "answer_correctness":
        return (_claims_calls(record.answer, [record.reference or ""], fuse)
                + _claims_calls(record.reference or "", [record.answer], fuse))
    if name == "context_relevance":
        sentences = _sentences(passages)
        return [_rate_call(record.question, sentences, None)] if sentences else []
    if name == "context_precision":
        return [_rate_call(record.question, passages, record.reference or record.answer)] if passages else []
    if name == "answer_relevancy":
        n = getattr(metric, "n_questions", 3)
        return [(_prompt_tokens("generate_questions", answer=data_block("answer", record.answer), n=str(n)),
                 _reply_tokens("generate_questions", n))]
    if name in ("abstention", "false_abstention"):
        return [(_prompt_tokens("is_abstention", **_qa_block(record)), _reply_tokens("is_abstention", 0))]
    if name == "citation_support":
        claims = len(split_sentences(record.answer))
        return [(_prompt_tokens("verify", claims=data_block("claim", record.answer),
                                passages=passages_block(passages)), _reply_tokens("verify", claims))]
    if not metric.primitives:
        return []
    if metric.primitives == ("grade",):
        steps = len(getattr(metric, "steps", ()) or ())
        fields = "\n".join(data_block(k, v) for k, v in {"question": record.question, "answer": record.answer}.items())
        blocks = {"criteria": str(getattr(metric, "criteria", "")), "steps": "\n".join(getattr(metric, "steps", ())),
                  "low": "1", "high": "5", "fields": fields}
        return [(_prompt_tokens("grade", **blocks), _reply_tokens("grade", steps))]
    return None


def _llm_judges(judge: Judge | None) -> list[LLMJudge]:
    """The LLM judges that will be asked: the judge itself, or a panel's LLM members."""
    if judge is None:
        return []
    if isinstance(judge, LLMJudge):
        return [judge]
    return [j for member in getattr(judge, "members", ()) for j in _llm_judges(member)]


def _price(judge: LLMJudge, prices: dict[str, Any]) -> tuple[float, float] | None:
    """USD per million (input, output) tokens; (0, 0) in process; None when the table lacks it."""
    if judge.backend.provider in IN_PROCESS_PROVIDERS:
        return 0.0, 0.0
    price = prices.get("models", {}).get(judge.backend.model)
    return (float(price["input"]), float(price["output"])) if price else None


@dataclass
class Estimate:
    """What an evaluation will ask its LLM judges for, at most, before any call."""

    judge: str
    rows: int
    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    #: US dollars; None when an LLM judge's model has no price in the table
    cost_usd: float | None = 0.0
    #: metric -> calls
    calls_by_metric: dict[str, int] = field(default_factory=dict)
    #: metrics whose calls this module cannot count (other libraries' prompts)
    not_estimated: list[str] = field(default_factory=list)
    #: LLM models without a price in the table
    unpriced: list[str] = field(default_factory=list)
    #: the estimated cost of each row, in row order (what the budget checks batch by batch)
    row_costs: list[float] = field(default_factory=list, repr=False)
    prices_as_of: str | None = None

    def to_text(self) -> str:
        """One line: calls, tokens and cost, and what the estimate could not count."""
        if not self.calls and not self.not_estimated:
            return f"rag eval budget: {self.rows} rows, judge {self.judge}: no paid LLM call (cost $0)"
        cost = "unknown cost" if self.cost_usd is None else f"about ${self.cost_usd:.4f}"
        text = (f"rag eval budget: {self.rows} rows, judge {self.judge}: at most {self.calls} LLM calls, "
                f"~{self.tokens_in} prompt + ~{self.tokens_out} reply tokens, {cost}")
        if self.prices_as_of and self.cost_usd:
            text += f" (list prices of {self.prices_as_of}; cached replies cost nothing)"
        if self.calls_by_metric:
            text += " [" + ", ".join(f"{k} {v}" for k, v in self.calls_by_metric.items() if v) + "]"
        if self.unpriced:
            text += f"; no price for {', '.join(self.unpriced)} in the price table"
        if self.not_estimated:
            text += f"; not estimated (their library's prompts): {', '.join(self.not_estimated)}"
        return text

    def as_params(self) -> dict[str, str]:
        """The estimate as run params, beside what the judge then spent (in the lineage)."""
        return {"rag_eval.budget.estimated_calls": str(self.calls),
                "rag_eval.budget.estimated_tokens": str(self.tokens_in + self.tokens_out),
                "rag_eval.budget.estimated_cost_usd": "unknown" if self.cost_usd is None else f"{self.cost_usd:.6f}"}


def estimate_cost(metrics: Sequence[Metric], records: Sequence[RagRecord], judge: Judge | None, *,
                  done: Sequence[Collection[str]] | None = None) -> Estimate:
    """The estimate of scoring ``records`` with ``metrics`` (checked already) on ``judge``;
    ``done``: per record, the metrics (display names) it will not be scored by (scored before)."""
    llms = _llm_judges(judge)
    prices = load_price_table()
    name = judge.info().name if judge is not None else "none"
    out = Estimate(judge=name, rows=len(records), prices_as_of=prices.get("as_of"))
    rates = [_price(j, prices) for j in llms]
    out.unpriced = sorted({j.backend.model for j, rate in zip(llms, rates) if rate is None})
    if not llms:
        out.row_costs = [0.0] * len(records)
        return out
    judged = [m for m in metrics if m.primitives]
    out.not_estimated = [m.display_name for m in judged if m.name not in _KNOWN and m.primitives != ("grade",)]
    per_token_in = sum(r[0] for r in rates if r) / 1e6
    per_token_out = sum(r[1] for r in rates if r) / 1e6
    for i, record in enumerate(records):
        row_cost = 0.0
        for metric in judged:
            if metric.not_applicable(record) is not None or (done is not None and metric.display_name in done[i]):
                continue
            calls = _row_calls(metric, record, all(j.settings.fuse for j in llms))
            for tokens_in, tokens_out in calls or ():
                out.calls += len(llms)
                out.tokens_in += tokens_in * len(llms)
                out.tokens_out += tokens_out * len(llms)
                row_cost += tokens_in * per_token_in + tokens_out * per_token_out
            out.calls_by_metric[metric.display_name] = (out.calls_by_metric.get(metric.display_name, 0)
                                                        + len(calls or ()) * len(llms))
        out.row_costs.append(row_cost)
    out.cost_usd = None if out.unpriced else round(sum(out.row_costs), 6)
    return out


_KNOWN = frozenset({"faithfulness", "context_recall", "answer_correctness", "context_relevance", "context_precision",
                    "answer_relevancy", "abstention", "false_abstention", "citation_support"})


llm_judges = _llm_judges


@dataclass
class Budget:
    """An evaluation's cap in US dollars (None: no cap, the estimate is still printed) and what
    became of it: the estimate, what was spent, and why scoring stopped, if it did.

    A route makes one, checks the estimate (:meth:`check`), scores within :meth:`metering`
    (each judge call reserves and settles on the budget's ledger, the cap checked call by call)
    and between shares of rows asks :meth:`allows`, then logs :meth:`run_tags` on the run, so a
    stopped run says so."""

    max_cost: float | None = None
    estimate: Estimate | None = None
    #: rows (or traces) left unscored because of the cap
    rows_not_scored: int = 0
    _judge: Judge | None = field(default=None, repr=False)
    _stopped: str | None = field(default=None, repr=False)
    ledger: CostLedger = field(init=False, repr=False)

    def __post_init__(self):
        self.max_cost = check_max_cost(self.max_cost)
        self.ledger = CostLedger(self.max_cost)

    def check(self, estimate: Estimate, *, announce: bool = True, judge: Judge | None = None) -> None:
        """Print ``estimate`` on stderr and refuse it (:class:`BudgetExceeded`) when it is above
        the cap, or when the cap cannot be checked (a model without a price, a metric not
        estimated). ``judge`` is the one :meth:`metering` meters by default."""
        self.estimate, self._judge = estimate, judge
        if announce:
            say(estimate.to_text())
        if self.max_cost is None or (not estimate.calls and not estimate.not_estimated):
            return
        if estimate.cost_usd is None or estimate.not_estimated:
            what = (f"no price for {', '.join(estimate.unpriced)} in the price table" if estimate.cost_usd is None
                    else f"the calls of {', '.join(estimate.not_estimated)} cannot be estimated")
            raise BudgetExceeded(f"max_cost=${self.max_cost:g} cannot be checked before the run: {what}; "
                                 "drop max_cost or those metrics")
        if estimate.cost_usd > self.max_cost:
            raise BudgetExceeded(f"the estimated cost ${estimate.cost_usd:.4f} ({estimate.calls} LLM calls, "
                                 f"~{estimate.tokens_in + estimate.tokens_out} tokens) is above max_cost="
                                 f"${self.max_cost:g}; nothing was judged: raise max_cost, sample fewer rows "
                                 "or name fewer metrics")

    @contextlib.contextmanager
    def metering(self, judge: Judge | None = None) -> Iterator[None]:
        """Within it, every provider call of ``judge``'s LLMs (a panel's members; by default the
        judge given to :meth:`check`) reserves what it may cost on this budget's ledger before
        it is sent, is refused once that would pass the cap, and settles with its usage."""
        with contextlib.ExitStack() as stack:
            for llm in _llm_judges(judge if judge is not None else self._judge):
                stack.enter_context(llm.metered(self.ledger))
            yield

    @property
    def stopped(self) -> str | None:
        """Why scoring stopped before the end (None: it did not): a call the cap refused, or a
        share of rows whose estimate no longer fitted."""
        return self._stopped or self.ledger.stopped

    @property
    def spent(self) -> float:
        """US dollars the metered judge calls cost: what their replies' usage says, and each
        reply that said no usage charged at its call's estimate (never at 0)."""
        return self.ledger.spent

    def allows(self, next_cost: float, rows_left: int) -> bool:
        """Whether the next share of work (estimated at ``next_cost``, scaled by how much dearer
        than estimated the calls so far were) may start; once not, the budget is stopped, with
        the reason and the ``rows_left`` it leaves unscored."""
        if self.stopped is not None:
            self.rows_not_scored = max(self.rows_not_scored, rows_left)
            return False
        if self.ledger.fits(next_cost):
            return True
        self._stopped = (f"max_cost=${self.max_cost:g} reached: ${self.spent:.4f} spent, the next rows were "
                         f"estimated at ${next_cost * self.ledger.dearer():.4f}")
        self.ledger.stop(self._stopped)
        self.rows_not_scored = rows_left
        return False

    def reason(self) -> str:
        """Why a row was left unscored (its not-applicable reason)."""
        return f"not scored: {self.stopped}"

    def run_tags(self) -> dict[str, str]:
        """Tags of the run: the cap, what was spent and, when it stopped, why, how many rows
        were left and how many judge calls the cap refused."""
        tags: dict[str, str] = {}
        if self.max_cost is not None:
            tags["rag_eval.budget.max_cost_usd"] = f"{self.max_cost:g}"
            tags["rag_eval.budget.spent_usd"] = f"{self.spent:.6f}"
        if self.stopped:
            tags["rag_eval.budget.stopped"] = self.stopped
            tags["rag_eval.budget.rows_not_scored"] = str(self.rows_not_scored)
            tags["rag_eval.budget.calls_refused"] = str(self.ledger.calls_refused)
        if self.ledger.charged_at_estimate:
            tags["rag_eval.budget.calls_charged_at_estimate"] = str(self.ledger.charged_at_estimate)
        if self.estimate is not None:
            tags.update(self.estimate.as_params())
        return tags
