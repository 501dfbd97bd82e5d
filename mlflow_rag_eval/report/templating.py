"""The Jinja2 environment of the HTML pages (the evaluation report, the run comparison).

Templates are package files under ``mlflow_rag_eval/report/templates/``. Autoescaping is on for
every template: each value from the data (questions, answers, justifications, evidence, run
ids, lineage) is escaped when it is written; only markup this package builds itself (the inline
SVG charts of :mod:`._svg`, which escape their own text) is passed as ``Markup``. Undefined
variables raise, so a template cannot silently drop a section.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["render"]


def _num(value: float | None, digits: int = 3, signed: bool = False, missing: str = "—") -> str:
    if value is None:
        return missing
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _thousands(value: int | float) -> str:
    return f"{value:,}"


@lru_cache(maxsize=1)
def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("mlflow_rag_eval.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["thousands"] = _thousands
    return env


def render(template: str, **context: Any) -> str:
    """``template`` (a file name under ``templates/``) rendered with ``context``."""
    return _environment().get_template(template).render(**context)
