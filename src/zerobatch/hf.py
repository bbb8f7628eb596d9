"""Hugging Face ``Trainer`` over a zerobatch source, with exact, immediate resume.

``zerobatch.hf.Trainer`` is ``transformers.Trainer`` whose training data is a
zerobatch source (``TokenWindows``, ``Documents``, a mixture, ...) or a
:class:`~zerobatch.Loader`::

    from zerobatch.hf import Trainer
    windows = open_dataset(path).windows(512, labels="aligned")  # HF's label convention
    trainer = Trainer(model=model, args=args, train_dataset=windows)
    trainer.train()                               # or, after a crash:
    trainer.train(resume_from_checkpoint=True)    # exactly where the checkpoint was

What it changes, and why:

- **Batches come from the plan**: a :class:`~zerobatch.Loader` of
  ``per_device_train_batch_size`` rows for this process (``args.process_index``
  of ``args.world_size``), seeded by ``args.data_seed`` (else ``args.seed``),
  read by ``dataloader_num_workers`` workers through
  :class:`zerobatch.torch.DataLoader`. Accelerate does not wrap it, so under
  torchrun each rank reads its own share once (accelerate would split it again).
- **Labels in Hugging Face's convention**: ``labels[i] = input_ids[i]`` (the
  model shifts), -100 at each document's first token (``position_ids == 0``)
  and wherever a ``loss_mask`` column is 0. zerobatch's own ``labels`` are
  shifted by one already (nanoGPT's convention); a Hugging Face model shifting
  them again would learn to predict two tokens ahead. A source that makes
  aligned labels itself (``labels="aligned"``: windows or packed documents)
  is taken as it is; one set to ``labels="shifted"`` (windows' default) is
  refused.
- **Resume at once**: each checkpoint folder gets ``zerobatch_loader.json`` (the
  Loader's position after the last batch trained on, written before
  ``trainer_state.json``). ``train(resume_from_checkpoint=...)`` loads it and
  sets ``ignore_data_skip``, so the Trainer never replays consumed batches: the
  resume costs O(1), not a re-read of the epoch so far. A checkpoint without
  the file is refused (it would restart the data).
- **Epochs reshuffle**: the Trainer's ``set_epoch`` reaches the Loader.

WARNING: with ``gradient_accumulation_steps`` above 1, an epoch whose steps are
not a multiple of it ends with a short accumulation; on the resumed epoch the
Trainer, counting batches from 0, folds that short one into the next epoch's
first update. Keep the epoch's steps a multiple (or ``drop_last``-sized) for
bit-exact resumes there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import transformers
from transformers.trainer_utils import get_last_checkpoint

from zerobatch.loader import Loader
from zerobatch.storage.publish import publisher
from zerobatch.torch import DataLoader

__all__ = ["CHECKPOINT_FILE", "IGNORE_INDEX", "Trainer", "aligned_labels"]

CHECKPOINT_FILE = "zerobatch_loader.json"
"""The Loader state's file name inside each Trainer checkpoint folder."""

IGNORE_INDEX = -100
"""The label of a token that takes no loss (Hugging Face and PyTorch's default)."""


def aligned_labels(batch: dict[str, Any], *, columns: Sequence[str] = ("input_ids", "labels")
                   ) -> dict[str, Any]:
    """``columns`` of a zerobatch torch batch with ``labels`` in Hugging Face's
    aligned convention: ``input_ids`` copied, -100 where ``position_ids == 0``
    (a document's first token: no loss across documents) and where a
    ``loss_mask`` column is 0. O(batch_size * seq_len), one copy.

    >>> ids, positions = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[3, 0, 1, 2]])
    >>> aligned_labels({"input_ids": ids, "position_ids": positions})["labels"].tolist()
    [[5, -100, 7, 8]]
    """
    ids = batch["input_ids"]
    out = {name: batch[name] for name in columns if name != "labels"}
    if "labels" in columns:
        labels = ids.to(torch.int64, copy=True)  # copy: the labels differ from the inputs
        positions = batch.get("position_ids")
        if positions is not None:
            labels[positions == 0] = IGNORE_INDEX
        mask = batch.get("loss_mask")
        if mask is not None:
            labels[mask == 0] = IGNORE_INDEX
        out["labels"] = labels
    return out


def _label_mode(source: Any) -> str | None:
    """The source's own label convention (``"aligned"``, ``"shifted"``) when it
    names one, else None (zerobatch's windows: derive aligned labels)."""
    mode = getattr(source, "labels", None)
    return mode if isinstance(mode, str) else None


class _TrainerData(DataLoader):
    """:class:`zerobatch.torch.DataLoader` yielding the Trainer's columns."""

    def __init__(self, loader: Loader, columns: Sequence[str], **kwargs: Any) -> None:
        super().__init__(loader, **kwargs)
        self.columns = tuple(columns)
        mode = _label_mode(loader._source)
        if mode not in (None, "aligned"):
            raise ValueError(f"the source makes labels={mode!r}; Hugging Face models shift "
                             "labels themselves: build it with labels='aligned'")
        self._given = mode == "aligned"  # the source's labels are HF's already

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator, as its base's
        for batch in super().__iter__():
            if self._given:
                yield {name: batch[name] for name in self.columns}
            else:
                yield aligned_labels(batch, columns=self.columns)


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` over a zerobatch source or Loader (module docstring).

    Args:
        *args, **kwargs: ``transformers.Trainer``'s; ``train_dataset`` is a
            zerobatch source (a Loader is built from ``args``) or a
            :class:`~zerobatch.Loader` (used as it is: its batch_size, seed and
            rank apply).
        columns: the batch keys passed to the model (``labels`` made aligned);
            add ``"position_ids"`` for padding-free attention.
    """

    def __init__(self, *args: Any, columns: Sequence[str] = ("input_ids", "labels"),
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.train_dataset is not None and not _is_source(self.train_dataset):
            raise ValueError(f"zerobatch.hf.Trainer takes a zerobatch source or Loader as "
                             f"train_dataset, got {type(self.train_dataset).__name__}; use "
                             "transformers.Trainer for other datasets")
        if self.args.dataloader_persistent_workers:
            raise ValueError("zerobatch.hf.Trainer needs dataloader_persistent_workers=False: "
                             "persistent workers keep the Loader's position they started with")
        self.columns = tuple(columns)
        self._data: _TrainerData | None = None
        self._resume: dict[str, Any] | None = None

    def _loader(self) -> Loader:
        dataset = self.train_dataset
        if isinstance(dataset, Loader):
            return dataset
        args = self.args
        seed = args.data_seed if args.data_seed is not None else args.seed
        return Loader(dataset, args.per_device_train_batch_size, seed=seed,
                      rank=args.process_index, world_size=args.world_size,
                      drop_last=True, num_threads=0, prefetch=0)

    def get_train_dataloader(self) -> DataLoader:
        """The zerobatch DataLoader of this process's batches (not wrapped by
        accelerate: the plan already gave this rank its share), moved to the
        resumed position when ``train`` was given a checkpoint."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if self._data is None:
            args = self.args
            options: dict[str, Any] = {"num_workers": args.dataloader_num_workers,
                                       "pin_memory": bool(args.dataloader_pin_memory
                                                          and torch.cuda.is_available())}
            if args.dataloader_num_workers > 0 and args.dataloader_prefetch_factor is not None:
                options["prefetch_factor"] = args.dataloader_prefetch_factor
            self._data = _TrainerData(self._loader(), self.columns, **options)
        if self._resume is not None:
            self._data.load_state_dict(self._resume)
            self._resume = None
        return self._data

    def train(self, resume_from_checkpoint: str | bool | None = None,
              *args: Any, **kwargs: Any) -> Any:
        """``transformers.Trainer.train``; a checkpoint resumes the data exactly
        from its ``zerobatch_loader.json``, with no batch replayed."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"no valid checkpoint found in output directory "
                                 f"({self.args.output_dir})")
        if resume_from_checkpoint:
            self._resume = _read_state(str(resume_from_checkpoint))
            self.args.ignore_data_skip = True  # the Loader resumes itself: never replay
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The Trainer's checkpoint, with the Loader's position written first."""
        if self._data is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-"
                                  f"{self.state.global_step}")
            files = publisher(folder)
            try:
                files.put(CHECKPOINT_FILE, json.dumps(self._data.state_dict()).encode())
            finally:
                files.close()
        super()._save_checkpoint(model, trial)


def _is_source(dataset: Any) -> bool:
    return isinstance(dataset, Loader) or (callable(getattr(dataset, "read", None))
                                           and hasattr(dataset, "__len__"))


def _read_state(checkpoint: str) -> dict[str, Any]:
    """The Loader state in ``checkpoint``'s folder; ValueError naming the file."""
    path = os.path.join(checkpoint, CHECKPOINT_FILE)
    try:
        with open(path, "rb") as file:
            state = json.loads(file.read(1 << 20))
    except FileNotFoundError:
        raise ValueError(f"{path} is missing: this checkpoint was not saved by "
                         "zerobatch.hf.Trainer, so the data position is unknown; resume from "
                         "a checkpoint it saved") from None
    except ValueError as error:
        raise ValueError(f"{path} is not a Loader state ({error})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a Loader state")
    return state
