"""Property-based tests of the packers (every strategy in ``packtool.packing.STRATEGIES``).

At the plan level (``make_plan`` + ``build_pack_arrays`` over a real ``ChunkStore`` written by
``write_chunk``), for random sample lengths, N, ``split_across_pack``, ``max_packs``, ``long_samples`` and
``position_ids``:

* every kept token is in the packs exactly once, each sample's tokens in order, and every token that is
  not kept is counted (``dropped``/``truncated``/``over_max_packs``): nothing is lost silently;
* every pack has N tokens; ``seq_lens`` sums to N, with one trailing entry for the padding iff any;
* ``labels``, ``loss_mask`` and ``position_ids`` line up with the tokens they belong to;
* the plan and the packs are the same when made again (with the same seed).

Through the CLI, a few examples check that the output is byte-identical for ``--num-proc`` 1 and 2.


(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.packing.planner import STRATEGIES
from tests.conftest import run_cli, write_jsonl

PAD = 7  # pad_token_id, never a real token (real tokens start above it)


def sample_tokens(lengths: list[int]) -> list[np.ndarray]:
    """Distinct token ids for every sample: sample i holds a run of ids no other sample has."""
    starts = np.concatenate([[0], np.cumsum(lengths)]) + PAD + 1
    return [np.arange(starts[i], starts[i] + n, dtype=np.int32) for i, n in enumerate(lengths)]


# --- through the CLI: the same bytes for any --num-proc ----------------------------------------------------
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30).filter(any),  # some tokens to pack
    split=st.booleans(),
    max_packs=st.none() | st.integers(1, 4),
)
def test_output_is_identical_for_any_num_proc(tmp_path_factory, strategy, lengths, split, max_packs):
    tmp = tmp_path_factory.mktemp("numproc")
    src = write_jsonl(tmp / "in.jsonl", [{"input_ids": t.tolist()} for t in sample_tokens(lengths)])
    args = [
        "--packed-sequence-size",
        "16",
        "--strategy",
        strategy,
        "--chunk-size",
        "4",
        "--shard-size",
        "2",
        "-q",
    ]
    args += ["--split-across-pack"] if split else ["--long-samples", "truncate"]
    args += ["--max-packs", str(max_packs)] if max_packs else []
    for num_proc in (1, 2):
        (tmp / f"p{num_proc}").mkdir()
        run_cli("pack", src, "-o", "out", "--num-proc", num_proc, *args, cwd=tmp / f"p{num_proc}")
    m1 = json.loads((tmp / "p1" / "out" / "manifest.json").read_text())
    assert m1 == json.loads((tmp / "p2" / "out" / "manifest.json").read_text())
    for shard in m1["shards"]:
        assert (tmp / "p1" / "out" / shard["path"]).read_bytes() == (
            tmp / "p2" / "out" / shard["path"]
        ).read_bytes()
