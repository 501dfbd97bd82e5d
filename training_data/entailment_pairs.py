"""Writes ``entailment_pairs.jsonl.gz`` (the cross-encoder's training pairs) and the word
relation table the synthetic swaps use (``mlflow_rag_eval/judges/local_model/word_relations.json.gz``)
from ``../shared/data/nli`` and the example corpus. Deterministic (seed 0); see README.md here.

    .venv/bin/python training_data/entailment_pairs.py [--nli-dir ../shared/data/nli]

Every row is ``{"claim", "premise", "label", "source", "kind"}``, label 1 when the premise
entails the claim. Long premises (GoFigure and FactCC documents, HaluEval passages) are cut to
the window the judge itself would read for that claim: its best sentence or pair of adjacent
sentences by the embedding model's cosine (:class:`mlflow_rag_eval.judges.local_model.support_model.Premise`).
Three Breaking NLI categories (:data:`HELD_OUT_BREAKING`) are left out: the bench reports the
cross-encoder's accuracy on them (a check inside the entailment data that it learnt the
relation, not the words).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlflow_rag_eval._util.text import split_sentences  # noqa: E402
from mlflow_rag_eval.judges.local_model.corruptions import word_relation_examples  # noqa: E402
from mlflow_rag_eval.judges.local_model.embedding import Embedder  # noqa: E402
from mlflow_rag_eval.judges.local_model.support_model import Premise  # noqa: E402

OUT = ROOT / "training_data" / "entailment_pairs.jsonl.gz"
RELATIONS_OUT = ROOT / "mlflow_rag_eval" / "judges" / "local_model" / "word_relations.json.gz"
HELD_OUT_BREAKING = ("drinks", "rooms", "materials")
#: pairs taken per file at most (a big file cannot drown the others)
CAPS = {"breaking_nli": 7000, "cad_nli": 9000, "esnli_snli_devtest": 7000, "mnli_binary": 7000,
        "hans_generated": 2500, "med": 2500, "help_nli": 2500, "negation_nli": 4500, "factcc_sample": 1000,
        "factcc_pubmed": 150, "gofigure": 6000, "halueval_qa": 1481}
POSITIVE = {"entailment", "consistent"}
_WORD = re.compile(r"^[a-z]+$")


def rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def word_relations(path: Path) -> dict[str, dict[str, list[str]]]:
    """word -> relation -> words, for single lower-case words both of some frequency: antonyms
    (direct and indirect), synonyms, hypernyms, and noun co-hyponyms of frequent senses (the
    table's co-hyponyms mix word senses: only common words of both sides are kept)."""
    keep = {"antonym": 0, "indirect_antonym": 1, "synonym": 2, "hypernym": 2, "cohyponym": 3, "co-instance": 1}
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in rows(path):
        rel = r["relation"]
        a, b = r["premise"], r["hypothesis"]
        if rel not in keep or not (_WORD.match(a.lower()) and _WORD.match(b.lower())) or a.lower() == b.lower():
            continue
        if min(r["freq1"], r["freq2"]) < keep[rel] or (rel == "cohyponym" and r["pos"] != "n"):
            continue
        rel = {"indirect_antonym": "antonym", "co-instance": "cohyponym"}.get(rel, rel)
        out[a.lower()][rel].add(b.lower())
    return {w: {rel: sorted(ws) for rel, ws in sorted(rels.items())} for w, rels in sorted(out.items())}


def windows(embedder: Embedder, items: list[tuple[str, str]]) -> list[str]:
    """Each (claim, document)'s best unit: the window the judge would read (every document's
    units embedded in one call, so that the encoder batches them by length)."""
    claims = embedder.encode([c for c, _ in items])
    units = {doc: Premise.units_of([doc])[0] for _, doc in items}
    embedder.encode(list(dict.fromkeys(u for us in units.values() for u, _ in us)))  # fills its cache
    out = []
    for k, (claim, doc) in enumerate(items):
        if not units[doc]:
            out.append(doc)
            continue
        vectors = embedder.encode([u for u, _ in units[doc]])
        out.append(units[doc][int(np.argmax(vectors @ claims[k]))][0])
    print(f"  {len(items)} windows from {len(units)} documents", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nli-dir", default=str(ROOT.parent / "shared" / "data" / "nli"))
    args = parser.parse_args()
    nli = Path(args.nli_dir)
    rng = random.Random(0)
    embedder = Embedder()
    out: list[dict] = []

    def add(claim, premise, label, source, kind):
        if claim.strip() and premise.strip():
            out.append({"claim": claim.strip(), "premise": premise.strip(), "label": int(label), "source": source,
                        "kind": kind})

    for name, cap in CAPS.items():
        print(name, flush=True)
        data = rows(nli / f"{name}.jsonl.gz")
        if name == "breaking_nli":
            data = [r for r in data if r["category"] not in HELD_OUT_BREAKING]
        if name == "gofigure":
            # per document: the gold summary's sentences are entailed; an edited summary's
            # sentences that the gold one lacks are its edits (not entailed)
            gold = {r["doc_idx"]: set(split_sentences(r["hypothesis"])) for r in data if r["label"] == "consistent"}
            items = []
            for r in data:
                sentences = split_sentences(r["hypothesis"])
                if r["label"] == "consistent":
                    items += [(s, r["premise"], 1, "gold_sentence") for s in sentences]
                elif r["doc_idx"] in gold:
                    items += [(s, r["premise"], 0, r.get("transform", "edit")) for s in sentences
                              if s not in gold[r["doc_idx"]]]
            rng.shuffle(items)
            pos = [x for x in items if x[2] == 1][: cap // 2]
            neg = [x for x in items if x[2] == 0][: cap - len(pos)]
            chosen = pos + neg
            for (claim, _, label, kind), window in zip(chosen, windows(embedder, [(c, p) for c, p, _, _ in chosen])):
                add(claim, window, label, name, kind)
            continue
        rng.shuffle(data)
        data = data[:cap]
        if name in ("factcc_pubmed", "halueval_qa"):
            claims = [r["answer"] if name == "halueval_qa" and len(r.get("answer", "").split()) > 4
                      else r["hypothesis"] for r in data]
            for r, claim, window in zip(data, claims, windows(embedder, [(c, r["premise"]) for c, r in zip(claims, data)])):
                add(claim, window, r["label"] in POSITIVE, name, r.get("relation", "pair"))
            continue
        for r in data:
            premise = r.get("premise_window") or r["premise"]
            kind = r.get("category") or r.get("augmentation") or r.get("heuristic") or r.get("part") or "pair"
            add(r["hypothesis"], premise, r["label"] in POSITIVE, name, str(kind))

    relations = word_relations(nli / "wordnet_relations.jsonl.gz")
    RELATIONS_OUT.write_bytes(gzip.compress(json.dumps(relations, sort_keys=True).encode(), mtime=0))
    # synthetic one-word swaps of plain sentences: the example corpus and SNLI / MultiNLI premises
    corpus = [json.loads(line)["text"] for line in (ROOT / "examples/rag_pipeline/data/corpus.jsonl").open()]
    premises = sorted({r["premise"] for f in ("esnli_snli_devtest", "mnli_binary", "cad_nli")
                       for r in rows(nli / f"{f}.jsonl.gz") if 6 <= len(r["premise"].split()) <= 40})
    rng.shuffle(premises)
    sentences = [s for p in corpus for s in split_sentences(p)] + premises[:6000]
    for e in word_relation_examples(sentences, relations, seed=0):
        add(e.claim, e.passage, e.label, "synthetic", e.kind)

    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in out)
    OUT.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    counts = Counter((r["source"], r["label"]) for r in out)
    print(f"{len(out)} pairs -> {OUT}; word relations for {len(relations)} words -> {RELATIONS_OUT}")
    for (source, label), n in sorted(counts.items()):
        print(f"  {source:<20} label {label}: {n}")


if __name__ == "__main__":
    main()
