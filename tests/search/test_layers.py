"""The layer map of search/__init__.py holds: no module imports a higher layer, no modules import each other
in a circle (function-level imports included), and the layers that read a campaign (records, analysis,
monitor) load neither Ray, torch nor timm."""
import ast
import json
import subprocess
import sys

import pytest
from helpers import REPO

# Lowest first: a module may import its own layer and any lower one. The package root (qkvsearch itself,
# the public facade that builds models lazily) and search/__init__ with its legacy aliases stand outside.
LAYERS = [
    ("qkvsearch.storage", "qkvsearch.ray_private"),
    ("qkvsearch.spaces",),
    # trainers/ by role; the Ray Train adapter (ray_train/) above the others, whose runs it starts
    ("qkvsearch.trainers.model",),
    ("qkvsearch.trainers.data",),
    ("qkvsearch.trainers.training",),
    ("qkvsearch.trainers.deploy",),
    ("qkvsearch.trainers.stages",),
    ("qkvsearch.trainers.supernet",),
    ("qkvsearch.trainers.ray_train", "qkvsearch.trainers"),
    ("qkvsearch.search.records",),
    ("qkvsearch.search.analysis",),
    ("qkvsearch.search.monitor",),
    ("qkvsearch.search.scheduling",),
    ("qkvsearch.search.searchers",),
    ("qkvsearch.search.cluster",),
    ("qkvsearch.search.campaign",),
    ("qkvsearch.search.simulation",),
    ("qkvsearch.search.cli",),
]
OUTSIDE = {"qkvsearch", "qkvsearch._legacy", "qkvsearch.search"}
FOLDERS = {"search/_root": "qkvsearch", "search": "qkvsearch.search", "spaces": "qkvsearch.spaces",
           "trainers": "qkvsearch.trainers"}
LIGHT = ("records", "analysis", "monitor")  # the layers status, watch and report stand on
HEAVY = ("ray", "torch", "timm")


def _module_name(path) -> str:
    rel = path.relative_to(REPO)
    folder = next(f for f in sorted(FOLDERS, key=len, reverse=True) if str(rel).startswith(f + "/"))
    parts = list(rel.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([FOLDERS[folder], *parts])


def _modules() -> dict[str, object]:
    out = {}
    for folder in FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            if "_root" in path.parts and folder != "search/_root":
                continue
            out[_module_name(path)] = path
    return out


def _layer(module: str) -> int | None:
    """The layer of the longest prefix that holds ``module`` (a module may stand above its own package)."""
    found = [(len(p), rank) for rank, prefixes in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    return max(found)[1] if found else None


def _imports(path) -> list[tuple[int, str]]:
    """(line, module) of every qkvsearch import in the file, at module level or inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("qkvsearch")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qkvsearch"):
            # `from qkvsearch.x import y` may import the module qkvsearch.x.y: judge that one where it exists
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def test_every_module_belongs_to_a_layer():
    assert [m for m in _modules() if m not in OUTSIDE and _layer(m) is None] == []


def test_no_module_imports_a_higher_layer():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        own = _layer(name)
        if own is None:
            continue
        for line, target in _imports(path):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]  # an object imported from a module: that module's layer
            layer = _layer(target)
            if layer is not None and layer > own:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target} (layer {LAYERS[layer][0]})")
    assert wrong == []


def _graph() -> dict[str, set[str]]:
    """module -> the modules of the project it imports, anywhere in its file."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = set()
        for _, target in _imports(path):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def test_no_modules_import_each_other_in_a_circle():
    graph, circles = _graph(), []
    for start in sorted(graph):  # a circle through start: start reaches itself
        seen, stack = set(), [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert circles == []


MAX_LINES = 450


def test_no_module_passes_the_line_limit():
    long = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {n: lines for n, lines in long.items() if lines > MAX_LINES} == {}


@pytest.mark.parametrize("layer", LIGHT)
def test_reading_layers_load_neither_ray_torch_nor_timm(layer):
    modules = sorted(m for m in _modules() if m.startswith(f"qkvsearch.search.{layer}"))
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(__import__('json').dumps(sorted(set({HEAVY!r}) & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert json.loads(out.stdout) == [], f"importing search.{layer} loads {out.stdout.strip()}"
