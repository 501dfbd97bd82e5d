"""A judge server that misbehaves the way providers do, for tests and benchmarks: loopback only.

:class:`FaultyServer` speaks just enough HTTP/1.1 over raw sockets (bound to 127.0.0.1 only)
to answer ``POST /v1/chat/completions``, and lets its caller decide, per request, what the
server does: answer (:class:`Answer`: any status, body and headers, so 429 with or without
``Retry-After`` and 5xx too), send an answer one byte at a time (:class:`Trickle`, headers
included or not), accept and never answer (:class:`Hang`: a stalled socket), drop the
connection with a TCP reset before answering (:class:`Reset`) or half-way through the body
(:class:`ResetMidBody`). ``http.server`` cannot do the last four faithfully, hence raw sockets.
:meth:`FaultyServer.stop` wakes every connection it still holds.

:func:`judge_answer` is a valid reply to any of the package's prompts (as
:class:`~mlflow_rag_eval.testing.FakeJudgeServer` gives, its verdicts varied per prompt so rows
differ, and the same for the same prompt): the fault-free answer. :class:`FaultMix` is a
``respond`` that answers so, with faults drawn at given rates from a seeded generator, and a
provider outage (every connection reset) for a stretch of the run: what ``bench/faults.py``
runs 100,000 rows against. Use it to test how the package holds up, never to claim quality.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAULTS", "Answer", "FaultMix", "FaultyServer", "Hang", "Request", "Reset", "ResetMidBody", "Trickle",
           "completion", "judge_answer"]


def completion(content: str, *, usage: Any = None, model: str = "faulty-judge") -> dict[str, Any]:
    """An OpenAI ``chat.completion`` body carrying ``content``."""
    return {
        "id": "chatcmpl-faulty",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": usage if usage is not None else {"prompt_tokens": 10, "completion_tokens": 5},
    }


@dataclass(frozen=True)
class Request:
    """What the client sent: the body parsed as JSON, and the raw headers."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def prompt(self) -> str:
        return "\n".join(str(m.get("content", "")) for m in self.body.get("messages", []))

    @property
    def response_format(self) -> str | None:
        fmt = self.body.get("response_format")
        return fmt.get("type") if isinstance(fmt, dict) else None


def _http_bytes(status: int, body: Any, headers: dict[str, str] | None = None) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [f"HTTP/1.1 {status} X", "Content-Type: application/json", f"Content-Length: {len(data)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


@dataclass(frozen=True)
class Answer:
    """A normal answer, sent at once; the connection stays open for the next request."""

    status: int = 200
    body: Any = field(default_factory=lambda: completion('{"ok": true}'))
    headers: dict[str, str] = field(default_factory=dict)

    def perform(self, conn: socket.socket, stop: threading.Event) -> bool:
        conn.sendall(_http_bytes(self.status, self.body, self.headers))
        return True


@dataclass(frozen=True)
class Trickle:
    """A valid answer sent one byte every ``interval`` seconds: the status line and headers
    at once and then the body (``headers_too=False``), or everything byte by byte."""

    body: Any
    interval: float = 0.5
    headers_too: bool = False

    def perform(self, conn: socket.socket, stop: threading.Event) -> bool:
        raw = _http_bytes(200, self.body)
        split = 0 if self.headers_too else raw.index(b"\r\n\r\n") + 4
        try:
            conn.sendall(raw[:split])
            for i in range(split, len(raw)):
                if stop.wait(self.interval):
                    return False
                conn.sendall(raw[i : i + 1])
        except OSError:  # the client gave up: what this fault is for
            return False
        return True


@dataclass(frozen=True)
class Hang:
    """Read the request, then say nothing until the server stops."""

    def perform(self, conn: socket.socket, stop: threading.Event) -> bool:
        stop.wait()
        return False


@dataclass(frozen=True)
class Reset:
    """Read the request, then close with SO_LINGER 0: the client gets a TCP reset."""

    def perform(self, conn: socket.socket, stop: threading.Event) -> bool:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False


@dataclass(frozen=True)
class ResetMidBody:
    """Send the status line, the headers and the first half of the body, then a TCP reset: a
    reply cut mid-body (a proxy or a worker killed while it streamed)."""

    body: Any

    def perform(self, conn: socket.socket, stop: threading.Event) -> bool:
        raw = _http_bytes(200, self.body)
        head = raw.index(b"\r\n\r\n") + 4
        try:
            conn.sendall(raw[: head + (len(raw) - head) // 2])
        except OSError:
            return False
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False


Respond = Callable[[Request], Any]  # -> Answer | Trickle | Hang | Reset | ResetMidBody


class FaultyServer:
    """An HTTP server on 127.0.0.1 whose answer to each request is ``respond(request)``
    (an :class:`Answer`, :class:`Trickle`, :class:`Hang`, :class:`Reset` or :class:`ResetMidBody`).

    ``requests`` holds what it received (thread-safe): all of it, or the last ``keep`` requests
    (a bench of 100,000 rows would otherwise hold every prompt it sent); ``calls`` counts them
    all. ``base_url`` is the API root to give an ``OpenAICompatBackend``.
    """

    def __init__(self, respond: Respond, *, keep: int | None = None):
        self.respond = respond
        self._requests: deque[Request] = deque(maxlen=keep)
        self._calls = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept_loop, daemon=True, name="faulty-accept")
        self._accepting.start()

    def __enter__(self) -> FaultyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[Request]:
        """The requests received (the last ``keep``), oldest first: a copy."""
        with self._lock:
            return list(self._requests)

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls

    def stop(self) -> None:
        """Stop accepting, wake every connection still held (hangs, trickles), join threads."""
        self._stop.set()
        try:  # shutdown, not just close, wakes a thread blocked in accept() on Linux
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            clients, threads = list(self._clients), list(self._threads)
        for conn in clients:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in [self._accepting, *threads]:
            thread.join(5)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:  # the listener was closed: stopping
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True, name="faulty-conn")
            with self._lock:  # connections closed since (resets, retries) are forgotten
                self._clients = [c for c in self._clients if c.fileno() != -1]
                self._threads = [t for t in self._threads if t.is_alive()]
                self._clients.append(conn)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while not self._stop.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                with self._lock:
                    self._requests.append(request)
                    self._calls += 1
                action = self.respond(request)
                if not action.perform(conn, self._stop):
                    return
        except OSError:
            return
        finally:
            reader.close()
            conn.close()  # after a Reset's SO_LINGER 0, this sends the RST


def _read_request(reader) -> Request | None:
    """One HTTP request from the connection, or None when the client closed it."""
    line = reader.readline(65537)
    if not line.strip():
        return None
    _, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        header = reader.readline(65537)
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raw = reader.read(int(headers.get("content-length", 0)))
    return Request(path=path, headers=headers, body=json.loads(raw) if raw else {})


# -- the fault-free answer, and faults mixed into it ---------------------------------------------------

def _varied(value: Any, prompt: str) -> Any:
    """``value`` (a generated reply) with each boolean verdict a function of the prompt (as
    first asked: a corrective retry gets the same verdicts) and its place: rows get different
    scores, the same prompt always the same reply."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
    counter = iter(range(1 << 30))

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (bool(seed >> (next(counter) % 61) & 1) if k in ("supported", "verdict") else walk(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(value)


def judge_answer(request: Request, *, usage: Any = None, model: str = "faulty-judge") -> Answer:
    """The fault-free answer to ``request``: valid JSON for the package's prompt (the schema it
    asks for by name), varied per prompt (:func:`_varied`), a minimal schema-valid value for
    any other schema. ``usage`` replaces the token counts (a fault of its own)."""
    from mlflow_rag_eval.testing import _reply_for, instance_of

    fmt = request.body.get("response_format") or {}
    name = fmt.get("json_schema", {}).get("name", "")
    prompt = request.prompt
    asked = "\n".join(str(m.get("content", "")) for m in request.body.get("messages", [])[:2])  # less any repair
    try:
        content = _varied(_reply_for(name, prompt), asked)
    except KeyError:  # another library's prompt: any schema-valid reply
        content = instance_of(fmt.get("json_schema", {}).get("schema") or {})
    tokens = {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(json.dumps(content)) // 4}
    return Answer(body=completion(json.dumps(content), usage=tokens if usage is None else usage, model=model))


def _miscounted(request: Request) -> Answer:
    """A reply valid for the schema but for the wrong number of items: one verdict more than
    the prompt has passages or claims, or a claim citing a passage that is not there."""
    answer = judge_answer(request)
    reply = json.loads(answer.body["choices"][0]["message"]["content"])
    if "verdicts" in reply:
        reply["verdicts"].append({"index": len(reply["verdicts"]), "verdict": True, "reason": "extra"})
    elif "claims" in reply and reply["claims"] and isinstance(reply["claims"][0], dict):
        reply["claims"][0]["passage"] = 99
    return Answer(body=completion(json.dumps(reply), usage=answer.body["usage"]))


#: What :class:`FaultMix` can inject, by name: each a function of the request.
FAULTS: dict[str, Callable[[Request], Any]] = {
    "429_retry_after": lambda r: Answer(429, {"error": {"message": "rate limited"}}, {"Retry-After": "1"}),
    "429": lambda r: Answer(429, {"error": {"message": "rate limited"}}),
    "500": lambda r: Answer(500, {"error": {"message": "internal error"}}),
    "503": lambda r: Answer(503, {"error": {"message": "overloaded"}}),
    "reset": lambda r: Reset(),
    "reset_mid_body": lambda r: ResetMidBody(judge_answer(r).body),
    "stall": lambda r: Hang(),
    "trickle": lambda r: Trickle(judge_answer(r).body, interval=0.05),
    "usage_negative": lambda r: judge_answer(r, usage={"prompt_tokens": -5, "completion_tokens": -1}),
    "usage_huge": lambda r: judge_answer(r, usage={"prompt_tokens": 10**12, "completion_tokens": 10**12}),
    "usage_missing": lambda r: judge_answer(r, usage={}),
    "wrong_count": _miscounted,
}


class FaultMix:
    """A ``respond`` for :class:`FaultyServer`: the fault-free answer (:func:`judge_answer`),
    or, at the given rates, a fault of :data:`FAULTS` drawn from a seeded generator; and, from
    call ``outage_after`` on, ``outage_s`` seconds in which every connection is reset (a provider
    down; counted from the first request it drops).

    ``counts`` says what was served, by fault name (``ok`` for fault-free answers, ``outage``
    for the outage's resets). Thread-safe.
    """

    def __init__(self, rates: dict[str, float] | None = None, *, seed: int = 0, outage_after: int | None = None,
                 outage_s: float = 0.0):
        unknown = set(rates or {}) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {sorted(FAULTS)}")
        self.rates = dict(rates or {})
        self.outage_after, self.outage_s = outage_after, outage_s
        self.counts: Counter[str] = Counter()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._calls = 0
        self._down_since: float | None = None

    def __call__(self, request: Request) -> Any:
        with self._lock:
            self._calls += 1
            if self.outage_after is not None and self._calls > self.outage_after:
                now = time.monotonic()
                self._down_since = now if self._down_since is None else self._down_since
                if now - self._down_since < self.outage_s:
                    self.counts["outage"] += 1
                    return Reset()
            draw, name = self._random.random(), "ok"
            for fault, rate in self.rates.items():
                if draw < rate:
                    name = fault
                    break
                draw -= rate
            self.counts[name] += 1
        return judge_answer(request) if name == "ok" else FAULTS[name](request)
