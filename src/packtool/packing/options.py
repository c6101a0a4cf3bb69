"""The packing stage's options: N, the strategy and its own options, the long-sample policy, the layout
of a pack, and the checks that their structure cannot express (``PackingOptions.check``)."""

from __future__ import annotations

from typing import Literal

import msgspec

from packtool.conventions import MAX_PACKED_SEQUENCE_SIZE, MAX_TOKEN_ID, POSITION_IDS
from packtool.errors import ConfigError
from packtool.option_types import Applies, OptionGroup, option
from packtool.plugins import is_plugin_spec

STRATEGIES = ("bfd", "sequential")  # built-in packing strategies (packtool.packing); or module:callable
LONG_SAMPLE_POLICIES = ("error", "drop", "truncate", "split")


def strategy_kind(strategy: str) -> str:
    """``bfd``, ``sequential``, or ``custom`` for a module:callable policy."""
    return strategy if strategy in STRATEGIES else "custom"


class BfdOptions(OptionGroup):
    """``--strategy bfd``'s own options."""

    section = "packing"
    applies = Applies("strategy", ("bfd",))

    shuffle_packs: option(
        bool,
        "Shuffle the packs by --seed, so that their order does not follow sample length; "
        "--no-shuffle-packs keeps them in the order they were filled (TRL's order).",
    ) = True


class BufferOptions(OptionGroup):
    """Options of the strategies that plan samples together (bfd and a custom policy)."""

    section = "packing"
    applies = Applies("strategy", ("bfd", "custom"))

    packing_buffer_size: option(int | None, "Samples planned together [default: the whole input].", gt=0) = (
        None
    )


class PackingOptions(OptionGroup):
    """How samples become packs of N tokens."""

    section = "packing"

    packed_sequence_size: option(
        int | None, "Tokens per pack (N).", required=True, gt=0, le=MAX_PACKED_SEQUENCE_SIZE
    ) = None
    strategy: option(
        str,
        "bfd (best-fit decreasing, packs shuffled by --seed), sequential (NeMo PackedSequence order), or "
        "module:callable naming a select_samples_to_pack policy.",
    ) = "bfd"
    split_across_pack: option(
        bool, "Let a sample run over into the next pack instead of moving it whole."
    ) = False
    max_packs: option(int | None, "Keep at most this many packs (the rest is counted, not kept).", gt=0) = (
        None
    )
    long_samples: option(
        Literal[LONG_SAMPLE_POLICIES],
        "Samples longer than N without --split-across-pack: error, drop (counted), truncate (counted), or "
        "split into N-token pieces packed on their own, every sample that fits staying whole (TRL's "
        "bfd_split).",
    ) = "error"
    position_ids: option(
        Literal[POSITION_IDS] | None,
        "nemo (PackedSequence parity) or restart (0 at every piece and the padding) [default: nemo for "
        "sequential, restart otherwise].",
    ) = None
    cp_size: option(
        int,
        "Context-parallel size: every sample is padded to a multiple of 2 x cp_size tokens inside its pack "
        "(NeMo AutoModel's pack_dataset cp_size; the padding is recorded per piece in cp_padding); 1: none.",
        gt=0,
    ) = 1
    pad_token_id: option(int, "Id that pads input_ids (PackedSequence's).", ge=0, le=MAX_TOKEN_ID) = 0
    seed: option(
        int, "Seed of bfd's pack shuffle and of the --val-fraction holdout (same seed, same bytes).", ge=0
    ) = 0
    val_fraction: option(
        float,
        "Hold out this fraction of the packs, chosen by --seed, as the validation split: shards val-*, "
        "Energon's val split, the dataset card's validation split; readers take the train split by default.",
        ge=0,
        lt=1,
    ) = 0.0
    bfd: BfdOptions = msgspec.field(default_factory=BfdOptions)
    buffer: BufferOptions = msgspec.field(default_factory=BufferOptions)

    def check(self, given: frozenset[str]) -> None:
        """``ConfigError`` naming both options where one makes the other do nothing, in the cases a
        group's ``applies`` cannot say (they depend on two options' values, not on one choice)."""
        if self.strategy not in STRATEGIES and not is_plugin_spec(self.strategy):
            raise ConfigError(
                f"strategy must be one of {', '.join(STRATEGIES)} or module:callable, got {self.strategy!r}"
            )
        n, cp = self.packed_sequence_size, self.cp_size
        if n is not None and cp > 1 and n % (2 * cp):
            raise ConfigError(
                f"packed_sequence_size {n} is not a multiple of 2 x cp_size ({2 * cp}), so a sample padded "
                "for context parallelism could outgrow its pack"
            )
        custom = strategy_kind(self.strategy) == "custom"
        split = self.split_across_pack
        # a custom policy is handed the seed; bfd shuffles by it; the holdout draws by it
        seeded = custom or (self.strategy == "bfd" and self.bfd.shuffle_packs) or bool(self.val_fraction)
        pairs = [
            (
                "long_samples",
                "split_across_pack",
                split and self.long_samples != "error",
                "with --split-across-pack a long sample runs over into the next pack",
            ),
            (
                "split_across_pack",
                "strategy",
                split and custom,
                "a custom strategy splits in its pack_selected_samples",
            ),
            (
                "long_samples",
                "strategy",
                self.long_samples == "split" and custom,
                "a custom strategy splits in its pack_selected_samples",
            ),
            (
                "cp_size",
                "split_across_pack",
                cp > 1 and split,
                "context-parallel padding pads whole samples (--long-samples split cuts only long ones)",
            ),
            ("cp_size", "strategy", cp > 1 and custom, "a custom strategy lays out its own packs"),
            (
                "seed",
                "strategy" if self.strategy != "bfd" else "shuffle_packs",
                "seed" in given and not seeded,
                "the seed orders bfd's shuffle and the --val-fraction holdout, and neither is on",
            ),
        ]
        for a, b, conflict, why in pairs:
            if conflict:
                raise ConfigError(
                    f"--{_flag(a)} {self._shown(a)} and --{_flag(b)} {self._shown(b)} conflict: {why}; "
                    "drop one"
                )

    def _shown(self, name: str) -> str:
        """The value of option ``name`` as a flag takes it (``on`` / ``off``, ``long-samples`` style)."""
        value = self.bfd.shuffle_packs if name == "shuffle_packs" else getattr(self, name)
        if isinstance(value, bool):
            return "on" if value else "off"
        return _flag(value) if isinstance(value, str) and value.isidentifier() else str(value)


def _flag(name: str) -> str:
    return str(name).replace("_", "-")
