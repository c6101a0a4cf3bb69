"""``packtool pack DOCS --processor DIR``: interleaved image-text documents (OBELICS's ``texts`` and
``images``; Energon's interleaved WebDataset samples) packed with their images, every input kind; each
packed document's ids those of its processor on the document alone (its texts joined with the
processor's image placeholder), its labels on its texts only; ``--long-samples split`` cutting a long
document only between its images; ``verify --source`` finding every token and image; the options that
do not apply refused in one line.

A ``pack`` imports transformers (seconds): the runs are in this process (``run_pack``) but for the command
a user types first.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from packtool import read_packs
from packtool.errors import ConfigError, InputError
from packtool.manifest import IGNORE_INDEX
from packtool.options import PackOptions
from packtool.pipeline.run import run_pack
from packtool.verify import verify_output
from packtool.vision.processor import load_processor
from tests.conftest import run_cli
from tests.fixtures.vision_inputs import document_records, write_jsonl, write_real_images
from tests.fixtures.vision_processors import build_qwen2vl

EOS = "<|im_end|>"  # the demo tokenizer's EOS
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # what Qwen2-VL's text holds for an image


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> dict:
    """A Qwen2-VL processor directory and 24 documents over 14 real images (paths relative to the input),
    one of them images only (nothing to learn)."""
    root = tmp_path_factory.mktemp("interleaved")
    paths = write_real_images(root / "images", 14)
    records = document_records([p.relative_to(root) for p in paths], 23)
    records.append({"texts": [None, None], "images": [str(paths[0].relative_to(root))] * 2})
    processor = build_qwen2vl(root / "qwen2vl")
    source = write_jsonl(root / "docs.jsonl", records)
    vp = load_processor(processor, conversations=False)
    return {"root": root, "records": records, "processor": processor, "source": source, "vp": vp}


def alone(vp, record: dict, base: Path, eos: str | None) -> tuple[list[int], list[bool]]:
    """What the processor writes for ``record`` alone, and which of its tokens are a text's: its texts
    joined with ``IMAGE`` at each image (and ``eos`` after), tokenized with the tokenizer's special tokens,
    as ``processor(text=..., images=...)`` does."""
    texts = [IMAGE if t is None else t for t in record["texts"]] + [eos or ""]
    images = []
    for image in record["images"]:
        if image is not None:
            data = image["bytes"] if isinstance(image, dict) else (base / image).read_bytes()
            images.append(Image.open(io.BytesIO(data)))
    out = vp.processor(text=["".join(texts)], images=[images] if images else None,
                       return_offsets_mapping=True)  # fmt: skip
    starts = np.asarray(out["offset_mapping"][0]).reshape(-1, 2)
    ids = list(out["input_ids"][0])
    markup = [vp.tokenizer.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>")]
    is_image = np.isin(ids, [*vp.image_token_ids, *markup])
    of_text = ~((starts[:, 0] == 0) & (starts[:, 1] == 0)) & ~is_image
    return ids, of_text.tolist()


def packed_samples(out: Path) -> dict[int, tuple[list[int], list[int], int]]:
    """Each packed sample's tokens and shifted labels, its pieces put back together in order, and the
    number of its pieces."""
    pieces: dict[int, list] = {}
    for pack in read_packs(out, with_sample_index=True):
        ends = np.cumsum(pack["seq_lens"])
        for j, (s, at) in enumerate(
            zip(pack["sample_index"].tolist(), pack["sample_offset"].tolist(), strict=True)
        ):
            a, e = int(ends[j] - pack["seq_lens"][j]), int(ends[j])
            pieces.setdefault(s, []).append(
                (at, pack["input_ids"][a:e].tolist(), pack["labels"][a:e].tolist())
            )
    out_ = {}
    for s, parts in pieces.items():
        parts.sort()
        out_[s] = (
            [t for _, ids, _ in parts for t in ids],
            [t for _, _, lab in parts for t in lab],
            len(parts),
        )
    return out_


def test_packtool_pack_docs_jsonl_with_a_processor(docs, tmp_path):
    """The command that was exit 2 ("no chat template"): the records told apart by their fields, each
    document exactly its processor's tokens, trained on its texts (the image-only one has nothing to learn:
    dropped and counted), and verify --source accounts for every token and image."""
    out = tmp_path / "out"
    run_cli(
        "pack", docs["source"], "--processor", docs["processor"], "--packed-sequence-size", 400, "-o", out
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["empty_loss_dropped"] == 1 and manifest["vision"]["packed_images"] == sum(
        1 for r in docs["records"][:-1] for i in r["images"] if i is not None
    )
    samples = packed_samples(out)
    assert sorted(samples) == list(range(len(docs["records"]) - 1))
    for s, (ids, labels, _) in samples.items():
        want, of_text = alone(docs["vp"], docs["records"][s], docs["root"], None)
        assert ids == want, s
        trained = [lab != IGNORE_INDEX for lab in labels]
        assert trained == [*of_text[1:], False], s  # shifted: a label is the next token's, if a text's
    report = verify_output(out, source=[str(docs["source"])])
    assert report.ok, report.problems


def test_every_input_kind_packs_documents(docs, tmp_path):
    """Parquet and a ``save_to_disk`` dataset holding each image's bytes (``datasets.Image``), and
    WebDataset shards in Energon's interleaved layout (a ``.json`` naming members ``KEY.NAME.jpg``): one run
    over the three, every document its processor's tokens, the packs' images the source's bytes."""
    import datasets  # slow to import: only this test makes datasets

    root, records = docs["root"], docs["records"][:8]

    def embedded(record: dict) -> dict:
        images = [
            None if i is None else {"bytes": (root / i).read_bytes(), "path": str(i)}
            for i in record["images"]
        ]
        return {"texts": record["texts"], "images": images}

    rows = [embedded(r) for r in records]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "docs.parquet")
    features = datasets.Features({"texts": datasets.Sequence(datasets.Value("string")),
                                  "images": datasets.Sequence(datasets.Image())})  # fmt: skip
    datasets.Dataset.from_list(rows, features=features).save_to_disk(tmp_path / "saved")
    with tarfile.open(tmp_path / "docs.tar", "w") as tar:
        for i, row in enumerate(rows):
            names = [
                None if im is None else f"{k}.{Path(im['path']).suffix[1:]}"
                for k, im in enumerate(row["images"])
            ]
            members = [("json", json.dumps({"texts": row["texts"], "images": names}).encode())]
            members += [(n, im["bytes"]) for n, im in zip(names, row["images"], strict=True) if n is not None]
            for name, data in members:
                info = tarfile.TarInfo(f"doc{i:03d}.{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    inputs = [str(tmp_path / "docs.parquet"), str(tmp_path / "saved"), str(tmp_path / "docs.tar")]
    values = {"inputs": inputs, "output": str(out), "packed_sequence_size": 400, "quiet": True,
              "processor": str(docs["processor"]), "sample_format": "interleaved"}  # fmt: skip
    run_pack(PackOptions.from_dict(values), progress=False)
    samples = packed_samples(out)
    assert len(samples) == 3 * len(records)
    for s, (ids, _, _) in samples.items():
        assert ids == alone(docs["vp"], rows[s % len(rows)], root, None)[0], s
    images = sorted(image["bytes"] for p in read_packs(out) for image in p["images"])
    assert images == sorted(3 * [im["bytes"] for row in rows for im in row["images"] if im is not None])


def test_long_documents_are_split_between_their_images(docs, tmp_path):
    """``--long-samples split`` at N = 96 with ``--add-eos``: long documents cut into pieces, never inside
    what the processor writes for an image; the pieces put back together are the document's tokens with
    the EOS (the image-only document has the EOS to learn: kept), each image in the piece its span lies
    in, with its bytes; verify --source finds every token and image."""
    out = tmp_path / "out"
    values = {"inputs": [str(docs["source"])], "output": str(out), "packed_sequence_size": 96, "quiet": True,
              "processor": str(docs["processor"]), "long_samples": "split", "add_eos": True}  # fmt: skip
    run_pack(PackOptions.from_dict(values), progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["split_samples"] >= 5 and manifest["tokenizer"]["eos_token"] == EOS
    samples = packed_samples(out)
    vp = docs["vp"]
    assert sorted(samples) == list(range(len(docs["records"])))
    for s, (ids, _, _) in samples.items():
        assert ids == alone(vp, docs["records"][s], docs["root"], EOS)[0], s
    pad = vp.tokenizer.token_to_id("<|image_pad|>")
    images = 0
    for pack in read_packs(out, with_sample_index=True):
        starts = np.cumsum(pack["seq_lens"]) - pack["seq_lens"]
        spans = {int(a): int(a + n) for a, n in zip(pack["image_offset"], pack["image_length"], strict=True)}
        for j, a, n in zip(pack["image_sample"], pack["image_offset"], pack["image_length"], strict=True):
            assert starts[j] <= a and a + n <= starts[j] + pack["seq_lens"][j]  # in its piece
            assert (pack["input_ids"][a : a + n] == pad).all()
            piece_end = starts[j] + pack["seq_lens"][j]  # the whole span (or the next image's follows)
            assert a + n == piece_end or pack["input_ids"][a + n] != pad or a + n in spans
            images += 1
        for j in range(len(pack["sample_index"])):  # no piece starts or ends inside a span
            first, last = int(starts[j]), int(starts[j] + pack["seq_lens"][j] - 1)
            assert pack["input_ids"][first] != pad or first in spans
            assert pack["input_ids"][last] != pad or last + 1 in spans.values()
    assert images == manifest["vision"]["packed_images"] == manifest["vision"]["input_images"]
    report = verify_output(out, source=[str(docs["source"])])
    assert report.ok, report.problems


@pytest.mark.parametrize(
    ("flags", "error", "message"),
    [
        ({"loss_on": "last"}, ConfigError, r"--loss-on last does not apply to interleaved documents"),
        ({"chat_template": "t.jinja"}, ConfigError,
         r"--chat-template does not apply to --sample-format interleaved"),
        ({"long_samples": "truncate"}, ConfigError, r"--long-samples truncate would cut through images: use "
         r"error or drop \(interleaved documents are cut between their images with split\)"),
        ({"packed_sequence_size": 80}, InputError,
         r"docs\.jsonl, line \d+, field 'input_ids': sample has \d+ tokens, more than packed_sequence_size "
         r"80.*use --long-samples split \(a document is cut between its images\) or drop"),
    ],
    ids=["loss-on last", "chat template", "truncate", "too long"],
)  # fmt: skip
def test_what_does_not_apply_to_documents_is_refused_in_one_line(docs, tmp_path, flags, error, message):
    values = {"inputs": [str(docs["source"])], "output": str(tmp_path / "out"), "packed_sequence_size": 400,
              "processor": str(docs["processor"]), "quiet": True, **flags}  # fmt: skip
    with pytest.raises(error, match=message) as caught:
        run_pack(PackOptions.from_dict(values), progress=False)
    assert "\n" not in str(caught.value)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
