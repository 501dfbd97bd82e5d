"""A loopback judge server that echoes every credential it receives, in every encoding.

:class:`EchoingServer` answers any POST (OpenAI's ``/chat/completions``, the MLflow gateway's
``/endpoints/<name>/invocations``, Bedrock's ``/model/<id>/converse``) in turn with: a valid
verdict whose reasons hold the echo, a 500 whose body is the echo, a 401 quoting it, a reply
that is not JSON and holds it. The echo is every spelling (:func:`secret_forms`) of every
header value that carries a credential and of every ``known`` secret the test names (a secret
never sent on the wire, the AWS secret key, is "echoed" too: a server could have it). Each
request rotates the order, so that every spelling comes first in some error message (those
are cut to a few hundred characters). Binds 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["EchoingServer", "secret_forms"]

#: Request headers whose values are credentials.
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key", "x-amz-security-token", "x-custom-auth")


def secret_forms(secret: str) -> dict[str, str]:
    """``secret`` in every form issue 38 lists, as a server might echo it."""
    data = secret.encode()
    return {
        "plain": secret,
        "lower": secret.lower(),
        "upper": secret.upper(),
        "reversed": secret[::-1],
        "hex": data.hex(),
        "HEX": data.hex().upper(),
        "percent": "".join(f"%{b:02X}" for b in data),
        "json \\u": "".join(f"\\u{ord(c):04x}" for c in secret),
        "html decimal": "".join(f"&#{ord(c)};" for c in secret),
        "html hex": "".join(f"&#x{ord(c):x};" for c in secret),
        "base64": base64.b64encode(data).decode(),
        "base64url": base64.urlsafe_b64encode(data).decode().rstrip("="),
        "base64 of Bearer": base64.b64encode(b"Bearer " + data).decode(),
        "base64 of user:password": base64.b64encode(b"gateway-user:" + data).decode(),
        "base64url of Bearer": base64.urlsafe_b64encode(b"Bearer " + data).decode(),
        "base64 inside JSON inside base64": base64.b64encode(json.dumps({"auth": f"Bearer {secret}"}).encode()).decode(),
        "JSON-escaped twice": json.dumps(json.dumps(secret)),
    }


def _claims(reason: str) -> dict:
    return {"claims": [{"claim": "A bike ticket costs 5 euros.", "supported": True, "reason": reason,
                        "evidence": "Bikes travel for a flat fare of 5 euros.", "passage": 0}]}


class EchoingServer:
    """See the module docstring. ``requests`` holds each request's headers (lower-cased names)."""

    def __init__(self, known: tuple[str, ...] = ()):
        self.known = known
        self.requests: list[dict[str, str]] = []
        self._count = itertools.count()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                server._answer(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def echo(self, headers: dict[str, str], turn: int) -> str:
        """Every spelling of every credential in ``headers`` and of ``known``, rotated by ``turn``."""
        values = [v for k, v in headers.items() if k in CREDENTIAL_HEADERS]
        for value in list(values):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "basic":
                values.append(base64.b64decode(token).decode())  # user:password
            if scheme.lower() in ("basic", "bearer"):
                values.append(token)
        forms = [f for v in [*values, *self.known] for f in secret_forms(v).values()]
        turn %= max(1, len(forms))
        return " | ".join(forms[turn:] + forms[:turn])

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self._lock:
            self.requests.append(headers)
            turn = next(self._count)
        echo = self.echo(headers, turn)
        bedrock = handler.path.endswith("/converse")
        kind = turn % 4
        extra: dict[str, str] = {}
        if kind == 0:  # a valid verdict, its reason the echo
            status, text = 200, json.dumps(_claims(echo))
            body = ({"output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                     "stopReason": "end_turn", "usage": {"inputTokens": 5, "outputTokens": 5, "totalTokens": 10}}
                    if bedrock else
                    {"id": "echo", "object": "chat.completion", "model": "echo-judge",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": text}}],
                     "usage": {"prompt_tokens": 5, "completion_tokens": 5}})
        elif kind == 1:  # a server error quoting the request
            status, body = 500, {"error": {"message": f"upstream failed for {echo}"}, "message": echo}
            extra = {"x-amzn-ErrorType": "InternalServerException"}
        elif kind == 2:  # a gateway 401 quoting the header it got
            status, body = 401, {"error": {"message": f"invalid credentials: {echo}"}, "message": echo}
            extra = {"x-amzn-ErrorType": "AccessDeniedException"}
        else:  # a reply that is no verdict
            text = f"I cannot comply. You sent: {echo}"
            status = 200
            body = ({"output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                     "stopReason": "end_turn", "usage": {"inputTokens": 5, "outputTokens": 5, "totalTokens": 10}}
                    if bedrock else
                    {"id": "echo", "object": "chat.completion", "model": "echo-judge",
                     "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                                                                                    "content": text}}]})
        data = json.dumps(body).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for name, value in extra.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> EchoingServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
