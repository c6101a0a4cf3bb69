"""Start-up of the CLI and a whole demo pack, this checkout against another commit, runs interleaved.

    python scripts/bench_startup.py [--base-ref 51bca6e] [--repeats 7]

Times four commands as ``packtool`` runs them (a fresh Python process each): ``packtool --help``,
``packtool pack --help``, ``packtool pack --config configs/demo.yaml`` (two workers, as ``make demo``)
and the same with ``--num-proc 1``. The reference is the same commands at ``--base-ref`` (``git
archive`` of that commit into a temporary folder, run with the same Python and packages), or, without
one, ``python -c 'import click'`` (the floor: what any Click CLI pays). Each pair runs back to back,
``--repeats`` times; the table gives the median wall seconds and the median CPU seconds of the process
and its children (which other jobs on a shared machine change less than the wall time).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_CLI = "from packtool.cli import main; main()"


def commands(out: Path) -> dict[str, list[str]]:
    demo = ["pack", "--config", str(ROOT / "configs" / "demo.yaml"), "--overwrite", "-q", "-o", str(out)]
    return {
        "packtool --help": ["--help"],
        "packtool pack --help": ["pack", "--help"],
        "demo pack (2 workers)": demo,
        "demo pack --num-proc 1": [*demo, "--num-proc", "1"],
    }


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (the process and its children) of one run; exits on a failed run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode:
        sys.exit(f"{' '.join(argv)} failed ({run.returncode}): {run.stderr[-400:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def checkout(ref: str, into: Path) -> Path:
    """The package folder of commit ``ref`` (``git archive``): ``src/`` in the src layout, else the root."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")
    return into / "src" if (into / "src" / "packtool").is_dir() else into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-ref", help="the commit to compare with (default: `import click` alone)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trees = {"this checkout": ROOT / "src"}
        if args.base_ref:
            trees[args.base_ref] = checkout(args.base_ref, tmp / "base")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.repeats):
            for tag, tree in trees.items():
                env = dict(os.environ, PYTHONPATH=str(tree))
                for name, argv in commands(tmp / f"out-{len(tag)}").items():
                    run = timed([sys.executable, "-c", RUN_CLI, *argv], env)
                    times.setdefault((name, tag), []).append(run)
            if not args.base_ref:
                times.setdefault(("import click", "floor"), []).append(
                    timed([sys.executable, "-c", "import click"], dict(os.environ))
                )
    print(f"median of {args.repeats} interleaved runs; seconds, wall / CPU (process and children)")
    for (name, tag), runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"  {name:24s} {tag:16s} {wall:6.3f} / {cpu:6.3f}")


if __name__ == "__main__":
    main()
