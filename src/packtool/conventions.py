"""The conventions a packed output names, as plain values: the reading contract's vocabulary
(``packtool.manifest`` records them) and the choices the writer's options offer (``packtool.encoders``,
``packtool.packing``).

Kept apart from ``packtool.manifest`` (which needs numpy for its statistics) so that declaring the stages'
options, and so ``packtool pack --help``, imports neither numpy nor pyarrow.
"""

from __future__ import annotations

LABELS = ("shifted", "unshifted")  # how labels[i] relates to input_ids
POSITION_IDS = ("nemo", "restart")  # how positions run on in a pack
MAX_PACKED_SEQUENCE_SIZE = 1 << 24  # tokens in a pack: what --packed-sequence-size takes, a reader accepts
IGNORE_INDEX = -100  # the label of a token that takes no loss (padding, prompts, sample ends)
MAX_TOKEN_ID = 2**31 - 1  # the packs' input_ids are int32
# the most bytes one image may take (256 MiB: beyond any image file a training set holds; Pillow refuses
# over 89M pixels): pack refuses a larger image file as it reads it, the writers a larger image, and the
# readers a shard declaring one, so that reading an image allocates at most a few times this
MAX_IMAGE_BYTES = 256 << 20
