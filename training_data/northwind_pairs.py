"""Write northwind_pairs.jsonl: the Northwind golden references as labelled support pairs.

    .venv/bin/python training_data/northwind_pairs.py

Each answerable golden question with relevant passages gives two pairs: its reference answer
against its relevant passages (label 1: the golden set was written from them) and against two
passages of other topics, not relevant to it (label 0). They teach the support model what
SummEdits does not show: a faithful answer is usually a paraphrase, not a copy.
"""

import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "rag_pipeline" / "data"


def main() -> None:
    rng = random.Random(0)
    corpus = {p["id"]: p["text"] for p in map(json.loads, (DATA / "corpus.jsonl").read_text().splitlines()) if p}
    ids = sorted(corpus)
    rows = []
    for n, line in enumerate((DATA / "golden.jsonl").read_text().splitlines()):
        g = json.loads(line)
        relevant = sorted(g.get("relevant_ids") or [])
        if not g.get("answerable", True) or not relevant or not g.get("reference"):
            continue
        rows.append({"id": f"golden-{n}-rel", "source": "northwind", "label": 1, "answer": g["reference"],
                     "context": "\n\n".join(corpus[i] for i in relevant)})
        others = rng.sample([i for i in ids if i not in relevant], 2)
        rows.append({"id": f"golden-{n}-other", "source": "northwind", "label": 0, "answer": g["reference"],
                     "context": "\n\n".join(corpus[i] for i in others)})
    with open(Path(__file__).with_name("northwind_pairs.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} pairs")


if __name__ == "__main__":
    main()
