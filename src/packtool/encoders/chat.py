"""``chat`` encoder: conversations rendered with a chat template, loss on the assistant's turns.

Records hold either ``messages`` (OpenAI / Hugging Face format: ``[{"role": ..., "content": ...}, ...]``,
roles ``system``/``user``/``assistant``/``tool`` and any other the template knows) or ``conversations``
(ShareGPT: ``[{"from": ..., "value": ...}, ...]``, with ``human`` -> ``user``, ``gpt`` -> ``assistant``,
``system``, and ``tool``/``function``/``observation`` -> ``tool``). A record's ``tools`` field, when
present, is passed to the template. Every message is kept and rendered, whatever its role.

The conversation is rendered with the chat template and its trained turns found as
``packtool.tokenizing.chat_template`` says (``--loss-on``, ``{% generation %}`` spans or prefix renders,
the template's budget); the rendered text is tokenized whole, without added special tokens (the template
writes its own).

A token is trained when its first character lies inside a trained span. Limits: a token that straddles a
span boundary (a BPE merge across the header and the content) is trained only if it starts inside the
span; a template without ``add_generation_prompt`` support trains its assistant header too; text inside
messages that spells a special token (``<|im_end|>``) is tokenized as that special token, as
``apply_chat_template`` followed by tokenization would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from packtool.arrays import token_lists
from packtool.encoders.masking import apply_empty_loss, loss_columns
from packtool.readers.base import SourceBatch, column_values
from packtool.tokenizing.chat_template import ChatTemplate
from packtool.tokenizing.tokenizer import HFTokenizer

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


def _drop_nulls(value: Any) -> Any:
    """Remove ``None`` entries from dicts, recursively (Arrow gives every row the union of all keys)."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


class ChatEncoder(ChatTemplate):
    """Encodes conversations; see the module docstring."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        chat_template: str | None = None,
        loss_on: str = "assistant",
        labels: str = "shifted",
        empty_loss: str = "drop",
    ) -> None:
        super().__init__(tokenizer, chat_template, loss_on)
        self.labels, self.empty_loss = labels, empty_loss

    # --- records -------------------------------------------------------------------------------------
    def conversations(self, batch: SourceBatch) -> tuple[list[str], list[list[dict]]]:
        """Every record's messages, validated, and the field each came from: ``messages`` (role/content)
        or ``conversations`` (ShareGPT), whichever the record holds (a file may mix the two kinds)."""
        names = batch.batch.schema.names
        present = [f for f in ("messages", "conversations") if f in names]
        if not present:
            raise batch.error(
                0,
                "messages",
                f"missing field (record has: {', '.join(names) or 'nothing'}); chat records need "
                "messages (role/content) or conversations (ShareGPT from/value)",
            )
        columns = {f: column_values(batch.batch, f) for f in present}
        fields, out = [], []
        for i in range(batch.num_rows):
            field = next((f for f in present if columns[f][i] is not None), present[0])
            conv = columns[field][i]
            if not isinstance(conv, list):
                what = (
                    "missing value (null)"
                    if conv is None
                    else f"expected a list of messages, got {conv!r:.40}"
                )
                raise batch.error(i, field, what)
            messages = []
            for k, m in enumerate(_drop_nulls(conv)):
                if not isinstance(m, dict):
                    raise batch.error(i, field, f"message {k} is not an object: {m!r:.40}")
                if field == "conversations":
                    m = self._from_sharegpt(m, batch, i, k)
                elif not isinstance(m.get("role"), str):
                    raise batch.error(i, field, f"message {k} has no role")
                messages.append(m)
            fields.append(field)
            out.append(messages)
        return fields, out

    def _from_sharegpt(self, m: dict, batch: SourceBatch, i: int, k: int) -> dict:
        who = m.get("from")
        if who not in SHAREGPT_ROLES:
            raise batch.error(
                i,
                "conversations",
                f"message {k}: unknown speaker from={who!r} (known: {', '.join(SHAREGPT_ROLES)})",
            )
        rest = {key: v for key, v in m.items() if key not in ("from", "value")}
        return {"role": SHAREGPT_ROLES[who], "content": m.get("value", ""), **rest}

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        fields, convs = self.conversations(batch)
        tools = (
            _drop_nulls(column_values(batch.batch, "tools"))
            if "tools" in batch.batch.schema.names
            else [None] * batch.num_rows
        )
        texts, spans = [], []
        for i, messages in enumerate(convs):
            try:
                text, sp = self.trained_spans(messages, tools[i] or None)
            except ValueError as e:
                raise batch.error(i, fields[i], str(e), getattr(e, "skip_reason", "invalid")) from None
            except Exception as e:  # the template raised (raise_exception, an undefined variable, ...)
                reason = str(e).splitlines()[0] if str(e) else ""
                message = f"chat template failed: {type(e).__name__}: {reason}"
                raise batch.error(i, fields[i], message) from None
            texts.append(text)
            spans.append(sp)
        ids, starts = self.tokenizer.encode_batch_offsets(texts)
        trained = []
        for st, sp in zip(starts, spans, strict=True):
            t = np.zeros(len(st), dtype=np.int8)
            for a, b in sp:  # tokens whose first character lies in [a, b)
                t[np.searchsorted(st, a, side="left") : np.searchsorted(st, b, side="left")] = 1
            trained.append(t)
        ids = token_lists(ids)
        flat = np.concatenate(trained) if trained else np.zeros(0, dtype=np.int8)
        labels, loss_mask = loss_columns(ids, flat, self.labels)
        return apply_empty_loss(batch, ids, labels, loss_mask, self.empty_loss, fields)

    def identity(self) -> dict[str, Any]:
        return {**self.tokenizer.identity(), **super().identity()}
