"""The numpy encoder computes what sentence-transformers computes, without torch.

sentence-transformers (the ``[train]`` extra, installed by ``make test``) is the reference: the
same vectors to float32 noise on the repository's own texts, truncation at the same token,
vectors that do not depend on the batch, and a judge process that never imports torch.
"""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from mlflow_rag_eval.judges.local_model import embedding
from mlflow_rag_eval.judges.local_model import encoder as encoder_module
from mlflow_rag_eval.judges.local_model.embedding import Embedder, load_model, resolve_model_path
from mlflow_rag_eval.judges.local_model.encoder import BertEncoder, numpy_problem, read_safetensors
from mlflow_rag_eval.judges.providers.local import LocalJudge

ROOT = Path(__file__).resolve().parents[3]
MINILM = resolve_model_path("minilm-l6")
HEAVY = ("torch", "transformers", "sentence_transformers")


def _repo_texts() -> list[str]:
    """A few hundred texts of the repository's data: passages, questions, answers, long articles."""
    data = ROOT / "examples" / "rag_pipeline" / "data"
    texts = [json.loads(line)["text"] for line in (data / "corpus.jsonl").read_text().splitlines()]
    for line in (data / "golden.jsonl").read_text().splitlines():
        row = json.loads(line)
        texts += [row["question"], row["reference"]]
    for line in (ROOT / "training_data" / "northwind_pairs.jsonl").read_text().splitlines():
        texts.append(json.loads(line)["answer"])
    with gzip.open(ROOT / "training_data" / "summedits_dev.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for _, line in zip(range(60), f)]
    texts += [r["answer"] for r in rows] + [r["context"] for r in rows[:20]]  # contexts: past 256 tokens
    return list(dict.fromkeys(t for t in texts if t))


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers on the shipped MiniLM: what the judge computed before."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(MINILM, device="cpu")


@pytest.fixture(scope="module")
def encoder():
    return BertEncoder(MINILM)


def test_vectors_equal_sentence_transformers_on_the_repository_texts(reference, encoder):
    texts = _repo_texts()
    assert len(texts) >= 250
    ours = encoder.encode(texts)
    theirs = reference.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == theirs.shape == (len(texts), 384) and ours.dtype == np.float32
    assert np.abs(ours - theirs).max() < 1e-5
    assert (ours * theirs).sum(axis=1).min() >= 0.99999


def test_long_inputs_are_cut_at_the_same_token(reference, encoder):
    long = " ".join(f"word{i} fare{i % 7}" for i in range(400))
    ours = encoder.tokenize([long, "short text"])
    theirs = reference.tokenize([long, "short text"])["input_ids"]
    assert len(ours[0]) == reference.max_seq_length == 256
    assert ours[0] == theirs[0].tolist()
    assert ours[1] == [t for t in theirs[1].tolist() if t != 0]
    # what lies past the cut changes nothing
    assert np.array_equal(encoder.encode([long]), encoder.encode([long + " more words at the end"]))


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_a_vector_does_not_depend_on_its_batch_mates(encoder, monkeypatch):
    monkeypatch.setattr(encoder_module, "_ONE_PRODUCT", {})  # each shape's first product compares both ways
    texts = _repo_texts()[:80]
    together = encoder.encode(texts)
    alone = np.stack([encoder.encode([t])[0] for t in texts[:12]])
    reordered = encoder.encode(texts[::-1])[::-1]
    again = encoder.encode(texts)  # every shape decided: one product wherever this BLAS allows it
    assert np.array_equal(_bits(together[:12]), _bits(alone))  # the same bits, not only to 1e-6
    assert np.array_equal(_bits(together), _bits(reordered))
    assert np.array_equal(_bits(together), _bits(again))


def _rows_dependent_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A BLAS whose sums depend on the number of rows (as OpenBLAS's did on one CI machine):
    past 40 rows, every value is one float32 step away from what fewer rows give."""
    out = x @ w
    return np.nextafter(out, np.float32(np.inf)) if x.shape[0] > 40 else out


@pytest.mark.parametrize("blas", ["this machine's", "rows-dependent"])
def test_a_step_takes_one_product_only_where_it_gives_each_input_its_own_bits(monkeypatch, blas):
    monkeypatch.setattr(encoder_module, "_ONE_PRODUCT", {})
    if blas == "rows-dependent":
        monkeypatch.setattr(encoder_module, "_one_product", _rows_dependent_product)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((384, 1536)).astype(np.float32)
    for inputs, length in ((2, 3), (23, 22), (4, 128), (64, 8)):
        x = rng.standard_normal((inputs * length, 384)).astype(np.float32)
        own = np.concatenate([x[i * length:(i + 1) * length] @ w for i in range(inputs)])
        for _ in range(2):  # the first sight of the shape decides it, the second takes the decision
            assert np.array_equal(_bits(encoder_module._per_input(x, w, inputs)), _bits(own)), (inputs, length)
        if blas == "rows-dependent" and inputs * length > 40:  # found out, and one product per input kept
            assert encoder_module._ONE_PRODUCT[(384, 1536, inputs * length, inputs)] is False


def _tiny_bert_folder(root: Path) -> Path:
    """A BERT of another size, weights under ``bert.``, CLS pooling, half precision on disk."""
    from safetensors.numpy import save_file

    root.mkdir()
    rng = np.random.default_rng(0)
    hidden, inter, layers, vocab = 64, 128, 2, 30522
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
              "max_position_embeddings": 128, "type_vocab_size": 2, "vocab_size": vocab,
              "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0}
    (root / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (root / name).write_bytes((Path(MINILM) / name).read_bytes())
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32, "do_lower_case": False}))
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float16)

    tensors = {"bert.embeddings.word_embeddings.weight": w(vocab, hidden),
               "bert.embeddings.position_embeddings.weight": w(128, hidden),
               "bert.embeddings.token_type_embeddings.weight": w(2, hidden),
               "bert.embeddings.LayerNorm.weight": 1 + w(hidden), "bert.embeddings.LayerNorm.bias": w(hidden)}
    for i in range(layers):
        p = f"bert.encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            tensors[f"{p}{name}.weight"], tensors[f"{p}{name}.bias"] = w(hidden, hidden), w(hidden)
        tensors[f"{p}intermediate.dense.weight"], tensors[f"{p}intermediate.dense.bias"] = w(inter, hidden), w(inter)
        tensors[f"{p}output.dense.weight"], tensors[f"{p}output.dense.bias"] = w(hidden, inter), w(hidden)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[f"{p}{ln}.weight"], tensors[f"{p}{ln}.bias"] = 1 + w(hidden), w(hidden)
    save_file(tensors, str(root / "model.safetensors"))
    return root


def test_another_bert_folder_loads_the_same_way(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    folder = str(_tiny_bert_folder(tmp_path / "tiny"))
    assert numpy_problem(folder) is None
    texts = ["A bike ticket costs 5 euros.", "Trains leave Halden Central every hour. " * 10, "x"]
    ours = BertEncoder(folder).encode(texts)
    # in float32, as ours (half-precision weights would otherwise run in float16 there)
    theirs = sentence_transformers.SentenceTransformer(folder, device="cpu", model_kwargs={"dtype": "float32"}).encode(
        texts, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == (3, 64) and np.abs(ours - theirs).max() < 1e-5


def test_safetensors_are_read_by_dtype(tmp_path):
    values = np.array([[1.5, -2.25], [0.0, 3.0]], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # exact: these fit bf16
    header = json.dumps({"b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                         "h": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]},
                         "__metadata__": {"format": "pt"}}).encode()
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bf16 + np.array([0.5, -1], "<f2").tobytes())
    tensors = read_safetensors(path)
    assert np.array_equal(tensors["b"], values) and tensors["b"].dtype == np.float32
    assert tensors["h"].tolist() == [0.5, -1.0] and set(tensors) == {"b", "h"}


def test_a_model_without_a_bert_folder_names_the_extra_when_sentence_transformers_is_missing(monkeypatch):
    monkeypatch.setattr(embedding, "_MODELS", {})
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError) as raised:
        load_model("sentence-transformers/all-mpnet-base-v2")
    message = str(raised.value)
    assert "\n" not in message and "not a local folder" in message and "mlflow-rag-eval[train]" in message


def test_the_fingerprint_records_the_engine_and_is_the_same_in_every_process(monkeypatch):
    code = "from mlflow_rag_eval.judges.providers.local import LocalJudge; print(LocalJudge().info().fingerprint)"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           check=True).stdout.strip() for _ in range(2)}
    info = LocalJudge().info()
    assert runs == {info.fingerprint} and info.params["engine"] == "numpy"
    monkeypatch.setattr(Embedder, "engine", property(lambda self: "sentence-transformers"))
    assert LocalJudge().info().fingerprint != info.fingerprint


def test_a_local_judge_evaluation_imports_no_torch():
    code = textwrap.dedent(
        f"""
        import sys
        import pandas as pd
        from mlflow_rag_eval.evaluation.engine import evaluate_records
        from mlflow_rag_eval.judges.providers.local import LocalJudge
        from mlflow_rag_eval.records import records_from_frame

        frame = pd.DataFrame({{
            "question": ["How much does a bike ticket cost?"],
            "answer": ["A bike ticket costs 5 euros."],
            "contexts": [[{{"id": "p1", "text": "Bikes travel for a flat fare of 5 euros."}}]],
            "reference": ["5 euros."],
        }})
        result = evaluate_records(records_from_frame(frame), ["faithfulness", "answer_relevancy"], LocalJudge(),
                                  progress=False)
        assert all(m.summary.n_error == 0 for m in result.metrics)
        print([m for m in {HEAVY!r} if m in sys.modules])
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_concurrent_encodings_leave_the_callers_blas_threads_as_they_were(encoder):
    from threadpoolctl import threadpool_info

    def blas_threads():
        return sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    before = blas_threads()
    barrier = threading.Barrier(4)
    errors = []

    def work(n):
        try:
            barrier.wait(10)
            for _ in range(3):
                encoder.encode([f"text number {n} {'long ' * (n * 40)}", "short"])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and blas_threads() == before


def _blas_threads_seen_here() -> list[int]:
    """numpy's BLAS (the wheel's, under numpy.libs): other BLAS libraries that later imports load
    (scipy's, torch's) do not run the encoder's products."""
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    return sorted(i["num_threads"] for i in blas if "numpy" in i["filepath"]) or sorted(i["num_threads"] for i in blas)


def test_an_encoding_called_from_a_worker_thread_runs_its_blas_on_one_thread_there():
    """MLflow's harness and our engine call the judge from worker threads. threadpoolctl lets only
    the first thread that set OpenBLAS's limit set it again: after the main thread had encoded,
    a worker's limit did nothing, and its forward pass ran beside a spinning BLAS thread, 1.8x
    slower than the same encode on the main thread."""
    from mlflow_rag_eval.judges.local_model.encoder import one_blas_thread

    with one_blas_thread():  # the main thread limits first, as an encode at start-up does
        pass
    seen = {}

    def in_a_worker():
        seen["before"] = _blas_threads_seen_here()
        with one_blas_thread():
            seen["inside"] = _blas_threads_seen_here()
        seen["after"] = _blas_threads_seen_here()

    worker = threading.Thread(target=in_a_worker)
    worker.start()
    worker.join(60)
    assert seen["inside"] == [1] * len(seen["inside"]) and seen["inside"]
    assert seen["after"] == seen["before"]



def test_a_blas_without_openblas_calls_is_limited_through_threadpoolctl_and_restored(monkeypatch):
    """MKL, BLIS or an OpenBLAS without the C calls: threadpoolctl sets them, and the count is
    the caller's again after the encoding."""
    from mlflow_rag_eval.judges.local_model import encoder as module

    monkeypatch.setattr(module, "_openblas_calls", lambda filepath: None)
    before = _blas_threads_seen_here()
    with module.one_blas_thread():
        inside = _blas_threads_seen_here()
    assert inside == [1] * len(inside) and inside
    assert _blas_threads_seen_here() == before
