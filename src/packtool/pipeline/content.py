"""What a scratch chunk holds, summed up: its content digest (``chunk_digest``: the run's identity is made
from these, and a resumed run checks a chunk against its own) and whether its labels are its input ids
(``labels_equal_input_ids``)."""

from __future__ import annotations

import numpy as np
import xxhash

from packtool.errors import ConfigError
from packtool.manifest import IGNORE_INDEX

DIGESTED = ("input_ids", "labels", "loss_mask", "rows")  # with the samples' lengths: a chunk's content


def chunk_digest(parts: list[dict], dtypes: dict, names: tuple[str, ...] = DIGESTED) -> str:
    """XXH3 (128 bits, fast: docs/performance.md) of a chunk's content: its ``names`` arrays (``DIGESTED``,
    and for a scratch chunk's own check its ``source_ids`` too) end to end in their ``dtypes``, then the
    samples' lengths (int64), whether given as one part or as several
    (``chunk_parts``'s parts, or a whole chunk read back: ``{name: array, "offsets": ...}``). The run's
    identity is made from these (``binding.content_run_key``), and a resumed run checks a scratch chunk
    against its own.

    >>> ids = np.arange(4)
    >>> whole = {"input_ids": ids, "labels": ids, "offsets": np.array([0, 1, 4])}
    >>> parts = [{"input_ids": ids[:1], "labels": ids[:1], "offsets": np.array([0, 1])},
    ...          {"input_ids": ids[1:], "labels": ids[1:], "offsets": np.array([0, 3])}]
    >>> dtypes = {"input_ids": np.int32, "labels": np.int32}
    >>> chunk_digest([whole], dtypes) == chunk_digest(parts, dtypes)
    True
    """
    out = xxhash.xxh3_128()
    for name in (*names, "lengths"):
        h = xxhash.xxh3_128()
        for part in parts:
            if name == "lengths":
                array = np.diff(np.asarray(part["offsets"], dtype=np.int64))
            elif name in part:
                array = np.ascontiguousarray(part[name], dtype=dtypes[name])
            else:
                continue
            h.update(memoryview(array).cast("B"))
        out.update(name.encode() + h.digest())
    return out.hexdigest()


def labels_equal_input_ids(parts: list[dict]) -> bool:
    """Whether every label that takes a loss (not ``-100``) equals the input id at its own position, with
    at least one such label: labels that follow the ``unshifted`` rule (a trainer shifts them), which no
    real text gives under the ``shifted`` one (that would need every sample to repeat one token).

    >>> ids = np.array([5, 6, 7], np.int32)
    >>> labels_equal_input_ids([{"input_ids": ids, "labels": ids}])
    True
    >>> labels_equal_input_ids([{"input_ids": ids, "labels": np.array([6, 7, -100], np.int32)}])
    False
    """
    seen = False
    for part in parts:
        ids, labels = part["input_ids"], part["labels"]
        head = labels[:256]  # shifted or made labels differ at once: the whole compare is rarely made
        if np.any((head != IGNORE_INDEX) & (head != ids[:256])):
            return False
        trained = labels != IGNORE_INDEX
        if np.any((labels != ids) & trained):
            return False
        seen = seen or bool(trained.any())
    return seen


def labels_as_given(
    labels: str, strict: bool, sample_format: str, fields: list[str], metas: list[dict]
) -> list[str]:
    """Pretokenized input with ``labels`` of its own, equal to its ``input_ids`` in every sample (each
    chunk's meta says, ``labels_equal_input_ids``), packed as ``labels`` ``shifted``: such labels follow the
    ``unshifted`` rule, and a trainer that believes the manifest would learn to copy its input. A warning
    (in the manifest's ``warnings``, which ``pack`` prints), or under ``strict`` a ``ConfigError`` before any
    shard is written.

    >>> labels_as_given("shifted", False, "pretokenized", ["input_ids", "labels"],
    ...                 [{"labels_equal_input_ids": True}])[0][:40]
    'labels: taken as given from the input; t'
    >>> labels_as_given("unshifted", False, "pretokenized", ["input_ids", "labels"],
    ...                 [{"labels_equal_input_ids": True}])
    []
    """
    given = sample_format == "pretokenized" and "labels" in fields
    if not given or labels != "shifted" or not all(m.get("labels_equal_input_ids") for m in metas):
        return []
    message = (
        "the input's own labels equal its input_ids in every sample: they follow the unshifted convention "
        "(the trainer shifts them), not --labels shifted; pass --labels unshifted so the manifest says so"
    )
    if strict:
        raise ConfigError(f"--strict: {message}")
    return [f"labels: taken as given from the input; {message}"]
