"""The README and docs/ say what the code does.

* Every ```bash and ```python block of the README, except the set-up block (it installs), runs in order
  in a scratch copy of ``data/`` and ``configs/``, with a ``packtool`` on PATH that runs this checkout's
  code, and exits 0. The examples are small (the shipped demo data): the whole run is bounded by
  ``EXAMPLES_BUDGET_S``.
* The README's flag table and pack-column table are the ones generated from the code (the stages' option
  keys, ``schema.PACK_COLUMNS``). ``python tests/e2e/test_readme.py`` prints them; ``--write`` puts
  them into the README.
* Relative links and ``#anchors`` in the README and ``docs/*.md`` resolve.
* The README is at most ``MAX_README_LINES`` lines; the rest belongs in ``docs/``.
* docs/quickstart-trainers.md runs as it says: its blocks in order (its Python ones in one process, to
  import transformers once), each Python block complete by itself (no name it does not define).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
QUICKSTART = DOCS / "quickstart-trainers.md"
MAX_README_LINES = 300
EXAMPLES_BUDGET_S = 30  # every README example together, on the 2-core development machine: ~5 s
SETUP_HEADING = "## Set-up"  # its block installs (make demo, make test): not run here
# generated sections of the README: (start marker, end marker)
FLAGS = ("<!-- flags: python tests/e2e/test_readme.py --write -->", "<!-- /flags -->")
COLUMNS = ("<!-- columns: python tests/e2e/test_readme.py --write -->", "<!-- /columns -->")
FENCE = re.compile(r"^```(\w*)\s*$")


# --- generated tables ------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    return f"`{value}`"


def flags_table() -> str:
    """The ``packtool pack`` flag table, from the stages' option declarations (``packtool.options.SPECS``:
    default, help, choices, the choice it applies to), in ``--help``'s order; the flag spellings are the
    click options ``cli.option_params`` makes of them."""
    from packtool.cli import option_params
    from packtool.options import SPECS

    options = {p.name: p for p in option_params()}
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for spec in SPECS.values():
        if not spec.flag:
            continue
        option = options[spec.name]
        names = sorted(option.opts, key=len) + option.secondary_opts
        flag = " / ".join(f"`{n}`" for n in names)
        meaning = f"{spec.section.capitalize()}: {spec.help}"
        if spec.choices:
            meaning += " One of " + ", ".join(f"`{c}`" for c in spec.choices) + "."
        if spec.applies:
            meaning += " Only with " + ", ".join(a.describe() for a in spec.applies) + "."
        rows.append(f"| {flag} | {_default(spec.default)} | {_cell(meaning)} |")
    return "\n".join(rows)


def columns_table() -> str:
    """The pack columns, from ``packtool.schema.PACK_COLUMNS``."""
    from packtool.schema import PACK_COLUMNS

    per = {
        "token": "N",
        "bit": "ceil(N / 8) bytes",
        "segment": "one per piece, +1 for padding",
        "piece": "one per piece",
        "image": "one per image (vision)",
    }
    rows = ["| column | stored as | values per pack | meaning |", "|---|---|---|---|"]
    for c in PACK_COLUMNS:
        name = f"`{c.name}`" + (" (minimal only)" if c.stored_only else " (optional)" if c.optional else "")
        rows.append(f"| {name} | `list<{c.dtype.name}>` | {per[c.per]} | {_cell(c.meaning)} |")
    return "\n".join(rows)


def generated(text: str, markers: tuple[str, str]) -> str:
    """The README's text between ``markers`` (without the blank lines around it)."""
    start, end = markers
    assert text.count(start) == 1 and text.count(end) == 1, f"README needs exactly one {start} ... {end}"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def regenerate(text: str) -> str:
    for markers, table in ((FLAGS, flags_table()), (COLUMNS, columns_table())):
        start, end = markers
        head, rest = text.split(start, 1)
        text = f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}"
    return text


# --- markdown --------------------------------------------------------------------------------------------
def code_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` of every fenced block, in order, with the ``##`` section it is in
    prefixed to the language as ``SECTION\\tLANG``."""
    blocks, section, lang, start, body = [], "", None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if lang is None:
            if line.startswith("## "):
                section = line
            elif m:
                lang, start, body = m.group(1), n, []
        elif line.strip() == "```":
            blocks.append((start, f"{section}\t{lang}", "\n".join(body) + "\n"))
            lang = None
        else:
            body.append(line)
    return blocks


def prose(text: str) -> str:
    """``text`` without fenced blocks and inline code (where link-like text is not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(text: str) -> set[str]:
    """The ``#anchors`` GitHub gives the headings of ``text`` (repeats get ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6} (.*)$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links and anchors of markdown file ``path`` that do not resolve."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.relative_to(ROOT)}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{path.relative_to(ROOT)}: {target}: no such heading")
    return bad


# --- the tests -------------------------------------------------------------------------------------------
def _packtool_shim(bin_dir: Path) -> None:
    """``packtool`` on PATH, running this checkout's code with the test's Python."""
    module = "packtool" if (ROOT / "src" / "packtool" / "__main__.py").exists() else "packtool.cli"
    bin_dir.mkdir()
    shim = bin_dir / "packtool"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
    shim.chmod(0o755)


def _scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A scratch copy of ``data/`` and ``configs/`` to run examples in, and their environment: this
    checkout's ``packtool`` on PATH, Hugging Face caches inside ``tmp_path``, offline."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("data", "configs"):
        shutil.copytree(ROOT / name, work / name)
    _packtool_shim(tmp_path / "bin")
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": pythonpath,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
    }
    return work, env


def test_readme_examples_run(tmp_path):
    work, env = _scratch(tmp_path)
    blocks = [
        (line, kind.split("\t")[1], code)
        for line, kind, code in code_blocks(README.read_text())
        if kind.split("\t")[1] in ("bash", "python") and not kind.startswith(SETUP_HEADING)
    ]
    assert blocks, "the README has no examples to run"
    deadline = time.monotonic() + EXAMPLES_BUDGET_S
    for line, lang, code in blocks:
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        left = deadline - time.monotonic()
        assert left > 0, f"README examples took over {EXAMPLES_BUDGET_S} s (at the block of line {line})"
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=left)
        assert proc.returncode == 0, (
            f"README.md line {line}: the {lang} block exited {proc.returncode}:\n{code}\n"
            f"--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-2000:]}"
        )


def test_quickstart_page_runs(tmp_path):
    """The page's pack command, then its Trainer and TRL blocks: each trains two steps of a tiny random
    model on the packs."""
    work, env = _scratch(tmp_path)
    blocks = [(line, kind.split("\t")[1], code) for line, kind, code in code_blocks(QUICKSTART.read_text())]
    shell = [b for b in blocks if b[1] == "bash"]
    python = [b for b in blocks if b[1] == "python"]
    assert len(shell) == 1 and len(python) == 2, "the page: one pack command, then Trainer and TRL"
    for line, _, code in python:  # each block is what a reader copies: complete by itself
        lint = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821,F401,F811",
             "--stdin-filename", f"block_{line}.py", "-"],
            input=code, capture_output=True, text=True,
        )  # fmt: skip
        assert lint.returncode == 0, f"{QUICKSTART.name} line {line}:\n{lint.stdout}"
    for cmd, line in (
        (["bash", "-euo", "pipefail", "-c", shell[0][2]], shell[0][0]),
        ([sys.executable, "-c", "\n".join(code for _, _, code in python)], python[0][0]),
    ):
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (
            f"{QUICKSTART.name} line {line}: exited {proc.returncode}:\n--- stdout\n{proc.stdout[-2000:]}\n"
            f"--- stderr\n{proc.stderr[-3000:]}"
        )
    assert proc.stdout.count("'train_loss'") == 2, proc.stdout[-2000:]  # both trainers trained


def test_readme_flag_table_is_the_code():
    assert generated(README.read_text(), FLAGS) == flags_table(), (
        "the README's flag table differs from PackOptions: run python tests/e2e/test_readme.py --write"
    )


def test_readme_column_table_is_the_code():
    assert generated(README.read_text(), COLUMNS) == columns_table(), (
        "the README's column table differs from PACK_COLUMNS: run python tests/e2e/test_readme.py --write"
    )


def test_links_and_anchors_resolve():
    pages = [README, *sorted(DOCS.glob("*.md"))]
    assert len(pages) > 1, "docs/ has no pages"
    bad = [b for page in pages for b in broken_links(page)]
    assert not bad, "\n".join(bad)


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move some to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    text = README.read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"](docs/{p.name})" not in text]
    assert not missing, f"README.md does not link to docs/{', docs/'.join(missing)}"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:] == ["--write"]:
        README.write_text(regenerate(README.read_text()))
        print(f"wrote the flag and column tables into {README}")
    else:
        print(flags_table())
        print()
        print(columns_table())
