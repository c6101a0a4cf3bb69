"""Mixtures of outputs through packtool.loader: shares, determinism, each pack's data and source, the
per-source figures, exact resume, and the refusals (one line, naming both outputs and the field)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from packtool.errors import ConfigError
from packtool.loader import PackedDataset, get_loader
from packtool.loader.sources import OutputSource, check_mixable, open_source
from packtool.reading import read_packs
from tests.fixtures.loader_outputs import packed  # noqa: F401 - fixtures
from tests.fixtures.mixture_outputs import smaller, unmixable  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
SHARES = (0.5, 0.3, 0.2)


def weighted(packed, smaller) -> dict:
    return dict(zip([str(packed), *map(str, smaller)], SHARES, strict=True))


def repeated(packed, smaller) -> list[dict]:
    return [{"path": str(packed), "repeat": 1}, {"path": str(smaller[0]), "repeat": 2},
            {"path": str(smaller[1]), "repeat": 0.5}]  # fmt: skip


def drawn(loader, limit: int | None = None) -> list[list[tuple[int, int]]]:
    """The (source, pack_index) of each pack of each batch the loader yields (up to ``limit`` batches)."""
    out = []
    for batch in loader:
        out.append(list(zip(batch.extra["source"].tolist(), batch.pack_index.tolist(), strict=True)))
        if limit is not None and len(out) == limit:
            break
    return out


def real_tokens(pack: dict) -> int:
    """A pack's samples' tokens (its seq_lens less the padding entry, if any)."""
    return int(pack["seq_lens"][: len(pack["sample_index"])].sum())


# --- shares ----------------------------------------------------------------------------------------
def test_weighted_shares_are_within_statistical_bounds_over_many_batches(packed, smaller):
    """Each pack from source i with probability w_i / sum(w): over 200 epochs (48,000 packs, from the order
    alone) each source's share is within 4 standard deviations of its weight; and 6 epochs through the
    loader (with workers) give what the order says."""
    ds = PackedDataset(weighted(packed, smaller), batch_size=4, seed=5, infinite=True, lanes=2)
    table = ds.table
    sources = np.concatenate([table.output[table.unit_of(ds.plan(e).reshape(-1))] for e in range(200)])
    share = np.bincount(sources, minlength=3) / len(sources)
    sd = np.sqrt(np.array(SHARES) * (1 - np.array(SHARES)) / len(sources))
    assert (np.abs(share - SHARES) < 4 * sd).all(), share
    loader = get_loader(ds, num_workers=2)
    got = [s for batch in drawn(loader, 6 * ds.batches_per_epoch) for s, _ in batch]
    want = sources[: len(got)]
    assert got == want.tolist()
    counts = [s["packs"] for s in loader.stats["sources"]]
    assert counts == np.bincount(want, minlength=3).tolist()


def test_a_small_source_drawn_often_repeats_only_after_all_its_packs(packed, smaller):
    """Each lap of a source's own cycle holds each of its packs once (less the few the epochs' remainders
    leave out); the loader counts the laps begun."""
    ds = PackedDataset({str(packed): 1, str(smaller[1]): 9}, batch_size=4, seed=1, infinite=True)
    c = ds.outputs[1].num_packs
    plans = [ds._plan(e) for e in range(3)]
    ids = np.concatenate([p.reshape(-1) for p, _ in plans])
    laps = np.concatenate([lap.reshape(-1) for _, lap in plans])
    small = ds.table.output[ds.table.unit_of(ids)] == 1
    assert small.sum() > 12 * c
    for lap in np.unique(laps[small])[:-1]:  # the last one is under way
        here = ids[small & (laps == lap)]
        assert len(set(here.tolist())) == len(here) and len(here) >= c - 4  # once each; at most 4 left out
    loader = get_loader(ds, num_workers=0)
    assert len(drawn(loader, 3 * ds.batches_per_epoch)) == 3 * ds.batches_per_epoch
    assert loader.stats["sources"][1]["epochs"] == laps[small].max() + 1


def test_repeats_give_exact_counts_and_len(packed, smaller):
    ds = PackedDataset(repeated(packed, smaller), batch_size=4, seed=0, drop_last=False)
    sizes = [o.num_packs for o in ds.outputs]
    counts = [sizes[0], 2 * sizes[1], sizes[2] // 2]
    assert ds.num_packs == sum(counts) and len(ds) == -(-sum(counts) // 4)
    loader = get_loader(ds, num_workers=2)
    epochs = [[p for batch in drawn(loader) for p in batch] for _ in range(2)]
    assert len(loader) == len(ds)
    for epoch in epochs:
        per = [[p for s, p in epoch if s == i] for i in range(3)]
        assert [len(p) for p in per] == counts
        assert sorted(per[0]) == list(range(sizes[0]))  # repeat 1: each pack once
        assert sorted(per[1]) == sorted(list(range(sizes[1])) * 2)  # repeat 2: each pack twice
    halves = [{p for s, p in epoch if s == 2} for epoch in epochs]
    assert len(halves[0]) == len(halves[1]) == sizes[2] // 2 and not halves[0] & halves[1]  # another half


# --- the batches -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_pack", [False, True])
def test_each_pack_holds_its_sources_data(packed, smaller, per_pack):
    """Each row of a batch is the pack its source and pack_index name (the default stages, and a task
    encoder's per-pack path), and each source's tokens are counted exactly."""

    class Identity:
        def encode_sample(self, pack):
            return pack

    refs = [list(read_packs(d, with_sample_index=True)) for d in (packed, *smaller)]
    te = Identity() if per_pack else None
    loader = get_loader(
        PackedDataset(weighted(packed, smaller), batch_size=4, seed=2, task_encoder=te), num_workers=2
    )
    tokens = [0, 0, 0]
    for batch in loader:
        assert (
            batch.source.dtype == torch.int64
            and batch.source.shape == (4,)
            and batch.source is batch.extra["source"]
        )
        for row, (s, p) in enumerate(
            zip(batch.extra["source"].tolist(), batch.pack_index.tolist(), strict=True)
        ):
            ref = refs[s][p]
            assert torch.equal(batch.input_ids[row], torch.from_numpy(ref["input_ids"]))
            assert torch.equal(batch.labels[row], torch.from_numpy(ref["labels"]))
            assert torch.equal(batch.loss_mask[row], torch.from_numpy(ref["loss_mask"]))
            k = len(ref["seq_lens"])
            assert batch.seq_lens[row, :k].tolist() == ref["seq_lens"].tolist()
            tokens[s] += real_tokens(ref)
    assert [s["tokens"] for s in loader.stats["sources"]] == tokens
    assert [s["name"] for s in loader.stats["sources"]] == [str(packed), *map(str, smaller)]


def test_the_stream_is_a_function_of_the_seed_whatever_the_workers(packed, smaller):
    def epochs(seed, workers):
        ds = PackedDataset(weighted(packed, smaller), batch_size=4, seed=seed, lanes=2)
        loader = get_loader(ds, num_workers=workers)
        return [drawn(loader) for _ in range(2)]

    a = epochs(0, 0)
    assert a == epochs(0, 2) == epochs(0, 1)
    assert a[0] != a[1] and a[0] != epochs(1, 0)[0]


def test_a_mixture_file_is_the_same_mixture(packed, smaller, tmp_path):
    rel = lambda p: Path("..") / Path(p).relative_to(Path(p).parents[1])  # noqa: E731
    files = tmp_path / "files"
    shutil.copytree(packed, files / "a")
    shutil.copytree(smaller[0], files / "b")
    (tmp_path / "configs").mkdir()
    mix = tmp_path / "configs" / "mixture.yaml"
    mix.write_text(
        f"sources:\n  - path: {rel(files / 'a')}\n    weight: 3\n  - {{path: ../files/b, weight: 1}}\n"
    )
    by_file = drawn(get_loader(PackedDataset(mix, batch_size=4, seed=3), num_workers=0))
    by_dict = {str(files / "a"): 3, str(files / "b"): 1}
    assert by_file == drawn(get_loader(PackedDataset(by_dict, batch_size=4, seed=3), num_workers=0))


# --- resume ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("save_workers", [0, pytest.param(1, marks=pytest.mark.slow), 2])
def test_resume_of_a_mixture_equals_the_uninterrupted_stream_on_each_rank(packed, smaller, save_workers):
    """Two ranks, across worker counts and an epoch boundary; the per-source figures continue too."""

    def make(rank, workers):
        ds = PackedDataset(weighted(packed, smaller), batch_size=4, seed=3, infinite=True, rank=rank,
                           world_size=2)  # fmt: skip
        return get_loader(ds, num_workers=workers)

    load_workers = (save_workers + 1) % 3
    for rank in (0, 1):
        total = make(rank, 0).dataset.batches_per_epoch + 6
        whole = make(rank, save_workers)
        reference = drawn(whole, total)
        first = make(rank, save_workers)
        head = drawn(first, 7)
        state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
        second = make(rank, load_workers)
        second.load_state_dict(state)
        tail = drawn(second, total - 7)
        assert head + tail == reference, (rank, save_workers)
        assert second.stats["sources"] == whole.stats["sources"]


def test_the_state_of_another_mixture_is_refused_naming_what_differs(packed, smaller):
    mix = weighted(packed, smaller)
    state = get_loader(PackedDataset(mix, batch_size=4, seed=0), num_workers=0).state_dict()
    b = str(smaller[0])
    cases = [
        ({**mix, b: 0.4}, 0, f"source 1 ({b}): weight: saved 0.3, now 0.4"),
        (dict(list(mix.items())[:2]), 0, "sources: saved a mixture of 3 ("),
        (mix, 1, "seed: saved 0, now 1"),
        (str(packed), 0, "sources: saved a mixture of 3 (" + str(packed)),
        ([{"path": p, "repeat": 1} for p in mix], 0, f"source 0 ({packed}): weight: saved 0.5, now None"),
    ]
    for source, seed, message in cases:
        loader = get_loader(PackedDataset(source, batch_size=4, seed=seed), num_workers=0)
        with pytest.raises(
            ValueError, match=re.escape("loader state does not match this dataset: " + message)
        ):
            loader.load_state_dict(state)
    single = get_loader(PackedDataset(packed, batch_size=4), num_workers=0).state_dict()
    with pytest.raises(ValueError, match=re.escape("sources: saved one output (run ")):
        get_loader(PackedDataset(mix, batch_size=4), num_workers=0).load_state_dict(single)


# --- refusals --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["packed_sequence_size", "labels"])
def test_outputs_that_differ_in_what_a_batch_needs_do_not_mix(packed, unmixable, field):
    other = unmixable[field]
    names = f"{re.escape(str(packed))} and {re.escape(str(other))}"
    with pytest.raises(ConfigError, match=rf"^cannot mix {names}: they differ in {field} \("):
        PackedDataset({str(packed): 1, str(other): 1}, batch_size=4)


def _with_manifest(source: OutputSource, **changes) -> OutputSource:
    return dataclasses.replace(source, manifest=dataclasses.replace(source.manifest, **changes))


def test_other_tokenizers_and_vision_processors_do_not_mix(packed, smaller):
    a, b = OutputSource.open(packed), OutputSource.open(smaller[0])
    tokenizer = dataclasses.replace(a.manifest.tokenizer, sha256="a" * 64)
    with pytest.raises(ConfigError, match=r"they differ in tokenizer sha256 \('aaa"):
        other = dataclasses.replace(tokenizer, sha256="b" * 64)
        check_mixable([_with_manifest(a, tokenizer=tokenizer), _with_manifest(b, tokenizer=other)])
    check_mixable([_with_manifest(a, tokenizer=tokenizer), b])  # a digest only one records cannot differ
    sized = dataclasses.replace(a.manifest.tokenizer, details={"vocab_size": 1000})
    with pytest.raises(ConfigError, match=r"they differ in tokenizer vocab_size \(1000 and 32000\)"):
        check_mixable(
            [
                _with_manifest(a, tokenizer=sized),
                _with_manifest(b, tokenizer=dataclasses.replace(sized, details={"vocab_size": 32000})),
            ]
        )
    processor = {"family": "llava", "image_token_ids": [7], "image_processor": "CLIPImageProcessor",
                 "config_sha256": "c" * 64}  # fmt: skip
    vision = lambda **p: {"processor": {**processor, **p}, "images": {}}  # noqa: E731
    with pytest.raises(ConfigError, match=r"differ in vision processor config_sha256 \('ccc"):
        check_mixable(
            [_with_manifest(a, vision=vision()), _with_manifest(b, vision=vision(config_sha256="d"))]
        )
    with pytest.raises(ConfigError, match=r"differ in vision processor image_token_ids \(\[7\] and \[8\]\)"):
        check_mixable(
            [_with_manifest(a, vision=vision()), _with_manifest(b, vision=vision(image_token_ids=[8]))]
        )
    check_mixable([_with_manifest(a, vision=vision()), b])  # a text output mixes with a vision one


@pytest.mark.parametrize("weight", [0, -1, math.nan, math.inf, "0.5", True, None])
def test_a_weight_that_is_not_a_finite_positive_number_is_refused(packed, smaller, weight):
    with pytest.raises(ConfigError, match=r"mixture, sources\[1\]: weight must be a finite positive number"):
        PackedDataset({str(packed): 1, str(smaller[0]): weight}, batch_size=4)


BAD_FILES = {
    "not a mapping": ("- a\n- b\n", "a mixture file is a mapping with a 'sources' list"),
    "unknown key": ("sources: []\nseed: 1\n", "unknown key 'seed'"),
    "no sources": ("sources: []\n", "a mixture needs at least one source"),
    "both shares": ("sources:\n  - {path: A, weight: 1, repeat: 2}\n", r"sources\[0\]: weight and repeat"),
    "kinds mixed": (
        "sources:\n  - {path: A, weight: 1}\n  - {path: B, repeat: 2}\n",
        "weight and repeat in one",
    ),
    "listed twice": ("sources:\n  - {path: A, weight: 1}\n  - {path: A, weight: 2}\n", "is listed twice"),
    "a bad repeat": (
        "sources:\n  - {path: A, repeat: -2}\n",
        r"sources\[0\]: repeat must be a finite positive",
    ),
    "no path": ("sources:\n  - {weight: 1}\n", r"sources\[0\]: each source is"),
    "an alias": (
        "x: &a A\nsources:\n  - {path: *a, weight: 1}\n",
        "YAML aliases .* not allowed in a packtool mixture",
    ),
    "code": ("sources: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    "not YAML": ("sources: [\n", "not valid YAML"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_mixture_file_that_packtool_does_not_read_is_refused(packed, smaller, tmp_path, name):
    text, message = BAD_FILES[name]
    path = tmp_path / "mixture.yaml"
    path.write_text(text.replace("A", str(packed)).replace("B", str(smaller[0])))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}.*{message}"):
        open_source(path)


def test_a_large_mixture_file_and_a_repeat_that_takes_nothing_are_refused(packed, tmp_path):
    path = tmp_path / "mixture.yaml"
    path.write_text("sources:\n" + "  - {path: x, weight: 1}\n" * 50_000)
    with pytest.raises(ConfigError, match="over 1,048,576 bytes: not a packtool mixture file"):
        open_source(path)
    with pytest.raises(ConfigError, match=r"repeat 0.001 of its \d+ packs takes none"):
        open_source([{"path": str(packed), "repeat": 0.001}])
