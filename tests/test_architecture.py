"""The package's shape, checked: layers that import only downward, no import cycle, plumbing
kept private, small functions.

Every ``import`` counts, those inside functions and under ``TYPE_CHECKING`` too: a deferred
import is still a dependency, and an upward one is a module in the wrong place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "mlflow_rag_eval"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: Bottom to top. A module may import its own layer's modules and any layer below; names on one
#: line separated by " | " are independent of each other (neither imports the other).
LAYERS = [
    "_util | keys",
    "stats",
    "records | results",
    "judges",
    "metrics",
    "evaluation",
    "report",
    "tracking",
    "compare",
    "routes | spark | calibration",
    "gate | golden",
    "cli | pytest_plugin | testing",
]

MAX_TOP_LEVEL_MODULES = 8
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


MODULES = _modules()


def _imports(module: str) -> list[tuple[str, int, str | None]]:
    """(imported module, line, imported name or None) for every import of our package."""
    path, is_package = MODULES[module]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, None) for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, node.lineno, None) if sub in MODULES else (target, node.lineno, alias.name))
    return found


def _owner(name: str) -> str:
    """The module a dotted name lives in (the longest prefix that is one of ours)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _graph() -> dict[str, set[str]]:
    return {m: {_owner(t) for t, _, _ in _imports(m)} - {m} for m in MODULES}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer_of() -> dict[str, tuple[int, str]]:
    out = {}
    for level, line in enumerate(LAYERS):
        for name in line.split(" | "):
            out[name] = (level, name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_every_module_has_a_layer():
    layers = _layer_of()
    homeless = sorted(m for m in MODULES if m != PACKAGE and _top(m) not in layers)
    assert not homeless, f"modules outside every layer of LAYERS: {homeless}"


def test_layers_import_only_downward():
    layers = _layer_of()
    wrong = []
    for module in sorted(MODULES):
        if module == PACKAGE:
            continue  # the curated API imports lazily from every layer
        mine = layers.get(_top(module))
        for target, line, _ in _imports(module):
            theirs = layers.get(_top(_owner(target)))
            if mine is None or theirs is None or _owner(target) == PACKAGE:
                continue
            if theirs[0] > mine[0] or (theirs[0] == mine[0] and theirs[1] != mine[1]):
                wrong.append(f"{module}:{line} imports {target} ({theirs[1]} is not below {mine[1]})")
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def _package_of(module: str) -> str:
    return module if MODULES[module][1] else module.rsplit(".", 1)[0]


def test_private_names_stay_in_their_package():
    """``_name`` modules and names are plumbing: importable only by the modules of the package
    (the folder) that holds them; ``_util`` is the whole package's."""
    wrong = []
    for module in sorted(MODULES):
        here = _package_of(module)
        for target, line, name in _imports(module):
            owner = _owner(target)
            parts = owner.split(".")
            private = [i for i, p in enumerate(parts) if p.startswith("_") and p != "__init__"]
            if private and parts[private[0]] != "_util" and here != ".".join(parts[: private[0]]):
                wrong.append(f"{module}:{line} imports private module {owner}")
            if name and name.startswith("_") and not name.startswith("__") and here != _package_of(owner):
                wrong.append(f"{module}:{line} imports private name {owner}.{name}")
    assert not wrong, "\n".join(wrong)


def test_few_modules_at_the_top():
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the package's top: {top}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_long_function(module):
    path, _ = MODULES[module]
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_checks_catch_what_they_guard(tmp_path):
    """The cycle finder and the layer table are not vacuous: a known cycle is found, and every
    layer named in LAYERS is a package or module that exists."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    existing = {_top(m) for m in MODULES}
    assert set(_layer_of()) <= existing, sorted(set(_layer_of()) - existing)
