"""The running stage's options: where and how the job runs, never what it writes (left out of the
manifest and the run_id, so that the output is byte-identical for any number of processes)."""

from __future__ import annotations

from typing import Literal

import msgspec

from packtool.errors import ON_ERROR
from packtool.option_types import Applies, OptionGroup, option

ENGINES = ("local", "ray")
# bytes of input an encoding chunk holds at most (pipeline.encode.chunked): what one worker holds, and its
# tokenizer works through, at once is then a few times this, whatever the documents' length
CHUNK_BYTES = 16 << 20


class RayOptions(OptionGroup):
    """``--engine ray``'s own options."""

    applies = Applies("engine", ("ray",))

    ray_address: option(str | None, "Ray cluster to join [default: start a local Ray].", runtime=True) = None


class RunningOptions(OptionGroup):
    """Processes, the engine, the output directory's replacement, strictness and progress."""

    section = "running"

    num_proc: option(
        int | None,
        "Processes for encoding and writing (output identical for any) [default: the cores this process "
        "may use; 1 for inputs under 48 MiB that need worker processes (all but pretokenized Parquet), "
        "where starting them takes longer than it saves].",
        runtime=True,
        gt=0,
    ) = None
    engine: option(Literal[ENGINES], "Where encoding and writing run.", runtime=True) = "local"
    chunk_size: option(
        int | None,
        f"Records per encoding chunk, at most (a chunk also ends at {CHUNK_BYTES >> 20} MiB of input, so a "
        "worker holds about as much whatever the documents' length): how the work is cut, never what is "
        "written [default: 4096; 256 for vision-language samples, whose images a worker holds].",
        runtime=True,
        gt=0,
    ) = None
    on_error: option(
        Literal[ON_ERROR],
        "Bad records: fail (stop, exit code 3) or skip (count by reason, log errors.jsonl).",
    ) = "fail"
    overwrite: option(bool, "Replace an existing output directory (a packtool output).", runtime=True) = False
    strict: option(
        bool,
        "Exit 1 before writing any shard if a sample would not be packed whole (truncated, dropped, cut "
        "by --max-packs, empty, nothing to learn, skipped as bad).",
        runtime=True,
    ) = False
    quiet: option(
        bool, "No progress bars or notes (the result line and warnings stay).", runtime=True, short="q"
    ) = False
    storage_options: option(
        str | None,
        "The object store's settings as a JSON object, as fsspec's storage_options take them (endpoint, "
        "credentials, ...), for inputs and an output in a store; per scheme under its name "
        "('{\"s3\": {...}}') [default: the store's own variables, e.g. AWS_*].",
        runtime=True,
    ) = None
    scratch: option(
        str | None,
        "A store prefix for the scratch (encoded chunks, state) of a run whose output is in a store "
        "[default: <output>/.partial/].",
        runtime=True,
    ) = None
    ray: RayOptions = msgspec.field(default_factory=RayOptions)
