"""The package's shape, checked on every run: the folder tree is the architecture.

* No import cycle between packtool's modules, imports inside functions included.
* No module over 600 lines.
* An import inside a function only where ``DEFERRED`` allows it (optional extras, and the few imports
  deferred on purpose), each with a comment on its line or the line above saying why.
* One registry maps a shard format's name to its code (``packtool.formats.registry``); the config's list
  of names agrees with it. Each entry holds a writer, a reader and a checker; code that only reads (the
  readers, the loader, the manifest's binding) uses only the reader role.
* A stage package's ``__init__.py`` imports nothing, and ``packtool pack --help`` (the stages' options)
  imports neither numpy nor pyarrow: the CLI starts in under 0.1 s.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "packtool"
MAX_LINES = 600
OPTIONAL_EXTRAS = ("ray", "megatron", "transformers", "matplotlib")  # pyproject.toml's extras
# importer -> the packtool modules it may import inside a function (each site says why in a comment)
DEFERRED = {
    "packtool": {"packtool.reading", "packtool.pipeline.run"},  # the lazy public API (PEP 562)
    "packtool.cli": {
        "packtool.options",  # the stages' option groups: `packtool --help` does not import the stages
        "packtool.config_file",
        "packtool.pipeline.engines",
        "packtool.pipeline.engines.local",
        "packtool.pipeline.run",
        "packtool.inspect",
        "packtool.inspect.mixture",
        "packtool.inspect.render",
        "packtool.verify",
        "packtool.storage.outputs",  # fsspec, numpy and the cache: only a command that reads an output
    },
    "packtool.readers.inputs": {"packtool.readers.hf"},  # datasets is slow to import
    "packtool.pipeline.engines": {"packtool.pipeline.engines.ray"},  # the ray extra
    "packtool.encoders.registry": {"packtool.encoders.vision"},  # the vision extra: Pillow, transformers
    "packtool.tokenizing.chat_template": {"packtool.tokenizing.template_sandbox"},  # the extra's jinja2
    "packtool.verify": {"packtool.verify.images"},  # the vision extra, for image outputs only
}
# importer -> third-party modules it may import inside a function (each site says why)
DEFERRED_THIRD_PARTY = {
    "packtool.config_file": {"yaml"},  # yaml: ~20 ms of every start-up
    "packtool.storage.urls": {"fsspec"},  # ~90 ms, paid only by a command that opens a URL
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
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
            allowed = (
                target.split(".")[0] in OPTIONAL_EXTRAS
                or target in DEFERRED.get(name, ())
                or target in DEFERRED_THIRD_PARTY.get(name, ())
            )
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
    from packtool.formats.options import FORMATS as NAMES
    from packtool.formats.registry import FORMATS

    assert tuple(FORMATS) == NAMES
    outside = []
    for name, path in MODULES.items():
        if name.startswith("packtool.formats"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            compared = any(f'== "{f}"' in line or f'!= "{f}"' in line for f in NAMES)
            if compared and "format" in line:  # (readers compare input kinds, which include "parquet")
                outside.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not outside, "dispatch on a shard format's name outside packtool.formats:\n" + "\n".join(outside)


# modules that only read an output: they may use a format's reader role, never its writer or checker
READ_ONLY = ("packtool.reading", "packtool.binding", "packtool.loader")


def test_shard_formats_are_split_by_role():
    from packtool.formats.base import ShardChecker, ShardReader, ShardWriter
    from packtool.formats.registry import FORMATS

    for fmt in FORMATS.values():
        assert isinstance(fmt.writer, ShardWriter), fmt.name
        assert isinstance(fmt.reader, ShardReader), fmt.name
        assert isinstance(fmt.checker, ShardChecker), fmt.name
    assert len({fmt.suffix for fmt in FORMATS.values()}) == len(FORMATS)  # verify's strays glob on them
    wrong = []
    for name, path in MODULES.items():
        if not any(name == m or name.startswith(m + ".") for m in READ_ONLY):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("writer", "checker"):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not wrong, "a read-only module uses a format's writer or checker:\n" + "\n".join(wrong)


# the options: each stage's group is declared in its own package and read only there -----------------------
# PackOptions' attribute -> the stage (package) that owns that group
STAGE_OF_GROUP = {
    "reading": "readers",
    "encoding": "encoders",
    "packing": "packing",
    "output": "formats",
    "running": "pipeline",
}
# the registry (gathers the groups for the CLI, the config file and the docs) and the CLI that presents them
REGISTRY = {"packtool.options", "packtool.option_types", "packtool.config_file", "packtool.cli"}
# The driver (packtool.pipeline; verify --source and inspect --pack re-read inputs as it does) hands each
# stage its group and passes a few values between stages (N, the pad id, the labels convention, the
# inputs...). Each such read of another stage's option is listed here: a new one fails the test, so that
# it is added on purpose (or, better, the stage gets a function that answers the driver's question).
DRIVER_READS = {
    "packtool.pipeline.chunks": {"encoding.labels", "output.columns"},
    "packtool.pipeline.encode": {
        "encoding.text_field",
        "packing.long_samples",
        "packing.packed_sequence_size",
        "packing.split_across_pack",
        "reading.files",  # --input-format: how the files are read, wherever they are read
        "reading.inputs",
        "reading.split",  # first_bad_record reads a file again up to its bad record
    },
    "packtool.pipeline.engines": {"encoding.tokenizer", "reading.inputs"},
    "packtool.pipeline.memory": {"encoding.tokenizer", "reading.files", "reading.inputs"},
    # the run_id binds the manifest fields readers rely on (binding.reading_fields), for both drivers
    "packtool.pipeline.identity": {
        "encoding.labels",
        "output.columns",
        "output.format",
        "packing.packed_sequence_size",
        "packing.pad_token_id",
    },
    "packtool.pipeline.run": {
        "encoding.text_field",
        "encoding.labels",  # bound into the run_id (binding.reading_fields); given labels equal to the ids
        "encoding.tokens",  # the BOS/EOS the user named: one the tokenizer had to guess is warned of
        "encoding.vision",  # --balance-visual-tokens orders the packs
        "output.columns",
        "output.format",
        "output.output",
        "output.shard_size",
        "packing.packed_sequence_size",
        "packing.pad_token_id",
        "packing.max_packs",  # the losses said when nothing or not all is packed
        "packing.seed",
        "packing.split_across_pack",  # the warning of split samples' nemo positions
        "packing.val_fraction",
        "reading.files",
        "reading.inputs",
        "reading.split",
    },
    "packtool.pipeline.summary": {
        "encoding.fine_tuning",
        "encoding.labels",
        "output.columns",  # the manifest's layout
        "output.format",
        "packing.packed_sequence_size",
        "packing.pad_token_id",
    },
    "packtool.pipeline.write": {
        "encoding.labels",
        "output.columns",
        "output.format",
        "packing.cp_size",
        "packing.packed_sequence_size",
        "packing.pad_token_id",
    },
    # the checks before a run: the writers' memory; the options that would cut an image
    "packtool.pipeline.preflight": {
        "output.format",
        "output.shard_size",
        "output.webdataset",  # --shard-max-bytes refused for vision samples: the plan knows no image bytes
        "packing.packed_sequence_size",
        "packing.cp_size",  # refused for vision samples: no context-parallel padding around image spans
        "packing.long_samples",  # truncate/split refused for vision samples: an image is never cut
        "packing.split_across_pack",
    },
    "packtool.verify.source": {
        "encoding.text_field",
        "reading.files",
        "reading.inputs",
        "reading.split",
        "running.on_error",
    },
    "packtool.verify.images": {"reading.inputs", "running.on_error"},  # verify --source of an image output
    # inspect --pack re-reads a source
    "packtool.inspect.sources": {"encoding.text_field", "reading.files", "reading.split"},
}


def _stage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGE_OF_GROUP.values() else None


def test_option_groups_are_declared_in_their_stage():
    from packtool.option_types import OptionGroup
    from packtool.options import PackOptions

    def groups(cls):
        for f in msgspec.structs.fields(cls):
            if isinstance(f.type, type) and issubclass(f.type, OptionGroup):
                yield f.type
                yield from groups(f.type)

    for attr, stage in STAGE_OF_GROUP.items():
        top = next(f.type for f in msgspec.structs.fields(PackOptions) if f.name == attr)
        for cls in (top, *groups(top)):
            assert cls.__module__ == f"packtool.{stage}.options", (
                f"{cls.__name__} is not declared in {stage}/"
            )


def test_a_stage_options_module_is_imported_only_by_its_stage_and_the_registry():
    bad = []
    for name, path in MODULES.items():
        for target, line, _ in imports(path):
            owner = target.split(".")[1] if target.endswith(".options") and target.count(".") == 2 else None
            if owner and _stage(name) != owner and name not in REGISTRY:
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert not bad, "a stage's options imported outside the stage:\n" + "\n".join(bad)


def test_no_module_outside_a_stage_reads_its_options():
    bad = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)):
                continue
            group = node.value.attr
            if group not in STAGE_OF_GROUP or _stage(name) == STAGE_OF_GROUP[group] or name in REGISTRY:
                continue
            read = f"{group}.{node.attr}"
            if read not in DRIVER_READS.get(name, ()):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: reads {read}")
    assert not bad, "options read outside their stage:\n" + "\n".join(bad)


def test_the_option_reads_check_finds_a_read():
    tree = ast.parse("def f(options):\n    return options.packing.seed\n")
    reads = [
        f"{n.value.attr}.{n.attr}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
    ]
    assert reads == ["packing.seed"]


def test_a_stage_package_file_imports_nothing():
    """Importing ``packtool.<stage>.options`` runs ``packtool/<stage>/__init__.py`` first: it stays a
    docstring, so that declaring the options (``packtool pack --help``) does not import the stage's code."""
    for stage in sorted(set(STAGE_OF_GROUP.values())):
        tree = ast.parse((PACKAGE / stage / "__init__.py").read_text())
        found = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not found, f"src/packtool/{stage}/__init__.py imports at lines {found}"


def test_declaring_the_options_imports_neither_numpy_nor_pyarrow():
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write(repr(sorted(m for m in ('numpy', 'pyarrow', 'tokenizers',"
        " 'torch') if m in sys.modules))))\n"
        "import packtool.cli\n"
        "packtool.cli.main(['pack', '--help'])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and "--packed-sequence-size" in run.stdout, run.stderr
    assert run.stderr.splitlines()[-1] == "[]", run.stderr


# what users import: the CLI, the package's API, the loader and its task encoders, the masks, the readers
# of NeMo's and Energon's layouts, the vision loader
ENTRY_POINTS = (
    "packtool",
    "packtool.cli",
    "packtool.loader",
    "packtool.loader.trl",
    "packtool.loader.hf_trainer",
    "packtool.masks",
    "packtool.energon",
    "packtool.nemo",
    "packtool.vision.loader",
    "packtool.vision.energon",
)


def test_every_module_is_reached_from_what_users_import():
    """No module that only tests import: code the product never runs is deleted, not kept beside it."""
    edges, seen = graph(), set()
    todo = [m for m in ENTRY_POINTS]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(edges[name])
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}  # imported with any
    unreached = sorted(set(MODULES) - seen - packages - {"packtool.version"})
    assert not unreached, f"modules no entry point imports: {unreached}"


def test_one_definition_of_the_image_columns():
    definitions = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in MODULES.values()
        for i, line in enumerate(path.read_text().splitlines(), start=1)
        if line.startswith("IMAGE_COLUMNS =")
    ]
    assert definitions == ["src/packtool/schema.py:110"], definitions
