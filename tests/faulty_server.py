"""A loopback HTTP server that misbehaves on purpose, for the judge layer's fault matrix.

:class:`FaultyServer` speaks just enough HTTP/1.1 over raw sockets (bound to 127.0.0.1 only)
to answer ``POST /v1/chat/completions``, and lets each test decide, per request, what the
server does: answer normally (:class:`Reply`), send its answer one byte at a time
(:class:`Trickle`, headers included or not), accept and never answer (:class:`Hang`), or drop
the connection with a TCP reset (:class:`Reset`). ``http.server`` cannot do the last three
faithfully, hence raw sockets. The ``faulty_server`` fixture in ``test_faults.py`` starts it
and always stops it; :meth:`FaultyServer.stop` wakes every connection it still holds.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FaultyServer", "Hang", "Reply", "Request", "Reset", "Trickle", "completion"]


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
class Reply:
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


Respond = Callable[[Request], Any]  # -> Reply | Trickle | Hang | Reset


class FaultyServer:
    """An HTTP server on 127.0.0.1 whose answer to each request is ``respond(request)``.

    ``requests`` lists what it received (thread-safe); ``base_url`` is the API root to give an
    ``OpenAICompatBackend``.
    """

    def __init__(self, respond: Respond):
        self.respond = respond
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clients: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept_loop, daemon=True, name="faulty-accept")
        self._accepting.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

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
            with self._lock:
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
                    self.requests.append(request)
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
