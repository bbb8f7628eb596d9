"""``ShardDataset``: seed 003's JAX dataset class, rebuilt on zerobatch.

The interface and layout are seed 003's: ``.npy`` token shards under
``<bucket or folder>/<train_folder_name>/`` and ``<val_folder_name>/``, and
``ds(step)`` returns ``(x, y)`` of shape ``(step, microbatch, dp * batch_size //
microbatch, T)`` placed with the ``partition`` sharding (``step`` consecutive
training steps, e.g. for gradient accumulation). What changed:

- The shards are one token stream read in place (``zerobatch.stream.npy``):
  labels continue across shard boundaries (no token pair is lost), and
  nothing is downloaded whole or written to local disk.
- Each process reads only the rows its own devices hold, and the next calls'
  rows are read and placed on the devices in a background thread while the
  current step runs (``prefetch`` calls ahead, assuming the same ``step``).
- ``shuffle=True`` shuffles windows globally through the Loader's plan
  (``zerobatch.plan.Plan.order``: a Feistel permutation per epoch, from
  ``seed`` and the epoch); ``shuffle=False`` walks the stream in order.
- ``state_dict()`` / ``load_state_dict()`` resume exactly (epoch, position).
- Every divisibility condition is checked when the dataset is built.

Thread safety: one thread calls a ``ShardDataset``; the background thread is
internal.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from zerobatch.jax._global import check_layout, local_rows, to_global
from zerobatch.plan import Plan, Position
from zerobatch.storage import is_url, join, local_path, open_storage
from zerobatch.stream.npy import NpyTokens, open_npy

__all__ = ["DataConfig", "ShardDataset", "get_datasets"]

_logger = logging.getLogger("zerobatch.jax")


def _log(message: str) -> None:
    """Log on process 0 only (every process would say the same)."""
    if jax.process_index() == 0:
        _logger.info(message)


def _open_split(location: str | os.PathLike[str], folder: str,
                storage_options: dict[str, Any]) -> NpyTokens:
    """The ``.npy`` shards of ``<location>/<folder>/`` (a folder or an object-store
    prefix) as one stream."""
    if is_url(location):
        url = str(join(location, folder))
        storage = open_storage(url, **storage_options)
        names = [name for name in storage.names() if name.endswith(".npy")]
        return open_npy(url, storage=storage, names=names)
    path = local_path(location) / folder
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder; expected .npy token shards in "
                                f"<bucket or folder>/{folder}/ (an object-store bucket is "
                                "a URL: s3://, gs://, az://)")
    return open_npy(path, storage=open_storage(path, **storage_options))


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Seed 003's data settings, with its field names and defaults, plus zerobatch's.

    ``bucket_name`` is a folder (or object-store URL) holding one sub-folder
    of ``.npy`` shards per split. ``process_path`` is kept for seed 003's
    configs and unused: nothing is downloaded to local disk.
    """

    bucket_name: str
    process_path: str = "./bucket_downloads/processShard"
    train_folder_name: str = "train"
    val_folder_name: str = "val"
    T: int = 6
    train_batch_size: int = 3
    val_batch_size: int = 3
    micro_batch_size: int = 1
    shuffle: bool = False
    seed: int = 0
    prefetch: int = 4
    dtype: str = "int32"
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> DataConfig:
        """Parse seed 003's flags (``--bucket_name``, ``--T``, ``--train_batch_size``
        …, with its command-line defaults) and ``--shuffle``, ``--seed``,
        ``--prefetch``, ``--dtype``; other flags (the model's) are ignored."""
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--bucket_name", type=str, default="10bt_gpt2")
        parser.add_argument("--process_path", type=str, default=cls.process_path)
        parser.add_argument("--train_folder_name", type=str, default=cls.train_folder_name)
        parser.add_argument("--val_folder_name", type=str, default=cls.val_folder_name)
        parser.add_argument("--T", type=int, default=1024)
        parser.add_argument("--train_batch_size", type=int, default=16)
        parser.add_argument("--val_batch_size", type=int, default=16)
        parser.add_argument("--micro_batch_size", type=int, default=4)
        parser.add_argument("--shuffle", action="store_true")
        parser.add_argument("--seed", type=int, default=cls.seed)
        parser.add_argument("--prefetch", type=int, default=cls.prefetch)
        parser.add_argument("--dtype", type=str, default=cls.dtype, choices=("int32", "int64"))
        args, _ = parser.parse_known_args(argv)
        return cls(**vars(args))


class ShardDataset:
    """Seed 003's ``Dataset`` over ``<bucket_name>/<id>/*.npy`` (see the module doc).

    Args:
        bucket_name: the folder (or object-store URL) holding the split folders.
        id: the split's folder name (``"train"``, ``"val"``).
        T: tokens per window.
        batch_size: windows per data-parallel replica per step.
        microbatch: microbatches per step (``batch_size % microbatch == 0``).
        dp, pp, tp: data, pipeline and tensor parallelism (``microbatch % pp
            == 0``, ``T % tp == 0``).
        partition: the ``NamedSharding`` of ``(step, microbatch, dp *
            batch_size // microbatch, T)`` arrays, e.g. ``P(None, "pp", "dp",
            "tp")``; None puts whole arrays on the default device (one process).
        shuffle, seed: a global shuffle per epoch, from ``(seed, epoch)``.
        prefetch: calls read and placed ahead (0: read when called). From object
            storage, ``prefetch * step time`` should exceed a few request
            latencies (``benchmarks/jax_input.py``: 8 at 10 ms steps, 20 ms latency).
        dtype: ``"int32"`` (JAX's default integer) or ``"int64"``.
        storage_options: for ``zerobatch.storage.open_storage`` (object-store
            credentials, endpoint, retries); reads that still fail after the
            retry budget raise ``StorageError``.
    """

    def __init__(
        self, bucket_name: str | os.PathLike[str], id: str, T: int, batch_size: int,
        microbatch: int, dp: int = 1, pp: int = 1, partition: Any = None, *, tp: int = 1,
        shuffle: bool = False, seed: int = 0, prefetch: int = 4, dtype: str = "int32",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._step_shape = check_layout(batch_size=batch_size, microbatch=microbatch,
                                         seq_len=T, dp=dp, pp=pp, tp=tp)
        if partition is None and jax.process_count() > 1:
            raise ValueError("with several JAX processes, pass partition= (a NamedSharding "
                             "of (step, microbatch, dp * batch_size // microbatch, T) arrays)")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        self.T, self.batch_size, self.microbatch = T, batch_size, microbatch
        self.dp, self.pp, self.tp = dp, pp, tp
        self.partition = partition
        self.id = id
        self._shuffle = bool(shuffle)
        self._seed = seed
        self._prefetch = prefetch
        self._tokens = _open_split(bucket_name, id, dict(storage_options or {}))
        self._windows = self._tokens.windows(T, dtype=dtype)
        self._rows = dp * batch_size  # windows per step, all replicas
        if len(self._windows) < self._rows:
            self._tokens.close()
            raise ValueError(f"{bucket_name}/{id} holds {len(self._windows)} windows of {T} "
                             f"tokens, fewer than one step ({self._rows} = dp * batch_size)")
        self._plan = Plan(len(self._windows), self._rows, seed=self._seed,
                          shuffle=self._shuffle)
        # The one state every zerobatch iterable shares: consumed counts the windows of
        # the epoch already returned, all processes together, as a Loader's does.
        self._position = Position(self._plan, self._windows.fingerprint)
        self._ahead: collections.deque[tuple[tuple[int, int, int], Future[Any]]] = (
            collections.deque()
        )
        # Reads overlap one another (object-store latency), results come in call order.
        self._pool = ThreadPoolExecutor(max_workers=max(1, prefetch),
                                        thread_name_prefix="zerobatch-jax")
        self._file = -1
        _log(f"{id}: {len(self._tokens.names)} shards, {self._tokens.num_tokens} tokens, "
             f"{len(self)} steps per epoch")

    @classmethod
    def getDataset(  # seed 003's name, for drop-in use
        cls, cfg: DataConfig, partition: Any = None, dp: int = 1, pp: int = 1, tp: int = 1,
    ) -> tuple[ShardDataset, ShardDataset]:
        """Seed 003's constructor of the (train, val) pair: ``get_datasets``."""
        return get_datasets(cfg, partition, dp, pp, tp)

    def __len__(self) -> int:
        """Steps (of ``dp * batch_size`` windows) per epoch."""
        return len(self._windows) // self._rows

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one step, all replicas: ``dp * batch_size * T``."""
        return self._rows * self.T

    @property
    def epoch(self) -> int:
        """The epoch the next call reads from."""
        return self._position.epoch

    @property
    def plan(self) -> Plan:
        """The plan: one step is ``dp * batch_size`` windows, all processes together."""
        return self._plan

    def _start(self, epoch: int, consumed: int, step: int) -> tuple[int, int]:
        """Where a call of ``step`` steps from (epoch, consumed) starts: the
        next epoch when the rest of this one is too short."""
        if consumed + step * self._rows > len(self._windows):
            return epoch + 1, 0
        return epoch, consumed

    def _fetch(self, epoch: int, consumed: int, step: int) -> tuple[Any, Any]:
        """Read this process's rows of a call and place them; runs in the pool."""
        shape = (step, *self._step_shape)
        if self.partition is None:
            positions = np.arange(step * self._rows, dtype=np.int64)
        else:
            positions = local_rows(self.partition, shape)
        order = self._plan.order(epoch)  # the Loader's epoch order: same seed, same windows
        windows = consumed + positions
        batch = self._windows.read(windows if order is None else order(windows))
        if self.partition is None:
            return (jax.device_put(np.asarray(batch["input_ids"]).reshape(shape)),
                    jax.device_put(np.asarray(batch["labels"]).reshape(shape)))
        arrays = to_global(batch, self.partition, global_shape=shape,
                           fields=("input_ids", "labels"))
        return arrays["input_ids"], arrays["labels"]

    def __call__(self, step: int = 1) -> tuple[Any, Any]:
        """The next ``step`` training steps: ``(x, y)``, each ``(step, microbatch,
        dp * batch_size // microbatch, T)``; ``y`` is ``x`` shifted by one token."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be a positive int, got {step!r}")
        if step * self._rows > len(self._windows):
            raise ValueError(f"step={step} needs {step * self._rows} windows; the split "
                             f"holds {len(self._windows)}")
        epoch, consumed = self._start(*self._position.step, step)
        key = (epoch, consumed, step)
        if self._ahead and self._ahead[0][0] == key:
            future = self._ahead.popleft()[1]
        else:
            self._drop_ahead()
            future = self._pool.submit(self._fetch, *key)
        self._fill_ahead(step, (epoch, consumed + step * self._rows))
        try:
            arrays = future.result()
        except BaseException:
            self._drop_ahead()  # the position stays: the next call retries these rows
            raise
        if epoch != self._position.epoch:
            _log(f"{self.id}: epoch {epoch}")
        self._position.epoch, self._position.consumed = epoch, consumed + step * self._rows
        self._note_file(consumed)
        return arrays

    def _note_file(self, consumed: int) -> None:
        if self._shuffle:
            return
        file = self._tokens.file_at(consumed * self.T)
        if file != self._file:
            self._file = file
            _log(f"{self.id}: reading shard {self._tokens.names[file]}")

    def _fill_ahead(self, step: int, position: tuple[int, int]) -> None:
        """Read up to ``prefetch`` calls of ``step`` ahead, from ``position``
        (epoch, consumed) where the queue is empty."""
        epoch, consumed = position
        if self._ahead:
            epoch, consumed = self._ahead[-1][0][:2]
            consumed += step * self._rows
        while len(self._ahead) < self._prefetch:
            epoch, consumed = self._start(epoch, consumed, step)
            key = (epoch, consumed, step)
            self._ahead.append((key, self._pool.submit(self._fetch, *key)))
            consumed += step * self._rows

    def _drop_ahead(self) -> None:
        while self._ahead:
            _, future = self._ahead.popleft()
            if not future.cancel():
                future.exception()  # wait; a failed read-ahead that nobody asked for is moot

    def state_dict(self) -> dict[str, Any]:
        """Where the next call starts: :meth:`zerobatch.plan.Position.state_dict`,
        JSON-able, independent of ``prefetch``."""
        return self._position.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly where ``state`` was taken (same shards and ``T``, any
        ``prefetch``). ValueError names what differs when the state has another
        seed, shuffle, data or version: it would not continue the same order."""
        if isinstance(state, dict) and "length" not in state and "fingerprint" in state:
            # the older form: no length and block_size (a ShardDataset never blocks)
            state = {**state, "length": len(self._windows), "block_size": None}
        step = self._position.check(state)
        self._drop_ahead()
        self._position.epoch, self._position.consumed = step
        self._file = -1

    def close(self) -> None:
        """Stop reading ahead and close the shards; idempotent."""
        self._drop_ahead()
        self._pool.shutdown(wait=True)
        self._tokens.close()

    def __enter__(self) -> ShardDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def get_datasets(
    cfg: DataConfig, partition: Any = None, dp: int = 1, pp: int = 1, tp: int = 1,
) -> tuple[ShardDataset, ShardDataset]:
    """The train and val datasets of ``cfg`` (seed 003's ``getDataset``)."""
    common = {"partition": partition, "dp": dp, "pp": pp, "tp": tp, "seed": cfg.seed,
              "prefetch": cfg.prefetch, "dtype": cfg.dtype,
              "storage_options": cfg.storage_options}
    train = ShardDataset(cfg.bucket_name, cfg.train_folder_name, cfg.T, cfg.train_batch_size,
                         cfg.micro_batch_size, shuffle=cfg.shuffle, **common)
    val = ShardDataset(cfg.bucket_name, cfg.val_folder_name, cfg.T, cfg.val_batch_size,
                       cfg.micro_batch_size, **common)
    return train, val
