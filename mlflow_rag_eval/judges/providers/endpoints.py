"""Judges served by an MLflow deployments target: the MLflow AI Gateway or Databricks.

The target is ``target_uri`` or, when not given, the MLflow deployments target
(``mlflow.deployments.set_deployments_target`` or ``$MLFLOW_DEPLOYMENTS_TARGET``): a gateway
URL such as ``http://127.0.0.1:5000``, or ``databricks``. The endpoint must be a chat endpoint
(``llm/v1/chat``); replies are OpenAI-style and parsed like
:mod:`~mlflow_rag_eval.judges.providers.openai`'s.

One attempt per call. ``MlflowDeploymentClient.predict`` (the gateway client) retries 429 and
5xx itself, up to ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (7) times with exponential backoff, and
takes its timeout from a process-wide variable. For a gateway target this backend therefore
sends the same request the client would (same route, same MLflow credentials via
``mlflow.utils.rest_utils.http_request``) with ``max_retries=0`` and the request's own timeout,
so that retries stay in the layer above. Other targets (Databricks, plugins) go through their
client's public ``predict``, which may retry internally; its errors are mapped as well as the
client exposes them (``requests.HTTPError`` carries the status; a timeout surfaces as an
``MlflowException`` caused by ``requests.Timeout``).

The gateway does not forward an upstream ``Retry-After`` header (seen with mlflow 3.17.2), so
a rate limit behind a gateway usually arrives with ``retry_after=None``.

Credentials this backend knows (the MLflow and Databricks tokens and secrets in
:data:`_SECRET_ENVS`, and the ``user:password`` pair it sends as Basic auth) are replaced by
``***``, in any common encoding, in error messages and in every reply's text, so a server that
echoes one (a gateway 401 quoting ``Basic ...``) cannot get it into the cache or a report. The request's timeout is
passed to the HTTP client as is: unlike the ``openai`` backend it bounds each socket read, not
the whole attempt (MLflow's client owns the connection).
"""

from __future__ import annotations

import os
from typing import Any

from mlflow_rag_eval._util.redaction import remember
from mlflow_rag_eval.judges.llm.chat import CONNECTION_ERROR, ChatReply, ChatRequest, PermanentError, TransientError
from mlflow_rag_eval.judges.providers.openai import error_for_status, parse_chat_completion, scrub
from mlflow_rag_eval.judges.registry import (
    as_bool,
    as_int,
    as_url,
    backend_options,
    register_judge_provider,
    url_refusal,
)

__all__ = ["MlflowEndpointsBackend", "parse_endpoints_target"]

#: Environment variables whose values must never reach an error message.
_SECRET_ENVS = (
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "DATABRICKS_TOKEN",
    "DATABRICKS_CLIENT_SECRET",
)
#: Options of an ``endpoints:/`` judge name and their types.
_TARGET_OPTIONS = {"target_uri": as_url, "supports_schema": as_bool, "concurrency": as_int}


class MlflowEndpointsBackend:
    """A judge backend for one chat endpoint of an MLflow deployments target.

    Args:
        endpoint: the endpoint's name on the target.
        target_uri: the gateway URL or ``databricks``; default: the MLflow deployments target.
        default_concurrency: the concurrency the layer above uses unless told otherwise.
        supports_schema: send ``response_format`` json_schema (the gateway forwards it; whether
            the model behind the endpoint honours it depends on its provider).
    """

    provider = "endpoints"

    def __init__(
        self,
        endpoint: str,
        *,
        target_uri: str | None = None,
        default_concurrency: int = 4,
        supports_schema: bool = False,
    ):
        if not endpoint:
            raise ValueError("MlflowEndpointsBackend needs an endpoint name")
        if not target_uri:
            from mlflow.deployments.utils import get_deployments_target
            from mlflow.exceptions import MlflowException

            try:
                target_uri = get_deployments_target()
            except MlflowException as exc:
                raise ValueError(
                    "no MLflow deployments target: pass target_uri= or set MLFLOW_DEPLOYMENTS_TARGET"
                ) from exc
        refused = url_refusal(target_uri) if "://" in target_uri else None
        if refused:  # target_uri is shown, logged and stored like a base_url
            raise ValueError(f"target_uri has {refused}; refused (it is logged and stored): MLflow credentials "
                             "come from MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN")
        self.model = endpoint
        self.base_url = target_uri.rstrip("/")
        self.default_concurrency = default_concurrency
        self.supports_schema = supports_schema
        self._client = None

    def __repr__(self) -> str:
        return f"MlflowEndpointsBackend(endpoint={self.model!r}, target_uri={self.base_url!r})"

    def identity(self) -> dict[str, Any]:
        return {"provider": self.provider, "model": self.model, "base_url": self.base_url}

    def client(self):
        """The MLflow deployments client for the target (created on first use)."""
        if self._client is None:
            from mlflow.deployments import get_deploy_client

            self._client = get_deploy_client(self.base_url)
        return self._client

    def inputs(self, request: ChatRequest) -> dict[str, Any]:
        """The ``inputs`` of the predict call for ``request``."""
        inputs: dict[str, Any] = {**request.params, "messages": request.messages}
        if request.schema is not None and self.supports_schema:
            inputs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.schema_name, "schema": request.schema, "strict": True},
            }
        return inputs

    def complete(self, request: ChatRequest) -> ChatReply:
        from mlflow.deployments.mlflow import MlflowDeploymentClient

        inputs = self.inputs(request)
        where = f"endpoint {self.model!r} at {self.base_url}"
        secrets = tuple(os.environ.get(name) for name in _SECRET_ENVS)
        schema_sent = "response_format" in inputs
        client = self.client()
        if isinstance(client, MlflowDeploymentClient):
            payload = self._gateway_call(client, inputs, request.timeout, where, secrets, schema_sent)
        else:
            payload = self._predict(client, inputs, where, secrets, schema_sent)
        if not isinstance(payload, dict):
            raise TransientError("ServerError", f"{where}: reply is not a JSON object")
        return parse_chat_completion(payload, default_model=self.model, where=where, secrets=secrets)

    def _gateway_call(self, client, inputs, timeout, where, secrets, schema_sent) -> Any:
        """One POST to ``/endpoints/<name>/invocations``, as the gateway client's predict makes it."""
        from mlflow.deployments.constants import MLFLOW_DEPLOYMENT_CLIENT_REQUEST_RETRY_CODES
        from mlflow.deployments.server.constants import (
            MLFLOW_DEPLOYMENTS_ENDPOINTS_BASE,
            MLFLOW_DEPLOYMENTS_QUERY_SUFFIX,
        )
        from mlflow.exceptions import MlflowException
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request
        from mlflow.utils.uri import join_paths

        route = join_paths(MLFLOW_DEPLOYMENTS_ENDPOINTS_BASE, self.model, MLFLOW_DEPLOYMENTS_QUERY_SUFFIX)
        creds = get_default_host_creds(client.target_uri)
        # The gateway gets these as Basic auth (base64 of user:password) or a bearer token.
        pair = f"{creds.username}:{creds.password}" if creds.username and creds.password else None
        remember(creds.password, creds.token, pair)
        failure: Exception | None = None
        try:
            response = http_request(
                host_creds=creds,
                endpoint=route,
                method="POST",
                json=inputs,
                timeout=timeout,
                max_retries=0,
                backoff_factor=0,
                retry_codes=MLFLOW_DEPLOYMENT_CLIENT_REQUEST_RETRY_CODES,
                raise_on_status=False,
            )
        except MlflowException as exc:
            failure = _transport_error(exc, where, secrets)
        if failure is not None:
            # Raised outside the except block: no __context__ chain to requests' exception, whose
            # .request holds the MLflow credentials' Authorization header.
            raise failure
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if response.status_code >= 400:
            detail = scrub(_detail(payload, response.text), secrets)
            raise error_for_status(
                response.status_code, response.headers, f"{where}: {detail}", schema_sent=schema_sent
            )
        return payload

    def _predict(self, client, inputs, where, secrets, schema_sent) -> Any:
        import requests
        from mlflow.exceptions import MlflowException

        failure: Exception | None = None
        try:
            return client.predict(endpoint=self.model, inputs=inputs)
        except requests.HTTPError as exc:
            detail = f"{where}: {scrub(str(exc), secrets)}"
            if exc.response is None:
                failure = TransientError(CONNECTION_ERROR, detail)
            else:
                failure = error_for_status(
                    exc.response.status_code, exc.response.headers, detail, schema_sent=schema_sent
                )
        except MlflowException as exc:
            failure = _transport_error(exc, where, secrets)
        raise failure  # outside the except blocks, for the reason given in _gateway_call


def _detail(payload: Any, text: str) -> str:
    if isinstance(payload, dict):
        detail = payload.get("detail") or payload.get("message") or payload.get("error")
        if isinstance(detail, dict):
            detail = detail.get("message") or detail
        if detail:
            return str(detail)
    return text or ""


def _transport_error(exc: Exception, where: str, secrets: tuple[str | None, ...]) -> Exception:
    """Map an MlflowException raised around the HTTP call (timeouts, refused connections)."""
    import requests
    import urllib3

    # http_request chains requests' Timeout as __cause__; other failures only as __context__,
    # and predict() re-raises a timeout as a new MlflowException whose context holds it.
    seen = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, requests.ConnectTimeout):  # never connected: counts as unreachable
            return TransientError(CONNECTION_ERROR, f"{where}: no connection in time")
        if isinstance(cause, requests.Timeout):
            return TransientError("Timeout", f"{where}: no answer in time ({type(cause).__name__})")
        if isinstance(cause, requests.ConnectionError):
            # MLflow's session has a urllib3 Retry, so a read timeout arrives as a
            # ConnectionError wrapping MaxRetryError(reason=ReadTimeoutError).
            reason = getattr(cause.args[0] if cause.args else None, "reason", None)
            # (urllib3's NewConnectionError, a refused connection, is also a TimeoutError.)
            if isinstance(reason, urllib3.exceptions.TimeoutError) and not isinstance(
                reason, urllib3.exceptions.NewConnectionError
            ):
                return TransientError("Timeout", f"{where}: no answer in time ({type(reason).__name__})")
            return TransientError(CONNECTION_ERROR, f"{where}: {type(cause).__name__}")
        cause = cause.__cause__ or cause.__context__
    message = scrub(getattr(exc, "message", None) or str(exc), secrets)
    if "timed out" in message.lower():
        return TransientError("Timeout", f"{where}: {message}")
    return PermanentError("BadRequest", f"{where}: {message}")


@register_judge_provider("endpoints")
def parse_endpoints_target(spec: str) -> MlflowEndpointsBackend:
    """A backend from a judge name: ``endpoints:/<name>``, options as a query string.

    Example: ``endpoints:/chat?target_uri=http://127.0.0.1:5000``. Options: ``target_uri``
    (a gateway URL without credentials, or ``databricks``), ``supports_schema``
    (``true``/``false``), ``concurrency`` (the backend's default concurrency). Without
    ``target_uri`` the MLflow deployments target is used (``$MLFLOW_DEPLOYMENTS_TARGET``).
    """
    name, options = backend_options(spec, "endpoints", _TARGET_OPTIONS, "endpoint name", "name")
    return MlflowEndpointsBackend(name, **options)
