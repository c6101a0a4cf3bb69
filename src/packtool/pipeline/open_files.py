"""How many scratch chunks a process keeps mapped: as many as its open-file limit and the kernel's limit on
memory mappings allow, up to ``MAX_OPEN``.

Writing shuffled packs, every gather touches nearly every chunk: when the chunks outnumber the ones kept
open, each gather reopens them all (docs/performance.md has what that cost), so the more that stay open the
better, within the limits. Each open chunk holds one descriptor and one mapping per mapped array (its token
columns; a vision-language chunk's image table and blob too).
"""

from __future__ import annotations

from pathlib import Path

try:
    import resource  # Unix: the open-file limit
except ImportError:  # pragma: no cover - Windows
    resource = None

MAX_OPEN = 8192  # chunks mapped at once at most: 33M samples at the default chunk_size of 4096


def default_max_open(maps_per_chunk: int = 3) -> int:
    """Chunks to keep mapped, each holding ``maps_per_chunk`` descriptors and mappings; the soft open-file
    limit is first raised toward the hard one, as far as ``MAX_OPEN`` chunks need."""
    if resource is None:
        return 8
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 8
    want = 64 + maps_per_chunk * MAX_OPEN
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (OSError, ValueError):
                pass
    by_maps = max(1, (max_map_count() - 4096) // maps_per_chunk)
    if soft == resource.RLIM_INFINITY:
        return min(MAX_OPEN, by_maps)
    return max(1, min(MAX_OPEN, by_maps, (soft - 64) // maps_per_chunk))


def max_map_count() -> int:
    """The kernel's limit on a process's memory mappings (Linux ``vm.max_map_count``; 65530 by default)."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530
