"""The package's shape, checked on every run: the folder tree is the architecture.

* No import cycle between packtool's modules, imports inside functions included.
* No module over 600 lines.
* An import inside a function only where ``DEFERRED`` allows it (optional extras, and the few imports
  deferred on purpose), each with a comment on its line or the line above saying why.
* One registry maps a shard format's name to its code (``packtool.formats``); the config's list of names
  agrees with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "packtool"
MAX_LINES = 600
OPTIONAL_EXTRAS = ("ray", "megatron", "transformers", "matplotlib")  # pyproject.toml's extras
# importer -> the packtool modules it may import inside a function (each site says why in a comment)
DEFERRED = {
    "packtool": {"packtool.reading", "packtool.pipeline.run"},  # the lazy public API (PEP 562)
    "packtool.cli": {
        "packtool.pipeline.run",
        "packtool.inspect",
        "packtool.inspect.render",
        "packtool.verify",
    },
    "packtool.readers": {"packtool.readers.hf"},  # datasets is slow to import
    "packtool.pipeline.engines": {"packtool.pipeline.engines.ray"},  # the ray extra
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement imports (``from a import b`` imports ``a.b`` if that is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert node.level == 0, "packtool uses absolute imports only"
    base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(module, line, inside a function)`` of every import of ``path`` (each module once a line)."""
    tree = ast.parse(path.read_text())
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                out.extend((m, child.lineno, in_function) for m in dict.fromkeys(imported(child)))
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, inner)

    visit(tree, False)
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for target, _, _ in imports(path):
            if target in MODULES and target != name:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
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
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles (imports inside functions count): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_600_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines: split it by concern"


def test_imports_inside_functions_are_deferred_on_purpose_and_say_why():
    bad = []
    for name, path in MODULES.items():
        source = path.read_text().splitlines()
        for target, line, in_function in imports(path):
            if not in_function:
                continue
            allowed = target.split(".")[0] in OPTIONAL_EXTRAS or target in DEFERRED.get(name, ())
            said = _explained(source, line)
            if not allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {target} imported inside a function")
            elif not said:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {target} deferred without a comment saying why")
    assert not bad, "\n".join(bad)


def _explained(source: list[str], line: int) -> bool:
    """A comment on the import's line, or on a line of the block of imports it is in, or just above it."""
    i = line - 1
    while i >= 0 and (source[i].strip().startswith(("import ", "from ")) or not source[i].strip()):
        if "#" in source[i]:
            return True
        i -= 1
    return i >= 0 and "#" in source[i]


def test_one_registry_of_shard_formats():
    from packtool.config import FORMATS as NAMES
    from packtool.formats import FORMATS

    assert tuple(FORMATS) == NAMES
    outside = []
    for name, path in MODULES.items():
        if name.startswith("packtool.formats") or name == "packtool.config":
            continue
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            compared = any(f'== "{f}"' in line or f'!= "{f}"' in line for f in NAMES)
            if compared and "format" in line:  # (readers compare input kinds, which include "parquet")
                outside.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not outside, "dispatch on a shard format's name outside packtool.formats:\n" + "\n".join(outside)
