"""Custom packing policies: ``--strategy module:callable``, the Megatron-Energon contract, offline.

``module:callable`` names a function ``select_samples_to_pack(samples) -> list of groups`` (``module`` is a
dotted module or a ``path/to/file.py``). packtool calls it once per buffer of ``packing_buffer_size``
encoded samples (the whole input when unset), in input order. A policy that takes the keyword arguments
``packed_sequence_size`` (N, the tokens a group may hold) and ``seed`` (the run's ``--seed``), or
``**kwargs``, is given them: ``select_samples_to_pack(samples, packed_sequence_size=N, seed=S)``, so that
it packs to the run's N rather than one of its own; a policy of one argument is called as before. The
module may also define ``pack_selected_samples(group) -> pack``; when it does, packtool calls it on every
group and writes the pack it returns.

A **sample** is a dict:

============ ======================= ==========================================================
key          type                    meaning
============ ======================= ==========================================================
index        int                     global input index (what ``sample_index`` in the output says)
length       int                     tokens in the sample (after ``--long-samples truncate``)
input_ids    ``(length,)`` int32     read-only NumPy view of the encoded tokens
labels       ``(length,)`` int32     read-only NumPy view of the labels (``-100``: no loss)
loss_mask    ``(length,)`` int8      only when the input carried a loss mask
============ ======================= ==========================================================

``select_samples_to_pack`` returns a list of groups, each a list of the sample dicts it was given (any
mapping with the same ``index`` will do). A group becomes one pack, its samples laid out in group order;
packs are written in the order of the groups. packtool checks the result and stops with a one-line
error naming the sample's file and row when a sample is **left out of every group** (Energon drops such
samples silently), appears **in two groups**, or is not from the buffer, and when a **group holds more
than N tokens** or is empty.

``pack_selected_samples(group)`` (optional) returns one pack as a dict:

* ``input_ids``: 1-D integer sequence of ``L <= N`` tokens; ``labels``: the same length (required);
* ``loss_mask`` (optional): the same length, 0/1;
* ``seq_lens`` (optional, default ``[L]``): lengths of the sequences in the pack, summing to ``L``;
  attention and positions restart at every entry (``position_ids`` follow ``--position-ids``);
* ``sample_index`` (optional): one input index per ``seq_lens`` entry; by default the group's indices,
  which requires as many ``seq_lens`` entries as samples in the group. A pack may name fewer samples than
  its group holds (it merged them into one sequence): every sample of the group still counts as packed
  whole, and the manifest's ``policy_packs`` says how many packs hold the policy's tokens, which
  ``verify --source`` therefore does not compare with the source (it says so and exits 2).

packtool pads the pack to N (``pad_token_id``, ``-100`` labels, one ``seq_lens`` entry for the padding).
The returned tokens are kept in the scratch directory as extra encoded samples and written like any other
pack, so the output layout, manifest and ``--num-proc`` parity are the same as for built-in strategies.
``--split-across-pack`` is not available with a custom policy (split in ``pack_selected_samples``).

Example: ``configs/custom_policy.py`` (``--strategy configs/custom_policy.py:select_samples_to_pack``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from packtool.arrays import concat_ragged
from packtool.errors import ConfigError, PacktoolError
from packtool.packing.plan import PackPlan
from packtool.plugins import load_plugin

# fetch(samples, lengths) -> the sample dicts (see above) of global indices ``samples``
Fetch = Callable[[np.ndarray, np.ndarray], list[dict]]
# store_packs(packs) -> the sample numbers given to the pieces of the packs (one per seq_lens entry)
StorePacks = Callable[[list[dict[str, np.ndarray]]], np.ndarray]


def load_policy(
    spec: str,
) -> tuple[Callable[[list[dict]], list[list[dict]]], Callable[[list[dict]], Any] | None]:
    """``select_samples_to_pack`` named by ``spec`` and the module's ``pack_selected_samples`` (or None)."""
    select = load_plugin(spec, "strategy")
    if not callable(select):
        raise ConfigError(f"strategy {spec}: not a callable")
    module_spec = spec.rpartition(":")[0]
    try:
        pack_fn = load_plugin(f"{module_spec}:pack_selected_samples", "strategy")
    except ConfigError:
        pack_fn = None
    return select, pack_fn


def run_arguments(select: Callable, n: int, seed: int) -> dict[str, int]:
    """The keyword arguments of the run that ``select`` takes: ``packed_sequence_size`` and ``seed``
    (those it names, or both when it takes ``**kwargs``); none for a policy of one argument.

    >>> run_arguments(lambda samples, packed_sequence_size: [], 2048, 0)
    {'packed_sequence_size': 2048}
    """
    try:
        params = inspect.signature(select).parameters
    except (TypeError, ValueError):  # a builtin or extension callable: nothing to ask it
        return {}
    given = {"packed_sequence_size": n, "seed": seed}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return given
    return {k: v for k, v in given.items() if k in params}


def _index_of(item: Any, spec: str, group: int) -> int:
    try:
        return int(item["index"])
    except (TypeError, KeyError, ValueError):
        raise ConfigError(
            f"strategy {spec}: group {group} holds {type(item).__name__!s}, not a sample dict with 'index'"
        ) from None


def check_groups(
    groups: Any, window: np.ndarray, lengths: np.ndarray, n: int, spec: str, locate: Callable
) -> list[np.ndarray]:
    """Validate a policy's groups for buffer ``window`` (global indices); return them as index arrays."""
    if not isinstance(groups, list | tuple):
        raise ConfigError(f"strategy {spec}: select_samples_to_pack must return a list of groups")
    pos = {int(s): i for i, s in enumerate(window.tolist())}
    where = np.full(len(window), -1, dtype=np.int64)
    out = []
    for g, group in enumerate(groups):
        if not isinstance(group, list | tuple) or not group:
            raise ConfigError(f"strategy {spec}: group {g} is empty or not a list")
        idx = np.array([_index_of(item, spec, g) for item in group], dtype=np.int64)
        for s in idx.tolist():
            p = pos.get(s)
            if p is None:
                raise ConfigError(f"strategy {spec}: group {g} holds sample {s}, which is not in this buffer")
            if where[p] >= 0:
                raise locate(s, "input_ids", f"sample is in two groups ({where[p]} and {g}) of {spec}")
            where[p] = g
        total = int(lengths[np.array([pos[s] for s in idx.tolist()])].sum())
        if total > n:
            raise locate(
                int(idx[0]),
                "input_ids",
                f"group {g} of {spec} starting with this sample holds {total} tokens, "
                f"more than packed_sequence_size {n}",
            )
        out.append(idx)
    missing = np.flatnonzero(where < 0)
    if len(missing):
        raise locate(
            int(window[missing[0]]),
            "input_ids",
            f"sample left out of every group by {spec} ({len(missing)} sample(s) of this buffer left out)",
        )
    return out


def _as_array(pack: dict, key: str, dtype, spec: str, g: int) -> np.ndarray:
    try:
        arr = np.asarray(pack[key])
    except KeyError:
        raise ConfigError(
            f"strategy {spec}: pack_selected_samples returned no '{key}' for group {g}"
        ) from None
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(f"strategy {spec}: '{key}' of the pack for group {g} is not a 1-D integer sequence")
    return arr.astype(dtype)


def _custom_pack(pack: Any, group: np.ndarray, n: int, spec: str, g: int) -> dict[str, np.ndarray]:
    if not isinstance(pack, dict):
        raise ConfigError(
            f"strategy {spec}: pack_selected_samples must return a dict, got {type(pack).__name__}"
        )
    ids = _as_array(pack, "input_ids", np.int32, spec, g)
    labels = _as_array(pack, "labels", np.int32, spec, g)
    length = len(ids)
    if not 1 <= length <= n or len(labels) != length:
        raise ConfigError(
            f"strategy {spec}: pack for group {g} has {length} input_ids and {len(labels)} labels; "
            f"both must be the same length, 1..{n}"
        )
    if length and (ids.min() < 0 or ((labels < 0) & (labels != -100)).any()):
        raise ConfigError(
            f"strategy {spec}: pack for group {g} holds a negative token id or label (labels may be -100, "
            "no loss)"
        )
    seq_lens = _as_array(pack, "seq_lens", np.int64, spec, g) if "seq_lens" in pack else np.array([length])
    if len(seq_lens) == 0 or seq_lens.min() < 1 or int(seq_lens.sum()) != length:
        raise ConfigError(
            f"strategy {spec}: seq_lens of the pack for group {g} must be >= 1 and sum to {length}"
        )
    if "sample_index" in pack:
        index = _as_array(pack, "sample_index", np.int64, spec, g)
    elif len(seq_lens) == len(group):
        index = group
    else:
        raise ConfigError(
            f"strategy {spec}: pack for group {g} has {len(seq_lens)} seq_lens for {len(group)} samples; "
            "return sample_index (one input index per seq_lens entry)"
        )
    if len(index) != len(seq_lens):
        raise ConfigError(f"strategy {spec}: pack for group {g}: sample_index and seq_lens differ in length")
    out = {"input_ids": ids, "labels": labels, "seq_lens": seq_lens, "origin": index}
    if pack.get("loss_mask") is not None:
        mask = _as_array(pack, "loss_mask", np.int8, spec, g)
        if len(mask) != length:
            raise ConfigError(f"strategy {spec}: loss_mask of the pack for group {g} has the wrong length")
        out["loss_mask"] = mask
    return out


def plan_custom(
    lengths: np.ndarray,
    samples: np.ndarray,
    n: int,
    spec: str,
    fetch: Fetch,
    store_packs: StorePacks,
    locate: Callable,
    position_ids: str = "restart",
    packing_buffer_size: int | None = None,
    seed: int = 0,
) -> PackPlan:
    """Plan packs with the policy ``spec`` over buffers of ``packing_buffer_size`` samples.

    ``lengths``/``samples``: ``(num_samples,)`` int64 token counts (each <= n) and global indices of the
    samples to pack, in input order. ``fetch`` gives the policy its samples' tokens; ``store_packs`` keeps
    the packs a ``pack_selected_samples`` returns (the caller stores them: no file I/O here). Returns one
    pack per group, in group order.
    """
    select, pack_fn = load_policy(spec)
    kwargs = run_arguments(select, n, seed)
    window = packing_buffer_size or max(len(samples), 1)
    groups: list[np.ndarray] = []
    made: list[dict[str, np.ndarray]] = []
    for a in range(0, len(samples), window):
        w, wl = samples[a : a + window], lengths[a : a + window]
        buf = fetch(w, wl)
        try:
            chosen = select(buf, **kwargs)
        except PacktoolError:
            raise
        except Exception as e:
            raise ConfigError(
                f"strategy {spec}: select_samples_to_pack failed: {type(e).__name__}: {e}"
            ) from e
        checked = check_groups(chosen, w, wl, n, spec, locate)
        if pack_fn is not None:
            by_index = {d["index"]: d for d in buf}
            for g, idx in enumerate(checked, start=len(groups)):
                try:
                    pack = pack_fn([by_index[i] for i in idx.tolist()])
                except PacktoolError:
                    raise
                except Exception as e:
                    raise ConfigError(
                        f"strategy {spec}: pack_selected_samples failed on group {g}: {type(e).__name__}: {e}"
                    ) from e
                made.append(_custom_pack(pack, idx, n, spec, g))
        groups.extend(checked)
    origin = None
    if pack_fn is None:
        counts = np.array([len(g) for g in groups], dtype=np.int64)
        sample = np.concatenate(groups) if groups else np.zeros(0, np.int64)
        pos = np.searchsorted(samples, sample)  # samples is increasing
        length = lengths[pos]
    else:
        counts = np.array([len(p["seq_lens"]) for p in made], dtype=np.int64)
        length = np.concatenate([p["seq_lens"] for p in made]) if made else np.zeros(0, np.int64)
        sample = store_packs(made) if made else np.zeros(0, np.int64)
        origin = np.concatenate([p["origin"] for p in made]).astype(np.int64) if made else sample
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    members = None
    if pack_fn is not None:  # a pack may name fewer samples than its group holds (it merged them)
        flat, group_offsets = concat_ragged(groups, np.int64)
        members = (group_offsets, flat)
    return PackPlan(
        n,
        offsets,
        sample,
        np.zeros(len(sample), dtype=np.int64),
        length.astype(np.int64),
        position_ids,
        origin=origin,
        members=members,
    )
