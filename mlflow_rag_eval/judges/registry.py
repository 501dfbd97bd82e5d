"""Judge providers by scheme: the one way a judge name becomes a judge.

A judge name is ``<scheme>:<target>?<options>``, e.g. ``bedrock:/<model id>?region_name=us-west-2``.
Each provider module registers, with :func:`register_judge_provider`, the parser of its own
names under its scheme; the parser returns what its provider's ``build`` takes (for LLM
providers a chat backend, which :func:`llm_judge` wraps in an ``LLMJudge``). Nothing here
knows a provider's options or SDK.

Lazy by construction: ``import mlflow_rag_eval.judges`` imports no provider module. The built-in
schemes are a table of module names (:data:`BUILTIN`), imported when their scheme is first
used; third-party packages declare theirs in the entry-point group ``mlflow_rag_eval.judges``
(entry point name = scheme; its value names the module, or an object in it, whose import
registers the scheme), loaded the same way. The built-ins are deliberately not entry points:
an entry point exists only once the package metadata is installed and current, and the default
judge must resolve in a source checkout, in code shipped to Spark executors without its
metadata, and without scanning every installed distribution on each start.

A provider declares the modules its SDK needs (``requires``); they are checked, without
importing them, before its parser runs, so a missing optional dependency is one clear error
naming what to install, raised when the judge is built, not in every row.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from mlflow_rag_eval._util.text import did_you_mean, did_you_mean_each

if TYPE_CHECKING:  # pragma: no cover
    from mlflow_rag_eval.judges.base import Judge

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "JudgeProvider",
    "MissingJudgeDependency",
    "as_bool",
    "as_float",
    "as_int",
    "as_positive_float",
    "as_url",
    "build_judge",
    "judge_provider",
    "known_schemes",
    "llm_judge",
    "register_judge_provider",
    "secret_query_parameters",
    "split_judge_name",
    "url_refusal",
]

ENTRY_POINT_GROUP = "mlflow_rag_eval.judges"

#: Built-in schemes: the module whose import registers each one, and the extra that installs
#: what it needs (None: the core dependencies).
BUILTIN: dict[str, tuple[str, str | None]] = {
    "local": ("mlflow_rag_eval.judges.providers.local", None),
    "openai": ("mlflow_rag_eval.judges.providers.openai", None),
    "bedrock": ("mlflow_rag_eval.judges.providers.bedrock", None),
    "endpoints": ("mlflow_rag_eval.judges.providers.endpoints", None),
    "llamacpp": ("mlflow_rag_eval.judges.providers.llamacpp", "llamacpp"),
    "scripted": ("mlflow_rag_eval.judges.providers.scripted", None),
    "panel": ("mlflow_rag_eval.judges.providers.panel", None),
}

_SCHEME = re.compile(r"[a-z][a-z0-9_.\-]*")
#: Option names that would carry a secret; a judge name is logged, so none is accepted.
_SECRET_WORDS = re.compile(r"key|token|secret|password|passwd|credential", re.I)
#: Query parameters of a URL that would carry a secret: any name with one of these in it
#: (``subscription-key``, ``api-key``, ``access_token``, ``client_secret``, ``X-Amz-Signature``)...
_SECRET_QUERY_WORDS = re.compile(r"key|token|secret|passw|pwd|credential|signature|auth", re.I)
#: ...or one of these names, letters only (Azure Storage SAS ``sig``, Azure Functions ``code``).
_SECRET_QUERY_NAMES = frozenset({"sig", "code", "pass", "jwt", "sas"})
_PROVIDERS: dict[str, JudgeProvider] = {}
#: scheme -> what to install when its provider's dependencies are missing
_INSTALL_HINTS: dict[str, str] = {
    scheme: f"pip install 'mlflow-rag-eval[{extra}]'" for scheme, (_, extra) in BUILTIN.items() if extra
}


class MissingJudgeDependency(ImportError):
    """A judge provider's optional dependency is not installed; the message says what to install."""


@dataclass(frozen=True)
class JudgeProvider:
    """What a scheme resolves to.

    Attributes:
        scheme: the part of a judge name before the first ``:``.
        parse: the whole judge name -> what ``build`` takes; raises ValueError for a bad name.
        build: ``build(parsed, name=..., **options) -> Judge``; ``options`` are the keyword
            arguments of :func:`~mlflow_rag_eval.judges.get_judge`.
        requires: modules the provider's SDK needs, checked (not imported) before ``parse``.
    """

    scheme: str
    parse: Callable[[str], Any]
    build: Callable[..., Judge]
    requires: tuple[str, ...] = ()

    def judge(self, spec: str, **options: Any) -> Judge:
        """The judge named ``spec`` (whose scheme is this provider's)."""
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                hint = _INSTALL_HINTS.get(self.scheme, f"install the package that provides {module!r}")
                raise MissingJudgeDependency(
                    f"the {self.scheme!r} judge needs {module!r}, which is not installed: {hint}",
                    name=module,
                )
        # The name logged and shown is the target without its options (which may hold URLs).
        return self.build(self.parse(spec), name=spec.partition("?")[0], **options)


def llm_judge(backend: Any, *, name: str, **options: Any) -> Judge:
    """The default ``build``: an ``LLMJudge`` over the parsed chat backend.

    ``options``: ``settings``, ``cache`` and the fields of ``LLMSettings`` (``temperature``,
    ``timeout``, ``deadline``, ``max_retries``, ``concurrency``, ...).
    """
    import dataclasses

    from mlflow_rag_eval.judges.llm.judge import LLMJudge, LLMSettings

    allowed = {f.name for f in dataclasses.fields(LLMSettings)} | {"settings", "cache"}
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for judge {name!r}"
                         f"{did_you_mean_each(sorted(unknown), allowed)}; allowed: {sorted(allowed)}")
    return LLMJudge(backend, name=name, **options)


def register_judge_provider(
    scheme: str,
    *,
    build: Callable[..., Judge] | None = None,
    requires: tuple[str, ...] = (),
) -> Callable[[Callable[[str], Any]], Callable[[str], Any]]:
    """Decorator: make the decorated parser resolve judge names ``<scheme>:...``.

    Args:
        scheme: lower-case letters, digits, ``_``, ``.``, ``-``; a third-party package should
            use a name of its own (its package name, say), not a built-in one.
        build: ``build(parsed, name=..., **options) -> Judge``; default :func:`llm_judge`,
            for parsers that return a chat backend.
        requires: importable module names the provider needs (e.g. its SDK).

    The parser takes the whole judge name and returns what ``build`` takes; it validates the
    target and the query-string options, refusing unknown ones (:func:`split_judge_name`).
    """
    if not _SCHEME.fullmatch(scheme):
        raise ValueError(f"invalid judge scheme {scheme!r}: lower-case letters, digits, '_', '.', '-'")

    def decorate(parse: Callable[[str], Any]) -> Callable[[str], Any]:
        provider = JudgeProvider(scheme, parse, build or llm_judge, tuple(requires))
        builtin = BUILTIN.get(scheme)
        if builtin is not None and parse.__module__ != builtin[0]:
            raise ValueError(f"judge scheme {scheme!r} is built in ({builtin[0]}); choose another name")
        existing = _PROVIDERS.get(scheme)
        if existing is not None and _origin(existing.parse) != _origin(parse):
            raise ValueError(
                f"judge scheme {scheme!r} is already registered by {'.'.join(_origin(existing.parse))}"
            )
        _PROVIDERS[scheme] = provider  # the same origin again: a module reload, replace it
        return parse

    return decorate


#: A shorter name for the decorator.
judge_provider = register_judge_provider


def _origin(fn: Callable) -> tuple[str, str]:
    return getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", repr(fn))


def _entry_points() -> list:
    # Looked up through the module at call time, so tests can substitute it.
    import importlib.metadata

    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def known_schemes() -> list[str]:
    """Every scheme a judge name may use: built in, registered, or declared by an entry point."""
    return sorted(set(BUILTIN) | set(_PROVIDERS) | {ep.name for ep in _entry_points()})


def _load(scheme: str, what: str, load: Callable[[], Any]) -> Any:
    try:
        return load()
    except ImportError as exc:
        if isinstance(exc, MissingJudgeDependency):
            raise
        missing = f" needs {exc.name!r}, which is not installed" if exc.name else f" cannot be imported ({exc})"
        hint = _INSTALL_HINTS.get(scheme, f"reinstall {what}")
        raise MissingJudgeDependency(f"the {scheme!r} judge{missing}: {hint}", name=exc.name) from exc


def provider(scheme: str) -> JudgeProvider:
    """The provider of ``scheme``, importing its module on first use."""
    found = _PROVIDERS.get(scheme)
    if found is not None:
        return found
    if scheme in BUILTIN:
        module = BUILTIN[scheme][0]
        _load(scheme, "mlflow-rag-eval", lambda: importlib.import_module(module))
        where = f"module {module}"
    else:
        matches = [ep for ep in _entry_points() if ep.name == scheme]
        if not matches:
            known = known_schemes()
            raise ValueError(f"unknown judge scheme {scheme!r}{did_you_mean(scheme, known)}; known: {', '.join(known)}")
        if len({ep.value for ep in matches}) > 1:
            raise ValueError(
                f"judge scheme {scheme!r} is declared by several entry points: {sorted(ep.value for ep in matches)}"
            )
        ep = matches[0]
        dist = getattr(getattr(ep, "dist", None), "name", None) or ep.value.split(":")[0].split(".")[0]
        _INSTALL_HINTS.setdefault(scheme, f"reinstall {dist} with its dependencies")
        loaded = _load(scheme, dist, ep.load)
        if isinstance(loaded, JudgeProvider) and scheme not in _PROVIDERS:
            if loaded.scheme != scheme:
                raise ValueError(f"entry point {scheme!r} names the provider of scheme {loaded.scheme!r}")
            _PROVIDERS[scheme] = loaded
        where = f"entry point {scheme!r} ({ep.value}) in group {ENTRY_POINT_GROUP}"
    found = _PROVIDERS.get(scheme)
    if found is None:
        raise TypeError(f"{where} registered no judge provider for scheme {scheme!r}")
    return found


def scheme_of(spec: str) -> str:
    """``bedrock`` for ``bedrock:/m?x=1``; ``scripted`` for ``scripted``."""
    return spec.partition(":")[0].partition("?")[0].strip()


def build_judge(spec: str, **options: Any) -> Judge:
    """The judge named ``spec``, built by its scheme's provider with ``options``."""
    return provider(scheme_of(spec)).judge(spec, **options)


# -- helpers for parsers ----------------------------------------------------------------------
def backend_options(spec: str, scheme: str, options: Mapping[str, Callable[[str], Any]],
                    what: str, placeholder: str) -> tuple[str, dict[str, Any]]:
    """:func:`split_judge_name` for a chat backend: the target must not be empty (``what`` and
    ``placeholder`` name it in the error), and ``concurrency`` becomes the backend's
    ``default_concurrency``."""
    target, parsed = split_judge_name(spec, scheme, options)
    if not target:
        raise ValueError(f"no {what} in judge name {spec.partition('?')[0]!r} (expected '{scheme}:/<{placeholder}>')")
    if "concurrency" in parsed:
        parsed["default_concurrency"] = parsed.pop("concurrency")
    return target, parsed


def split_judge_name(
    spec: str,
    scheme: str,
    options: Mapping[str, Callable[[str], Any]],
    *,
    strip_slash: bool = True,
) -> tuple[str, dict[str, Any]]:
    """``(target, options)`` from ``<scheme>:[/]<target>?<k>=<v>&...``.

    ``options`` maps each accepted option to its converter (``str``, :func:`as_bool`, ...).
    Unknown options are refused naming the accepted ones; an option given twice is refused; an
    empty value counts as not given. Everything after the first ``?`` is options, so a value
    with its own ``?`` or ``&`` must be percent-encoded. Option names that would hold a secret
    (key, token, password, ...) are refused with a pointer to the environment: names are logged.
    """
    # Messages show the name without its query string: values are never echoed.
    base = spec.partition("?")[0]
    head, sep, rest = spec.partition(":")
    if head.partition("?")[0] != scheme:
        raise ValueError(f"not a {scheme} judge name: {base!r}")
    if not sep:  # "scripted" or "scripted?x=1"
        rest = head[len(scheme):]
    if strip_slash and rest.startswith("/"):
        rest = rest[1:]
    target, _, query = rest.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    names = [k for k, _ in pairs]
    repeated = sorted({k for k in names if names.count(k) > 1})
    if repeated:
        raise ValueError(f"option(s) {repeated} given twice in judge name {base!r}")
    unknown = sorted(set(names) - set(options))
    if unknown:
        secret = [k for k in unknown if _SECRET_WORDS.search(k)]
        hint = (
            "; secrets are never part of a judge name (names are logged): the provider reads them "
            "from its usual configuration or environment" if secret else ""
        )
        allowed = sorted(options) or "none"
        raise ValueError(
            f"unknown option(s) {unknown} in judge name {base!r}{did_you_mean_each(unknown, options)}; "
            f"allowed: {allowed}{hint}"
        )
    parsed: dict[str, Any] = {}
    for key, value in pairs:
        if value == "":
            continue
        try:
            parsed[key] = options[key](value)
        except ValueError as exc:
            # Named by option and type, never echoing the value: a key pasted into the wrong
            # option (concurrency=sk-...) must not reach the message.
            expected = _EXPECTED.get(options[key], None) or _message_without(str(exc), value)
            raise ValueError(f"option {key} in judge name {base!r}: {expected}") from None
    return target, parsed


def _message_without(message: str, value: str) -> str:
    """``message`` if it does not hold ``value``; else a message that names no value."""
    return message if value not in message and repr(value) not in message else "invalid value"


def as_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false", "1", "0"):
        raise ValueError("expected true or false")
    return lowered in ("true", "1")


def as_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError("expected a positive integer") from None
    if number < 1:
        raise ValueError("expected a positive integer")
    return number


def as_float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError("expected a number") from None


def as_positive_float(value: str) -> float:
    number = as_float(value)
    if not number > 0:
        raise ValueError("expected a positive number")
    return number


#: What each converter expects, said in an error instead of the value given.
_EXPECTED: dict[Callable[[str], Any], str] = {
    as_bool: "expected true or false", as_int: "expected a positive integer", as_float: "expected a number",
    as_positive_float: "expected a positive number", int: "expected an integer", float: "expected a number",
}


def secret_query_parameters(url: str) -> list[str]:
    """The names of ``url``'s query parameters that would carry a secret (a key, token,
    signature, password...), in order; the values are never looked at, nor shown."""
    names = dict.fromkeys(k for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True))
    return [k for k in names
            if _SECRET_QUERY_WORDS.search(k) or re.sub(r"[^a-z]", "", k.lower()) in _SECRET_QUERY_NAMES]


def as_url(value: str) -> str:
    """A URL without credentials or a query string: a judge name is logged, and a URL is
    written to the lineage and the report, so neither ``user:password@`` nor anything in a query
    string (``?sig=``, ``;api-key=``, a parameter under any name) ever enters one. Options a
    server needs in its query have their own documented option (``azure_api_version``)."""
    refused = url_refusal(value)
    if refused:
        raise ValueError(f"{refused} in a URL is refused (URLs are logged and stored in the lineage); "
                         "use the provider's environment or its documented options")
    return value


def url_refusal(value: str) -> str | None:
    """What in ``value`` would put a secret in a logged URL (userinfo, a query string, path
    parameters, a fragment), named without any of it; None for a URL that may be logged."""
    try:
        parts = urlsplit(value)
        has_userinfo = "@" in parts.netloc or bool(parts.username or parts.password)
    except ValueError:
        return "a malformed address"
    if has_userinfo:
        return "credentials (user:password@)"
    secret = secret_query_parameters(value)
    if secret:
        return f"query parameter(s) {secret} that would carry a secret"
    if parts.query or value.rstrip().endswith("?"):
        return "a query string"
    if ";" in parts.path:
        return "path parameters (;...)"
    if parts.fragment:
        return "a fragment (#...)"
    return None
