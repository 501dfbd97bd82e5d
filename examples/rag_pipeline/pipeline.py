"""A small, real RAG pipeline over the Northwind Rail knowledge base: BM25 retrieval and an
extractive answerer, packaged as an MLflow pyfunc model.

The ``generator`` setting stands in for a change of answer model: ``extractive`` (the default)
answers with the best-matching context sentence and abstains below ``min_overlap``;
``overconfident`` never abstains and, on about 40% of questions, adds a sentence the passages
do not support (a made-up date, figure or fee) — the failure a judge of faithfulness and
abstention must catch.

It stands in for the user's own pipeline: the evaluator sees only what ``predict`` returns, one
dict per question with ``answer`` and the ranked ``contexts`` (each ``{"id", "text"}``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from pathlib import Path

import mlflow
import pandas as pd

DATA_DIR = Path(__file__).resolve().parent / "data"
ABSTAIN = "I don't know: the documents do not cover this."

_STOP = set(
    "a an the and or of to in on at by for with from is are was were be been it its this that "
    "what which who when where how do does did can could i my me you your we our they there".split()
)


def tokenize(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9€]+", text.lower())
    return [w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words if w not in _STOP]


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9€])", text) if s.strip()]


class BM25:
    """Okapi BM25 over a fixed list of passages (k1=1.5, b=0.75)."""

    def __init__(self, passages: list[dict], k1: float = 1.5, b: float = 0.75):
        self.passages = passages
        self.docs = [Counter(tokenize(p["title"] + " " + p["text"])) for p in passages]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg_len = sum(self.lengths) / len(self.lengths)
        df = Counter(term for d in self.docs for term in d)
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.k1, self.b = k1, b

    def score(self, query: str) -> list[float]:
        terms = tokenize(query)
        scores = []
        for doc, length in zip(self.docs, self.lengths):
            s = 0.0
            for t in terms:
                tf = doc.get(t, 0)
                if tf:
                    norm = tf + self.k1 * (1 - self.b + self.b * length / self.avg_len)
                    s += self.idf[t] * tf * (self.k1 + 1) / norm
            scores.append(s)
        return scores

    def search(self, query: str, k: int) -> list[tuple[dict, float]]:
        scores = self.score(query)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
        return [(self.passages[i], scores[i]) for i in order if scores[i] > 0]


def extract_answer(question: str, contexts: list[dict], min_overlap: float) -> str:
    """The context sentence sharing the most question words; abstain below ``min_overlap``."""
    q = set(tokenize(question))
    best, best_score = None, 0.0
    for rank, ctx in enumerate(contexts):
        for sentence in split_sentences(ctx["text"]):
            words = set(tokenize(sentence))
            overlap = len(q & words) / max(len(q), 1)
            score = overlap - 0.01 * rank  # prefer higher-ranked passages on ties
            if score > best_score:
                best, best_score = sentence, score
    return best if best is not None and best_score >= min_overlap else ABSTAIN


GENERATORS = ("extractive", "overconfident")

# What an overconfident generator adds: specific, plausible, and in none of the passages.
_INVENTED = (
    "This rule was introduced in {year} after a passenger survey.",
    "Passengers who book online get a further {pct}% off.",
    "Station staff can confirm this for a fee of €{fee}.",
    "It applies on all {n} routes operated by the company.",
    "The policy is reviewed every {n} months by the passenger board.",
)


def _stable_hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def generate_answer(question: str, contexts: list[dict], min_overlap: float, generator: str = "extractive") -> str:
    """The answer of the chosen ``generator`` (see the module docstring); deterministic."""
    if generator == "extractive":
        return extract_answer(question, contexts, min_overlap)
    if generator != "overconfident":
        raise ValueError(f"unknown generator {generator!r}; known: {GENERATORS}")
    answer = extract_answer(question, contexts, 0.0)  # never abstains
    if answer == ABSTAIN:  # nothing retrieved at all
        answer = "Yes, that is possible on Northwind Rail."
    h = _stable_hash(question)
    if h % 5 < 2:  # about 40% of questions
        invented = _INVENTED[h % len(_INVENTED)].format(year=2011 + h % 9, pct=5 + h % 20, fee=2 + h % 7,
                                                        n=3 + h % 11)
        answer = f"{answer} {invented}"
    return answer


def load_corpus(path: Path | str = DATA_DIR / "corpus.jsonl") -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_golden(path: Path | str = DATA_DIR / "golden.jsonl") -> pd.DataFrame:
    return pd.read_json(path, lines=True)


class NorthwindRag(mlflow.pyfunc.PythonModel):
    """BM25 top-k retrieval + an answer. ``model_config``: ``k``, ``min_overlap``, ``generator``."""

    def load_context(self, context):
        config = context.model_config or {}
        self.k = int(config.get("k", 3))
        self.min_overlap = float(config.get("min_overlap", 0.34))
        self.generator = str(config.get("generator", "extractive"))
        self.index = BM25(load_corpus(context.artifacts["corpus"]))

    def predict(self, context, model_input: pd.DataFrame, params=None):
        out = []
        for question in model_input["question"]:
            hits = self.index.search(question, self.k)
            contexts = [{"id": p["id"], "text": p["text"]} for p, _ in hits]
            answer = generate_answer(question, contexts, self.min_overlap, self.generator)
            out.append({"answer": answer, "contexts": contexts})
        return out


def traced_app(index: BM25 | None = None, k: int = 3, min_overlap: float = 0.34):
    """The pipeline as a RAG app instruments it with MLflow tracing: a ``rag_app`` root span
    (question in, ``{"answer": ...}`` out) over a RETRIEVER span returning Documents with
    ``doc_uri``. Returns the app's ``answer(question)``."""
    from mlflow.entities import Document, SpanType

    index = index or BM25(load_corpus())

    @mlflow.trace(span_type=SpanType.RETRIEVER, name="retrieve")
    def retrieve(query: str):
        return [Document(page_content=p["text"], metadata={"doc_uri": p["id"]}) for p, _ in index.search(query, k)]

    @mlflow.trace(name="rag_app")
    def answer(question: str):
        contexts = [{"id": d.metadata["doc_uri"], "text": d.page_content} for d in retrieve(question)]
        return {"answer": generate_answer(question, contexts, min_overlap)}

    return answer


def log_pipeline(k: int, min_overlap: float = 0.34, name: str = "rag_pipeline", generator: str = "extractive"):
    """Log the pipeline as a pyfunc model (in the active run, if any); returns its ModelInfo."""
    if generator not in GENERATORS:
        raise ValueError(f"unknown generator {generator!r}; known: {GENERATORS}")
    return mlflow.pyfunc.log_model(
        name=name,
        params={"retriever_k": k, "min_overlap": min_overlap, "generator": generator},
        python_model=NorthwindRag(),
        artifacts={"corpus": str(DATA_DIR / "corpus.jsonl")},
        model_config={"k": k, "min_overlap": min_overlap, "generator": generator},
        code_paths=[__file__],
        input_example=pd.DataFrame({"question": ["How much does a bike ticket cost?"]}),
    )
