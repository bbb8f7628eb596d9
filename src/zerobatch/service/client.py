"""``BatchClient``: the Loader's interface, with batches from BatchServers.

The client computes nothing but positions: it asks servers for
(seed, epoch, position, rank, world_size, batch_size) and yields their
batches in order. Moving a training script from ``Loader`` to
``BatchClient`` changes nothing it receives: the same batches in the same
order, the same ``state_dict`` (a Loader's state resumes a client and the
reverse), the same elastic resume.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from zerobatch.columnar import Batch
from zerobatch.packing import PackedPlan
from zerobatch.plan import Plan, Position
from zerobatch.service._fetch import Fetcher
from zerobatch.service._transport import CurveKeys
from zerobatch.source import ordered_shuffle, resolve_rank

__all__ = ["BatchClient"]


class BatchClient:
    """Batches of this rank from BatchServers at ``addresses``, like ``Loader(source, ...)``.

    Args:
        addresses: one server address or several serving the same dataset;
            requests spread over them and move to another when one dies.
        batch_size, seed, shuffle, rank, world_size, drop_last: as ``Loader``.
        output, epochs, block_size, transform, pin_memory, device: as
            ``Loader``. The token dtype is the server's: its source's ``dtype=``.
        prefetch: requests kept in flight (the credit window), at least 1.
        timeout: seconds a server may leave a request unanswered before its
            requests go elsewhere; with no reply from any server for this
            long, iteration raises TimeoutError naming the addresses.
        curve, server_key: CURVE keys for servers started with ``curve=``.

    Thread safety: iterate from one thread. :meth:`close` never blocks.
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int = 4,
        drop_last: bool = True,
        output: str = "torch",
        epochs: int | None = 1,
        block_size: int | None = None,
        transform: Any = None,
        pin_memory: bool = False,
        device: Any = None,
        timeout: float = 30.0,
        curve: CurveKeys | None = None,
        server_key: bytes | None = None,
    ) -> None:
        if isinstance(addresses, str):
            addresses = [addresses]
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if output not in ("torch", "numpy", "batch"):
            raise ValueError(f"output must be 'torch', 'numpy' or 'batch', got {output!r}")
        rank, world_size, _ = resolve_rank(rank, world_size)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.output = output
        self.epochs = epochs
        self.block_size = block_size
        self.transform = transform
        self.pin_memory = pin_memory
        self.device = device
        self._fetcher = Fetcher(
            list(addresses), timeout=timeout, window=prefetch, curve=curve, server_key=server_key
        )
        # packed rows' epoch op runs while batches stream: its own sockets, made on first use
        self._side: Fetcher | None = None
        self._side_options: tuple[list[str], dict[str, Any]] = (
            list(addresses),
            {"timeout": timeout, "window": 1, "curve": curve, "server_key": server_key})
        info, _ = self._fetcher.request({"op": "info"})
        self.length: int = info["length"]
        shuffle = self.shuffle = ordered_shuffle(bool(info.get("ordered")), shuffle,
                                                 "the served source")
        self._packed: dict[str, Any] | None = info.get("packed")
        plan_type: Any = Plan
        extra: dict[str, Any] = {}
        if self._packed is not None:  # packed rows: epochs of their own lengths
            plan_type, extra = _ServedPlan, {"ask": self._ask_epoch}
        self._plan = plan_type(
            self.length,
            batch_size,
            world_size=world_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            block_size=block_size,
            **extra,
        )
        self.rank = self._plan.check_rank(rank)
        self._position = Position(self._plan, info.get("fingerprint"), info.get("source"))

    def __len__(self) -> int:
        """Steps per epoch for this rank (from the start of the epoch)."""
        return int(self._plan.steps(0))

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first step at the next iteration."""
        self._position.start_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """What the caller received: the Loader's state, so either resumes the other."""
        return self._position.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume after ``state`` (a client's or a Loader's), any world_size or batch_size."""
        self._position.load_state_dict(state)

    def _requests(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        for epoch, consumed in self._position.steps(self.epochs):
            yield (
                (epoch, consumed),
                {
                    "op": "batch",
                    "seed": self.seed,
                    "epoch": epoch,
                    "consumed": consumed,
                    "rank": self.rank,
                    "world_size": self.world_size,
                    "batch_size": self.batch_size,
                    "shuffle": self.shuffle,
                    "drop_last": self.drop_last,
                    "block_size": self.block_size,
                },
            )

    def __iter__(self) -> Iterator[Any]:
        for (epoch, consumed), _reply, frames in self._fetcher.run(self._requests()):
            batch = Batch.from_frames(frames)
            self._position.received(epoch, consumed)
            yield self._convert(batch)

    def _ask_epoch(self, epoch: int, consumed: int) -> dict[str, Any]:
        """The server's ``epoch`` op: the epoch's rows and the state's cursor."""
        header = {"op": "epoch", "seed": self.seed, "epoch": epoch, "consumed": consumed,
                  "rank": self.rank, "world_size": self.world_size,
                  "batch_size": self.batch_size, "shuffle": self.shuffle,
                  "drop_last": self.drop_last, "block_size": self.block_size}
        if self._side is None:
            addresses, options = self._side_options
            self._side = Fetcher(addresses, **options)
        reply, _ = self._side.request(header)
        return reply

    def _convert(self, batch: Batch) -> Any:
        if self.transform is not None:
            batch = self.transform(batch)
        if self.output == "batch":
            return batch
        if self._packed is not None:  # the varlen contract, as the Loader collates it
            from zerobatch.packing import collate_rows

            columns = collate_rows(batch.to_numpy(), self.output, **self._packed)
            if self.output == "torch" and (self.pin_memory or self.device is not None):
                columns = {name: _moved(value, self.pin_memory, self.device)
                           for name, value in columns.items()}
            return columns
        if self.output == "numpy":
            return batch.to_numpy()
        return batch.to_torch(pin_memory=self.pin_memory, device=self.device)

    def close(self) -> None:
        """Close the sockets (idempotent; iteration after it fails)."""
        self._fetcher.close()
        if self._side is not None:
            self._side.close()

    def __enter__(self) -> BatchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _moved(value: Any, pin_memory: bool, device: Any) -> Any:
    """A tensor pinned and moved to ``device``; anything else as it is."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    value = value.pin_memory() if pin_memory else value
    return value if device is None else value.to(device, non_blocking=pin_memory)


class _ServedPlan(PackedPlan):
    """The plan of packed rows served by BatchServers: each epoch's row count
    and the state's cursor come from a server (``ask(epoch, consumed)``, the
    ``epoch`` op; row counts kept), the batches too."""

    def __init__(self, *args: Any, ask: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_ask", ask)
        object.__setattr__(self, "_known", {})

    def _total(self, epoch: int) -> int:
        known: dict[int, int] = self._known  # type: ignore[attr-defined]
        if epoch not in known:
            known[epoch] = int(self._ask(epoch, 0)["rows"])  # type: ignore[attr-defined]
        return known[epoch]

    def _exists(self, epoch: int, row: int) -> bool:
        return row < self._total(epoch)

    def cursor_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        return dict(self._ask(epoch, consumed)["cursor"])  # type: ignore[attr-defined]

    def restore_cursor(self, epoch: int, consumed: int, state: dict[str, Any]) -> None:
        """Nothing to restore: the servers re-pack the window they need."""
