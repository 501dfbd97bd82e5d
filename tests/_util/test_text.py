"""Text helpers every layer uses."""

from __future__ import annotations

from mlflow_rag_eval._util.text import shorten


def test_shorten_keeps_short_text_on_one_line():
    assert shorten("a  refused\n format") == "a refused format"


def test_shorten_cuts_at_a_word_and_says_how_much_is_left_out():
    """A server's refusal quoted in a warning: cut between words, never inside a value."""
    message = "response_format json_schema is not supported: " + " ".join(f"value-{i}" for i in range(100))
    short = shorten(message, 80)
    kept, _, rest = short.partition(" … (")
    assert message.startswith(kept) and message[len(kept)] == " "  # a whole word last
    assert rest == f"{len(message) - len(kept)} more characters)"
    assert len(kept) <= 80
