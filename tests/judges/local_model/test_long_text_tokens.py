"""Tokenization is bounded: a text is cut to what the model can read before the tokenizer sees
it, and the tokens kept are those of the whole text (issue 38: 1M CJK characters peaked at
913 MiB, 4M at 2,764 MiB, all but 256 tokens thrown away; bench/long_text_memory.py)."""

from __future__ import annotations

import pytest

from mlflow_rag_eval._util.text import readable_prefix
from mlflow_rag_eval.judges.local_model.embedding import Embedder, load_model
from mlflow_rag_eval.judges.local_model.encoder import CHARS_PER_TOKEN

ENGLISH = "The bike ticket costs five euros on every regional train, weekends included. "
CJK = "自行车票在所有地区列车上的价格为五欧元。"
TEXTS = {
    "english": ENGLISH * 1_400,  # 100k characters
    "cjk": CJK * 5_000,
    "mixed, no spaces": ("価格abc12€" + "ﬃ㍿") * 10_000,  # ligatures and squared words expand under NFKC
    "long words": " ".join(["antidisestablishmentarianism-supercalifragilistic"] * 3_000),
}


@pytest.fixture(scope="module")
def encoder():
    return load_model(Embedder().path)


class Recording:
    """The real tokenizer, recording the length of each text it is given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.lengths = tokenizer, []

    def encode(self, text, *args, **kwargs):
        self.lengths.append(len(text))
        return self.tokenizer.encode(text, *args, **kwargs)


@pytest.mark.parametrize("name", list(TEXTS))
def test_the_tokens_kept_are_those_of_the_whole_text(encoder, name):
    text = TEXTS[name]
    assert len(text) > CHARS_PER_TOKEN * encoder.max_seq_length
    whole = encoder.tokenizer.encode(text.lower() if encoder.lower_case else text).ids  # truncated after the fact
    assert encoder.tokenize([text]) == [whole]
    assert len(whole) == encoder.max_seq_length


def test_the_tokenizer_never_sees_more_than_the_model_can_read(encoder, monkeypatch):
    recording = Recording(encoder.tokenizer)
    monkeypatch.setattr(encoder, "tokenizer", recording)
    texts = [CJK * 200_000, ENGLISH * 50_000, "short"]  # 4M and 3.8M characters
    ids = encoder.tokenize(texts)
    limit = CHARS_PER_TOKEN * encoder.max_seq_length
    assert max(recording.lengths) <= limit and recording.lengths[-1] == len("short")
    assert [len(i) for i in ids[:2]] == [encoder.max_seq_length] * 2


def test_a_cut_never_splits_a_word_when_a_space_is_near():
    assert readable_prefix("alpha beta gamma", 12) == "alpha beta"
    assert readable_prefix("alpha beta", 20) == "alpha beta"
    assert readable_prefix("x" * 40, 16) == "x" * 16  # no space in the last quarter: cut where it falls
