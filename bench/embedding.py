"""Sentences per second of the numpy encoder beside sentence-transformers (target: >= 0.8x).

    .venv/bin/python bench/embedding.py [--rounds 3] [--rows 200]

Both run on the shipped MiniLM in this one process, interleaved round by round (other processes
on the machine slow both alike), on short texts (the example corpus's passages, questions and
answers: 20-90 tokens) and long ones (news articles cut at 256 tokens). The table reports each
side's best round. Then the local suite's rows/s (bench/local_judge.py, target >= 50 rows/s).
Needs the ``[train]`` extra for the comparison (``make test`` installs it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from mlflow_rag_eval.judges.local_model.embedding import resolve_model_path  # noqa: E402
from mlflow_rag_eval.judges.local_model.encoder import BertEncoder  # noqa: E402


def _texts() -> dict[str, list[str]]:
    data = ROOT / "examples" / "rag_pipeline" / "data"
    short = [json.loads(line)["text"] for line in (data / "corpus.jsonl").read_text().splitlines()]
    for line in (data / "golden.jsonl").read_text().splitlines():
        row = json.loads(line)
        short += [row["question"], row["reference"]]
    with gzip.open(ROOT / "training_data" / "summedits_dev.jsonl.gz", "rt") as f:
        long = list(dict.fromkeys(json.loads(line)["context"] for line in f))  # rows share contexts
    return {"short": short, "long": long[:64]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200, help="rows of bench/local_judge.py (0: skip it)")
    args = parser.parse_args()
    path = resolve_model_path("minilm-l6")
    t = time.perf_counter()
    numpy_encoder = BertEncoder(path)
    print(f"numpy encoder loaded in {time.perf_counter() - t:.2f} s ({numpy_encoder.workers} worker threads)")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise SystemExit("the comparison needs sentence-transformers: pip install 'mlflow-rag-eval[train]'") from None
    reference = SentenceTransformer(path, device="cpu")
    engines = {
        "numpy": lambda texts: numpy_encoder.encode(texts),
        "sentence-transformers": lambda texts: reference.encode(texts, batch_size=64, normalize_embeddings=True,
                                                                  convert_to_numpy=True, show_progress_bar=False),
    }
    best: dict[tuple[str, str], float] = {}
    diff: dict[str, float] = {}
    for _ in range(args.rounds):
        for kind, texts in _texts().items():
            vectors = {}
            for name, encode in engines.items():
                t = time.perf_counter()
                vectors[name] = encode(texts)
                rate = len(texts) / (time.perf_counter() - t)
                best[kind, name] = max(best.get((kind, name), 0.0), rate)
            diff[kind] = float(np.abs(vectors["numpy"] - vectors["sentence-transformers"]).max())
    print(f"\n{'texts':<8}{'n':>5}{'numpy /s':>12}{'s-t /s':>12}{'ratio':>8}{'max |diff|':>12}")
    for kind, texts in _texts().items():
        ours, theirs = best[kind, "numpy"], best[kind, "sentence-transformers"]
        print(f"{kind:<8}{len(texts):>5}{ours:>12.1f}{theirs:>12.1f}{ours / theirs:>8.2f}{diff[kind]:>12.1e}")
    if args.rows:
        print(f"\nlocal suite (bench/local_judge.py --rows {args.rows}):", flush=True)
        subprocess.run([sys.executable, str(ROOT / "bench" / "local_judge.py"), "--rows", str(args.rows)], check=True)


if __name__ == "__main__":
    main()
