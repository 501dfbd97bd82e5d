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
from mlflow_rag_eval.judges.local_model.encoder import read_safetensors

__all__ = ["EntailmentPair", "estimate_seconds", "load_entailment_pairs", "per_source", "train_cross_encoder", "user_pairs",
           "write_safetensors"]

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
    #: pairs of one group (a sentence's faithful rewrite and its one-word edit) share a batch,
    #: and the ranking loss puts the entailed one above the other; -1: no group
    group: int = -1


def load_entailment_pairs(path: str | Path) -> list[EntailmentPair]:
    """Pairs from a JSON-lines file (or ``.jsonl.gz``) with ``claim``, ``premise``, ``label`` (0/1)
    and optional ``source`` and ``kind``."""
    from mlflow_rag_eval.judges.local_model.training import json_lines

    return json_lines(path, lambda row: EntailmentPair(row["claim"], row["premise"], int(row["label"]),
                                                       str(row.get("source", "")), str(row.get("kind", "")),
                                                       int(row.get("group", -1))),
                      "claim, premise and a 0/1 label")


def estimate_seconds(n_pairs: int, epochs: int = 2) -> float:
    """About how long training on ``n_pairs`` takes with the recipe's defaults on this machine's cores."""
    from mlflow_rag_eval.judges.local_model.encoder import _cores

    return n_pairs * SECONDS_PER_PAIR_EPOCH * (epochs + 0.1) * 2 / max(1, min(_cores(), 2))


def user_pairs(passages: Sequence[str], labelled=(), *, seed: int = 0, embedder=None) -> list[EntailmentPair]:
    """Training pairs from a user's data: each sentence of the passages with a faithful rewrite
    and a one-word edit, in groups (:func:`~mlflow_rag_eval.judges.local_model.rewrites.rewrite_edit_pairs`,
    as the shipped cross-encoder was trained) and, for each labelled (context, answer, label)
    pair, every answer sentence against its best window of the context when the label is 1 (a 0
    says only that some sentence is unsupported: not used)."""
    import numpy as np

    from mlflow_rag_eval._util.text import split_sentences
    from mlflow_rag_eval.judges.local_model.embedding import Embedder
    from mlflow_rag_eval.judges.local_model.rewrites import rewrite_edit_pairs
    from mlflow_rag_eval.judges.local_model.support_model import Premise, ranked_units

    out = []
    for g, pair in enumerate(rewrite_edit_pairs([split_sentences(p) for p in passages], seed=seed)):
        out += [EntailmentPair(pair.rewrite, pair.premise, 1, "user_corpus", pair.rewrite_kind, g),
                EntailmentPair(pair.edit, pair.premise, 0, "user_corpus", pair.edit_kind, g)]
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


def _bottom_states(base, base_path: str, inputs: Sequence[tuple[list[int], list[int]]], frozen_layers: int, torch,
                  log) -> list[np.ndarray]:
    """Each input's hidden states after the frozen bottom layers, float16, computed once, in
    torch (about 3x the numpy encoder's speed here) from the same weights and the same
    arithmetic (erf GELU, the model's LayerNorm epsilon) the numpy encoder runs at inference."""
    d = base.words.shape[1]
    Top = _torch_modules(torch)
    bottom = Top(frozen_layers, d, base.heads, base.layers[0].up.shape[1], base.eps, 0.0)
    weights = read_safetensors(Path(base_path) / "model.safetensors")
    prefix = next(p for p in ("", "bert.", "model.") if f"{p}embeddings.word_embeddings.weight" in weights)
    _load_top(bottom, weights, prefix, 0, torch)
    bottom.eval()
    words, positions = torch.from_numpy(base.words), torch.from_numpy(base.positions)
    types, ln = torch.from_numpy(base.types), [torch.from_numpy(x) for x in base.ln0]
    states: list[np.ndarray | None] = [None] * len(inputs)
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i][0]))
    t0, done = time.perf_counter(), 0
    with torch.no_grad():
        for start in range(0, len(order), 128):
            chunk = order[start:start + 128]
            width = max(len(inputs[i][0]) for i in chunk)
            tokens = np.zeros((len(chunk), width), dtype=np.int64)
            segments = np.zeros_like(tokens)
            mask = np.zeros(tokens.shape, dtype=np.float32)
            for row, i in enumerate(chunk):
                n = len(inputs[i][0])
                tokens[row, :n], segments[row, :n], mask[row, :n] = inputs[i][0], inputs[i][1], 1.0
            x = words[torch.from_numpy(tokens)] + positions[:width] + types[torch.from_numpy(segments)]
            x = torch.nn.functional.layer_norm(x, (d,), ln[0], ln[1], base.eps)
            key_bias = ((1.0 - torch.from_numpy(mask)) * -1e30)[:, None, None, :]
            for layer in bottom.layers:
                x = layer(x, key_bias)
            h = x.numpy()
            for row, i in enumerate(chunk):
                states[i] = h[row, :len(inputs[i][0])].astype(np.float16)
            done += len(chunk)
            if start % (128 * 100) == 0 and start:
                log(f"bottom layers: {done}/{len(inputs)} pairs ({done / (time.perf_counter() - t0):.0f} pairs/s)")
    return states


def _batches(states: Sequence[np.ndarray], groups: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of similar length; the pairs of a group always in one batch."""
    units: dict[object, list[int]] = {}
    for i, g in enumerate(groups):
        units.setdefault(("g", g) if g >= 0 else ("p", i), []).append(i)
    ordered = sorted(units.values(), key=lambda u: (max(len(states[i]) for i in u), u[0]))
    batches, current = [], []
    for unit in ordered:
        if current and len(current) + len(unit) > batch_size:
            batches.append(current)
            current = []
        current.extend(unit)
    if current:
        batches.append(current)
    return batches


def _fit(top, states: list[np.ndarray], y: np.ndarray, w: np.ndarray, groups: Sequence[int], *, epochs: int,
         batch_size: int, lr: float, head_lr: float, rank_weight: float, seed: int, torch, log,
         checkpoint: Path | None = None, checkpoint_seconds: float = 600.0) -> int:
    """AdamW over the top layers (``lr``) and the head (``head_lr``), linear warm-up over the
    first 5% of steps then linear decay; batches of similar length (a group's pairs together),
    shuffled each epoch. The loss: weighted binary cross-entropy, plus ``rank_weight`` times a
    pairwise ranking loss, -log sigmoid(logit(entailed) - logit(not entailed)), over the groups'
    pairs. With ``checkpoint``, the model, the optimiser, the schedule and the random state are
    written there every ``checkpoint_seconds`` and at the end; a checkpoint found there is
    resumed from (every epoch's batch order is fixed by the seed up front, so a resumed run
    takes the batches the uninterrupted one would). Returns the number of steps taken."""
    d = states[0].shape[1]
    layer_params = [p for layer in top.layers for p in layer.parameters()]
    head_params = list(top.dense.parameters()) + list(top.out.parameters())
    optimizer = torch.optim.AdamW([{"params": layer_params, "lr": lr}, {"params": head_params, "lr": head_lr}],
                                  weight_decay=0.01)
    batches = _batches(states, groups, batch_size)
    rng = random.Random(seed)
    plan = []
    for _ in range(epochs):
        rng.shuffle(batches)
        plan.extend(list(b) for b in batches)
    total = len(plan)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, total // 20)) * max(0.0, 1 - step / total))
    step = 0
    if checkpoint is not None and checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        if saved["total"] != total:
            raise ValueError(f"the checkpoint {checkpoint} is of another run ({saved['total']} steps, not {total})")
        top.load_state_dict(saved["top"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        torch.set_rng_state(saved["torch_rng"])
        step = saved["step"]
        log(f"resumed from {checkpoint} at step {step}/{total}")

    def save():
        if checkpoint is not None:
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"top": top.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                        "torch_rng": torch.get_rng_state(), "step": step, "total": total}, tmp)
            tmp.replace(checkpoint)

    group_of = np.asarray(groups)
    t0, last_save, running, since = time.perf_counter(), time.perf_counter(), 0.0, 0
    top.train()
    while step < total:
        batch = plan[step]
        width = max(len(states[i]) for i in batch)
        x = np.zeros((len(batch), width, d), dtype=np.float32)
        mask = np.zeros((len(batch), width), dtype=np.float32)
        for row, i in enumerate(batch):
            x[row, :len(states[i])], mask[row, :len(states[i])] = states[i], 1.0
        logits = top(torch.from_numpy(x), torch.from_numpy(mask))
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(
            logits, torch.from_numpy(y[batch]), reduction="none") * torch.from_numpy(w[batch]).float()).mean()
        pos, neg = _ranked_pairs(batch, group_of, y)
        if rank_weight and pos:
            margin = logits[torch.tensor(pos)] - logits[torch.tensor(neg)]
            loss = loss + rank_weight * torch.nn.functional.softplus(-margin).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(top.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        since += 1
        running += loss.item()
        if step % 200 == 0:
            log(f"epoch {step * epochs // total + 1} step {step}/{total}: loss {running / since:.4f} "
                f"({(time.perf_counter() - t0) / since:.2f} s/step)")
            running, since, t0 = 0.0, 0, time.perf_counter()
        if time.perf_counter() - last_save > checkpoint_seconds:
            save()
            last_save = time.perf_counter()
    save()
    top.eval()
    return total


def _ranked_pairs(batch: Sequence[int], group_of: np.ndarray, y: np.ndarray) -> tuple[list[int], list[int]]:
    """Positions in ``batch`` of (entailed, not entailed) pairs of one group."""
    by: dict[int, tuple[list[int], list[int]]] = {}
    for row, i in enumerate(batch):
        if group_of[i] >= 0:
            by.setdefault(int(group_of[i]), ([], []))[0 if y[i] else 1].append(row)
    pos, neg = [], []
    for good, bad in by.values():
        for g in good:
            for b in bad:
                pos.append(g)
                neg.append(b)
    return pos, neg


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


def _cached_states(base, base_path: str, inputs, frozen_layers: int, cache: Path | None, torch, log):
    """The bottom states, read from the folder ``cache`` when it holds those of exactly these
    inputs (memory-mapped: a resumed run neither recomputes nor loads them whole), else
    computed and written there."""
    key = hashlib.sha256(json.dumps([frozen_layers, inputs]).encode()).hexdigest()[:16]
    if cache is not None and (cache / "key.txt").is_file() and (cache / "key.txt").read_text() == key:
        flat = np.load(cache / "states.npy", mmap_mode="r")
        ends = np.load(cache / "ends.npy")
        log(f"bottom states read from {cache}")
        return np.split(flat, ends[:-1])
    t0 = time.perf_counter()
    states = _bottom_states(base, base_path, inputs, frozen_layers, torch, log)
    log(f"bottom {frozen_layers} layers for {len(inputs)} pairs: {time.perf_counter() - t0:.0f} s")
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "key.txt").unlink(missing_ok=True)
        ends = np.cumsum([len(x) for x in states])
        flat = np.lib.format.open_memmap(cache / "states.npy", mode="w+", dtype=np.float16,
                                         shape=(int(ends[-1]), states[0].shape[1]))
        for state, end in zip(states, ends):
            flat[end - len(state):end] = state
        flat.flush()
        del flat
        np.save(cache / "ends.npy", ends)
        (cache / "key.txt").write_text(key)
    return states


def choose_threshold(entailed: np.ndarray, not_entailed: np.ndarray) -> dict:
    """The probability threshold that best separates a validation set's entailed pairs from its
    not-entailed ones (the highest balanced accuracy, midway between neighbouring scores), and
    what it gives: the share of entailed pairs passed, of not-entailed ones caught, and of
    (entailed, not entailed) twins ordered, when the two arrays are twins in order."""
    scores = np.unique(np.concatenate([entailed, not_entailed]))
    cuts = np.concatenate([[0.0], (scores[1:] + scores[:-1]) / 2, [1.0]])
    passed = np.array([(entailed >= c).mean() for c in cuts])
    caught = np.array([(not_entailed < c).mean() for c in cuts])
    best = int(np.argmax(passed + caught))
    out = {"threshold": round(float(cuts[best]), 6), "passed": round(float(passed[best]), 4),
           "caught": round(float(caught[best]), 4), "n_entailed": int(len(entailed)),
           "n_not_entailed": int(len(not_entailed))}
    if len(entailed) == len(not_entailed):
        out["ordered"] = round(float((entailed > not_entailed).mean()), 4)
    return out


#: The share of a validation set's faithful rewrites a confident veto may fail (:func:`confident_veto`).
CONFIDENT_REWRITE_FAILURES = 0.005


def confident_veto(entailed: np.ndarray, not_entailed: np.ndarray, failures: float = CONFIDENT_REWRITE_FAILURES) -> dict:
    """The probability below which the cross-encoder is confident a claim is not entailed: the
    highest cut that fails at most ``failures`` of the validation's entailed pairs (faithful
    rewrites), and the share of not-entailed ones (one-word edits) it catches. The judge's veto
    sits there: it overrules the support model only where it almost never fails a faithful
    rewrite, so what the support model ranks well elsewhere stays ranked (leave-one-source-out on
    human labels, a veto at the balanced threshold cost 0.05 AUROC; one at this cut none)."""
    ordered = np.sort(np.asarray(entailed, dtype=np.float64))
    cut = float(ordered[int(np.floor(failures * len(ordered)))])
    return {"veto": round(cut, 6), "rewrites_failed": round(float((ordered < cut).mean()), 4),
            "edits_caught": round(float((np.asarray(not_entailed) < cut).mean()), 4), "rule": (
                f"the highest P(entailed) that fails at most {failures:.1%} of the validation's faithful rewrites")}


def validate(path: str | Path, pairs: Sequence[EntailmentPair], model: str = "minilm-l6") -> dict:
    """The artifact at ``path``, run as the judge runs it (numpy), on validation pairs of
    rewrite/edit twins: :func:`choose_threshold` of its probabilities, and per edit kind the
    share caught at that threshold; and the :func:`confident_veto` cut, which the judge's veto uses."""
    from mlflow_rag_eval.judges.local_model.cross_encoder import CrossEncoder

    encoder = CrossEncoder(path, model)
    probs = encoder.entailment([(p.claim, p.premise) for p in pairs])
    by_group: dict[int, dict[int, float]] = defaultdict(dict)
    kinds: dict[int, str] = {}
    for p, prob in zip(pairs, probs):
        by_group[p.group][p.label] = float(prob)
        if p.label == 0:
            kinds[p.group] = p.kind
    twins = [g for g, v in by_group.items() if 0 in v and 1 in v]
    good = np.array([by_group[g][1] for g in twins])
    bad = np.array([by_group[g][0] for g in twins])
    out = choose_threshold(good, bad)
    per_kind: dict[str, list[bool]] = defaultdict(list)
    for g, b in zip(twins, bad):
        per_kind[kinds[g]].append(bool(b < out["threshold"]))
    out["caught_by_kind"] = {k: round(float(np.mean(v)), 3) for k, v in sorted(per_kind.items())}
    out["confident"] = confident_veto(good, bad)
    return out


def _first_windows(base, pairs: Sequence[EntailmentPair], max_claim: int, max_premise: int) -> list:
    """Each pair's first (claim window, premise window) input, as the judge builds it."""
    cls, sep = base.tokenizer.token_to_id("[CLS]"), base.tokenizer.token_to_id("[SEP]")

    def ids(text):
        return base.tokenizer.encode(text.lower() if base.lower_case else text, add_special_tokens=False).ids

    return [pair_windows(ids(p.claim), ids(p.premise), cls=cls, sep=sep, max_claim=max_claim,
                         max_premise=max_premise)[0][0] for p in pairs]


def _training_record(pairs: Sequence[EntailmentPair], digest: str, steps: int, selection, torch) -> dict:
    """What the artifact's JSON records of its pairs and of the machine that trained it."""
    return {
        "n_pairs": len(pairs), "pairs_digest": digest, "steps": steps,
        "groups": len({p.group for p in pairs if p.group >= 0}),
        "sources": {s: {"pairs": n, "entailed": sum(1 for p in pairs if p.source == s and p.label)}
                    for s, n in sorted(Counter(p.source for p in pairs).items())},
        "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
        "selection": selection,
    }


def train_cross_encoder(pairs: Sequence[EntailmentPair], out: str | Path, *, model: str = "minilm-l6",
                        frozen_layers: int = 3, epochs: int = 3, batch_size: int = 32, lr: float = 1e-4,
                        head_lr: float = 1e-3, dropout: float = 0.1, rank_weight: float = 1.0,
                        max_claim_tokens: int = 64, max_premise_tokens: int = 128, seed: int = 0,
                        threads: int | None = None, start_from: str | Path | None = None,
                        selection: dict | None = None, validation: Sequence[EntailmentPair] = (),
                        work_dir: str | Path | None = None, checkpoint_seconds: float = 600.0, log=print) -> dict:
    """Fine-tune the top layers of ``model`` and a head on ``pairs``; write the artifact at ``out``
    (``.safetensors``, with ``.json`` beside it) and return what the JSON records.

    ``start_from``: a cross-encoder artifact to continue from (its top layers and head, its
    frozen layers and lengths) instead of the base model's own top layers and a new head.
    ``selection``: how ``pairs`` were chosen from their files (recorded as it is).
    ``validation``: rewrite/edit twins (pairs sharing a ``group``) the threshold is chosen on
    (:func:`validate`), recorded in the JSON.
    ``work_dir``: where the bottom states and the checkpoints are kept (every ~10 minutes); a
    run started again with the same inputs and ``work_dir`` resumes where the last one stopped.
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
    work = Path(work_dir) if work_dir else None
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads or base.workers)
    try:
        torch.manual_seed(seed)
        inputs = _first_windows(base, pairs, max_claim_tokens, max_premise_tokens)
        states = _cached_states(base, base_path, inputs, frozen_layers, work / "bottom_states" if work else None,
                                torch, log)
        top = _torch_modules(torch)(len(base.layers) - frozen_layers, base.words.shape[1], base.heads,
                                    base.layers[0].up.shape[1], base.eps, dropout)
        _start_top(top, base_path, frozen_layers, start_from, torch)
        digest = pairs_digest(pairs)
        steps = _fit(top, states, np.array([p.label for p in pairs], dtype=np.float32), _weights(pairs),
                     [p.group for p in pairs], epochs=epochs, batch_size=batch_size, lr=lr, head_lr=head_lr,
                     rank_weight=rank_weight, seed=seed, torch=torch, log=log,
                     checkpoint=work / f"checkpoint-{digest}-{seed}.pt" if work else None,
                     checkpoint_seconds=checkpoint_seconds)
        out = Path(out)
        write_safetensors(out, _export(top, frozen_layers))
        meta = {
            "schema_version": 2, "base_model": model, "base_model_sha256": model_files_sha256(base_path),
            "frozen_layers": frozen_layers, "max_claim_tokens": max_claim_tokens,
            "max_premise_tokens": max_premise_tokens, "dtype": "float16",
            "training": {
                **_training_record(pairs, digest, steps, selection, torch), "epochs": epochs,
                "batch_size": batch_size, "lr": lr, "head_lr": head_lr, "dropout": dropout,
                "rank_weight": rank_weight, "seed": seed, "seconds": round(time.perf_counter() - started),
                "started_from": started_from,
            },
        }
        out.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        if validation:
            meta["validation"] = {"pairs_digest": pairs_digest(validation), **validate(out, validation, model)}
            out.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
            v = meta["validation"]
            log(f"validation: threshold {v['threshold']:.3f}, {v['passed']:.1%} of rewrites passed, "
                f"{v['caught']:.1%} of edits caught, {v.get('ordered', 0):.1%} ordered")
        log(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {meta['training']['seconds']} s")
        return meta
    finally:
        torch.set_num_threads(saved_threads)
