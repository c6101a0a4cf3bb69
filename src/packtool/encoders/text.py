"""``text`` encoder: a text field through a Hugging Face tokenizer, with optional BOS/EOS.

The tokenizer (``packtool.tokenizing.tokenizer.HFTokenizer``) is either a ``tokenizer.json`` file (loaded
with the ``tokenizers`` library) or a local model directory (loaded with ``transformers.AutoTokenizer``
when transformers is installed, else its ``tokenizer.json``). Special tokens of the tokenizer's own
post-processor are not added: BOS/EOS are added only when asked (``add_bos``/``add_eos``), so the
manifest says exactly what is in the packs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.encoders.base import add_special, encoded_batch, make_labels
from packtool.errors import ConfigError
from packtool.readers.base import SourceBatch
from packtool.tokenizing.tokenizer import HFTokenizer


class TextEncoder:
    """Tokenizes ``text_field`` of every record; labels follow the ``labels`` convention."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        text_field: str = "text",
        add_bos: bool = False,
        add_eos: bool = False,
        bos_token: str | None = None,
        eos_token: str | None = None,
        labels: str = "shifted",
    ) -> None:
        self.tokenizer, self.text_field, self.labels = tokenizer, text_field, labels
        self.bos_id = self._special_id("bos", bos_token) if add_bos else None
        self.eos_id = self._special_id("eos", eos_token) if add_eos else None

    def _special_id(self, kind: str, token: str | None) -> int:
        return self.tokenizer.token_to_id(special_text(self.tokenizer, kind, token))

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        texts = text_column(batch, self.text_field)
        ids = self.tokenizer.encode_batch_tokens(texts)
        ids = add_special(ids, self.bos_id, self.eos_id)
        return encoded_batch(ids, make_labels(ids, self.labels))

    def identity(self) -> dict[str, Any]:
        ident = self.tokenizer.identity()
        ident.update(bos_token_id=self.bos_id, eos_token_id=self.eos_id)
        return ident


def special_text(tokenizer: HFTokenizer, kind: str, token: str | None) -> str:
    """The text of the ``kind`` (``bos``/``eos``) token ``--add-{kind}`` adds: ``token`` (``--{kind}-token``)
    or the tokenizer's own (``HFTokenizer.special_token``); ``ConfigError`` when it has none or the token is
    not in its vocabulary."""
    token = token or tokenizer.special_token(kind)
    if token is None:
        raise ConfigError(
            f"add_{kind}: tokenizer {tokenizer.spec} has no {kind} token; name one with --{kind}-token"
        )
    if tokenizer.token_to_id(token) is None:
        raise ConfigError(f"{kind}_token {token!r} is not in the vocabulary of {tokenizer.spec}")
    return token


def token_of(tokenizer: HFTokenizer, kind: str, token: str | None, token_id: int | None) -> str | None:
    """The text of the ``kind`` token a Hugging Face tokenizer's encoder adds: ``token`` (``--{kind}-token``),
    or the token whose id is ``token_id`` (``--{kind}-token-id``); ``ConfigError`` for an id that is not one
    of its tokens (None for neither: the encoder takes the tokenizer's own)."""
    if token_id is None:
        return token
    try:
        text = tokenizer.id_to_token(token_id)
    except (IndexError, KeyError, ValueError):  # a slow tokenizer's lookup past its vocabulary
        text = None
    if text is None or tokenizer.token_to_id(text) != token_id:
        raise ConfigError(
            f"--{kind}-token-id {token_id}: not a token of {tokenizer.spec} (vocabulary of "
            f"{tokenizer.vocab_size:,})"
        )
    return text


def text_column(batch: SourceBatch, field: str, flag: str = "--text-field") -> list[str]:
    """The ``field`` column as a list of strings; raises ``InputError`` naming a missing/null/non-text row.

    A field that no record of the batch has is most likely the wrong name, not bad records: the error
    then names the records' fields and ``flag``, the option that chooses it, rather than --on-error skip
    (which would skip every record)."""
    rb = batch.batch
    if field not in rb.schema.names:
        err = batch.error(
            0,
            field,
            f"missing field (record has: {', '.join(rb.schema.names) or 'nothing'})",
            "missing_field",
        )
        text = (pa.types.is_string, pa.types.is_large_string)
        strings = [f.name for f in rb.schema if any(is_text(f.type) for is_text in text)]
        example = f", e.g. {flag} {strings[0]}" if strings else ""
        err.hint = f"choose the field with {flag}{example}"
        raise err
    col = rb.column(field)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        if pa.types.is_null(col.type):
            raise batch.error(0, field, "missing field or null value", "missing_field")
        raise batch.error(0, field, f"expected a string, got {col.type}", "wrong_type")
    if col.null_count:
        i = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
        raise batch.error(i, field, "missing field or null value", "missing_field")
    return col.to_pylist()
