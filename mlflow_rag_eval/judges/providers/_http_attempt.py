"""One HTTP attempt under a wall-clock budget, and the texts that leave it scrubbed of secrets.

requests' ``timeout`` bounds each socket operation, not an attempt: a server trickling its
reply a byte at a time never trips it. :class:`AttemptClock` is the budget of one attempt,
enforced while the reply streams; :func:`transport_failure` names what went wrong when no
complete answer came; :func:`scrub` and :func:`redact` keep the API key out of every text that
an exception, a cache entry or a report could hold (both live in
:mod:`mlflow_rag_eval._util.redaction`, the one redactor). Used by the OpenAI-compatible backend.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
from typing import Any
from urllib.parse import urljoin, urlsplit

from mlflow_rag_eval._util.redaction import redact, scrub
from mlflow_rag_eval.judges.llm.chat import CONNECTION_ERROR, PermanentError, TransientError

__all__ = ["MAX_REPLY_BYTES", "CrossOriginRedirect", "redact", "same_origin_session_class", "scrub"]

#: A judge reply is a few kilobytes; a body past this is a broken server, not a verdict.
MAX_REPLY_BYTES = 8 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024


# -- redirects stay within the origin -----------------------------------------------------------

class CrossOriginRedirect(Exception):
    """The server redirected the request to another origin; ``origin`` is that origin only
    (scheme, host, port: the Location's path or query may carry anything)."""

    def __init__(self, origin: str):
        self.origin = origin
        super().__init__(origin)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


@functools.lru_cache(maxsize=1)
def same_origin_session_class() -> type:
    """A requests ``Session`` that follows redirects within the request's origin (scheme, host,
    port) and raises :class:`CrossOriginRedirect` for any other.

    requests drops ``Authorization`` on a redirect to another host, but sends every other
    header there: Azure's ``api-key``, a key the caller put in ``headers``. Stripping them is
    not enough either: the body, the texts under evaluation, would still go to a server nobody
    configured, and one that answers without a key would decide the verdicts under the
    configured judge's name. So the redirect is refused, naming where it pointed.
    """
    import requests

    class SameOriginSession(requests.Session):
        def get_redirect_target(self, resp: Any) -> str | None:
            target = super().get_redirect_target(resp)
            if target is not None:
                absolute = urljoin(resp.url, f"{urlsplit(resp.url).scheme}:{target}" if target.startswith("//")
                                   else target)
                if _origin(absolute) != _origin(resp.url):
                    resp.close()
                    scheme, host, port = _origin(absolute)
                    raise CrossOriginRedirect(f"{scheme}://{host}:{port}")
            return target

    return SameOriginSession


# -- one attempt's wall-clock budget ------------------------------------------------------------

_ATTEMPT = threading.local()  # the clock of the attempt this thread is making, if any


class AttemptClock:
    """The wall-clock budget of one HTTP attempt, enforced while the reply streams.

    requests' ``timeout`` bounds each socket operation: a server that sends a byte every half
    second (or trickles its headers) never trips it and can hold a row for minutes. While a
    clock runs (a context manager, one per attempt and thread), every connection the thread's
    requests use registers with it (:func:`_watched`); when the budget runs out a timer shuts
    those sockets down, which wakes a blocked read at once. The caller then sees a failed read
    with :attr:`expired` set and reports a ``Timeout``. The shutdown happens under the lock that
    ends the attempt, so a connection handed back to the pool is never shut afterwards.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._connections: list[Any] = []
        self._done = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> AttemptClock:
        _ATTEMPT.clock = self
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
        _ATTEMPT.clock = None

    def watch(self, connection: Any) -> None:
        """Register a connection (again after it connects: it may have had no socket before)."""
        with self._lock:
            if not any(c is connection for c in self._connections):
                self._connections.append(connection)
            if self.expired and not self._done:
                _shut(connection)

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            for connection in self._connections:
                _shut(connection)


def _shut(connection: Any) -> None:
    """Shut a connection's socket down for reading and writing, without closing it (the
    thread blocked on it closes it). ``socket.socket.shutdown`` is called directly so that a
    TLS socket's state, still in use by that thread, is left alone."""
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def _register(connection: Any) -> None:
    clock = getattr(_ATTEMPT, "clock", None)
    if clock is not None:
        clock.watch(connection)


def _watched(connection_class: type) -> type:
    """``connection_class`` registering itself with the running attempt's clock when it
    connects and when it sends a request (a pooled connection is reused without connecting)."""

    class Watched(connection_class):
        def connect(self) -> None:
            _register(self)
            super().connect()
            _register(self)

        def request(self, *args: Any, **kwargs: Any) -> None:
            _register(self)
            return super().request(*args, **kwargs)

    Watched.__name__ = Watched.__qualname__ = f"Watched{connection_class.__name__}"
    return Watched


@functools.lru_cache(maxsize=1)
def watched_adapter_class() -> type:
    """A requests ``HTTPAdapter`` whose connections (direct or through an HTTP proxy) register
    with :class:`AttemptClock`. Built on first use: ``requests`` is imported lazily."""
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class WatchedHTTPConnectionPool(HTTPConnectionPool):
        ConnectionCls = _watched(HTTPConnection)

    class WatchedHTTPSConnectionPool(HTTPSConnectionPool):
        ConnectionCls = _watched(HTTPSConnection)

    pools = {"http": WatchedHTTPConnectionPool, "https": WatchedHTTPSConnectionPool}

    class WatchedAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy: str, **kwargs: Any):
            manager = super().proxy_manager_for(proxy, **kwargs)
            if not proxy.lower().startswith("socks"):  # SOCKS pools have their own classes
                manager.pool_classes_by_scheme = pools
            return manager

    return WatchedAdapter


def read_body(response: Any, clock: AttemptClock) -> bytes:
    """The whole body of a streamed response, within the clock and :data:`MAX_REPLY_BYTES`."""
    import requests

    chunks, size = [], 0
    for chunk in response.iter_content(chunk_size=_CHUNK_BYTES):
        chunks.append(chunk)
        size += len(chunk)
        if clock.expired:
            raise requests.exceptions.ReadTimeout("attempt budget spent")
        if size > MAX_REPLY_BYTES:
            raise _ReplyTooLarge(size)
    return b"".join(chunks)


class _ReplyTooLarge(Exception):
    pass


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it wraps (args, urllib3's ``reason``, cause, context)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        nested = [a for a in getattr(current, "args", ()) if isinstance(a, BaseException)]
        nested += [getattr(current, "reason", None), current.__cause__, current.__context__]
        todo.extend(n for n in nested if isinstance(n, BaseException))
    return seen


def _connection_reason(exc: BaseException, secrets: tuple[str | None, ...]) -> str:
    """A short, stable reason for a failed connection (requests' own text names object
    addresses and repeats the URL)."""
    import http.client
    import ssl

    chain = _exception_chain(exc)
    reasons = (
        (ConnectionRefusedError, "connection refused"),
        (ConnectionResetError, "connection reset by the server"),
        (http.client.RemoteDisconnected, "connection closed without a reply"),
        (http.client.IncompleteRead, "connection closed before the reply was complete"),
        (socket.gaierror, "host not found"),
        (ssl.SSLError, "TLS handshake failed"),
    )
    for kind, reason in reasons:
        if any(isinstance(e, kind) for e in chain):
            return reason
    names = {type(e).__name__ for e in chain}
    if "NameResolutionError" in names:
        return "host not found"
    if "ProtocolError" in names or "ChunkedEncodingError" in names:
        return "connection broken while reading the reply"
    root = chain[-1]
    return f"{type(root).__name__}: {scrub(str(root), secrets)}"


def transport_failure(
    exc: BaseException, clock: AttemptClock, where: str, connect_timeout: float,
    secrets: tuple[str | None, ...],
) -> Exception:
    """The chat exception for a request that got no complete HTTP answer."""
    import requests

    if clock.expired or isinstance(exc, requests.exceptions.ReadTimeout):
        return TransientError("Timeout", f"{where}: no complete reply within {clock.seconds:g}s")
    if isinstance(exc, _ReplyTooLarge):
        return PermanentError("ReplyTooLarge", f"{where}: reply over {MAX_REPLY_BYTES} bytes")
    if isinstance(exc, CrossOriginRedirect):
        return PermanentError("CrossOriginRedirect", f"{where}: the server redirected to another origin "
                              f"({exc.origin}), not followed: the key and the texts under evaluation go "
                              "only to the configured server; set base_url to the address that answers")
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return TransientError(CONNECTION_ERROR, f"{where}: no connection within {connect_timeout:g}s")
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                        requests.exceptions.InvalidSchema)):
        return PermanentError("BadRequest", f"{where}: invalid URL ({type(exc).__name__})")
    if isinstance(exc, requests.exceptions.ContentDecodingError):
        return TransientError("ServerError", f"{where}: undecodable reply body")
    broken = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)
    if isinstance(exc, broken) or (
        isinstance(exc, OSError) and not isinstance(exc, requests.exceptions.RequestException)
    ):
        return TransientError(CONNECTION_ERROR, f"{where}: {_connection_reason(exc, secrets)}")
    # Redirect loops, malformed headers and the like: the same request fails the same way.
    return PermanentError("BadRequest", f"{where}: {type(exc).__name__}: {scrub(str(exc), secrets)}")


class Answer:
    """An HTTP answer read in full: status, headers, body."""

    def __init__(self, status: int, headers: Any, content: bytes, encoding: str | None):
        self.status_code = status
        self.headers = headers
        self.content = content
        self.encoding = encoding or "utf-8"

    @property
    def text(self) -> str:
        return self.content.decode(self.encoding, errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)
