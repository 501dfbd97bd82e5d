"""MkDocs hook: reference tables generated at build time from what the package ships, so the
pages cannot drift from the code. A page asks for one with an HTML comment on its own line:

- ``<!-- generated: policy-schema -->``: the gate policy's keys, from
  ``mlflow_rag_eval/gate/policy.schema.json`` (itself generated from the pydantic model
  ``GatePolicy``; tests/gate/test_policy.py checks that it is current).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
SCHEMA = _ROOT / "mlflow_rag_eval" / "gate" / "policy.schema.json"
_MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def _type(node: dict, defs: dict) -> str:
    """A schema node's type, as a reader writes the value in YAML."""
    if "$ref" in node:
        return f"[{node['$ref'].rsplit('/', 1)[-1]}](#{node['$ref'].rsplit('/', 1)[-1].lower()})"
    if "anyOf" in node:
        return " or ".join(_type(n, defs) for n in node["anyOf"])
    if "enum" in node:
        return " or ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type", "any")
    if kind == "array":
        return f"list of {_type(node.get('items', {}), defs)}"
    if kind == "object":
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            return f"map of {_type(values, defs)}"
        patterns = node.get("patternProperties")
        if patterns:
            ((pattern, value),) = patterns.items()
            return f"map `{pattern}` → {_type(value, defs)}"
        return "map"
    bounds = []
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if key in node:
            bounds.append(f"{sign} {node[key]}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


_CODE = re.compile(r"(`[^`]*`)")


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: outside code spans a pipe is escaped and ``<``/``>``
    are entities (a description's ``<metric>/<stat>`` is text, not an HTML tag the page would
    swallow); inside them nothing is, since a code span shows its backslashes."""
    parts = _CODE.split(str(text).replace("\n", " "))
    return "".join(part if part.startswith("`") else
                   part.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;") for part in parts)


def _table(properties: dict, defs: dict) -> list[str]:
    rows = ["| key | type | default | what |", "|---|---|---|---|"]
    for key, node in properties.items():
        default = f"`{json.dumps(node['default'])}`" if "default" in node else "—"
        rows.append(f"| `{key}` | {_cell(_type(node, defs))} | {_cell(default)} | {_cell(node.get('description', ''))} |")
    return rows


def policy_schema() -> str:
    """The policy's keys as tables (the top level, then each nested model), and the schema itself."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    defs = schema.get("$defs", {})
    out = [_cell(schema.get("description", "")), "", *_table(schema["properties"], defs)]
    for name, node in defs.items():
        out += ["", f"### {name}", "", _cell(node.get("description", "")), "", *_table(node["properties"], defs)]
    out += ["", "### The JSON schema", "", '??? note "policy.schema.json"', "",
            "    ```json", *("    " + line for line in json.dumps(schema, indent=2).splitlines()), "    ```"]
    return "\n".join(out)


GENERATORS = {"policy-schema": policy_schema}


def on_page_markdown(markdown: str, **kwargs) -> str:
    def generate(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return _MARKER.sub(generate, markdown)
