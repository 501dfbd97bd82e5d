"""What the docs' examples take as the reader's own: the Northwind example corpus and golden set
(examples/rag_pipeline/data), a small slice of them, as files in the page's folder and as names.

Files: docs.jsonl (the corpus: one passage per line, id and text), golden.jsonl (12 golden rows,
3 unanswerable, with metadata difficulty and tags), rows.jsonl / rows.parquet / rows.csv (those
rows with the example pipeline's answers and contexts), human.jsonl (60 human labels: answer,
contexts, label). Names: ``golden_df`` (the golden rows, the
question column named ``query``), ``rows`` (rows.jsonl as a DataFrame), ``golden_rows`` (the
genai form: inputs / expectations / tags), ``my_rag`` (the pipeline as a function:
``my_rag(question) -> {"answer", "contexts"}``), ``Pipeline`` (a pyfunc class of it).
"""

import json
import os
import shutil
import sys
from pathlib import Path

import mlflow
import pandas as pd

_ROOT = Path(os.environ["DOCS_REPO_ROOT"])
_DATA = _ROOT / "examples" / "rag_pipeline" / "data"
sys.path.insert(0, str(_ROOT / "examples" / "rag_pipeline"))
from pipeline import BM25, generate_answer, load_corpus  # noqa: E402

shutil.copy(_DATA / "corpus.jsonl", "docs.jsonl")
_golden = [json.loads(line) for line in (_DATA / "golden.jsonl").read_text().splitlines() if line.strip()]
_golden = [r for r in _golden if r["answerable"]][:9] + [r for r in _golden if not r["answerable"]][:3]
for _i, _row in enumerate(_golden):
    _row["relevant_ids"] = [{"id": k, "grade": v} for k, v in _row["relevant_ids"].items()]
    _row["metadata"] = {"difficulty": ("easy", "medium", "hard")[_i % 3], "tags": [("fares", "refunds")[_i % 2]]}
Path("golden.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _golden))
_index = BM25(load_corpus())


def my_rag(question: str) -> dict:
    """The example pipeline: BM25 top 3, an extractive answer (abstains below an overlap)."""
    contexts = [{"id": p["id"], "text": p["text"]} for p, _ in _index.search(question, 3)]
    return {"answer": generate_answer(question, contexts, 0.34), "contexts": contexts}


class Pipeline(mlflow.pyfunc.PythonModel):
    """``my_rag`` as a pyfunc model: one output per question of the input frame's first column."""

    def predict(self, context, model_input, params=None):
        return [my_rag(str(q)) for q in model_input.iloc[:, 0]]


golden_df = pd.DataFrame(_golden).rename(columns={"question": "query"})
rows = pd.DataFrame([{**r, **my_rag(r["question"])} for r in _golden])
rows.to_json("rows.jsonl", orient="records", lines=True)
rows.to_parquet("rows.parquet")
_csv = rows.copy()
for _col in ("contexts", "relevant_ids", "metadata"):
    _csv[_col] = [json.dumps(v) for v in _csv[_col]]
_csv.to_csv("rows.csv", index=False)
golden_rows = [{"inputs": {"question": r["question"]},
                "expectations": {"reference": r["reference"], "relevant_ids": r["relevant_ids"],
                                 "answerable": r["answerable"]},
                "tags": {"difficulty": r["metadata"]["difficulty"]}} for r in _golden]
_labels = []
for _i in range(60):  # faithful and unfaithful answers to label, alternately
    _ctx = _golden[_i % 9]["reference"]
    _labels.append({"answer": _ctx if _i % 2 == 0 else "The fee is 99 euros and applies on Sundays only.",
                    "contexts": [_ctx], "label": 1 if _i % 2 == 0 else 0})
Path("human.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _labels))
