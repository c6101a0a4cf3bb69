"""``trl_dataset``: a packtool output as the rows TRL's padding-free ``SFTTrainer`` reads, exactly.

TRL's ``DataCollatorForLanguageModeling(padding_free=True)`` (what ``SFTConfig(padding_free=True)``
uses) reads a pre-packed row's sequence boundaries from ``seq_lengths`` and its labels *unshifted*: it
restarts ``position_ids`` at each sequence, sets the label of each sequence's first token to -100 and lets
the model shift. packtool's rows say ``seq_lens`` and, by default, hold labels already shifted: given as
they are, TRL sees one sequence per row (attention across samples) and shifts the labels a second time,
a silently wrong loss. ``trl_dataset`` gives each pack as TRL's row: ``input_ids``, ``labels`` in TRL's
convention whatever the output's (``shifted`` ones moved one place right inside each sequence) and
``seq_lengths`` (``seq_lens``, the padding one more sequence, all -100). The loss is then each sequence's
alone, token for token (tests/interop/test_trainers.py).

TRL's padding-free batch is one flattened row (``input_ids`` and ``position_ids`` restarting at each
sample, no mask): packtool's ``mask="varlen"`` path, which keeps the samples apart only where the
model's code finds them from the ``position_ids`` (``packtool.loader.fit``; transformers' GPT-OSS does
not). So ``trl_dataset`` takes the model's config, ``attention=model.config``, and refuses a model that
path does not fit, naming what works (``packtool.loader`` with another mask).

What it cannot give exactly it refuses (``ValueError``): shifted labels whose sequence ends on a target
(a piece of a sample split across packs targets the first token of the next pack's piece; TRL has no
place for it): pack with ``--labels unshifted`` for TRL, or train such outputs through ``packtool.loader``;
and a vision-language output (TRL's rows would hold its image tokens without its images).

Example::

    from trl import SFTConfig, SFTTrainer
    from packtool.loader.trl import trl_dataset  # not in packtool.loader: datasets is slow to import

    train = trl_dataset("out/", attention=model.config)
    args = SFTConfig(output_dir="ckpt", padding_free=True, max_length=None, per_device_train_batch_size=8)
    SFTTrainer(model, args=args, train_dataset=train).train()
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import datasets
import numpy as np

from packtool.loader.batch import LABELS
from packtool.loader.fit import model_attention, row_limit
from packtool.loader.sources import Mixture, open_source, shards_digest
from packtool.loader.state import data_fields
from packtool.manifest import Manifest
from packtool.reading import read_packs
from packtool.schema import cu_seqlens

TRL_COLUMNS = ("input_ids", "labels", "seq_lengths")


def trl_labels(labels: np.ndarray, seq_lens: np.ndarray, convention: str) -> tuple[np.ndarray, int]:
    """One pack's labels as TRL takes them: unshifted (the model shifts), -100 at each sequence's first
    token (where TRL's collator puts it too), and how many targets were left out: shifted labels on a
    sequence's last token, which nothing unshifted can say. ``labels`` ``(N,)`` int, ``seq_lens``
    ``(S,)`` int summing to ``N``; ``convention`` the output's ``labels``.

    >>> out, lost = trl_labels(np.array([6, 7, -100, 9, 4]), np.array([3, 2]), "shifted")
    >>> out.tolist(), lost
    ([-100, 6, 7, -100, 9], 1)
    """
    if convention not in LABELS:
        raise ValueError(f"labels convention must be one of {', '.join(LABELS)}, got {convention!r}")
    cu = cu_seqlens(seq_lens).astype(np.int64)
    ends, starts = cu[1:], cu[:-1]
    lost = 0
    if convention == "unshifted":
        out = labels.astype(np.int64)
    else:
        lost = int((labels[ends - 1] != -100).sum())
        out = np.full(labels.shape, -100, dtype=np.int64)
        out[1:] = labels[:-1]
    out[starts] = -100
    return out, lost


def _rows(
    directory: str, split: str | None, identity: str, mixture: list | None = None, seed: int = 0
) -> Iterator[dict[str, Any]]:
    """The rows of ``trl_dataset`` (``identity`` binds ``datasets``' cache to the run's content): one
    output's packs, or each pack of a ``mixture``'s sources as many times as epoch 0 of the mixture holds it
    (``loader.sources``), source after source."""
    if mixture is None:
        yield from _output_rows(directory, split, None)
        return
    source = open_source(mixture, split)
    ids = source.sequence(0, seed, True)[0]
    times = np.bincount(ids, minlength=sum(o.num_packs for o in source.outputs))
    base = 0
    for output in source.outputs:
        yield from _output_rows(str(output.directory), split, times[base : base + output.num_packs])
        base += output.num_packs


def _output_rows(directory: str, split: str | None, times: np.ndarray | None) -> Iterator[dict[str, Any]]:
    """One output's packs as TRL's rows, each ``times[k]`` times (once without ``times``)."""
    convention = Manifest.load(directory).labels
    left_out = 0
    for k, pack in enumerate(read_packs(directory, split=split)):
        if times is not None and times[k] == 0:
            continue
        seq_lens = pack["seq_lens"].astype(np.int64)
        labels, lost = trl_labels(pack["labels"], seq_lens, convention)
        left_out += lost
        row = {"input_ids": pack["input_ids"], "labels": labels, "seq_lengths": seq_lens}
        for _ in range(1 if times is None else int(times[k])):
            yield row
    if left_out:
        warnings.warn(
            f"{directory}: {left_out:,} targets on the last token of a sequence (the next token of a "
            "truncated sample, or of a sample split across packs) are not in TRL's rows: TRL's padding-free "
            "collator shifts inside each sequence (packtool.loader keeps them)",
            stacklevel=2,
        )


def trl_dataset(
    source: Any,
    split: str | None = "train",
    cache_dir: str | None = None,
    *,
    attention: Any = None,
    seed: int = 0,
):
    """The packs of ``split`` of output ``source`` as a ``datasets.Dataset`` of TRL's padding-free rows
    (``input_ids`` int32, ``labels`` int64, ``seq_lengths`` int64; one row per pack, in the output's
    order); see the module docstring. Written once to ``datasets``' cache (``cache_dir``), keyed on the
    run's ``run_id`` and its shards' sha256s, so a re-packed output is never served from a stale cache.
    ``attention``: the model's config (``model.config``), required: TRL's rows are flattened, which not
    every model's code keeps apart (``"causal"`` or a ``masks.AttentionPattern``: a model of your own, on
    your word).

    ``source`` may be a mixture (a mixture file, ``{directory: weight}``, ...: ``loader.sources``): the
    rows are then the packs of the mixture's first epoch drawn from ``seed`` (a pack as many times as the
    epoch holds it: ``repeat: 2`` twice), source after source; the Trainer's sampler shuffles them.
    """
    opened = open_source(source, split)
    for output in opened.outputs:
        if output.manifest.image_columns:
            raise ValueError(
                f"{output.name}: the packs hold images, which TRL's text rows would drop (the model would "
                "train on its image tokens as text): read a vision-language output with packtool.vision."
                "loader.vision_dataset (or packtool.vision.energon.VisionPackTaskEncoder)"
            )
    if attention is None:
        raise ValueError(
            "trl_dataset needs the model: pass attention=model.config (TRL's padding-free rows are "
            "flattened, and not every model's code keeps the samples of a flattened row apart)"
        )
    limit = row_limit(attention)  # None for a declaration (the user's word)
    if limit is not None:
        raise ValueError(
            f"trl_dataset: the model scales its queries by their index in the row (attn_temperature_tuning, "
            f"floor_scale {limit}), and TRL's padding-free rows (a batch of packs flattened) have a length "
            "packtool cannot check here: train through packtool.loader (PackedDataset, which checks its rows)"
        )
    try:
        model_attention("varlen", attention)
    except ValueError as e:
        where = " through packtool.loader (PackedDataset, or collate_packs)" if "use mask=" in str(e) else ""
        said = f"trl_dataset: TRL's padding-free rows are the flattened path, and {e}{where}"
        raise ValueError(said) from None
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "labels": datasets.Sequence(datasets.Value("int64")),
            "seq_lengths": datasets.Sequence(datasets.Value("int64")),
        }
    )
    if isinstance(opened, Mixture):
        identity = f"{data_fields(opened)['shards']}:{seed}"
        gen_kwargs = {"directory": "", "split": split, "identity": identity, "mixture": opened.entries(),
                      "seed": seed}  # fmt: skip
    else:
        directory = str(opened.directory)
        identity = f"{opened.manifest.run_id}:{shards_digest(opened.manifest, split)}"
        gen_kwargs = {"directory": directory, "split": split, "identity": identity}
    return datasets.Dataset.from_generator(
        _rows, features=features, gen_kwargs=gen_kwargs, cache_dir=cache_dir
    )
