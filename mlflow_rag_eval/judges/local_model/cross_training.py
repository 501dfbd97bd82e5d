"""Training the local judge's cross-encoder (``make cross-encoder``; torch, the ``[train]`` extra).

The recipe fits a 2-core CPU: the bottom ``frozen_layers`` of all-MiniLM-L6-v2 stay as they
are, so their output for every training pair is computed once, by the numpy encoder the judge
runs at inference (the states the fine-tuned top sees in training are the states it sees when
judging), and kept in float16; only the top layers and a small head on ``[CLS]`` are trained,
with torch, from the model's own top-layer weights. The artifact holds the trained top layers
and the head in float16 (``cross_encoder.safetensors``) and a JSON file of how it was made:
the inputs' digest and counts, the settings, the base model's sha256 and the training time.

Examples weigh by source: each source's total weight grows with the square root of its size
(a large source cannot drown the small ones), and within a source both labels weigh the same.
Training is deterministic for a seed, the same inputs and the same thread count on one machine.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import platform
import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlflow_rag_eval.judges.local_model.cross_encoder import pair_windows
from mlflow_rag_eval.judges.local_model.embedding import load_model, model_files_sha256, resolve_model_path
from mlflow_rag_eval.judges.local_model.encoder import TOKENS_PER_STEP, plan_steps, read_safetensors, run_steps

__all__ = ["EntailmentPair", "estimate_seconds", "load_entailment_pairs", "per_source", "train_cross_encoder", "user_pairs",
           "word_relations", "write_safetensors"]

#: Seconds per pair and epoch of the recipe's defaults, measured on a 2-core machine (the
#: bottom layers' pass, once, is about a tenth of one epoch): what the CLI's estimate uses.
SECONDS_PER_PAIR_EPOCH = 0.02

_LAYER_NAMES = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")


@dataclass(frozen=True)
class EntailmentPair:
    """Does ``premise`` entail ``claim``? ``source`` and ``kind`` say where the pair comes from."""

    claim: str
    premise: str
    label: int
    source: str = ""
    kind: str = ""


def load_entailment_pairs(path: str | Path) -> list[EntailmentPair]:
    """Pairs from a JSON-lines file (or ``.jsonl.gz``) with ``claim``, ``premise``, ``label`` (0/1)
    and optional ``source`` and ``kind``."""
    from mlflow_rag_eval.judges.local_model.training import json_lines

    return json_lines(path, lambda row: EntailmentPair(row["claim"], row["premise"], int(row["label"]),
                                                       str(row.get("source", "")), str(row.get("kind", ""))),
                      "claim, premise and a 0/1 label")


def estimate_seconds(n_pairs: int, epochs: int = 2) -> float:
    """About how long training on ``n_pairs`` takes with the recipe's defaults on this machine's cores."""
    from mlflow_rag_eval.judges.local_model.encoder import _cores

    return n_pairs * SECONDS_PER_PAIR_EPOCH * (epochs + 0.1) * 2 / max(1, min(_cores(), 2))


def word_relations() -> dict[str, dict[str, list[str]]]:
    """The word relation table shipped with the package (from WordNet 3.0: synonyms, hypernyms,
    antonyms, co-hyponyms of common words; ``training_data/entailment_pairs.py`` writes it)."""
    path = Path(__file__).with_name("word_relations.json.gz")
    return json.loads(gzip.decompress(path.read_bytes()))


def user_pairs(passages: Sequence[str], labelled=(), *, seed: int = 0, embedder=None) -> list[EntailmentPair]:
    """Training pairs from a user's data: one-word edits of the passages' sentences
    (:func:`~mlflow_rag_eval.judges.local_model.corruptions.word_relation_examples`) and, for each
    labelled (context, answer, label) pair, every answer sentence against its best window of the
    context when the label is 1 (a 0 says only that some sentence is unsupported: not used)."""
    import numpy as np

    from mlflow_rag_eval._util.text import split_sentences
    from mlflow_rag_eval.judges.local_model.corruptions import word_relation_examples
    from mlflow_rag_eval.judges.local_model.embedding import Embedder
    from mlflow_rag_eval.judges.local_model.support_model import Premise, ranked_units

    sentences = [s for p in passages for s in split_sentences(p)]
    out = [EntailmentPair(e.claim, e.passage, e.label, "user_corpus", e.kind)
           for e in word_relation_examples(sentences, word_relations(), seed=seed)]
    positives = [(s, p.context) for p in labelled if p.label == 1 for s in split_sentences(p.answer)]
    if positives:
        embedder = embedder or Embedder()
        vectors = embedder.encode([s for s, _ in positives])
        for (sentence, context), vector in zip(positives, vectors):
            units, n = Premise.units_of([context])
            if units:
                premise = Premise.build([context], units, n, embedder.encode([u for u, _ in units]))
                out.append(EntailmentPair(sentence, units[ranked_units(np.asarray(vector), premise, 1)[0]][0], 1,
                                          "user_labels", "answer_sentence"))
    return out


def per_source(pairs: Sequence[EntailmentPair], limit: int | None) -> list[EntailmentPair]:
    """At most ``limit`` pairs of each source, the first ones in file order (the committed file
    is shuffled); all of them when ``limit`` is None."""
    if limit is None:
        return list(pairs)
    seen: Counter = Counter()
    out = []
    for p in pairs:
        seen[p.source] += 1
        if seen[p.source] <= limit:
            out.append(p)
    return out


def pairs_digest(pairs: Sequence[EntailmentPair]) -> str:
    """sha256 (16 hex digits) of the pairs, in order: what the artifact records of its inputs."""
    h = hashlib.sha256()
    for p in pairs:
        h.update(f"{p.label}\x01{p.claim}\x01{p.premise}\x01{p.source}\x00".encode())
    return h.hexdigest()[:16]


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """``tensors`` as a ``.safetensors`` file (the format :func:`read_safetensors` reads),
    names sorted, so the same arrays always give the same bytes."""
    codes = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[array.dtype], "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    if metadata:
        header["__metadata__"] = metadata
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    Path(path).write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def _torch_modules(torch):
    """The top layers and the head in torch, computing what the numpy encoder computes."""
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self, d: int, heads: int, inner: int, eps: float, dropout: float):
            super().__init__()
            self.heads, self.eps = heads, eps
            self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.out, self.ln1 = nn.Linear(d, d), nn.LayerNorm(d, eps=eps)
            self.up, self.down, self.ln2 = nn.Linear(d, inner), nn.Linear(inner, d), nn.LayerNorm(d, eps=eps)
            self.drop = nn.Dropout(dropout)

        def forward(self, x, key_bias):
            b, n, d = x.shape
            dh = d // self.heads

            def split(t):
                return t.view(b, n, self.heads, dh).transpose(1, 2)

            scores = split(self.query(x)) @ split(self.key(x)).transpose(-1, -2) / math.sqrt(dh) + key_bias
            context = (self.drop(scores.softmax(-1)) @ split(self.value(x))).transpose(1, 2).reshape(b, n, d)
            x = self.ln1(x + self.drop(self.out(context)))
            return self.ln2(x + self.drop(self.down(nn.functional.gelu(self.up(x)))))

    class Top(nn.Module):
        def __init__(self, n_layers: int, d: int, heads: int, inner: int, eps: float, dropout: float):
            super().__init__()
            self.layers = nn.ModuleList(Layer(d, heads, inner, eps, dropout) for _ in range(n_layers))
            self.dense, self.out = nn.Linear(d, d), nn.Linear(d, 1)
            self.drop = nn.Dropout(dropout)

        def forward(self, x, mask):
            key_bias = ((1.0 - mask) * -1e30)[:, None, None, :]
            for layer in self.layers:
                x = layer(x, key_bias)
            return self.out(self.drop(torch.tanh(self.dense(x[:, 0])))).squeeze(-1)

    return Top


def _load_top(top, base_weights: dict[str, np.ndarray], prefix: str, first: int, torch) -> None:
    """The base model's own top-layer weights as the starting point."""
    parts = ("query", "key", "value", "out", "ln1", "up", "down", "ln2")
    with torch.no_grad():
        for k, layer in enumerate(top.layers):
            for part, name in zip(parts, _LAYER_NAMES):
                module = getattr(layer, part)
                module.weight.copy_(torch.from_numpy(base_weights[f"{prefix}encoder.layer.{first + k}.{name}.weight"]))
                module.bias.copy_(torch.from_numpy(base_weights[f"{prefix}encoder.layer.{first + k}.{name}.bias"]))


def _export(top, first: int) -> dict[str, np.ndarray]:
    """The trained weights under the BERT names the numpy encoder's layers load, as float16."""
    parts = ("query", "key", "value", "out", "ln1", "up", "down", "ln2")
    out = {}
    for k, layer in enumerate(top.layers):
        for part, name in zip(parts, _LAYER_NAMES):
            module = getattr(layer, part)
            out[f"encoder.layer.{first + k}.{name}.weight"] = module.weight.detach().numpy().astype(np.float16)
            out[f"encoder.layer.{first + k}.{name}.bias"] = module.bias.detach().numpy().astype(np.float16)
    for name in ("dense", "out"):
        module = getattr(top, name)
        out[f"head.{name}.weight"] = module.weight.detach().numpy().astype(np.float16)
        out[f"head.{name}.bias"] = module.bias.detach().numpy().astype(np.float16)
    return out


def _weights(pairs: Sequence[EntailmentPair]) -> np.ndarray:
    """Per pair: its source's share (sqrt of the source's size) split evenly between the labels."""
    sizes = Counter(p.source for p in pairs)
    by = Counter((p.source, p.label) for p in pairs)
    labels_of = defaultdict(set)
    for p in pairs:
        labels_of[p.source].add(p.label)
    w = np.array([math.sqrt(sizes[p.source]) / len(labels_of[p.source]) / by[(p.source, p.label)] for p in pairs])
    return w * len(pairs) / w.sum()


def _bottom_states(base, inputs: Sequence[tuple[list[int], list[int]]], frozen_layers: int) -> list[np.ndarray]:
    """Each input's hidden states after the frozen bottom layers, float16, computed once by the
    numpy encoder (what the trained top sees at inference), a step per core at a time."""
    states: list[np.ndarray | None] = [None] * len(inputs)

    def run(chunk: list[int]) -> None:
        width = max(len(inputs[i][0]) for i in chunk)
        tokens = np.zeros((len(chunk), width), dtype=np.int64)
        types = np.zeros_like(tokens)
        mask = np.zeros(tokens.shape, dtype=np.float32)
        for row, i in enumerate(chunk):
            n = len(inputs[i][0])
            tokens[row, :n], types[row, :n], mask[row, :n] = inputs[i][0], inputs[i][1], 1.0
        h = base._forward(tokens, mask, types=types, layers=base.layers[:frozen_layers])
        for row, i in enumerate(chunk):
            states[i] = h[row, :len(inputs[i][0])].astype(np.float16)

    run_steps(plan_steps([len(i) for i, _ in inputs], 64, TOKENS_PER_STEP), run, None, base.workers,
              "mlflow-rag-eval-cross-training")
    return states


def _fit(top, states: list[np.ndarray], y: np.ndarray, w: np.ndarray, *, epochs: int, batch_size: int, lr: float,
         head_lr: float, rng: random.Random, torch, log) -> None:
    """AdamW over the top layers (``lr``) and the head (``head_lr``), linear warm-up over the
    first 5% of steps then linear decay; batches of similar length, shuffled each epoch."""
    d = states[0].shape[1]
    layer_params = [p for layer in top.layers for p in layer.parameters()]
    head_params = list(top.dense.parameters()) + list(top.out.parameters())
    optimizer = torch.optim.AdamW([{"params": layer_params, "lr": lr}, {"params": head_params, "lr": head_lr}],
                                  weight_decay=0.01)
    order = sorted(range(len(states)), key=lambda i: (len(states[i]), i))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    total = epochs * len(batches)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, total // 20)) * max(0.0, 1 - step / total))
    step, t0, running = 0, time.perf_counter(), 0.0
    top.train()
    for epoch in range(epochs):
        rng.shuffle(batches)
        for batch in batches:
            width = max(len(states[i]) for i in batch)
            x = np.zeros((len(batch), width, d), dtype=np.float32)
            mask = np.zeros((len(batch), width), dtype=np.float32)
            for row, i in enumerate(batch):
                x[row, :len(states[i])], mask[row, :len(states[i])] = states[i], 1.0
            logits = top(torch.from_numpy(x), torch.from_numpy(mask))
            loss = (torch.nn.functional.binary_cross_entropy_with_logits(
                logits, torch.from_numpy(y[batch]), reduction="none") * torch.from_numpy(w[batch]).float()).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(top.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            running += loss.item()
            if step % 200 == 0:
                log(f"epoch {epoch + 1} step {step}/{total}: loss {running / 200:.4f} "
                    f"({(time.perf_counter() - t0) / step:.2f} s/step)")
                running = 0.0
    top.eval()


def _start_top(top, base_path: str, frozen_layers: int, start_from, torch) -> None:
    """The base model's own top layers, or a cross-encoder's top layers and head to continue from."""
    weights = read_safetensors(Path(base_path) / "model.safetensors")
    prefix = next(p for p in ("", "bert.", "model.") if f"{p}embeddings.word_embeddings.weight" in weights)
    _load_top(top, weights, prefix, frozen_layers, torch)
    if start_from is not None:
        start = read_safetensors(start_from)
        _load_top(top, start, "", frozen_layers, torch)
        with torch.no_grad():
            for name in ("dense", "out"):
                getattr(top, name).weight.copy_(torch.from_numpy(start[f"head.{name}.weight"]))
                getattr(top, name).bias.copy_(torch.from_numpy(start[f"head.{name}.bias"]))


def train_cross_encoder(pairs: Sequence[EntailmentPair], out: str | Path, *, model: str = "minilm-l6",
                        frozen_layers: int = 4, epochs: int = 2, batch_size: int = 32, lr: float = 1e-4,
                        head_lr: float = 1e-3, dropout: float = 0.1, max_claim_tokens: int = 64,
                        max_premise_tokens: int = 128, seed: int = 0, threads: int | None = None,
                        start_from: str | Path | None = None, selection: dict | None = None, log=print) -> dict:
    """Fine-tune the top layers of ``model`` and a head on ``pairs``; write the artifact at ``out``
    (``.safetensors``, with ``.json`` beside it) and return what the JSON records.

    ``start_from``: a cross-encoder artifact to continue from (its top layers and head, its
    frozen layers and lengths) instead of the base model's own top layers and a new head.
    ``selection``: how ``pairs`` were chosen from their files (recorded as it is).
    Training reads one window per pair (the claim's first, the premise's first): the pairs'
    premises are already the window the judge reads, a sentence or two.
    """
    import torch  # the [train] extra

    started = time.perf_counter()
    started_from = None
    if start_from is not None:  # the artifact's own shape
        start_meta = json.loads(Path(start_from).with_suffix(".json").read_text())
        frozen_layers = int(start_meta["frozen_layers"])
        max_claim_tokens, max_premise_tokens = int(start_meta["max_claim_tokens"]), int(start_meta["max_premise_tokens"])
        started_from = start_meta["training"]["pairs_digest"]
    base_path = resolve_model_path(model)
    base = load_model(base_path)
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads or base.workers)
    try:
        torch.manual_seed(seed)
        cls, sep = base.tokenizer.token_to_id("[CLS]"), base.tokenizer.token_to_id("[SEP]")

        def ids(text):
            return base.tokenizer.encode(text.lower() if base.lower_case else text, add_special_tokens=False).ids

        inputs = [pair_windows(ids(p.claim), ids(p.premise), cls=cls, sep=sep, max_claim=max_claim_tokens,
                               max_premise=max_premise_tokens)[0][0] for p in pairs]
        t0 = time.perf_counter()
        states = _bottom_states(base, inputs, frozen_layers)
        log(f"bottom {frozen_layers} layers for {len(pairs)} pairs: {time.perf_counter() - t0:.0f} s")
        top = _torch_modules(torch)(len(base.layers) - frozen_layers, base.words.shape[1], base.heads,
                                    base.layers[0].up.shape[1], base.eps, dropout)
        _start_top(top, base_path, frozen_layers, start_from, torch)
        _fit(top, states, np.array([p.label for p in pairs], dtype=np.float32), _weights(pairs), epochs=epochs,
             batch_size=batch_size, lr=lr, head_lr=head_lr, rng=random.Random(seed), torch=torch, log=log)
        out = Path(out)
        write_safetensors(out, _export(top, frozen_layers))
        meta = {
            "schema_version": 1, "base_model": model, "base_model_sha256": model_files_sha256(base_path),
            "frozen_layers": frozen_layers, "max_claim_tokens": max_claim_tokens,
            "max_premise_tokens": max_premise_tokens, "dtype": "float16",
            "training": {
                "n_pairs": len(pairs), "pairs_digest": pairs_digest(pairs),
                "sources": {s: {"pairs": n, "entailed": sum(1 for p in pairs if p.source == s and p.label)}
                            for s, n in sorted(Counter(p.source for p in pairs).items())},
                "epochs": epochs, "batch_size": batch_size, "lr": lr, "head_lr": head_lr, "dropout": dropout,
                "seed": seed, "threads": torch.get_num_threads(), "torch": torch.__version__,
                "machine": platform.machine(), "seconds": round(time.perf_counter() - started),
                "started_from": started_from, "selection": selection,
            },
        }
        out.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        log(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {meta['training']['seconds']} s")
        return meta
    finally:
        torch.set_num_threads(saved_threads)
