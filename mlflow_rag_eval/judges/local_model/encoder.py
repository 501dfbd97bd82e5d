"""A BERT sentence encoder in numpy: the embedded judge's forward pass without torch.

sentence-transformers runs all-MiniLM-L6-v2 through torch and transformers, which cost a GB of
install and seconds of import for a 22M-parameter model. This module reads the same folder (the
``model.safetensors`` weights, ``tokenizer.json`` through the Rust ``tokenizers`` package, the
pooling and sequence-length settings) and computes what sentence-transformers computes:
tokens truncated at ``max_seq_length``, the BERT encoder, pooling over the attention mask, unit
rows. Results agree with sentence-transformers to float32 noise (about 1e-7).

Texts are grouped by token count, so a batch holds texts of one length (no padding), and every
text's rows get the bits of their own product (:func:`_per_input`): a text's vector is the same
bits whatever its batch mates.
numpy's BLAS runs with the threads it chose from the machine; nothing global is changed.

:func:`numpy_problem` says, from the folder's small JSON files alone, whether a folder is one
this encoder runs (any sentence-transformers folder of BERT architecture with safetensors
weights and a fast tokenizer); the loader sends the others to sentence-transformers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mlflow_rag_eval._util.text import readable_prefix

__all__ = ["CHARS_PER_TOKEN", "ENGINE", "TOKENS_PER_STEP", "BertEncoder", "numpy_problem", "one_blas_thread",
           "plan_steps", "read_safetensors", "run_steps"]

#: The name the judge's fingerprint records for this forward pass.
ENGINE = "numpy"

_POOLING_MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens")  # sentence-transformers' order
_MODULES = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize"}
#: Padded tokens per forward step. Bigger steps make arrays of tens of MB per operation, out of
#: the caches and page-faulted in again each time: 512 measured 1.3-1.5x faster than 2048, 2x than 4096.
TOKENS_PER_STEP = 512
#: float32 values in one working block of the elementwise passes (512 KB: inside a core's L2).
_CACHE_FLOATS = 1 << 17
#: Characters read per token the model can take: a WordPiece token of real text spans a few
#: characters (English about 4, CJK 1), so 16 per token gives the tokenizer several times the
#: tokens ``max_seq_length`` keeps. Only a text whose first ``16 x max_seq_length`` characters
#: make fewer tokens than that (a single word thousands of characters long, a run of
#: thousands of spaces) is read no further.
CHARS_PER_TOKEN = 16
_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


_BLAS_LOCK = threading.Lock()
_BLAS_STATE: dict = {"users": 0}
_OPENBLAS_AFFIXES = [(p, x) for p in ("", "scipy_") for x in ("", "64_", "_64")]  # as its builds export them


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _openblas_calls(filepath: str) -> tuple | None:
    """OpenBLAS's own ``openblas_get_num_threads`` / ``openblas_set_num_threads`` in that library."""
    import ctypes

    handle = ctypes.CDLL(filepath)  # the library numpy loaded: dlopen hands back the same one
    for prefix, suffix in _OPENBLAS_AFFIXES:
        get, put = (getattr(handle, f"{prefix}openblas_{f}_num_threads{suffix}", None) for f in ("get", "set"))
        if get is not None and put is not None:
            get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
            return get, put
    return None


def _limit_blas() -> list:
    """The BLAS libraries loaded at the first encode (numpy's among them, loaded with numpy) on one
    thread; returns what :func:`_restore_blas` needs to undo it.

    OpenBLAS with its own threads is set through its C API directly. threadpoolctl (3.8+) lets
    only the first thread that ever set OpenBLAS's limit set it again and makes the others' calls
    silent no-ops: a limit taken from a worker thread (where the harness and our engine call the
    judge) did nothing after one from the main thread, and the forward pass ran beside a
    spinning BLAS thread at 1.8x the wall time. Other BLAS libraries keep threadpoolctl.
    """
    from threadpoolctl import ThreadpoolController

    if "controller" not in _BLAS_STATE:
        _BLAS_STATE["controller"] = ThreadpoolController().select(user_api="blas")
    saved = []
    for library in _BLAS_STATE["controller"].lib_controllers:
        calls = None
        if library.internal_api == "openblas" and getattr(library, "threading_layer", "") != "openmp":
            calls = _openblas_calls(library.filepath)
        if calls is not None:
            get, put = calls
            saved.append((put, get()))
            put(1)
        else:
            saved.append((None, _BLAS_STATE["controller"].select(filepath=library.filepath).limit(limits=1)))
    return saved


def _restore_blas(saved: list) -> None:
    for put, before in saved:
        if put is not None:
            put(before)
        else:
            before.restore_original_limits()


@contextlib.contextmanager
def one_blas_thread():
    """numpy's BLAS on one thread while an encoding runs, as it was before once the last one ends.

    The encoder runs its steps on one Python thread per core instead: OpenBLAS's own threads
    spin between the many small matrix products of a forward pass and, on a busy machine, took
    the cores from the elementwise work (measured 3-6x slower than one thread). The limit is
    counted, so concurrent encodings (MLflow's scorer threads) restore the caller's setting
    only when the last of them ends, from whichever thread that is; it never outlives an
    ``encode`` call. See :func:`_limit_blas` for how it is set.
    """
    with _BLAS_LOCK:
        if _BLAS_STATE["users"] == 0:
            _BLAS_STATE["saved"] = _limit_blas()
        _BLAS_STATE["users"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_STATE["users"] -= 1
            if _BLAS_STATE["users"] == 0:
                _restore_blas(_BLAS_STATE.pop("saved"))


def plan_steps(lengths: list[int], batch_size: int, tokens_per_step: int) -> list[list[int]]:
    """Indices of inputs grouped into forward steps, longest first: each step holds inputs of one
    length (no padding), at most ``batch_size`` of them and about ``tokens_per_step`` tokens.

    With no padding and each input's rows the bits of its own product (:func:`_per_input`), an
    input's result is the same bits alone and in any step: a row judged alone (the genai route)
    scores as in a batch."""
    by_length: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        by_length.setdefault(lengths[i], []).append(i)
    steps = []
    for length, group in by_length.items():
        size = max(1, min(batch_size, tokens_per_step // max(1, length)))
        steps += [group[start:start + size] for start in range(0, len(group), size)]
    return steps


def run_steps(steps: list[list[int]], run, out: np.ndarray | None, workers: int, name: str) -> None:
    """``run(step)`` for every step, one step per core at a time with numpy's BLAS on one thread
    (see :func:`one_blas_thread`); each step's result goes to ``out[step]`` (None: kept nowhere)."""
    workers = min(workers, len(steps))
    with one_blas_thread():
        if workers > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
                for step, values in zip(steps, pool.map(run, steps)):
                    if out is not None:
                        out[step] = values
        else:
            for step in steps:
                values = run(step)
                if out is not None:
                    out[step] = values


def _json(path: Path) -> dict | list | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _pooling_folder(root: Path) -> Path | None:
    """The Pooling module's folder named by modules.json (None: no modules.json, mean pooling)."""
    modules = _json(root / "modules.json")
    if modules is None:
        return None
    return next(root / m.get("path", "") for m in modules if m["type"].endswith(".Pooling"))


def numpy_problem(path: str) -> str | None:
    """Why this encoder cannot run the model at ``path``, or None when it can (reads only the
    folder's JSON files: cheap enough for a fingerprint)."""
    root = Path(path)
    if not root.is_dir():
        return "not a local folder"
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not (root / name).is_file():
            return f"no {name}"
    config = _json(root / "config.json")
    if config.get("model_type") != "bert":
        return f"model_type {config.get('model_type')!r} is not bert"
    if config.get("hidden_act", "gelu") not in _ACTIVATIONS:
        return f"activation {config.get('hidden_act')!r}"
    if config.get("position_embedding_type", "absolute") != "absolute":
        return f"position embeddings {config.get('position_embedding_type')!r}"
    modules = _json(root / "modules.json")
    if modules is not None:
        other = sorted({m["type"] for m in modules} - _MODULES)
        if other:
            return f"modules {', '.join(other)}"
        if not any(m["type"].endswith(".Pooling") for m in modules):
            return "no Pooling module"
        pooling = _json(_pooling_folder(root) / "config.json") or {}
        used = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
        unknown = [k for k in used if k.removeprefix("pooling_mode_") not in _POOLING_MODES]
        if unknown or not used:
            return f"pooling {', '.join(unknown) or 'none'}"
    return None


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file as numpy arrays (float ones as float32).

    The format: an 8-byte little-endian header length, a JSON header naming each tensor's
    dtype, shape and byte range, then the raw little-endian data. Read here so that no torch
    (and no extra package) is needed; bf16 is widened to float32 by its bit pattern.
    """
    data = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    base = 8 + size
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        raw = data[base + start:base + end]
        if spec["dtype"] == "BF16":
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif spec["dtype"] in _DTYPES:
            array = np.frombuffer(raw, dtype=np.dtype(_DTYPES[spec["dtype"]]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {spec['dtype']}, which the numpy encoder does not read")
        array = array.reshape(spec["shape"])
        out[name] = array.astype(np.float32) if array.dtype.kind == "f" else array
    return out


def _per_input(x: np.ndarray, w: np.ndarray, inputs: int) -> np.ndarray:
    """``x @ w`` for the rows of ``inputs`` equal-length inputs, each input's rows the bits of
    its own product: an input gets the same vector alone and in any batch (issue 38's batch
    independence, exact).

    A BLAS may sum a row's products in an order that depends on the number of rows (OpenBLAS
    did, up to 4e-5 apart, on a machine CI ran on; on this one only a one-row product differs),
    and numpy's stacked matmul calls BLAS once per input, which is exact everywhere but slow on
    short inputs (a 22-row product ran at 46 GFLOP/s against 145 for 512 rows). So the first
    product of each shape (the weight's, the rows, the inputs) is computed both ways and
    compared bit for bit; where one product over all the rows gives every input's rows the same
    bits, that shape takes one product from then on, else one per input (:data:`_ONE_PRODUCT`).
    """
    key = (w.shape[0], w.shape[1], x.shape[0], inputs)
    exact = _ONE_PRODUCT.get(key) if inputs > 1 else False
    if exact:
        return _one_product(x, w)
    each = np.matmul(x.reshape(inputs, -1, x.shape[1]), w).reshape(x.shape[0], w.shape[1])
    if exact is None:
        whole = _one_product(x, w)
        _ONE_PRODUCT[key] = np.array_equal(each.view(np.uint32), whole.view(np.uint32))
    return each


def _one_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w`` as one BLAS product over all of ``x``'s rows."""
    return x @ w


#: (inner size, outputs, rows, inputs) of a product -> whether one BLAS product over all the
#: rows gives the bits of one product per input (found by :func:`_per_input` on first sight).
#: Bounded: the rows are an input's tokens times the inputs of a step (:data:`TOKENS_PER_STEP`).
_ONE_PRODUCT: dict[tuple[int, int, int, int], bool] = {}


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + eps) * weight + bias


def _add_norm(y: np.ndarray, y_bias: np.ndarray, residual: np.ndarray, weight: np.ndarray, bias: np.ndarray,
              eps: float) -> np.ndarray:
    """layer_norm(y + y_bias + residual), computed in ``y``'s memory a few rows at a time."""
    rows = max(1, _CACHE_FLOATS // y.shape[1])
    for i in range(0, y.shape[0], rows):
        block = y[i:i + rows]
        block += y_bias
        block += residual[i:i + rows]
        block -= block.mean(axis=-1, keepdims=True)
        scale = np.mean(block * block, axis=-1, keepdims=True)
        scale += eps
        np.sqrt(scale, out=scale)
        block /= scale
        block *= weight
        block += bias
    return y


#: erf(z) = z * P(z^2) / Q(z^2) on [-4, 4] (Eigen's float32 rational fit; |error| < 5e-7): 2-3x
#: faster than scipy's scalar erf, and no scipy import on the judge's path.
_ERF_P = tuple(np.float32(c) for c in (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02))
_ERF_Q = tuple(np.float32(c) for c in (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02))


def _polynomial(z2: np.ndarray, coefficients: tuple) -> np.ndarray:
    out = z2 * coefficients[0]
    for c in coefficients[1:]:
        out += c
        out *= z2
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    """x * Phi(x), with erf as torch's default ("gelu") computes it; in place where it can."""
    z = x * np.float32(1 / math.sqrt(2))
    np.clip(z, -4, 4, out=z)
    z2 = z * z
    p = _polynomial(z2, _ERF_P[:-1])
    p += _ERF_P[-1]
    q = _polynomial(z2, _ERF_Q[:-1])
    q += _ERF_Q[-1]
    p *= z
    p /= q
    p += 1.0
    p *= x
    p *= 0.5
    return p


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2 / math.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


_ACTIVATIONS = {"gelu": _gelu, "gelu_new": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh,
                "relu": lambda x: np.maximum(x, 0)}


class _Layer:
    """One transformer block's weights, laid out for ``x @ W``: query, key and value fused."""

    def __init__(self, w: dict[str, np.ndarray], prefix: str):
        def get(name):
            return w[f"{prefix}{name}"]

        self.qkv = np.ascontiguousarray(np.concatenate(
            [get(f"attention.self.{p}.weight") for p in ("query", "key", "value")]).T)
        self.qkv_bias = np.concatenate([get(f"attention.self.{p}.bias") for p in ("query", "key", "value")])
        self.out, self.out_bias = np.ascontiguousarray(get("attention.output.dense.weight").T), \
            get("attention.output.dense.bias")
        self.ln1 = get("attention.output.LayerNorm.weight"), get("attention.output.LayerNorm.bias")
        self.up, self.up_bias = np.ascontiguousarray(get("intermediate.dense.weight").T), get("intermediate.dense.bias")
        self.down, self.down_bias = np.ascontiguousarray(get("output.dense.weight").T), get("output.dense.bias")
        self.ln2 = get("output.LayerNorm.weight"), get("output.LayerNorm.bias")


class BertEncoder:
    """The model of a sentence-transformers BERT folder, run with numpy.

    ``encode`` takes the same ``batch_size`` as sentence-transformers' and returns unit rows.
    The tokenizer is called text by text (not ``encode_batch``): its thread pool would make a
    later ``fork`` print a warning in the caller's process.
    """

    engine = ENGINE

    def __init__(self, path: str):
        from tokenizers import Tokenizer  # Rust, small; imported when a model loads

        problem = numpy_problem(path)
        if problem:
            raise ValueError(f"the numpy encoder cannot run {path}: {problem}")
        root = Path(path)
        config = _json(root / "config.json")
        st_config = _json(root / "sentence_bert_config.json") or {}
        tokenizer_config = _json(root / "tokenizer_config.json") or {}
        self.max_seq_length = int(st_config.get("max_seq_length") or min(
            config.get("max_position_embeddings", 512), tokenizer_config.get("model_max_length", 512)))
        self.lower_case = bool(st_config.get("do_lower_case", False))
        pooling_folder = _pooling_folder(root)
        pooling = (_json(pooling_folder / "config.json") or {}) if pooling_folder else {"pooling_mode_mean_tokens": True}
        self.pooling = [m for m in _POOLING_MODES if pooling.get(f"pooling_mode_{m}")]
        self.tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        self.tokenizer.no_padding()  # tokenizer.json may fix a length; batches are padded here
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.workers = _cores()
        self.act = _ACTIVATIONS[config.get("hidden_act", "gelu")]
        self._load_weights(read_safetensors(root / "model.safetensors"), int(config["num_hidden_layers"]))

    def _load_weights(self, w: dict[str, np.ndarray], n_layers: int) -> None:
        prefix = next((p for p in ("", "bert.", "model.") if f"{p}embeddings.word_embeddings.weight" in w), None)
        if prefix is None:
            raise ValueError("model.safetensors holds no embeddings.word_embeddings.weight")
        self.words = w[f"{prefix}embeddings.word_embeddings.weight"]
        self.positions = w[f"{prefix}embeddings.position_embeddings.weight"]
        types = w.get(f"{prefix}embeddings.token_type_embeddings.weight")
        #: segment embeddings (row 0: a single text; row 1: a pair's second text, for the cross-encoder)
        self.types = types if types is not None else np.zeros((2, self.words.shape[1]), np.float32)
        self.type0 = self.types[0]
        self.ln0 = w[f"{prefix}embeddings.LayerNorm.weight"], w[f"{prefix}embeddings.LayerNorm.bias"]
        self.layers = [_Layer(w, f"{prefix}encoder.layer.{i}.") for i in range(n_layers)]

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids, special tokens included, truncated at ``max_seq_length`` as sentence-transformers does.

        Each text is first cut to what the model can read (:func:`readable_prefix`): the tokenizer
        builds its whole encoding before truncating (1M CJK characters peaked at 913 MiB), and
        the tokens past ``max_seq_length`` are thrown away. Memory and time are now flat in the
        text's length, and the tokens kept are those of the whole text.
        """
        limit = CHARS_PER_TOKEN * self.max_seq_length
        cut = (readable_prefix(t, limit) for t in texts)
        return [self.tokenizer.encode(t.lower() if self.lower_case else t).ids for t in cut]

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Unit-norm embeddings of ``texts``, shape (len(texts), dim), float32.

        Texts go through the model longest first, in steps of at most ``batch_size`` texts of one
        length and :data:`TOKENS_PER_STEP` tokens, one step per core at a time (see :func:`one_blas_thread`).
        """
        ids = self.tokenize(list(texts))
        steps = plan_steps([len(i) for i in ids], batch_size, TOKENS_PER_STEP)

        def embed(chunk: list[int]) -> np.ndarray:
            tokens = np.array([ids[i] for i in chunk], dtype=np.int64)  # one length per step
            mask = np.ones(tokens.shape, dtype=np.float32)
            return self._pool(self._forward(tokens, mask), mask)

        out = np.empty((len(ids), self.words.shape[1] * len(self.pooling)), dtype=np.float32)
        run_steps(steps, embed, out, self.workers, "mlflow-rag-eval-encoder")
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, np.float32(1e-12))

    def _forward(self, tokens: np.ndarray, mask: np.ndarray, types: np.ndarray | None = None,
                 layers: list | None = None, states: np.ndarray | None = None) -> np.ndarray:
        """The hidden states after ``layers`` (default: all of the model's), (batch, width, hidden).

        ``types`` are segment ids (a text pair, for the cross-encoder); ``states`` replaces the
        embedding layer's output with given hidden states, so a stack of layers can continue
        where another stopped (the cross-encoder's fine-tuned top over the shared bottom).
        """
        b, n = tokens.shape
        d = self.words.shape[1]
        h, dh = self.heads, d // self.heads
        if states is not None:
            x = np.ascontiguousarray(states, dtype=np.float32).reshape(b * n, d)
        else:
            segment = self.type0 if types is None else self.types[types]
            x = _layer_norm(self.words[tokens] + self.positions[:n] + segment, *self.ln0, self.eps).reshape(b * n, d)
        # A padded key gets -1e30: its weight after softmax is exactly 0, as with torch's mask.
        key_bias = None if mask.all() else np.repeat(((1.0 - mask) * np.float32(-1e30))[:, None, :], h, axis=0)
        scale = np.float32(1 / math.sqrt(dh))
        # Heads are attended to a few at a time, so that each group's scores stay in the core's
        # cache through the softmax's passes (as the GELU and add+norm blocks below: together,
        # 256-token texts 0.73x -> 0.8x sentence-transformers' speed; one GELU 6.8 -> 4.5 ms).
        group = max(1, _CACHE_FLOATS // (n * n))
        for layer in self.layers if layers is None else layers:
            # Contiguous per-head operands: numpy's stacked matmul on strided views skips BLAS (~100x slower).
            qkv = (_per_input(x, layer.qkv, b) + layer.qkv_bias).reshape(b, n, 3, h, dh)
            query = np.ascontiguousarray((qkv[:, :, 0] * scale).transpose(0, 2, 1, 3)).reshape(b * h, n, dh)
            key_t = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 3, 1)).reshape(b * h, dh, n)
            value = np.ascontiguousarray(qkv[:, :, 2].transpose(0, 2, 1, 3)).reshape(b * h, n, dh)
            context = np.empty((b * h, n, dh), dtype=np.float32)
            for i in range(0, b * h, group):
                scores = query[i:i + group] @ key_t[i:i + group]
                if key_bias is not None:
                    scores += key_bias[i:i + group]
                scores -= scores.max(axis=-1, keepdims=True)
                np.exp(scores, out=scores)
                # Normalised after the product: the division runs over n x dh values, not n x n.
                np.divide(scores @ value[i:i + group], scores.sum(axis=-1, keepdims=True), out=context[i:i + group])
            context = context.reshape(b, h, n, dh).transpose(0, 2, 1, 3).reshape(b * n, d)
            x = _add_norm(_per_input(context, layer.out, b), layer.out_bias, x, *layer.ln1, self.eps)
            x = _add_norm(self._feed_forward(layer, x, b), layer.down_bias, x, *layer.ln2, self.eps)
        return x.reshape(b, n, d)

    def _feed_forward(self, layer: _Layer, x: np.ndarray, inputs: int) -> np.ndarray:
        """down(act(up(x))), the activation over a few rows at a time (the cache, as above)."""
        up = _per_input(x, layer.up, inputs) + layer.up_bias
        rows = max(1, _CACHE_FLOATS // up.shape[1])
        for i in range(0, up.shape[0], rows):
            up[i:i + rows] = self.act(up[i:i + rows])
        return _per_input(up, layer.down, inputs)

    def _pool(self, states: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """sentence-transformers' Pooling: the configured modes side by side, in its order."""
        weights = mask[:, :, None]
        counts = np.maximum(weights.sum(axis=1), np.float32(1e-9))
        parts = []
        for mode in self.pooling:
            if mode == "cls_token":
                parts.append(states[:, 0])
            elif mode == "max_tokens":
                parts.append(np.where(weights > 0, states, np.float32(-1e9)).max(axis=1))
            else:
                summed = (states * weights).sum(axis=1)
                parts.append(summed / (counts if mode == "mean_tokens" else np.sqrt(counts)))
        return np.concatenate(parts, axis=1)
