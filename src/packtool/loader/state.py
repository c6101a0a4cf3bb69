"""A loader's state: what ``PackedLoader.state_dict`` saves and ``load_state_dict`` checks and resumes from.

The state is one global cursor, ``(epoch, batches consumed in it)``, plus ``lanes`` and what defines the
stream: the data (one output's ``run_id``, split, pack count and ``shards``, a digest of the split's
shard paths and sha256s; a mixture's ``sources``, each with its share), ``seed``, ``shuffle``,
``shuffle_buffer``, ``drop_last``; and the layout: ``world_size`` and ``batch_size``, ``order`` (the
world size and batch size of the run whose order the stream follows) and ``start`` (where the current
epoch continues that order's flat order, after a resume at another world size). Every field is checked
(type and range) before it is used: a damaged or hand-edited state raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from packtool.loader.order import Layout, flat_size, resumed_size
from packtool.loader.sources import Mixture, Source

STATE_VERSION = 1
STAT_COUNTS = ("skipped_packs", "skipped_batches", "bad_packs")
SOURCE_STATS = ("packs", "tokens", "epochs")  # per source of a mixture
# the fields that define the stream's data and order: a state resumes only the same
FIXED = ("run_id", "split", "shards", "num_packs", "seed", "shuffle", "shuffle_buffer", "drop_last")
# the type of every field of a state; states saved before a field existed get its default here
_TYPES = {
    "epoch": int, "batch": int, "lanes": int, "run_id": str, "split": (str, type(None)), "shards": str,
    "num_packs": int, "seed": int, "batch_size": int, "world_size": int, "shuffle": bool,
    "shuffle_buffer": int, "drop_last": bool, "rank": int, "stats": dict, "start": int, "order": dict,
}  # fmt: skip
_OLDER = {
    "drop_last": True,
    "start": 0,
}  # fields a state of this version may lack (saved before they existed)
_POSITIVE = ("lanes", "batch_size", "world_size")
INT64_MAX = (1 << 63) - 1  # a state's counts are used as NumPy int64
# lanes: the DataLoader workers of the loader that saved the state (torch starts one process each)
MAX_STATE_INT = {"lanes": 1 << 16}


def field_error(key: str, value: Any, want: str) -> ValueError:
    return ValueError(f"loader state: field {key!r} must be {want}, got {value!r}")


def _check_int(key: str, value: Any, low: int, high: int = INT64_MAX) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise field_error(key, value, "int")
    if value < low:
        raise field_error(key, value, "positive" if low == 1 else "non-negative")
    if value > high:  # no loader runs that many
        raise field_error(key, value, f"at most {high:,}")


def check_state(state: Any) -> dict:
    """``state`` with every field checked (``ValueError`` naming the first bad field) and the defaults
    of fields older states lack."""
    if not isinstance(state, dict):
        raise ValueError(
            f"loader state: must be a dict (from PackedLoader.state_dict), got {type(state).__name__}"
        )
    if state.get("format") != "packtool-loader" or state.get("version") != STATE_VERSION:
        raise ValueError("not a packtool loader state (or from another version)")
    state = {**_OLDER, "order": {k: state.get(k) for k in ("world_size", "batch_size")}, **state}
    for key, kind in _TYPES.items():
        if key not in state:
            raise ValueError(f"loader state: field {key!r} is missing")
        value = state[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if kinds == (int,):
            _check_int(key, value, 1 if key in _POSITIVE else 0, MAX_STATE_INT.get(key, INT64_MAX))
        # bool is an int in Python: an int field takes no bool, a bool field no int
        elif not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise field_error(
                key, value, " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            )
    for key in ("world_size", "batch_size"):
        _check_int(f"order.{key}", state["order"].get(key), 1)
    stats = state["stats"]
    for key in STAT_COUNTS:
        value = stats.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise field_error(f"stats.{key}", value, "a non-negative int")
    units = stats.get("bad_units", [])
    if not isinstance(units, list) or not all(isinstance(u, str) for u in units):
        raise field_error("stats.bad_units", units, "a list of strings")
    per_source = stats.get("sources", [])
    good = isinstance(per_source, list) and all(
        isinstance(s, dict)
        and all(
            (isinstance(s.get(k), int) and not isinstance(s.get(k), bool) and s.get(k) >= 0)
            or (k == "tokens" and s.get(k) is None)
            for k in SOURCE_STATS
        )
        for s in per_source
    )
    if not good:
        raise field_error("stats.sources", per_source, "a list of {packs, tokens, epochs} counts")
    sources = state.get("sources")
    if sources is not None and not (isinstance(sources, list) and all(isinstance(s, dict) for s in sources)):
        raise field_error("sources", sources, "a list of the mixture's sources")
    return state


# --- what a dataset's state holds -------------------------------------------------------------------------
def data_fields(source: Source) -> dict[str, Any]:
    """The data a state binds to: one output's ``run_id``, split, ``shards`` digest and pack count; for a
    mixture, its ``sources`` (each one's, with its share) and, in the same fields, digests of them all."""
    if not isinstance(source, Mixture):
        return source.identity()
    sources = source.identity()["sources"]
    digest = hashlib.sha256(json.dumps([{**s, "name": None} for s in sources], sort_keys=True).encode())
    return {
        "run_id": "mixture-" + digest.hexdigest()[:16],
        "split": source.split,
        "shards": digest.hexdigest(),
        "num_packs": source.epoch_packs,
        "sources": sources,
    }


def _describe(state: dict) -> str:
    sources = state.get("sources")
    if sources is None:
        return f"one output (run {state['run_id']})"
    return f"a mixture of {len(sources)} ({', '.join(str(s.get('name')) for s in sources)})"


def source_differences(saved: dict, now: dict) -> list[str]:
    """What differs between the data of a saved state and of a dataset's state, naming the source and
    the field (``source 1 (out/code): weight: saved 0.3, now 0.5``); ``[]`` if nothing."""
    a, b = saved.get("sources"), now.get("sources")
    if (a is None) != (b is None) or (a is not None and len(a) != len(b)):
        return [f"sources: saved {_describe(saved)}, now {_describe(now)}"]
    if a is None:
        return []
    out = []
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in ("run_id", "split", "shards", "num_packs", "weight", "repeat"):
            if x.get(key) != y.get(key):
                out.append(f"source {k} ({y.get('name')}): {key}: saved {x.get(key)!r}, now {y.get(key)!r}")
    return out


def resume_point(state: dict, total: int) -> tuple[tuple[int, int], int, int]:
    """From a checked state of a stream of ``total`` packs an epoch: the ``(world_size, batch_size)``
    whose order it follows, its epoch, and how many places of that epoch's flat order
    (``order.flat_order``) it has consumed. ``ValueError`` for a layout or cursor no stream of ``total``
    packs has."""
    order = state["order"]
    drop_last = state["drop_last"]
    origin = Layout(order["world_size"], order["batch_size"], drop_last=drop_last)
    saved = Layout(state["world_size"], state["batch_size"], drop_last=drop_last)
    for name, layout in (("order", origin), ("", saved)):  # a run had at least one batch on every rank
        if layout.epoch_size(total)[0] == 0 or layout.world_size > total:
            key = f"{name}.world_size" if name else "world_size"
            raise field_error(key, layout.world_size, f"a layout with batches of {total:,} packs")
    flat = flat_size(total, origin)
    if state["start"] > flat:
        raise field_error("start", state["start"], f"at most the {flat:,} places of the epoch")
    own = state["start"] == 0 and (saved.world_size, saved.batch_size) == (
        origin.world_size,
        origin.batch_size,
    )
    batches = resumed_size(total, origin, saved, None if own else state["start"])
    if state["batch"] >= batches:
        raise field_error("batch", state["batch"], f"below the batches per epoch ({batches})")
    consumed = state["start"] + state["batch"] * saved.global_batch
    return (origin.world_size, origin.batch_size), state["epoch"], consumed
