"""``PackConfig``: every option of ``packtool pack``, with one name per concept.

The same key is the CLI flag (``packed_sequence_size`` <-> ``--packed-sequence-size``), the YAML config
file key and the manifest's ``config`` key. Each field declares its help text and its constraints
(``choices``, ``positive``) once, here: the CLI builds its options from them (``cli.config_options``) and
``validate`` checks them. Precedence: defaults < config file < flags given on the command line (the CLI
passes the file's values to click as the options' defaults, its ``default_map``).

Example::

    >>> cfg = PackConfig.from_dict({"packed_sequence_size": 4096, "inputs": ["data.jsonl"], "output": "out"})
    >>> cfg.strategy
    'bfd'
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from packtool.errors import ON_ERROR, ConfigError
from packtool.plugins import is_plugin_spec

LONG_SAMPLE_POLICIES = ("error", "drop", "truncate", "split")
POSITION_IDS = ("nemo", "restart")
LABELS = ("shifted", "unshifted")
LAYOUTS = ("full", "minimal")  # the storage layouts of ``columns`` (packtool.layout)
FORMATS = ("parquet", "webdataset")  # the shard formats of packtool.formats (a test checks they agree)
SAMPLE_FORMATS = ("auto", "text", "pretokenized", "prompt_completion", "chat")
LOSS_ON = ("assistant", "last", "all")
EMPTY_LOSS_POLICIES = ("drop", "keep", "error")
ENGINES = ("local", "ray")
# 16M tokens: 64 MiB per int32 column of one pack (a pack is built, written and read whole)
MAX_PACKED_SEQUENCE_SIZE = 1 << 24
STRATEGIES = ("bfd", "sequential")  # built-in packing strategies (packtool.packing); or module:callable


def key(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    positive: bool = False,
    runtime: bool = False,
    flag: bool = True,
    short: str | None = None,
) -> Any:
    """A config key: its default, its ``--help`` text and its constraints.

    ``choices``: the allowed values; ``positive``: a positive integer (when set); ``runtime``: says where
    and how the job runs, never what it writes (left out of the manifest and the run_id, so the output is
    byte-identical for any number of processes); ``flag``: has a command-line flag (``False``: config
    file only); ``short``: a one-letter flag too.
    """
    meta = {"help": help, "choices": choices, "positive": positive, "runtime": runtime, "flag": flag}
    meta["short"] = short
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class PackConfig:
    """All settings of one ``packtool pack`` run (see each key's help: ``packtool pack --help``)."""

    inputs: list[str] = key([], "Input files, globs, directories, or hf:NAME[:CONFIG].", flag=False)
    output: str | None = key(None, "Output directory (written atomically).", runtime=True, short="o")
    packed_sequence_size: int | None = key(None, "Tokens per pack (N).", positive=True)
    # reading
    split: str = key("train", "Split of a Hugging Face dataset.")
    text_field: str = key("text", "Field holding the text.")
    sample_format: str = key("auto", "How records are encoded.", choices=SAMPLE_FORMATS)
    # encoding
    tokenizer: str | None = key(
        None, "tokenizer.json, a local model directory, or a module:callable encoder."
    )
    add_bos: bool = key(False, "Prepend the BOS token to every sample.")
    add_eos: bool = key(False, "Append the EOS token to every sample.")
    bos_token: str | None = key(None, "BOS token text [default: the tokenizer's].")
    eos_token: str | None = key(None, "EOS token text [default: the tokenizer's].")
    labels: str = key(
        "shifted",
        "shifted: labels[i] is the target of input_ids[i]; unshifted: labels = input_ids (the model shifts).",
        choices=LABELS,
    )
    mask_labels: bool = key(
        False,
        "pretokenized: where the input gives labels and a loss_mask, write -100 into the labels where "
        "loss_mask is 0 (as NeMo AutoModel's pack_dataset does).",
    )
    encoder_kwargs: dict | None = key(
        None, "Keyword arguments for a module:callable encoder class.", flag=False
    )
    # fine-tuning (sample_format prompt_completion / chat; see packtool.encoders.prompt_completion, .chat)
    prompt_field: str = key("prompt", "prompt_completion: field holding the prompt.")
    completion_field: str = key("completion", "prompt_completion: field holding the completion.")
    prompt_template: str | None = key(
        None,
        "prompt_completion: 'alpaca' (instruction/input) or a format string over fields ('Q: {question}').",
    )
    train_on_prompt: bool = key(False, "prompt_completion: train on the prompt too.")
    chat_template: str | None = key(
        None, "chat: Jinja template file [default: the tokenizer directory's own]."
    )
    loss_on: str = key(
        "assistant", "chat: train on every assistant turn, the last one only, or all tokens.", choices=LOSS_ON
    )
    empty_loss: str = key(
        "drop", "Samples with nothing to learn: drop (counted), keep, or error.", choices=EMPTY_LOSS_POLICIES
    )
    # packing
    strategy: str = key(
        "bfd",
        "bfd (best-fit decreasing, packs shuffled by --seed), sequential (NeMo PackedSequence order), or "
        "module:callable naming a select_samples_to_pack policy.",
    )
    packing_buffer_size: int | None = key(
        None, "Samples planned together by bfd or a custom policy [default: the whole input].", positive=True
    )
    split_across_pack: bool = key(
        False, "Let a sample run over into the next pack instead of moving it whole."
    )
    max_packs: int | None = key(
        None, "Keep at most this many packs (the rest is counted, not kept).", positive=True
    )
    long_samples: str = key(
        "error",
        "Samples longer than N without --split-across-pack: error, drop (counted), truncate (counted), or "
        "split into N-token pieces packed on their own, every sample that fits staying whole (TRL's "
        "bfd_split).",
        choices=LONG_SAMPLE_POLICIES,
    )
    position_ids: str | None = key(
        None,
        "nemo (PackedSequence parity) or restart (0 at every piece and the padding) [default: nemo for "
        "sequential, restart otherwise].",
        choices=POSITION_IDS,
    )
    cp_size: int = key(
        1,
        "Context-parallel size: every sample is padded to a multiple of 2 x cp_size tokens inside its pack "
        "(NeMo AutoModel's pack_dataset cp_size; the padding is recorded per piece in cp_padding); 1: none.",
        positive=True,
    )
    pad_token_id: int = key(0, "Id that pads input_ids (PackedSequence's).")
    seed: int = key(
        0, "Seed of bfd's pack shuffle and of the --val-fraction holdout (same seed, same bytes)."
    )
    val_fraction: float = key(
        0.0,
        "Hold out this fraction of the packs, chosen by --seed, as the validation split: shards val-*, "
        "Energon's val split, the dataset card's validation split; readers take the train split by default.",
    )
    shuffle_packs: bool = key(
        True,
        "bfd: shuffle the packs by --seed, so that their order does not follow sample length; "
        "--no-shuffle-packs keeps them in the order they were filled (TRL's order).",
    )
    on_error: str = key(
        "fail",
        "Bad records: fail (stop, exit code 3) or skip (count by reason, log errors.jsonl).",
        choices=ON_ERROR,
    )
    # writing
    format: str = key("parquet", "Shard format.", choices=FORMATS)
    columns: str = key(
        "full",
        "What the shards store: full (every column, as any reader expects) or minimal (input_ids and only "
        "what carries information; packtool's readers rebuild labels and position_ids: docs/formats.md).",
        choices=LAYOUTS,
    )
    shard_size: int = key(2048, "Packs per shard.", positive=True)
    shard_max_bytes: int | None = key(
        None, "webdataset: at most this many bytes per .tar shard.", positive=True
    )
    row_group_size: int = key(128, "Packs per Parquet row group.", positive=True)
    energon_index: bool = key(
        True,
        "webdataset: write Megatron-Energon's key index (.nv-meta/index.sqlite) when megatron-energon is "
        "installed (importing it takes a second or two).",
    )
    chunk_size: int = key(4096, "Samples per encoding chunk.", positive=True)
    # running
    num_proc: int | None = key(
        None,
        "Processes for encoding and writing (output identical for any) [default: the cores this process "
        "may use; 1 for inputs under 48 MiB that need worker processes (all but pretokenized Parquet), "
        "where starting them takes longer than it saves].",
        positive=True,
        runtime=True,
    )
    engine: str = key("local", "Where encoding and writing run.", choices=ENGINES, runtime=True)
    ray_address: str | None = key(
        None, "Ray cluster to join with --engine ray [default: start a local Ray].", runtime=True
    )
    overwrite: bool = key(False, "Replace an existing output directory (a packtool output).", runtime=True)
    strict: bool = key(
        False,
        "Exit 1 before writing any shard if a sample would not be packed whole (truncated, dropped, cut "
        "by --max-packs, empty, nothing to learn, skipped as bad).",
        runtime=True,
    )
    quiet: bool = key(False, "No progress bars.", runtime=True, short="q")

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, origin: str = "config") -> PackConfig:
        """Build a config from a mapping, rejecting unknown keys (``validate`` checks the values)."""
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            known = ", ".join(sorted(cls.keys()))
            raise ConfigError(f"{origin}: unknown key(s) {', '.join(unknown)}; known keys: {known}")
        cfg = cls(**values)
        if isinstance(cfg.inputs, str):
            cfg.inputs = [cfg.inputs]
        cfg.inputs = [str(p) for p in cfg.inputs]
        return cfg

    def to_dict(self, *, include_runtime: bool = True) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if not include_runtime:
            for k in RUNTIME_KEYS:
                d.pop(k, None)
        return d

    def validate(self) -> PackConfig:
        """Check values; raise ``ConfigError`` naming the offending key. Returns self."""
        if not self.inputs:
            raise ConfigError("no input given: pass INPUT paths or set 'inputs' in the config")
        if not self.output:
            raise ConfigError("no output directory: pass --output DIR or set 'output' in the config")
        if self.packed_sequence_size is None:
            raise ConfigError("packed_sequence_size is required (--packed-sequence-size)")
        for name in self.keys():
            check_value(name, getattr(self, name))
        if self.strategy not in STRATEGIES and not is_plugin_spec(str(self.strategy)):
            raise ConfigError(
                f"strategy must be one of {', '.join(STRATEGIES)} or module:callable, got {self.strategy!r}"
            )
        if not isinstance(self.pad_token_id, int) or isinstance(self.pad_token_id, bool):
            raise ConfigError(f"pad_token_id must be an integer, got {self.pad_token_id!r}")
        if self.pad_token_id < 0:
            raise ConfigError(f"pad_token_id must be a token id (0 or more), got {self.pad_token_id}")
        if self.packed_sequence_size > MAX_PACKED_SEQUENCE_SIZE:
            raise ConfigError(
                f"packed_sequence_size {self.packed_sequence_size:,} is over the "
                f"{MAX_PACKED_SEQUENCE_SIZE:,} tokens packtool packs into one sequence"
            )
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"val_fraction must be at least 0 and below 1, got {self.val_fraction}")
        if self.cp_size > 1 and self.packed_sequence_size % (2 * self.cp_size):
            raise ConfigError(
                f"packed_sequence_size {self.packed_sequence_size} is not a multiple of 2 x cp_size "
                f"({2 * self.cp_size}), so a sample padded for context parallelism could outgrow its pack"
            )
        self.check_conflicts(self.sample_format)
        return self

    def check_conflicts(self, sample_format: str) -> None:
        """``ConfigError`` naming both options when one is set where the other makes it do nothing (an
        option without effect would be recorded in the manifest as if it had one). ``sample_format``: the
        format in effect (``auto`` until the input's fields have decided it)."""
        d = {f.name: f.default for f in dataclasses.fields(self)}

        def changed(name: str) -> bool:
            return getattr(self, name) != d[name]

        custom = is_plugin_spec(str(self.strategy))
        pairs = [
            (
                "long_samples",
                "split_across_pack",
                self.split_across_pack and changed("long_samples"),
                "with --split-across-pack a long sample runs over into the next pack",
            ),
            (
                "shard_max_bytes",
                "format",
                self.shard_max_bytes is not None and self.format != "webdataset",
                "--shard-max-bytes bounds .tar shards (--format webdataset)",
            ),
            (
                "row_group_size",
                "format",
                changed("row_group_size") and self.format != "parquet",
                "--row-group-size is for Parquet shards",
            ),
            (
                "energon_index",
                "format",
                changed("energon_index") and self.format != "webdataset",
                "--no-energon-index is for --format webdataset",
            ),
            (
                "ray_address",
                "engine",
                self.ray_address is not None and self.engine != "ray",
                "--ray-address is for --engine ray",
            ),
            (
                "split_across_pack",
                "strategy",
                self.split_across_pack and custom,
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
                self.cp_size > 1 and self.split_across_pack,
                "context-parallel padding pads whole samples (--long-samples split cuts only long ones)",
            ),
            (
                "cp_size",
                "strategy",
                self.cp_size > 1 and custom,
                "a custom strategy lays out its own packs",
            ),
            (
                "packing_buffer_size",
                "strategy",
                self.packing_buffer_size is not None and self.strategy == "sequential",
                "sequential packing reads the input once in order, with no buffer",
            ),
            (
                "seed",
                "strategy",
                changed("seed") and self.strategy == "sequential" and not self.val_fraction,
                "sequential packing keeps the input order and does not shuffle",
            ),
            (
                "shuffle_packs",
                "strategy",
                changed("shuffle_packs") and self.strategy == "sequential",
                "sequential packing keeps the input order and does not shuffle",
            ),
            (
                "seed",
                "shuffle_packs",
                changed("seed") and not self.shuffle_packs and not self.val_fraction,
                "the seed only orders the shuffle",
            ),
            (
                "bos_token",
                "add_bos",
                self.bos_token is not None and not self.add_bos,
                "--bos-token names the token --add-bos adds",
            ),
            (
                "eos_token",
                "add_eos",
                self.eos_token is not None and not self.add_eos,
                "--eos-token names the token --add-eos adds",
            ),
        ]
        fine_tuning = {
            "prompt_completion": ("prompt_field", "completion_field", "prompt_template", "train_on_prompt"),
            "chat": ("chat_template", "loss_on"),
        }
        if sample_format != "auto":
            for fmt, names in fine_tuning.items():
                for name in names:
                    pairs.append(
                        (
                            name,
                            "sample_format",
                            changed(name) and sample_format != fmt,
                            f"--{_flag(name)} is for --sample-format {fmt.replace('_', '-')}",
                        )
                    )
            pairs.append(
                (
                    "mask_labels",
                    "sample_format",
                    changed("mask_labels") and sample_format != "pretokenized",
                    "--mask-labels is for pretokenized input (other encoders derive labels from the mask)",
                )
            )
            pairs.append(
                (
                    "empty_loss",
                    "sample_format",
                    changed("empty_loss") and sample_format not in fine_tuning,
                    "only fine-tuning formats (prompt_completion, chat) have samples with no loss",
                )
            )
        for a, b, conflict, why in pairs:
            if conflict:
                value = sample_format if b == "sample_format" else getattr(self, b)
                raise ConfigError(
                    f"--{_flag(a)} {_shown(getattr(self, a))} and --{_flag(b)} {_shown(value)} conflict: "
                    f"{why}; drop one"
                )


# Keys that say where and how a job runs, never what it writes. They are left out of the manifest (and
# the run_id) so that the output is byte-identical for any number of processes, and wherever it is written.
RUNTIME_KEYS = tuple(f.name for f in dataclasses.fields(PackConfig) if f.metadata["runtime"])


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _shown(value: Any) -> str:
    """A value as a flag would take it (``on`` / ``off`` for booleans)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value).replace("_", "-") if isinstance(value, str) and value.isidentifier() else str(value)


_TYPES = {"bool": bool, "int": int, "float": float, "str": str, "list": list, "dict": dict}
_FIELDS = {f.name: f for f in dataclasses.fields(PackConfig)}


def check_value(name: str, value: Any) -> None:
    """``value`` is one key ``name`` may take (its type, choices, sign); else ``ConfigError`` naming it."""
    f = _FIELDS[name]
    if value is None:
        if "None" not in str(f.type):
            raise ConfigError(f"{name} must be set, got null")
        return
    _type(name, value, str(f.type))
    if f.metadata["positive"]:
        _positive(name, value)
    if f.metadata["choices"]:
        _choice(name, value, f.metadata["choices"])


def _type(key: str, value: Any, annotation: str) -> None:
    """``value`` has the type the field's annotation names (a bool is not an int here)."""
    want = _TYPES[annotation.split("[")[0].split(" |")[0]]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return  # a config file's 0 for 0.0
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"{key} must be {want.__name__ if want is not str else 'a string'}, got {value!r}")


def _positive(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}")


def resolve_paths(values: dict[str, Any], base: Path) -> dict[str, Any]:
    """``values`` with the relative paths of a config file made relative to ``base`` (the file's folder),
    so that a config file means the same files from any working directory.

    Paths are the ``inputs`` (not ``hf:`` names), ``output``, ``chat_template``, and ``tokenizer`` or
    ``strategy`` when they are a path (a ``.py`` file of a ``file.py:callable`` spec; not a dotted module).

    >>> got = resolve_paths({"inputs": ["../data/a.jsonl", "hf:org/name"], "output": "/abs/out",
    ...                      "strategy": "bfd", "tokenizer": "enc.py:encode"}, Path("configs"))
    >>> got["inputs"], got["output"], got["strategy"], got["tokenizer"]
    (['data/a.jsonl', 'hf:org/name'], '/abs/out', 'bfd', 'configs/enc.py:encode')
    """

    def rel(p: str) -> str:
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(base, p))

    def spec_or_path(p: str, named: tuple[str, ...] = ()) -> str:
        if p in named:
            return p
        if is_plugin_spec(p):
            module, _, name = p.rpartition(":")
            file_like = module.endswith(".py") or "/" in module or "\\" in module
            return f"{rel(module)}:{name}" if file_like else p
        return rel(p)

    out = dict(values)
    for k, v in values.items():
        if not isinstance(v, str) and k != "inputs":
            continue
        if k == "inputs":
            items = [v] if isinstance(v, str) else v
            if isinstance(items, list):
                out[k] = [i if str(i).startswith("hf:") else rel(str(i)) for i in items]
        elif k in ("output", "chat_template"):
            out[k] = rel(v)
        elif k == "tokenizer":
            out[k] = spec_or_path(v)
        elif k == "strategy":
            out[k] = spec_or_path(v, STRATEGIES)
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict of PackConfig keys (dashes accepted for underscores);
    ``ConfigError`` naming the file for a missing file, bad YAML or an unknown key. Relative paths in it
    are relative to the file (``resolve_paths``)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys to values")
    values = {str(k).replace("-", "_"): v for k, v in data.items()}
    PackConfig.from_dict(values, origin=str(path))  # unknown keys are an error here, naming the file
    values = resolve_paths(values, path.parent)
    for name, value in values.items():
        if name != "inputs":
            try:
                check_value(name, value)
            except ConfigError as e:
                raise ConfigError(f"{path}: {e}") from None
    return values


def config_from_provenance(provenance: dict[str, Any]) -> PackConfig:
    """The options an output's manifest records (``Manifest.provenance``, a plain record) as this
    version's config, for what re-runs part of the pipeline (``verify --source``, ``inspect``'s look at
    the inputs): options this version does not know (a newer or an older packtool's) are left out, and
    those it knows but the record lacks take their defaults."""
    return PackConfig.from_dict({k: v for k, v in provenance.items() if k in PackConfig.keys()})
