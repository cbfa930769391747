"""Dependencies point one way: no import cycle between fastmode's modules, and no package
importing one above it in LAYERS.

What counts as an import: every `import` and `from ... import` statement in a module, read
with `ast` without importing anything: at module level, inside functions (the lazy imports
that keep torch out of `fastmode --help`) and under `if TYPE_CHECKING:` alike, since each
states that the module depends on the other. `from a.b import c` is an import of the module
`a.b.c` when that is a module, else of `a.b`. Importing `a.b.c` is not counted as importing
the package `a.b` (whose `__init__` Python also runs), and names resolved at run time
(`importlib.import_module`, the CLI's command table) are not seen.

A package (or a module at the package's base) belongs to one layer; a module may import
modules of its own layer and of the layers below it. Packages in one layer may import each
other as long as no cycle of modules forms: the engine's step loop drives speculation,
and speculation reads the engine's scheduler, sequences and block manager.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first. "__init__" is the package root (`fastmode.LLM`).
LAYERS: list[tuple[str, ...]] = [
    ("config", "env", "sampling_params", "flags"),  # a checkpoint's shape, the environment, a request's sampling, flags
    ("kernels",),
    ("models",),
    ("loader",),
    ("engine", "speculative"),
    ("llm", "__init__"),
    ("planner", "sim", "calibrate", "evals", "distill"),  # tools over the engine and the in-process API
    ("server",),
    ("ray", "bench", "vllm"),  # the server scaled out; a load generator for any server; the lane inside vLLM
    ("commands", "cli"),
]

# Imports (importer, imported) that break the rules today and are being removed: the runtime
# (the loader, the draft model) loads a Spark through the training package `distill`, and
# loader/load.py -> distill/spark.py -> loader/ is a cycle. Loading a Spark moves to the
# loader; delete each entry once its import is gone (test_known_exceptions_still_occur
# fails for an entry that no longer occurs). Never add one.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = {
    ("fastmode.loader.load", "fastmode.distill.export"),
    ("fastmode.loader.load", "fastmode.distill.spark"),
    ("fastmode.speculative.draft_source", "fastmode.distill"),
}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the fastmode package (a package by its __init__)."""
    out = {}
    for path in sorted((SRC / "fastmode").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The fastmode module `name` names, or the nearest package above it; None outside fastmode."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the fastmode modules it imports anywhere in its body."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1 packages
                    package = module.split(".") if is_package else module.split(".")[:-1]
                    package = package[: len(package) - (node.level - 1)]
                    base = ".".join([*package, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target.split(".")[0] != "fastmode":
                    continue
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != module:
                    graph[module].add(resolved)
    return graph


def _unit(module: str) -> str:
    """The package or base module a module belongs to: fastmode.engine.scheduler -> engine."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = _modules()
GRAPH = _imports(MODULES)
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _edges() -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in GRAPH.items() for b in targets if (a, b) not in KNOWN_EXCEPTIONS)


def _cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(MODULES):
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_import_graph_is_read():
    # Guards the reader itself: a graph it failed to build would pass every rule below.
    assert len(MODULES) > 100
    assert "fastmode.engine.sequence" in GRAPH["fastmode.engine.scheduler"]
    assert "fastmode.server.app" in GRAPH["fastmode.commands.serve"]  # a function-level import


def test_every_package_has_a_layer():
    units = {_unit(m) for m in MODULES}
    assert units - set(LAYER_OF) == set(), "place each new package in LAYERS"
    assert set(LAYER_OF) - units == set(), "LAYERS names a package that does not exist"


def test_no_package_imports_one_above_it():
    upward = [
        f"{a} ({_unit(a)}, layer {LAYER_OF[_unit(a)]}) imports {b} ({_unit(b)}, layer {LAYER_OF[_unit(b)]})"
        for a, b in _edges()
        if LAYER_OF[_unit(a)] < LAYER_OF[_unit(b)]
    ]
    assert upward == []


def test_no_import_cycles():
    assert _cycles(_edges()) == []


@pytest.mark.parametrize(("importer", "imported"), sorted(KNOWN_EXCEPTIONS))
def test_known_exceptions_still_occur(importer, imported):
    assert imported in GRAPH.get(importer, ()), f"{importer} no longer imports {imported}: delete the entry"
