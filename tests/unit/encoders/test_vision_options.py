"""The vision encoder's options (``encoders.options.VisionOptions``) and what ``run_pack`` refuses with images
(``pipeline.run.check_vision_options``), before the vision extra is imported."""

from __future__ import annotations

import pytest

from packtool.errors import ConfigError
from packtool.options import PackOptions
from packtool.pipeline.run import check_vision_options

BASE = {"inputs": ["data.jsonl"], "output": "out", "packed_sequence_size": 64}


def test_a_processor_makes_the_samples_vision_samples():
    assert PackOptions.of(**BASE, processor="model").encoding.is_vision
    assert PackOptions.of(**BASE, processor="model", sample_format="vision").encoding.is_vision
    assert not PackOptions.of(**BASE, tokenizer="tok.json").encoding.is_vision


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sample_format": "vision"}, "--sample-format vision needs --processor DIR"),
        ({"processor": "m", "sample_format": "chat"}, "--processor does not apply to --sample-format chat"),
        ({"processor": "m", "tokenizer": "t.json"}, "--tokenizer does not apply to vision samples"),
        ({"balance_visual_tokens": 8, "sample_format": "text"}, "--balance-visual-tokens does not apply"),
        ({"processor": "m", "balance_visual_tokens": 0}, "balance_visual_tokens must be a positive integer"),
    ],
)
def test_options_that_do_not_fit_are_usage_errors(values, message):
    with pytest.raises(ConfigError, match=message):
        PackOptions.of(**BASE, **values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"split_across_pack": True}, "--split-across-pack would cut images between packs"),
        ({"long_samples": "truncate"}, "--long-samples truncate would cut through images"),
        ({"long_samples": "split"}, "--long-samples split would cut through images"),
        ({"cp_size": 2}, "--cp-size is not available with images"),
        ({"format": "webdataset", "shard_max_bytes": 1 << 20}, "--shard-max-bytes is not available"),
    ],
)
def test_what_would_cut_an_image_is_refused(values, message):
    check_vision_options(PackOptions.of(**BASE, processor="m"))  # the defaults cut nothing
    with pytest.raises(ConfigError, match=message):
        check_vision_options(PackOptions.of(**BASE, processor="m", **values))
