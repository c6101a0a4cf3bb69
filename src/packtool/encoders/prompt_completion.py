"""``prompt_completion`` encoder: a prompt and a completion per record, loss on the completion only.

The prompt is either a field (``prompt_field``, default ``prompt``) or built from the record by
``prompt_template``:

* ``alpaca``: the Stanford Alpaca prompt from ``instruction`` and ``input`` (the variant without the
  ``### Input:`` block when ``input`` is missing or empty);
* any other string: a Python format string over the record's fields, e.g.
  ``"Question: {question}\\nAnswer: "``.

The completion is ``completion_field`` (default ``completion``; ``output`` for Alpaca data). Prompt and
completion are tokenized separately and concatenated (as a model sees them at inference: the prompt alone,
then the tokens it generates), then BOS is prepended (``add_bos``, never trained) and EOS appended
(``add_eos``, trained: the model learns to stop). Only completion tokens (and EOS) are trained unless
``train_on_prompt``; labels and ``loss_mask`` follow ``packtool.encoders.masking``.

Example: with ``labels: shifted``, prompt tokens ``[p1, p2]``, completion ``[c1]`` and EOS ``e``::

    input_ids  [p1,   p2, c1, e]
    labels     [-100, c1, e,  -100]
    loss_mask  [0,    1,  1,  0]
"""

from __future__ import annotations

import re
import string
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.arrays import arrow_array, np_view
from packtool.encoders.masking import apply_empty_loss, concat_lists, loss_columns
from packtool.encoders.text import TextEncoder, add_special, text_column
from packtool.errors import ConfigError
from packtool.readers.base import SourceBatch
from packtool.tokenizing.tokenizer import HFTokenizer

ALPACA = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
BUILTIN_TEMPLATES = ("alpaca",)


ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape_template(template: str) -> str:
    r"""``\n``, ``\t`` and ``\\`` typed in a template become a newline, a tab and a backslash.

    A shell passes ``--prompt-template 'Q: {q}\nA: '`` as a backslash and an ``n``, which a prompt never
    means (the model would read two characters); a YAML ``"Q: {q}\nA: "`` is a newline already and stays.

    >>> unescape_template("Q: {q}\\nA: ") == "Q: {q}\nA: "
    True
    """
    return re.sub(r"\\([nt\\])", lambda m: ESCAPES[m.group(1)], template)


def template_fields(template: str) -> list[str]:
    """Field names a format-string template reads.

    >>> template_fields("Q: {question}\\nContext: {context}\\nA: ")
    ['question', 'context']
    """
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise ConfigError(f"prompt_template is not a valid format string: {e}") from None
    for name in names:
        if not name.isidentifier():
            raise ConfigError(
                f"prompt_template: {{{name}}} is not a field name (use {{field}}; {{{{ for a brace)"
            )
    return list(dict.fromkeys(names))


class PromptCompletionEncoder:
    """Encodes prompt/completion records; see the module docstring."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        prompt_field: str = "prompt",
        completion_field: str = "completion",
        prompt_template: str | None = None,
        train_on_prompt: bool = False,
        add_bos: bool = False,
        add_eos: bool = False,
        bos_token: str | None = None,
        eos_token: str | None = None,
        labels: str = "shifted",
        empty_loss: str = "drop",
    ) -> None:
        self.tokenizer = tokenizer
        self.prompt_field, self.completion_field = prompt_field, completion_field
        if prompt_template is not None and prompt_template not in BUILTIN_TEMPLATES:
            prompt_template = unescape_template(prompt_template)
        self.prompt_template, self.train_on_prompt = prompt_template, train_on_prompt
        self.labels, self.empty_loss = labels, empty_loss
        if prompt_template is not None and prompt_template not in BUILTIN_TEMPLATES:
            self.fields = template_fields(prompt_template)
        # BOS/EOS ids resolved exactly as for the text format
        special = TextEncoder(
            tokenizer, add_bos=add_bos, add_eos=add_eos, bos_token=bos_token, eos_token=eos_token
        )
        self.bos_id, self.eos_id = special.bos_id, special.eos_id

    def prompts(self, batch: SourceBatch) -> list[str]:
        """The prompt text of every record (after the template, if any)."""
        if self.prompt_template is None:
            names = batch.batch.schema.names
            if self.prompt_field not in names and "instruction" in names:
                raise batch.error(
                    0,
                    self.prompt_field,
                    f"missing field (record has: {', '.join(names)}); for Alpaca-style records set "
                    "prompt_template: alpaca and completion_field: output",
                )
            return text_column(batch, self.prompt_field, "--prompt-field")
        if self.prompt_template == "alpaca":
            instructions = text_column(batch, "instruction")
            inputs = optional_text_column(batch, "input")
            return [
                ALPACA.format(instruction=ins, input=inp) if inp else ALPACA_NO_INPUT.format(instruction=ins)
                for ins, inp in zip(instructions, inputs, strict=True)
            ]
        columns = {name: text_column(batch, name, "--prompt-template") for name in self.fields}
        return [
            self.prompt_template.format(**{name: col[i] for name, col in columns.items()})
            for i in range(batch.num_rows)
        ]

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        prompts = self.prompts(batch)
        completions = text_column(batch, self.completion_field, "--completion-field")
        prompt_ids = self.tokenizer.encode_batch_tokens(prompts)
        completion_ids = self.tokenizer.encode_batch_tokens(completions)
        ids, part = concat_lists([prompt_ids, completion_ids])
        trained = np.ones(len(part), dtype=np.int32) if self.train_on_prompt else (part == 1).astype(np.int32)
        if self.bos_id is not None or self.eos_id is not None:
            flags = pa.LargeListArray.from_arrays(ids.offsets, arrow_array(trained, pa.int32()))
            # BOS never trained, EOS always (the model learns to stop)
            bos_flag = None if self.bos_id is None else 0
            eos_flag = None if self.eos_id is None else 1
            trained = np_view(add_special(flags, bos_flag, eos_flag).values)
            ids = add_special(ids, self.bos_id, self.eos_id)
        labels, loss_mask = loss_columns(ids, trained, self.labels)
        return apply_empty_loss(batch, ids, labels, loss_mask, self.empty_loss, self.completion_field)

    def identity(self) -> dict[str, Any]:
        ident = self.tokenizer.identity()
        ident.update(bos_token_id=self.bos_id, eos_token_id=self.eos_id)
        return ident


def optional_text_column(batch: SourceBatch, field: str) -> list[str]:
    """``field`` as strings, ``""`` where the field or the value is missing."""
    rb = batch.batch
    if field not in rb.schema.names or pa.types.is_null(rb.column(field).type):
        return [""] * batch.num_rows
    col = rb.column(field)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise batch.error(0, field, f"expected a string, got {col.type}")
    return [v or "" for v in col.to_pylist()]
