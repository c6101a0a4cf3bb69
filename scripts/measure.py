"""Measure one job for the benchmarks: wall and CPU seconds, the peak RSS of its largest process and of
its whole process tree.

Why a wrapper process: on Linux a child's ``ru_maxrss`` starts from its parent's high-water mark (the
kernel carries the old address space's peak across fork + exec, and ``subprocess`` uses vfork), so a job
started straight from a benchmark that has just built a large dataset reports at least the benchmark's own
peak. The job therefore runs under a small Python wrapper, and the wrapper's ``RUSAGE_CHILDREN`` is the
job's own. The wrapper's ~20 ms of start-up counts in every row alike.

    from measure import run_measured
    m = run_measured(["packtool", "pack", ...], log=Path("pack.log"))
    m.wall, m.cpu, m.rss, m.tree_rss   # seconds, seconds, bytes, bytes
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Runs argv[2:], then writes the peak RSS (KiB) of the largest process it waited for to the file argv[1].
WRAPPER = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
    "sys.exit(rc)"
)


@dataclass
class Measured:
    rc: int
    wall: float  # seconds
    cpu: float  # user + system seconds of the job and all its processes
    rss: int  # bytes: the peak resident set of its largest single process
    tree_rss: int  # bytes: the peak of the summed resident sets of all its processes (polled)
    t0: float  # time.time() at start
    log: Path  # its stdout and stderr


def tree_rss(root: int, include_root: bool = True) -> int:
    """Summed RSS (bytes) of ``root``'s descendants (and of ``root`` itself if asked), from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * page
    total, todo = 0, list(children.get(root, []))
    if include_root:
        total += rss.get(root, 0)
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


class _ExitWaiter:
    """``ended(timeout)``: True as soon as child ``pid`` has exited (not reaped yet), else False after
    ``timeout`` s; through a pidfd (Linux 5.3+), elsewhere by polling to within ``timeout``.

    The wall time used to be taken after a ``sleep(poll)`` loop, so it was late by up to ``poll`` (0.2 s in
    bench_pack, on jobs of about a second)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None

    def ended(self, timeout: float) -> bool:
        if self.fd is not None:
            return bool(select.select([self.fd], [], [], timeout)[0])
        if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(timeout)
        return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def run_measured(
    cmd: list[str],
    env: dict | None = None,
    log: Path | None = None,
    cwd: Path | None = None,
    poll: float = 0.05,
) -> Measured:
    """Run ``cmd`` under the wrapper to its end, output into ``log``; ``env`` adds to the environment."""
    full_env = {**os.environ, **(env or {})}
    if log is None:
        fd, name = tempfile.mkstemp(prefix="measure-", suffix=".log")
        os.close(fd)
        log = Path(name)
    with tempfile.TemporaryDirectory(prefix="measure-") as tmp:
        rss_file = Path(tmp) / "maxrss"
        with open(log, "w") as out:
            t0_epoch, t0 = time.time(), time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-c", WRAPPER, str(rss_file), *cmd],
                stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
            )  # fmt: skip
            peak = 0
            waiter = _ExitWaiter(proc.pid)
            while not waiter.ended(poll):  # the RSS is sampled every ``poll`` s; the end is seen at once
                peak = max(peak, tree_rss(proc.pid, include_root=False))
            wall = time.perf_counter() - t0
            waiter.close()
            _, status, usage = os.wait4(proc.pid, 0)
        max_rss = int(rss_file.read_text()) * 1024 if rss_file.exists() else 0
    return Measured(
        rc=os.waitstatus_to_exitcode(status),
        wall=wall,
        cpu=usage.ru_utime + usage.ru_stime,
        rss=max_rss,
        tree_rss=max(peak, max_rss),
        t0=t0_epoch,
        log=log,
    )


# Runs ``packtool ARGS`` (argv[2:]) with ``record_step`` as ``progress.on_step``, appending each step of the
# run (``read``, ``encode`` ..., ``plan``, ``write`` ...) and when it came to the file argv[1]; scripts/ on
# PYTHONPATH, so that the local engine's workers find the hook by name.
STEPS_RUNNER = (
    "import functools, sys, measure; from packtool.pipeline import progress; "
    "progress.on_step = functools.partial(measure.record_step, sys.argv[1]); "
    "from packtool.cli import main; main(sys.argv[2:], prog_name='packtool')"
)


def record_step(path: str, step: str, n: int) -> None:
    """``progress.on_step``: ``STEP N TIME`` (``time.perf_counter``) appended to ``path``."""
    with open(path, "a") as f:
        f.write(f"{step} {n} {time.perf_counter()} {os.getpid()}\n")


def step_times(path: Path) -> dict[str, float]:
    """Each step's last time in a ``record_step`` file: ``{"read": t, "plan": t, ...}``."""
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        step, _, t, *_ = line.split()
        out[step] = float(t)
    return out
