"""Writes ``entailment_pairs.jsonl.gz`` (the cross-encoder's training pairs) and
``rewrite_edit_validation.jsonl.gz`` (the twins its threshold is chosen on) from
``../shared/data/nli`` and the example corpus. Deterministic (seed 0); see README.md here.

    .venv/bin/python training_data/entailment_pairs.py [--nli-dir ../shared/data/nli]

Every row is ``{"claim", "premise", "label", "source", "kind"}`` (+ ``group`` for the synthetic
twins), label 1 when the premise entails the claim. Every row of the entailment files is used
(FactCC-PubMed: 150 of its 600, see :data:`CAPS`). Long premises (GoFigure and FactCC
documents, HaluEval passages) are cut to the window the judge itself would read for that claim:
its best sentence or pair of adjacent sentences by the embedding model's cosine
(:class:`mlflow_rag_eval.judges.local_model.support_model.Premise`). Three Breaking NLI categories
(:data:`HELD_OUT_BREAKING`) are left out: the bench reports the cross-encoder's accuracy on them
(a check inside the entailment data that it learnt the relation, not the words).

Beside them, source ``rewrites``: sentences of the example corpus, of news documents and
knowledge passages, and NLI premises, each with a faithful rewrite (label 1) and a one-word edit
(label 0) sharing a ``group`` (:mod:`mlflow_rag_eval.judges.local_model.rewrites`), some read as
a question and its short answer; 5% of the groups, chosen by the premise's hash, are written
apart for validation.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlflow_rag_eval._util.text import split_sentences  # noqa: E402
from mlflow_rag_eval.judges.local_model.embedding import Embedder, load_model  # noqa: E402
from mlflow_rag_eval.judges.local_model.rewrites import question_answer_pairs, rewrite_edit_pairs  # noqa: E402
from mlflow_rag_eval.judges.local_model.support_model import Premise  # noqa: E402

OUT = ROOT / "training_data" / "entailment_pairs.jsonl.gz"
HELD_OUT_BREAKING = ("drinks", "rooms", "materials")
#: the entailment files, every row of each (Breaking NLI less its held-out categories)
FILES = ("breaking_nli", "cad_nli", "esnli_snli_devtest", "mnli_binary", "hans_generated", "med", "help_nli",
         "negation_nli", "factcc_sample", "factcc_pubmed", "gofigure", "halueval_qa")
#: rows taken of a file at most, where not all: FactCC-PubMed's documents are whole papers (the
#: window search embeds every sentence of each; 150 of them take as long as all other files)
CAPS = {"factcc_pubmed": 150}
#: (rewrite, edit) groups of plain sentences, and the share of them kept apart for choosing the
#: cross-encoder's threshold (by sentence: no validation sentence is trained on)
SYNTHETIC_GROUPS = 16000
VALIDATION_SHARE = 0.05
VALIDATION_OUT = ROOT / "training_data" / "rewrite_edit_validation.jsonl.gz"
POSITIVE = {"entailment", "consistent"}


def rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


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

    for name in FILES:
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
            chosen = list({(c, p): (c, p, label, kind) for c, p, label, kind in items}.values())
            for (claim, _, label, kind), window in zip(chosen, windows(embedder, [(c, p) for c, p, _, _ in chosen])):
                add(claim, window, label, name, kind)
            continue
        rng.shuffle(data)
        data = data[:CAPS.get(name)]
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

    # faithful rewrites and one-word edits of plain sentences, in pairs (rewrites.py): the
    # example corpus, NLI premises, and the sentences of news documents and knowledge passages
    corpus = [json.loads(line)["text"] for line in (ROOT / "examples/rag_pipeline/data/corpus.jsonl").open()]
    premises = sorted({r["premise"] for f in ("esnli_snli_devtest", "mnli_binary", "cad_nli")
                       for r in rows(nli / f"{f}.jsonl.gz") if 6 <= len(r["premise"].split()) <= 40})
    documents = sorted({r["premise"] for f in ("factcc_sample", "gofigure", "halueval_qa")
                        for r in rows(nli / f"{f}.jsonl.gz")})
    rng.shuffle(premises)
    rng.shuffle(documents)
    passages = ([split_sentences(p) for p in corpus] + [split_sentences(d)[:12] for d in documents]
                + [[p] for p in premises])
    groups = rewrite_edit_pairs(passages, seed=0, per_sentence=1)
    rng.shuffle(groups)
    groups = groups[:SYNTHETIC_GROUPS]
    # the same sentences read as a question and its short answer, as golden sets hold them
    tokenizer = load_model(embedder.path).tokenizer
    groups += question_answer_pairs(passages, lambda word: tokenizer.token_to_id(word) is not None, seed=0)
    validation = []
    for g, pair in enumerate(groups):
        held_out = int(hashlib.sha256(pair.premise.encode()).hexdigest()[:8], 16) < VALIDATION_SHARE * 16 ** 8
        rewrite = {"claim": pair.rewrite, "premise": pair.premise, "label": 1, "source": "rewrites",
                   "kind": pair.rewrite_kind, "group": g}
        edit = {"claim": pair.edit, "premise": pair.premise, "label": 0, "source": "rewrites",
                "kind": pair.edit_kind, "group": g}
        if held_out:
            validation += [rewrite, edit]
        else:
            out.extend([rewrite, edit])
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in validation)
    VALIDATION_OUT.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    print(f"{len(validation) // 2} rewrite/edit groups held out -> {VALIDATION_OUT}")

    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in out)
    OUT.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    counts = Counter((r["source"], r["label"]) for r in out)
    print(f"{len(out)} pairs -> {OUT}")
    for (source, label), n in sorted(counts.items()):
        print(f"  {source:<20} label {label}: {n}")


if __name__ == "__main__":
    main()
