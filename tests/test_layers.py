"""The packages form layers: each imports only the packages below it, so there is no import
cycle between packages (docs/ARCHITECTURE.md draws the same table).

Every import in autosched/ and importers/ counts, also one inside a function: importing lazily
keeps start-up fast, but the code still depends on the module. A module belongs to the unit of
its first folder under autosched/ (autosched/graph/ops.py is in "graph"); a top-level module is
a unit of its own (autosched/driver.py is "driver"); autosched/__init__.py is the public API,
"autosched"; autosched/__main__.py belongs to "cli"; importers/ is "importers".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autosched", "importers")

# What each unit may import, from the bottom up.
LAYERS: dict[str, set[str]] = {
    "errors": set(),
    "version": set(),
    "settings": set(),
    "cache": {"errors", "settings"},
    "te": {"errors"},
    "tir": {"errors", "te"},
    "schedule": {"errors", "settings", "te", "tir"},
    "targets": {"errors", "settings", "cache", "te", "tir"},
    "driver": {"schedule", "targets", "tir"},
    "cost_model": {"errors", "te", "tir", "schedule", "targets"},
    "search": {"errors", "version", "settings", "cache", "te", "tir", "schedule", "targets", "driver",
               "cost_model"},
    "graph": {"errors", "version", "settings", "cache", "te", "tir", "schedule", "targets", "driver",
              "search"},
    "importers": {"errors", "te", "graph"},
    "autosched": {"errors", "version", "te", "schedule", "driver", "search", "graph",
                  "importers"},
    "demo": {"autosched", "te", "search", "graph", "importers"},
    "report": {"errors", "search"},
    "cli": {"autosched", "errors", "search", "graph", "importers", "demo", "report"},
    "testing": {"settings", "te", "demo"},
}



def modules() -> dict[str, Path]:
    """{dotted module name: file} for every module of the packages."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of ours in the module, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            # ``from autosched import te`` imports the module autosched.te
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            if target.split(".")[0] in PACKAGES:
                assert target in known, f"{path}:{node.lineno} imports {target}, not a module"
                yield target, node.lineno


def unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "importers":
        return "importers"
    if len(parts) == 1:
        return "autosched"
    return "cli" if parts[1] == "__main__" else parts[1]


def edges() -> Iterator[tuple[str, str, str]]:
    """(importing module, imported module, where) for every import between two units."""
    known = modules()
    for name, path in sorted(known.items()):
        for target, line in imports(name, path, known):
            if unit(name) != unit(target):
                yield name, target, f"{path.relative_to(ROOT)}:{line}"


def test_every_unit_has_a_layer() -> None:
    assert {unit(m) for m in modules()} == set(LAYERS)


def test_the_architecture_page_draws_this_table() -> None:
    """docs/ARCHITECTURE.md's layer table names the same units with the same imports."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Layers\n", 1)[1].split("\n## ", 1)[0]
    drawn = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            may = cells[2]
            drawn[cells[0].strip("`")] = set() if may == "nothing" else set(may.split(", "))
    assert drawn == LAYERS


def test_layers_have_no_cycle() -> None:
    """The table itself is a DAG: a unit never reaches itself through what it may import."""
    for start in LAYERS:
        seen, stack = set(), list(LAYERS[start])
        while stack:
            u = stack.pop()
            assert u != start, f"{start} may import itself through {sorted(seen)}"
            if u not in seen:
                seen.add(u)
                stack.extend(LAYERS[u])


def test_imports_follow_the_layers() -> None:
    wrong = [f"{where}: {name} imports {target} ({unit(name)} may not import {unit(target)})"
             for name, target, where in edges() if unit(target) not in LAYERS[unit(name)]]
    assert not wrong, "\n".join(wrong)


def test_constant_folding_needs_no_search() -> None:
    """Folding a node runs it on the reference backend: nothing that graph.passes reaches,
    at any depth, is part of the search."""
    known = modules()
    seen, stack = set(), ["autosched.graph.passes"]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(t for t, _ in imports(name, known[name], known))
    reached = sorted(m for m in seen if unit(m) == "search")
    assert not reached, f"graph.passes reaches {reached}"
