"""``transformers.Trainer`` on packtool's loader, resumable from the Trainer's own checkpoints.

``trainer_dataloader(trainer, dataset)`` is what a ``Trainer`` subclass's ``get_train_dataloader``
returns: packtool's loader over ``dataset`` (its order; each batch moved to ``trainer.args.device``, the
mask built there), after checking that the dataset's mask and attention fit the trainer's model. It adds
``LoaderStateCallback`` to the trainer, which saves the loader's state (``PackedLoader.state_dict()``, a
small JSON dict) in every checkpoint's ``trainer_state.json`` and restores it on
``trainer.train(resume_from_checkpoint=...)``: the resumed run trains on the batches the uninterrupted run
would have, step for step, with no extra argument.

How the resume stays exact: the Trainer resumes mid-epoch by skipping the batches of the epoch it has
trained on (accelerate's ``skip_first_batches``, which rebuilds a torch ``DataLoader`` over the dataset
and reads those batches again). packtool's loader, restored from the checkpoint, already continues
after them, reading nothing twice; it is handed to the Trainer through a torch ``DataLoader`` whose first
iteration after a restore starts with as many placeholders as the Trainer skips (the count the Trainer
derives from its ``global_step``, ``len(loader)`` and ``gradient_accumulation_steps``; none with
``TrainingArguments(ignore_data_skip=True)``). So the Trainer's own count of steps in the epoch (which
batches accumulate into a step, the epoch's last short step) is the one it would have had. A placeholder
that reaches training raises ``RuntimeError``; it never trains.

Example::

    from transformers import Trainer
    from packtool.loader import PackedDataset
    from packtool.loader.hf_trainer import trainer_dataloader  # not in packtool.loader: imports transformers

    class PackedTrainer(Trainer):
        def __init__(self, *args, packed_dataset: PackedDataset, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.packed_dataset = packed_dataset

        def get_train_dataloader(self):
            return trainer_dataloader(self, self.packed_dataset)

    packs = PackedDataset("out/", batch_size=8, mask="dense", attention=model.config, infinite=True)
    # or a mixture of outputs: PackedDataset({"out/web": 0.7, "out/code": 0.3}, ...) or "mixture.yaml"
    PackedTrainer(model=model, args=args, packed_dataset=packs).train(resume_from_checkpoint=True)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from packtool.loader.dataset import PackedDataset
from packtool.loader.fit import check_mask_for_model
from packtool.loader.loader import PackedLoader, get_loader
from packtool.masks import AttentionPattern, attention_pattern


class SkippedBatch:
    """What ``TrainerStream`` yields for a batch the Trainer skips on resume: it fails if used."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "packtool: a batch the Trainer was to skip on resume reached training (the Trainer skipped fewer "
            "batches than its global_step says); nothing was trained on it"
        )

    __len__ = __iter__ = __getitem__ = keys = to = _refuse


class TrainerStream(IterableDataset):
    """``loader``'s batches as a torch dataset for the Trainer's ``DataLoader``; the first iteration after
    ``restore`` starts with ``skip`` placeholders (``SkippedBatch``), which the Trainer's skip drops."""

    def __init__(self, loader: PackedLoader) -> None:
        super().__init__()
        self.loader, self.skip = loader, 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        for _ in range(skip):
            yield SkippedBatch()
        yield from self.loader

    def restore(self, state: dict, skip: int) -> None:
        """Continue from the loader ``state`` of a checkpoint, after ``skip`` placeholders."""
        if state.get("rank") != self.loader.dataset.rank:  # the cursor is every rank's; the counts are not
            state = {**state, "stats": {}}
        self.loader.load_state_dict(state)
        self.skip = skip


def _identity(x: Any) -> Any:
    return x


def _describe(pattern: AttentionPattern) -> str:
    windows, chunks = pattern.windows(), pattern.chunks()
    sizes = {
        kind: f" (window {w})" if w else f" (chunk {chunks[kind]})" if chunks[kind] else ""
        for kind, w in windows.items()
    }
    return ", ".join(kind + size for kind, size in sizes.items())


def check_dataset_fits_model(dataset: PackedDataset, model: Any) -> None:
    """Refuse (``ValueError``, one line) a dataset whose batches the model would train on inexactly: a mask
    path that does not fit the model (``loader.fit.check_mask_for_model``: its layers, its
    ``attn_implementation``, its code), or masks without the model's sliding window (or with another)."""
    config = getattr(model, "config", None)
    if config is None:
        return
    row = dataset.packed_sequence_size * (dataset.batch_size if dataset.mask == "varlen" else 1)
    mrope = getattr(dataset.task_encoder, "mrope", False)
    check_mask_for_model(dataset.mask, config, mrope=mrope, row_tokens=row)
    if dataset.mask == "varlen":  # the model applies its own windows and chunks inside each sequence
        return
    want, have = attention_pattern(config), dataset.attention
    if (want.windows(), want.chunks()) != (have.windows(), have.chunks()):
        raise ValueError(
            f"the model's attention is {_describe(want)}, the dataset's masks are for {_describe(have)}: "
            "pass PackedDataset(..., attention=model.config)"
        )


def trainer_dataloader(trainer: Trainer, dataset: PackedDataset, **dataloader_kwargs: Any) -> DataLoader:
    """The train ``DataLoader`` of ``trainer`` over ``dataset`` (see the module docstring): packtool's loader
    with ``trainer.args.dataloader_num_workers`` workers, each batch moved to ``trainer.args.device``,
    resumable from the trainer's checkpoints (``LoaderStateCallback``, added to ``trainer`` once).
    ``dataloader_kwargs`` go to ``get_loader`` (``pin_memory``, ``prefetch_factor``...)."""
    sp_size = getattr(trainer, "get_sp_size", lambda: 1)()  # transformers 5's sequence parallelism
    if sp_size > 1:
        raise ValueError(
            "trainer_dataloader: sequence parallelism (sp_size > 1) re-splits batches; not supported"
        )
    check_dataset_fits_model(dataset, trainer.model)
    loader = get_loader(
        dataset,
        num_workers=trainer.args.dataloader_num_workers,
        device=trainer.args.device,
        **dataloader_kwargs,
    )
    if not any(isinstance(cb, LoaderStateCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(LoaderStateCallback())
    return DataLoader(TrainerStream(loader), batch_size=None, num_workers=0, collate_fn=_identity)


def trainer_skip(args: Any, global_step: int, batches_per_epoch: int) -> int:
    """The batches ``transformers.Trainer`` skips when it resumes at ``global_step`` (what its
    ``_init_training_state`` computes): those of the current epoch already trained on."""
    if args.ignore_data_skip:
        return 0
    accumulation = args.gradient_accumulation_steps
    steps_per_epoch = max(batches_per_epoch // accumulation + int(batches_per_epoch % accumulation > 0), 1)
    return (global_step % steps_per_epoch) * accumulation


class LoaderStateCallback(TrainerCallback, ExportableState):
    """Saves the packtool loader's state in each checkpoint (the Trainer writes ``state()`` into
    ``trainer_state.json``, under ``stateful_callbacks``) and restores it when training resumes.

    Under DDP the checkpoint holds rank 0's state: every rank continues at the same cursor (the ranks
    advance together); ``loader.stats`` of the other ranks count from the resume."""

    def __init__(self) -> None:
        self.stream: TrainerStream | None = None

    def state(self) -> dict:
        loader_state = self.stream.loader.state_dict() if self.stream is not None else None
        return {"args": {}, "attributes": {"loader_state": loader_state}}

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        stream = getattr(train_dataloader, "dataset", None)
        if not isinstance(stream, TrainerStream):
            return
        self.stream = stream
        name = type(self).__name__
        if state.global_step == 0:  # a new run: its checkpoints will hold this callback's state
            state.stateful_callbacks[name] = self.state()
            return
        saved = state.stateful_callbacks.get(name)
        loader_state = saved.get("attributes", {}).get("loader_state") if isinstance(saved, dict) else None
        if loader_state is None:
            raise ValueError(
                f"resuming at step {state.global_step} from a checkpoint without packtool's loader state "
                "(saved without trainer_dataloader): the loader would start its order again"
            )
        stream.restore(loader_state, trainer_skip(args, state.global_step, len(train_dataloader)))
