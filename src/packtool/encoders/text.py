"""``text`` encoder: a text field through a Hugging Face tokenizer, with optional BOS/EOS.

The tokenizer is either a ``tokenizer.json`` file (loaded with the ``tokenizers`` library) or a local
model directory (loaded with ``transformers.AutoTokenizer`` when transformers is installed, else its
``tokenizer.json``). Special tokens of the tokenizer's own post-processor are not added: BOS/EOS are added
only when asked (``add_bos``/``add_eos``), so the manifest says exactly what is in the packs.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tokenizers

from packtool.arrays import large_lists, token_lists
from packtool.encoders.base import add_special, encoded_batch, make_labels
from packtool.errors import ConfigError
from packtool.fileio import file_sha256
from packtool.readers.base import SourceBatch
from packtool.storage.cache import local_copy
from packtool.storage.urls import is_url

_EOS_GUESSES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]", "<|im_end|>")
_BOS_GUESSES = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]")
# names found by the guess above that are something else first (BERT's separator and classifier token, a
# chat turn's end): used, but the run warns that they were a guess
WEAK_GUESSES = frozenset({"[SEP]", "[CLS]", "<|im_end|>"})


# Texts per call into the Rust tokenizer: its Encoding objects of one call are all alive at once, so calls
# of a few hundred texts run faster than one call over all of them (scripts/bench_pack.py's "tokenizer
# alone" rows; docs/performance.md).
TOKENIZER_CALL_TEXTS = 512
VERY_LARGE = int(1e30)  # transformers' own "no limit" value of model_max_length


class HFTokenizer:
    """A loaded tokenizer with one call, ``encode_batch(texts) -> list[list[int]]``."""

    def __init__(self, spec: str) -> None:
        path = local_copy(spec, "tokenizer") if is_url(spec) else Path(spec)  # a store's: copied here once
        self.spec = spec
        self._hf = None
        self._fast = None
        if path.is_file():
            self._fast = _load_tokenizer_file(path)
            self.hash_file = path
        elif path.is_dir():
            try:  # transformers is an optional extra (packtool[transformers]): only model directories need it
                import transformers
            except ImportError:
                transformers = None
            if transformers is not None:
                refuse_custom_code(path)  # before transformers asks "run the custom code? [y/N]"
                try:  # never runs a directory's code, nor asks: what it names is refused above
                    self._hf = transformers.AutoTokenizer.from_pretrained(
                        str(path), local_files_only=True, trust_remote_code=False
                    )
                except Exception as e:
                    raise ConfigError(f"tokenizer {spec}: cannot load with AutoTokenizer: {e}") from None
                self._fast = getattr(self._hf, "_tokenizer", None)
            elif (path / "tokenizer.json").exists():
                self._fast = _load_tokenizer_file(path / "tokenizer.json")
            else:
                raise ConfigError(
                    f"tokenizer {spec}: a directory without tokenizer.json needs transformers "
                    "(pip install 'packtool[transformers]')"
                )
            self.hash_file = _hash_file(path)
        else:
            raise ConfigError(
                f"tokenizer {spec}: no such file or directory (expected a tokenizer.json, a "
                "local model directory, or module:callable)"
            )
        self.switched_off = self._switch_off_truncation_and_padding()

    @classmethod
    def of_loaded(cls, directory: str, tokenizer: Any) -> HFTokenizer:
        """An ``HFTokenizer`` over a transformers tokenizer already loaded from ``directory``: a processor's
        own, which holds what the processor changed when it was built (tokens it added, a BOS it turned
        off), so that packtool tokenizes as that processor does."""
        self = cls.__new__(cls)
        self.spec, self._hf, self._fast = directory, tokenizer, getattr(tokenizer, "_tokenizer", None)
        self.hash_file = _hash_file(Path(directory))
        self.switched_off = self._switch_off_truncation_and_padding()
        return self

    def _switch_off_truncation_and_padding(self) -> dict[str, Any]:
        """Turn off what a tokenizer as shipped may do to every call: cut to ``max_length`` and pad to a
        fixed length (a ``tokenizer.json``'s ``truncation`` / ``padding``, as sentence-transformers exports
        and many Hub tokenizers carry), and warn past ``model_max_length``. packtool packs whole samples:
        a sample longer than N follows ``long_samples``, never the tokenizer's own limit.

        Returns what was on, for the manifest (``{}`` when nothing was).
        """
        off: dict[str, Any] = {}
        if self._fast is not None:
            if self._fast.truncation is not None:
                off["truncation"] = dict(self._fast.truncation)
                self._fast.no_truncation()
            if self._fast.padding is not None:
                off["padding"] = dict(self._fast.padding)
                self._fast.no_padding()
        limit = getattr(self._hf, "model_max_length", None)
        if isinstance(limit, int) and limit < VERY_LARGE:
            off["model_max_length"] = limit
            self._hf.model_max_length = VERY_LARGE  # no "sequence longer than the maximum" warning
        return off

    @property
    def vocab_size(self) -> int:
        if self._fast is not None:
            return self._fast.get_vocab_size(with_added_tokens=True)
        return len(self._hf)

    def token_to_id(self, token: str) -> int | None:
        if self._fast is not None:
            return self._fast.token_to_id(token)
        tid = self._hf.convert_tokens_to_ids(token)
        return None if tid == self._hf.unk_token_id and token != self._hf.unk_token else tid

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._fast is None:
            return self._hf(texts, add_special_tokens=False)["input_ids"]
        ids: list[list[int]] = []
        for i in range(0, len(texts), TOKENIZER_CALL_TEXTS):
            part = texts[i : i + TOKENIZER_CALL_TEXTS]
            calls = self._fast.encode_batch_fast(part, add_special_tokens=False)
            ids.extend(e.ids for e in calls)
        return ids

    def encode_batch_tokens(self, texts: list[str]) -> pa.LargeListArray:
        """``encode_batch`` as ``large_list<int32>``: each call's ids go into NumPy as they are fetched
        (lengths from ``len(Encoding)``), never held as a list of lists (whose build and later release took
        about 2% of the encoding time: scripts/bench_pack.py's raw-text rows; docs/performance.md)."""
        if self._fast is None:
            return token_lists(self.encode_batch(texts))
        lengths, flats = [], []
        for i in range(0, len(texts), TOKENIZER_CALL_TEXTS):
            calls = self._fast.encode_batch_fast(
                texts[i : i + TOKENIZER_CALL_TEXTS], add_special_tokens=False
            )
            n = np.fromiter(map(len, calls), dtype=np.int64, count=len(calls))
            lengths.append(n)
            flats.append(
                np.fromiter(itertools.chain.from_iterable(e.ids for e in calls), np.int32, int(n.sum()))
            )
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        flat = np.concatenate(flats) if flats else np.zeros(0, dtype=np.int32)
        return large_lists(offsets, flat, pa.int32())

    def encode_batch_offsets(self, texts: list[str]) -> tuple[list[list[int]], list[np.ndarray]]:
        """Token ids and, per text, ``(num_tokens,)`` int64 start character offsets of its tokens."""
        if self._fast is None:
            raise ConfigError(
                f"tokenizer {self.spec}: character offsets need a fast tokenizer (a tokenizer.json)"
            )
        encs = self._fast.encode_batch(texts, add_special_tokens=False)
        starts = [np.array(e.offsets, dtype=np.int64).reshape(-1, 2)[:, 0] for e in encs]
        return [e.ids for e in encs], starts

    @property
    def chat_template(self) -> str | None:
        """The chat template of a tokenizer directory (from tokenizer_config.json or chat_template.jinja)."""
        template = getattr(self._hf, "chat_template", None) if self._hf is not None else None
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default")
        return template or None

    def special_tokens_map(self) -> dict[str, str]:
        """``bos_token``/``eos_token``/... as a chat template sees them."""
        if self._hf is not None:
            return {k: v for k, v in self._hf.special_tokens_map.items() if isinstance(v, str)}
        return {f"{k}_token": t for k in ("bos", "eos") if (t := self.special_token(k)) is not None}

    def decode(self, ids: list[int]) -> str:
        if self._hf is not None:
            return self._hf.decode(ids)
        return self._fast.decode(ids, skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> str | None:
        """The token's text, e.g. ``'</s>'`` (None outside the vocabulary)."""
        if self._fast is not None:
            return self._fast.id_to_token(token_id)
        return self._hf.convert_ids_to_tokens(token_id)

    def declared_token(self, kind: str) -> str | None:
        """The ``bos``/``eos`` token the tokenizer's configuration declares (None: it declares none, as a
        bare ``tokenizer.json`` never does)."""
        return (getattr(self._hf, f"{kind}_token", None) or None) if self._hf is not None else None

    def special_token(self, kind: str) -> str | None:
        """The tokenizer's own ``bos``/``eos`` token if it declares one, else a well-known name it has."""
        if tok := self.declared_token(kind):
            return tok
        for guess in _EOS_GUESSES if kind == "eos" else _BOS_GUESSES:
            if self.token_to_id(guess) is not None:
                return guess
        return None

    def identity(self) -> dict[str, Any]:
        ident = {
            "kind": "huggingface",
            "name": self.spec,
            "sha256": file_sha256(self.hash_file) if self.hash_file else None,
            "vocab_size": self.vocab_size,
        }
        if self.switched_off:  # the tokenizer's own truncation / padding / length limit, not applied
            ident["switched_off"] = self.switched_off
        return ident


def _hash_file(directory: Path) -> Path | None:
    """The file of a tokenizer directory whose hash identifies the tokenizer."""
    names = ("tokenizer.json", "tokenizer.model", "vocab.json")
    return next((directory / n for n in names if (directory / n).exists()), None)


MAX_CONFIG_BYTES = 4 << 20  # a model directory's tokenizer_config.json / config.json, read to check them


def refuse_custom_code(directory: Path) -> None:
    """``ConfigError`` when the model directory's ``tokenizer_config.json`` or ``config.json`` maps
    ``AutoTokenizer`` to code of its own (``auto_map``): loading it would run that code, which packtool
    never does on a file's word (transformers would first ask on the terminal, then refuse).

    A file that is missing, too large or not JSON is left to transformers to judge.
    """
    for name in ("tokenizer_config.json", "config.json"):
        file = directory / name
        try:
            if file.stat().st_size > MAX_CONFIG_BYTES:
                continue
            config = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        auto_map = config.get("auto_map") if isinstance(config, dict) else None
        code = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
        if code:
            shown = ", ".join(c for c in code if c) if isinstance(code, list) else str(code)
            fast = directory / "tokenizer.json"
            instead = f"pass {fast} instead (the fast tokenizer alone: no code), or " * fast.is_file()
            raise ConfigError(
                f"tokenizer {directory}: its {name} maps AutoTokenizer to code in the directory "
                f"(auto_map: {shown}), which packtool does not run; {instead}wrap the tokenizer in a "
                "module:callable encoder you trust"
            )


def _load_tokenizer_file(path: Path) -> tokenizers.Tokenizer:
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:
        raise ConfigError(
            f"tokenizer {path}: not a loadable tokenizer.json: {str(e).splitlines()[0]}"
        ) from None


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
