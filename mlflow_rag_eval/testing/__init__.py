"""A loopback OpenAI-compatible judge server for tests and benchmarks, shipped in the package.

:class:`FakeJudgeServer` answers ``/v1/chat/completions`` with valid JSON for each of the
package's prompt templates (found by the ``response_format`` schema name), and a minimal
schema-valid value for any other schema (ragas' and deepeval's prompts), after a fixed latency. It exercises the real HTTP path (``openai:/...?base_url=...``) without a model: use
it to test wiring, timing and accounting, never to claim quality. It binds 127.0.0.1 only.
It records every request it receives, and answers what a test scripts instead when told to
(:class:`Reply`: a status, body, headers and delay; :meth:`FakeJudgeServer.script` for one
reply per request, :attr:`FakeJudgeServer.reply` for all of them): a provider's errors,
rate limits and timeouts.

:func:`serve` runs a real server command (``mlflow server``, the MLflow gateway,
``llama_cpp.server``) in its own process group until its health URL answers, and always stops
the whole group; :func:`mlflow_server` is that for a loopback tracking server.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "FakeJudgeServer", "Reply", "free_port", "mlflow_server", "postgres_server", "s3_server", "serve",
    "stop_process_group",
]

_INDEX = re.compile(r'<(passage|claim) index="(\d+)"')


def instance_of(schema: dict, defs: dict | None = None) -> object:
    """A minimal value valid for a JSON schema: first enum value, one array item, every
    property. Enough for other libraries' prompts (ragas, deepeval) to parse; says nothing."""
    defs = defs if defs is not None else schema.get("$defs", {})
    if "$ref" in schema:
        return instance_of(defs[schema["$ref"].split("/")[-1]], defs)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return instance_of(options[0], defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return {k: instance_of(v, defs) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [instance_of(schema.get("items", {}), defs)] * max(1, schema.get("minItems", 1))
    return {"string": "yes", "boolean": True, "integer": 1, "number": 1.0, "null": None}.get(kind, "yes")


def _reply_for(schema_name: str, prompt: str) -> dict:
    counts = {"passage": 0, "claim": 0}
    for kind, index in _INDEX.findall(prompt):
        counts[kind] = max(counts[kind], int(index) + 1)
    if schema_name == "claims_verdicts":
        return {"claims": [
            {"claim": f"Claim {i} of the text.", "supported": i % 3 != 2, "reason": "stated in passage 0",
             "evidence": "A sentence of the passage.", "passage": 0}
            for i in range(3)
        ]}
    if schema_name in ("verify", "rate_relevance"):
        n = counts["claim"] if schema_name == "verify" else counts["passage"]
        return {"verdicts": [{"index": i, "verdict": i % 2 == 0, "reason": "judged"} for i in range(n)]}
    if schema_name == "generate_questions":
        return {"questions": ["How much is a ticket?", "What does a ticket cost?", "Ticket price?"],
                "noncommittal": False}
    if schema_name == "extract_claims":
        return {"claims": ["Claim one.", "Claim two."]}
    if schema_name == "is_abstention":
        return {"abstains": False, "reason": "answers"}
    raise KeyError(schema_name)


@dataclass
class Reply:
    """One scripted answer of :class:`FakeJudgeServer`.

    ``body`` is JSON-encoded, unless it is ``bytes`` or ``str`` (sent as they are: a broken or
    HTML body); ``None`` is the server's generated completion. ``headers`` are sent after the
    defaults (``Content-Type: application/json`` unless they name one, ``Content-Length``);
    ``delay`` seconds are waited before answering (after the request is recorded), cut short by
    :meth:`FakeJudgeServer.release` and by closing the server.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class _Headers(dict):
    """A request's headers as sent (names in their case), looked up in any case."""

    def __getitem__(self, name: str) -> str:
        for key, value in self.items():
            if key.lower() == name.lower():
                return value
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(key.lower() == name.lower() for key in self.keys())

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default


class FakeJudgeServer:
    """A loopback chat-completions server with a fixed latency per call (cut short, like a
    reply's delay, by :meth:`release` and :meth:`close`).

    Every POST, whatever its path, is recorded in :attr:`requests` (and counted in
    :attr:`calls`) on arrival, as ``{"path", "query", "headers", "body"}``: the path without
    its query, the query parsed by :func:`urllib.parse.parse_qs`, the headers (looked up in
    any case) and the JSON body. It is answered, after ``latency`` seconds, by the first
    reply queued with :meth:`script`; with none queued, by :attr:`reply` (a :class:`Reply`);
    when that is ``None``, by a generated completion: valid JSON for the package's prompt
    templates, a minimal schema-valid value for any other ``response_format`` schema.
    """

    def __init__(self, latency: float = 0.0, model: str = "fake-judge", reply: Reply | None = None):
        self.latency = latency
        self.model = model
        self.reply = self._initial_reply = reply
        self.calls = 0
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._script: collections.deque[Reply] = collections.deque()
        self._wake = threading.Condition()
        self._closing = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                server._answer(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.port = self.httpd.server_address[1]
        # A short poll: close() returns within 50 ms instead of serve_forever's default 0.5 s,
        # which every test that stops a server would otherwise wait.
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply) -> None:
        """Queue ``replies``: the next requests get them, one each, in order, before
        :attr:`reply` answers again."""
        with self.lock:
            self._script.extend(replies)

    def reset(self) -> None:
        """Forget the requests received and the replies scripted: back to the reply given at
        construction (a server shared by several tests, set up once)."""
        with self.lock:
            self.requests.clear()
            self.calls = 0
            self._script.clear()
            self.reply = self._initial_reply

    def release(self) -> None:
        """End the wait of every reply being delayed now; later requests wait their full delay."""
        with self._wake:
            self._wake.notify_all()

    def _pause(self, seconds: float) -> None:
        if seconds > 0:
            with self._wake:
                if not self._closing:
                    self._wake.wait(seconds)

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        parts = urlsplit(handler.path)
        body = json.loads(raw) if raw else None
        with self.lock:
            self.calls += 1
            self.requests.append({"path": parts.path, "query": parse_qs(parts.query),
                                  "headers": _Headers(handler.headers.items()), "body": body})
            reply = self._script.popleft() if self._script else self.reply
        self._pause(self.latency)
        reply = reply or Reply()
        self._pause(reply.delay)
        content = self._completion(body) if reply.body is None else reply.body
        data = content if isinstance(content, bytes) else (
            content if isinstance(content, str) else json.dumps(content)).encode()
        try:
            handler.send_response(reply.status)
            if not any(name.lower() == "content-type" for name in reply.headers):
                handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            pass

    def _completion(self, body: dict) -> dict:
        """The generated chat.completion for a request's body."""
        prompt = "\n".join(m["content"] for m in body["messages"])
        fmt = body.get("response_format") or {}
        name = fmt.get("json_schema", {}).get("name", "")
        try:
            text = json.dumps(_reply_for(name, prompt))
        except KeyError:  # another library's prompt: any schema-valid reply
            text = json.dumps(instance_of(fmt.get("json_schema", {}).get("schema") or {}))
        return {
            "id": "bench", "object": "chat.completion", "model": self.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4},
        }

    def close(self) -> None:
        """Stop serving; replies being delayed are sent at once."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> FakeJudgeServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- real servers on loopback, for tests and benchmarks -----------------------------------------

def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process_group(proc, grace_s: float = 15.0) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it spawned
    (uvicorn/gunicorn workers, job runners): TERM the group, then KILL what is left."""
    import os
    import signal
    import subprocess

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + 10  # children may outlive the leader by a moment
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def serve(command: list[str], *, health_url: str, log_path, env=None, cwd=None, timeout_s: float = 60.0):
    """Run ``command`` in its own process group until ``health_url`` answers 2xx (polled, at
    most ``timeout_s``); yield the process; always stop the whole group afterwards."""
    import subprocess

    import requests

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            tail = lambda: open(log_path, errors="replace").read()[-3000:]  # noqa: E731
            if proc.poll() is not None:
                raise RuntimeError(f"{command[:4]} exited ({proc.returncode}):\n{tail()}")
            try:
                if requests.get(health_url, timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[:4]} not healthy in {timeout_s:g}s:\n{tail()}")
            time.sleep(0.25)
        yield proc
    finally:
        stop_process_group(proc)


@contextlib.contextmanager
def mlflow_server(home, *, backend_store_uri: str | None = None, artifacts_destination: str | None = None,
                  env: dict[str, str] | None = None, timeout_s: float = 60.0):
    """``mlflow server`` on 127.0.0.1 with proxied artifacts; yields ``(url, artifacts)``.

    Defaults: a sqlite store and an artifact folder under ``home`` (also the server's HOME).
    ``backend_store_uri`` (e.g. ``postgresql://...``) and ``artifacts_destination`` (e.g.
    ``s3://bucket/prefix``, with ``env`` carrying ``MLFLOW_S3_ENDPOINT_URL`` and credentials)
    put it in front of a real deployment's stores.
    """
    import os
    import sys
    from pathlib import Path

    home = Path(home)
    artifacts = artifacts_destination or str(home / "artifacts")
    port = free_port()
    server_env = {**os.environ, "HOME": str(home), "MLFLOW_DISABLE_TELEMETRY": "true", **(env or {})}
    server_env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1", "--backend-store-uri", backend_store_uri or f"sqlite:///{home / 'mlflow.db'}",
               "--artifacts-destination", artifacts]
    url = f"http://127.0.0.1:{port}"
    with serve(command, health_url=f"{url}/health", log_path=home / "server.log", env=server_env, cwd=home,
               timeout_s=timeout_s):
        yield url, (Path(artifacts) if "://" not in artifacts else artifacts)


def _postgres_bin(name: str) -> str:
    import glob
    import shutil

    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install PostgreSQL (Debian: apt-get install -y postgresql)")
    return found


@contextlib.contextmanager
def postgres_server(*, database: str = "mlflow", timeout_s: float = 60.0):
    """A throw-away PostgreSQL cluster on 127.0.0.1 (``initdb`` + ``pg_ctl``, trust auth),
    yielding its SQLAlchemy URI ``postgresql://postgres@127.0.0.1:<port>/<database>``; the
    cluster and its data folder are removed afterwards.

    PostgreSQL refuses to run as root: as root, the cluster runs as the ``postgres`` user
    (Debian's package creates it) in a folder that user owns.
    """
    import os
    import pwd
    import shutil
    import subprocess
    import tempfile

    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    home = tempfile.mkdtemp(prefix="rag_eval_pg_")
    data, sock = os.path.join(home, "data"), os.path.join(home, "sock")
    os.makedirs(sock)
    if as_root:
        os.chmod(home, 0o755)
        user = pwd.getpwnam("postgres")
        for path in (home, sock):
            os.chown(path, user.pw_uid, user.pw_gid)
    port = free_port()
    pg_ctl = _postgres_bin("pg_ctl")
    log = os.path.join(home, "postgres.log")

    def run(*command: str) -> None:
        subprocess.run([*prefix, *command], check=True, capture_output=True, timeout=timeout_s)

    started = False
    try:
        run(_postgres_bin("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale")
        run(pg_ctl, "-D", data, "-l", log, "-w", "-t", str(int(timeout_s)), "-o",
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        started = True
        run(_postgres_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", database)
        yield f"postgresql://postgres@127.0.0.1:{port}/{database}"
    except subprocess.CalledProcessError as exc:
        tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
        raise RuntimeError(f"PostgreSQL: {exc.cmd[len(prefix):][:2]} failed: {exc.stderr.decode()[-2000:]}\n{tail}") from exc
    finally:
        if started:
            subprocess.run([*prefix, pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], capture_output=True,
                           timeout=timeout_s)
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def s3_server(home, *, bucket: str = "mlflow-artifacts", timeout_s: float = 60.0):
    """An S3 stand-in (moto's server, extra ``moto[server]``) on 127.0.0.1 with one bucket;
    yields ``(endpoint_url, bucket, env)``, ``env`` being what a client or an ``mlflow server``
    needs to reach it (``MLFLOW_S3_ENDPOINT_URL``, dummy credentials, a region)."""
    import os
    import sys
    from pathlib import Path

    import boto3

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"MLFLOW_S3_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with serve(command, health_url=f"{url}/moto-api/", log_path=Path(home) / "moto.log",
               env={**os.environ, **env}, timeout_s=timeout_s):
        boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        yield url, bucket, env
