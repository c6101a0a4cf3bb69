"""``PackConfig``: every option of ``packtool pack``, with one name per concept.

The same key is used for the CLI flag (``packed_sequence_size`` <-> ``--packed-sequence-size``), the YAML
config file and the manifest. Precedence: defaults < config file < flags given on the command line.

Example::

    >>> cfg = PackConfig.from_dict({"packed_sequence_size": 4096, "inputs": ["data.jsonl"], "output": "out"})
    >>> cfg.strategy
    'bfd'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from packtool.errors import ON_ERROR, ConfigError
from packtool.plugins import is_plugin_spec

LONG_SAMPLE_POLICIES = ("error", "drop", "truncate")
POSITION_IDS = ("nemo", "restart")
LABELS = ("shifted", "unshifted")
FORMATS = ("parquet", "webdataset")  # the shard formats of packtool.formats (a test checks they agree)
SAMPLE_FORMATS = ("auto", "text", "pretokenized", "prompt_completion", "chat")
LOSS_ON = ("assistant", "last", "all")
EMPTY_LOSS_POLICIES = ("drop", "keep", "error")
ENGINES = ("local", "ray")
STRATEGIES = ("bfd", "sequential")  # built-in packing strategies (packtool.packing); or module:callable

# Keys that say where and how a job runs, never what it writes. They are left out of the manifest (and
# the run_id) so that the output is byte-identical for any number of processes, and wherever it is written.
RUNTIME_KEYS = ("output", "num_proc", "quiet", "overwrite", "engine", "ray_address")


@dataclass
class PackConfig:
    """All settings of one ``packtool pack`` run.

    Attributes mirror the CLI flags; see ``packtool pack --help`` for each one's meaning.
    """

    inputs: list[str] = field(default_factory=list)
    output: str | None = None
    packed_sequence_size: int | None = None
    # reading
    split: str = "train"
    text_field: str = "text"
    sample_format: str = "auto"
    # encoding
    tokenizer: str | None = None
    add_bos: bool = False
    add_eos: bool = False
    bos_token: str | None = None
    eos_token: str | None = None
    labels: str = "shifted"
    encoder_kwargs: dict | None = None  # keyword arguments for a module:callable encoder class
    # fine-tuning (sample_format prompt_completion / chat; see packtool.encoders.prompt_completion, .chat)
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    prompt_template: str | None = None
    train_on_prompt: bool = False
    chat_template: str | None = None
    loss_on: str = "assistant"
    empty_loss: str = "drop"
    # packing
    strategy: str = "bfd"  # bfd | sequential | module:callable (a custom packing policy)
    packing_buffer_size: int | None = None  # samples per planning window (bfd, custom); None: whole input
    split_across_pack: bool = False
    max_packs: int | None = None
    long_samples: str = "error"
    position_ids: str | None = None  # None: "nemo" for sequential, "restart" for the other strategies
    pad_token_id: int = 0
    seed: int = 0
    # bad records: fail (stop with exit code 2) or skip (count by reason, log to errors.jsonl)
    on_error: str = "fail"
    # writing
    format: str = "parquet"
    shard_size: int = 2048
    shard_max_bytes: int | None = None  # webdataset: bytes per .tar shard at most (None: shard_size only)
    row_group_size: int = 128
    chunk_size: int = 4096
    # running
    num_proc: int = 1
    engine: str = "local"
    ray_address: str | None = None  # with engine ray: the cluster to join; None starts a local Ray
    overwrite: bool = False
    quiet: bool = False

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, origin: str = "config") -> PackConfig:
        """Build a config from a mapping, rejecting unknown keys, then validate it."""
        known = set(cls.keys())
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"{origin}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"
            )
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
        """Check values; raise ``ConfigError`` with the offending key. Returns self."""
        if not self.inputs:
            raise ConfigError("no input given: pass INPUT paths or set 'inputs' in the config")
        if not self.output:
            raise ConfigError("no output directory: pass --output DIR or set 'output' in the config")
        _positive("packed_sequence_size", self.packed_sequence_size)
        for key in ("shard_size", "row_group_size", "chunk_size", "num_proc"):
            _positive(key, getattr(self, key))
        if self.max_packs is not None:
            _positive("max_packs", self.max_packs)
        if self.strategy not in STRATEGIES and not is_plugin_spec(str(self.strategy)):
            raise ConfigError(
                f"strategy must be one of {', '.join(STRATEGIES)} or module:callable, got {self.strategy!r}"
            )
        if self.shard_max_bytes is not None:
            _positive("shard_max_bytes", self.shard_max_bytes)
            if self.format != "webdataset":
                raise ConfigError("shard_max_bytes bounds tar shards: it needs format webdataset")
        _choice("long_samples", self.long_samples, LONG_SAMPLE_POLICIES)
        if self.packing_buffer_size is not None:
            _positive("packing_buffer_size", self.packing_buffer_size)
        if self.position_ids is not None:
            _choice("position_ids", self.position_ids, POSITION_IDS)
        _choice("labels", self.labels, LABELS)
        _choice("format", self.format, FORMATS)
        _choice("sample_format", self.sample_format, SAMPLE_FORMATS)
        _choice("loss_on", self.loss_on, LOSS_ON)
        _choice("empty_loss", self.empty_loss, EMPTY_LOSS_POLICIES)
        _choice("on_error", self.on_error, ON_ERROR)
        _choice("engine", self.engine, ENGINES)
        if not isinstance(self.pad_token_id, int) or isinstance(self.pad_token_id, bool):
            raise ConfigError(f"pad_token_id must be an integer, got {self.pad_token_id!r}")
        return self


def _positive(key: str, value: Any) -> None:
    if value is None:
        raise ConfigError(f"{key} is required (--{key.replace('_', '-')})")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict of PackConfig keys (dashes accepted for underscores)."""
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
    return {str(k).replace("-", "_"): v for k, v in data.items()}
