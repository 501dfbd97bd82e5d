"""The one redactor: every secret the process holds, in every spelling a text could carry it."""

from __future__ import annotations

import base64
import html
import json

import pytest
from echoing_server import secret_forms

from mlflow_rag_eval._util.redaction import known_secrets, redact, redact_json_text, remember, scrub

SECRET = "sk-live-REDACT-me-4q9Z/x+7"


@pytest.mark.parametrize("form", sorted(secret_forms(SECRET)))
def test_every_form_of_a_given_secret_is_hidden(form):
    text = f"error: the server was sent <{secret_forms(SECRET)[form]}> and refused it"
    out = redact(text, (SECRET,))
    assert secret_forms(SECRET)[form] not in out
    assert out.startswith("error: the server was sent <") and out.endswith("> and refused it")
    assert "***" in out


def test_the_environments_credentials_are_known_without_being_passed(monkeypatch):
    monkeypatch.setenv("MY_GATEWAY_API_KEY", "gw-key-0123456789")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "eva")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2-but-longer")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCY")
    assert {"gw-key-0123456789", "hunter2-but-longer", "eva:hunter2-but-longer",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"} <= set(known_secrets())
    basic = base64.b64encode(b"eva:hunter2-but-longer").decode()
    out = redact(f"401: Authorization: Basic {basic}; key gw-key-0123456789; aws wJalrXUtnFEMI/K7MDENG/bPxRfiCY")
    assert out == "401: Authorization: Basic ***; key ***; aws ***"


def test_the_userinfo_of_a_tracking_or_proxy_url_is_known(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://eva:s3cr%40t-tracking-pw@mlflow.example.com")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxyuser:proxy-SECRET-99@10.0.0.1:3128")
    assert {"s3cr@t-tracking-pw", "eva:s3cr@t-tracking-pw", "proxy-SECRET-99",
            "proxyuser:proxy-SECRET-99"} <= set(known_secrets())
    basic = base64.b64encode(b"proxyuser:proxy-SECRET-99").decode()
    assert redact(f"407 Proxy-Authorization: Basic {basic}; tracking s3cr@t-tracking-pw") == (
        "407 Proxy-Authorization: Basic ***; tracking ***")


def test_remembered_values_are_hidden_for_the_rest_of_the_process():
    remember("x-custom-header-secret-77", "short")
    assert "x-custom-header-secret-77" in known_secrets() and "short" not in known_secrets()
    assert redact("echo: " + base64.b64encode(b"x-custom-header-secret-77").decode()) == "echo: ***"


def test_nothing_else_changes_and_json_stays_json():
    reply = json.dumps({"verdicts": [{"index": 0, "reason": f"the key {SECRET} and caf\u00e9 &amp; 100%"}]})
    out = redact(reply, (SECRET,))
    assert json.loads(out) == {"verdicts": [{"index": 0, "reason": "the key *** and caf\u00e9 &amp; 100%"}]}
    assert redact("no secret here: caf\u00e9 &amp; 100% \\n", (SECRET,)) == "no secret here: caf\u00e9 &amp; 100% \\n"
    remember(SECRET)
    table = json.dumps({"data": [[f"Bearer {SECRET}", html.escape(SECRET)]]})
    assert json.loads(redact_json_text(table)) == {"data": [["Bearer ***", "***"]]}


def test_short_placeholders_are_left_in_replies_but_not_in_messages():
    assert redact("EMPTY answer", ("EMPTY",)) == "EMPTY answer"  # Ollama's placeholder key is a word too
    assert scrub("key EMPTY refused", ("EMPTY",)) == "key *** refused"
