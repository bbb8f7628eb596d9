"""``FieldStore``: fields of samples put by producers, got by consumer tasks (seed 002).

Samples are identified by their global index within a partition (for example
``"train@step_12"``). Producers :meth:`FieldStore.put` any subset of fields for
any samples; a consumer task asks :meth:`FieldStore.get_meta` for samples whose
requested fields are all produced and that the task has not received yet, then
:meth:`FieldStore.get` fetches their columns.

Storage is columnar: per partition one bool array per field says which
samples are produced, one bool array per task which it consumed, and one
buffer per field holds the values (dense: an ``[N, *shape]`` array; jagged: an
append-only values arena plus start and length per sample; objects: a NumPy
object array). Every request is vectorized NumPy over its B samples and F
fields, plus one scan of the partition's N status entries in ``get_meta``;
no Python object is made per sample (objects fields aside, whose values are
Python objects). Batches travel as the F + 1 frames of :meth:`Batch.to_frames`.

Global indexes must lie in ``[0, max_samples)``: buffers are indexed by them
and grow by doubling up to the largest index put.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from zerobatch.columnar import Batch, BatchMeta, FieldSchema, Jagged
from zerobatch.columnar.schema import Column
from zerobatch.columnar.wire import expect, read_array
from zerobatch.errors import FormatError
from zerobatch.service._transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Channel,
    CurveKeys,
    Server,
    no_payload,
)

__all__ = ["FieldStore", "FieldStoreServer", "FieldTable"]

DEFAULT_MAX_SAMPLES = 1 << 24
"""Default bound on global indexes per partition (exclusive)."""

_INDEX = np.dtype("<i8")


def _grow(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` with at least ``rows`` rows (doubling); new rows zero / False / None."""
    if len(array) >= rows:
        return array
    grown = np.zeros((max(rows, 2 * len(array)), *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array  # the one copy of a growth step
    return grown


class _FieldBuffer:
    """One field's values and produced flags for every sample slot of a partition."""

    def __init__(self, name: str, field: FieldSchema) -> None:
        self.name = name
        self.field = FieldSchema(field.kind, field.dtype, field.item_shape)
        self.produced = np.zeros(0, dtype=bool)
        if field.kind == "dense":
            assert isinstance(field.dtype, np.dtype)
            self.data = np.zeros((0, *field.item_shape), dtype=field.dtype)
        elif field.kind == "jagged":
            assert isinstance(field.dtype, np.dtype)
            self.data = np.zeros((0, *field.item_shape), dtype=field.dtype)  # the values arena
            self.used = 0
            self.start = np.zeros(0, dtype=np.int64)
            self.length = np.zeros(0, dtype=np.int64)
        else:
            self.data = np.empty(0, dtype=object)

    def put(self, slots: npt.NDArray[np.int64], column: Column, rows: int) -> None:
        """Store ``column`` at ``slots`` (copies: the received frames do not outlive this)."""
        self.produced = _grow(self.produced, rows)
        if self.field.kind == "jagged":
            assert isinstance(column, Jagged)
            compact = column.compact()
            items = len(compact.values)
            self.data = _grow(self.data, self.used + items)
            self.data[self.used : self.used + items] = compact.values
            self.start = _grow(self.start, rows)
            self.length = _grow(self.length, rows)
            self.start[slots] = self.used + compact.offsets[:-1]
            self.length[slots] = compact.lengths
            self.used += items
        elif self.field.kind == "dense":
            self.data = _grow(self.data, rows)
            self.data[slots] = column
        else:
            self.data = _grow(self.data, rows)
            values = np.empty(len(slots), dtype=object)
            values[:] = column
            self.data[slots] = values
        self.produced[slots] = True

    def schema(self, slots: npt.NDArray[np.int64]) -> FieldSchema:
        """This field's schema for the samples at ``slots`` (jagged: their lengths)."""
        if self.field.kind != "jagged":
            return self.field
        field = self.field
        return FieldSchema(field.kind, field.dtype, field.item_shape, self.length[slots])

    def take(self, slots: npt.NDArray[np.int64]) -> Column:
        """The column of the samples at ``slots``, in that order (a copy, O(B) or O(items))."""
        if self.field.kind == "dense":
            return self.data[slots]
        if self.field.kind == "objects":
            return list(self.data[slots])
        lengths = self.length[slots]
        starts = self.start[slots]
        offsets = np.zeros(len(slots) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if len(slots) and np.array_equal(starts - offsets[:-1], np.full(len(slots), starts[0])):
            # Stored back to back (put together, in this order): a view of the arena,
            # safe to send without a copy since arena rows are never written twice.
            first = int(starts[0])
            return Jagged(self.data[first : first + int(offsets[-1])], offsets)
        gather = np.repeat(self.start[slots] - offsets[:-1], lengths)
        gather += np.arange(int(offsets[-1]), dtype=np.int64)
        return Jagged(self.data[gather], offsets)


class _Partition:
    """The fields, produced flags and per-task consumed flags of one partition."""

    def __init__(self) -> None:
        self.rows = 0
        self.fields: dict[str, _FieldBuffer] = {}
        self.consumed: dict[str, npt.NDArray[np.bool_]] = {}


class FieldTable:
    """The store itself, without sockets: partitions of columnar fields.

    :class:`FieldStoreServer` wraps one; it is usable directly in one process.
    Thread safety: none; one thread at a time.
    """

    def __init__(self, *, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        self.max_samples = max_samples
        self._partitions: dict[str, _Partition] = {}

    @property
    def partitions(self) -> list[str]:
        """Partition names, in creation order."""
        return list(self._partitions)

    def _slots(self, indexes: Any, *, where: str) -> npt.NDArray[np.int64]:
        slots = np.asarray(indexes, dtype=np.int64)
        if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= self.max_samples):
            bad = int(slots.min()) if int(slots.min()) < 0 else int(slots.max())
            raise ValueError(
                f"{where}: global index {bad} outside [0, {self.max_samples}); "
                "raise max_samples or renumber the samples"
            )
        return slots

    def put(self, batch: Batch, partition: str) -> None:
        """Store every field of ``batch`` for its global indexes in ``partition``.

        Fields already in the partition must keep their kind, dtype and item
        shape; putting a field again for a sample replaces its value.
        Cost: O(B) per field (one copy of the values).
        """
        slots = self._slots(batch.meta.global_indexes, where="put")
        if len(np.unique(slots)) != len(slots):
            raise ValueError("put: a global index appears twice in the batch")
        part = self._partitions.get(partition)
        existing = {} if part is None else part.fields
        for name, field in batch.meta.field_schema.items():
            known = existing.get(name)
            if known is not None and not known.field.same_layout(field):
                raise ValueError(
                    f"put: field {name!r} is {field} here but {known.field} in partition "
                    f"{partition!r}"
                )
        if part is None:
            part = self._partitions[partition] = _Partition()
        rows = max(part.rows, int(slots.max()) + 1 if len(slots) else 0)
        for name, field in batch.meta.field_schema.items():
            buffer = part.fields.get(name)
            if buffer is None:
                buffer = part.fields[name] = _FieldBuffer(name, field)
            buffer.put(slots, batch[name], rows)
        part.rows = rows

    def get_meta(
        self, fields: Sequence[str], batch_size: int, partition: str, task: str
    ) -> BatchMeta:
        """Up to ``batch_size`` samples with every field of ``fields`` produced, not yet
        given to ``task``, in global-index order; they count as consumed by ``task``.

        Returns fewer (or none) when fewer are ready; a partition or field nobody
        has put yet has no ready samples. Cost: O(N * F) vectorized over the
        partition's N index slots, O(B) for the result.
        """
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        if not fields:
            raise ValueError("get_meta: name at least one field")
        part = self._partitions.get(partition)
        if part is None or any(name not in part.fields for name in fields):
            return BatchMeta(np.zeros(0, dtype=np.int64), partition_ids=partition)
        rows = part.rows
        ready = np.ones(rows, dtype=bool)
        for name in fields:
            buffer = part.fields[name]
            buffer.produced = _grow(buffer.produced, rows)  # fields put for fewer samples
            ready &= buffer.produced[:rows]
        consumed = _grow(part.consumed.get(task, np.zeros(0, dtype=bool)), rows)
        part.consumed[task] = consumed
        ready &= ~consumed[:rows]
        slots = np.flatnonzero(ready)[:batch_size].astype(np.int64)
        consumed[slots] = True
        schema = {name: part.fields[name].schema(slots) for name in fields}
        return BatchMeta(
            slots,
            partition_ids=partition,
            production_status=np.ones(len(slots), dtype=np.int8),
            field_schema=schema,
        )

    def get(self, meta: BatchMeta) -> Batch:
        """The columns of ``meta``'s fields for its samples (one partition), as a Batch.

        Raises ValueError for an unknown partition or field, or a sample whose
        field is not produced. Cost: O(B) per field (one gather each).
        """
        batch = self.take(_partition_of(meta), np.asarray(meta.global_indexes), meta.field_names)
        return Batch(meta.with_schema(batch.meta.field_schema), batch.to_numpy())

    def take(self, partition: str, indexes: Any, fields: Sequence[str]) -> Batch:
        """The Batch of ``fields`` for the samples ``indexes`` of ``partition``."""
        part = self._partitions.get(partition)
        if part is None:
            raise ValueError(
                f"get: unknown partition {partition!r}; partitions are {self.partitions}"
            )
        slots = self._slots(indexes, where="get")
        columns: dict[str, Column] = {}
        for name in fields:
            buffer = part.fields.get(name)
            if buffer is None:
                raise ValueError(
                    f"get: no field {name!r} in partition {partition!r}; fields are "
                    f"{list(part.fields)}"
                )
            if len(slots) and (
                int(slots.max()) >= len(buffer.produced) or not buffer.produced[slots].all()
            ):
                missing = slots[slots >= len(buffer.produced)]
                if not len(missing):
                    missing = slots[~buffer.produced[slots]]
                raise ValueError(
                    f"get: field {name!r} not produced for global index {int(missing[0])} "
                    f"of partition {partition!r}"
                )
            columns[name] = buffer.take(slots)
        meta = BatchMeta(
            slots, partition_ids=partition, production_status=np.ones(len(slots), dtype=np.int8)
        )
        return Batch.from_columns(columns, meta)

    def clear(self, partition: str) -> None:
        """Drop ``partition``: its fields, statuses and task progress."""
        if self._partitions.pop(partition, None) is None:
            raise ValueError(
                f"clear: unknown partition {partition!r}; partitions are {self.partitions}"
            )


def _partition_of(meta: BatchMeta) -> str:
    """The one partition of ``meta``'s samples (ValueError for several)."""
    ids = meta.partition_ids
    if len(ids.names) > 1 and len(np.unique(ids.codes)) > 1:
        raise ValueError(f"get: samples from several partitions {list(ids.names)}; get each")
    return ids[0] if len(meta) else (ids.names[0] if ids.names else "")


def _handle(table: FieldTable) -> Any:
    """The FieldStoreServer request handler over ``table``."""

    def handle(header: dict[str, Any], payload: list[memoryview]) -> tuple[dict, list]:
        op = expect(header, "op", str, where="header", field="op")
        if op == "put":
            partition = expect(header, "partition", str, where="header", field="partition")
            table.put(Batch.from_frames(payload), partition)
            return {}, []
        no_payload(op, payload)
        if op == "get_meta":
            fields = expect(header, "fields", list, where="header", field="fields")
            if not all(isinstance(f, str) for f in fields):
                raise FormatError("expected a list of names", path="header", field="fields")
            meta = table.get_meta(
                fields,
                expect(header, "batch_size", int, where="header", field="batch_size"),
                expect(header, "partition", str, where="header", field="partition"),
                expect(header, "task", str, where="header", field="task"),
            )
            return {}, [meta.to_bytes()]
        if op == "get":
            fields = expect(header, "fields", list, where="header", field="fields")
            if not all(isinstance(f, str) for f in fields):
                raise FormatError("expected a list of names", path="header", field="fields")
            raw = expect(header, "indexes", bytes, where="header", field="indexes")
            if len(raw) % _INDEX.itemsize:
                raise FormatError(
                    f"{len(raw)} bytes is not a whole number of <i8", path="header", field="indexes"
                )
            indexes = read_array(
                raw, _INDEX, len(raw) // _INDEX.itemsize, where="header", field="indexes"
            )
            partition = expect(header, "partition", str, where="header", field="partition")
            return {}, table.take(partition, indexes, fields).to_frames()
        if op == "clear":
            table.clear(expect(header, "partition", str, where="header", field="partition"))
            return {}, []
        raise FormatError(
            f"unknown op {op!r}; expected put, get_meta, get or clear", path="header", field="op"
        )

    return handle


class FieldStoreServer(Server):
    """Serves one :class:`FieldTable` over ZeroMQ until :meth:`stop`.

    Args:
        address: where to bind; ``tcp://127.0.0.1:0``-style ports pick a free
            one (``server.address`` is the bound endpoint). Non-loopback
            addresses need ``curve`` unless ``insecure=True``.
        max_samples: global indexes per partition must be below this.
        curve: the server's CURVE key pair; clients then need its public key.
        allowed_clients: CURVE public keys of the clients allowed (None: any
            client that knows the server key).
        max_message_bytes: the largest request accepted.

    Example::

        server = FieldStoreServer("tcp://127.0.0.1:5556")
        server.serve()  # in its own thread or process
    """

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:5556",
        *,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        curve: CurveKeys | None = None,
        allowed_clients: Collection[bytes] | None = None,
        insecure: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.table = FieldTable(max_samples=max_samples)
        super().__init__(
            address,
            _handle(self.table),
            curve=curve,
            allowed_clients=allowed_clients,
            insecure=insecure,
            max_message_bytes=max_message_bytes,
        )


class FieldStore:
    """A client of a :class:`FieldStoreServer`: the same four operations as FieldTable.

    Every call waits at most ``timeout`` seconds, then raises TimeoutError naming
    the address (a put that timed out may still be applied later). Errors the
    server reports raise :class:`ServiceError`. Not thread safe: one per thread.
    """

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:5556",
        *,
        timeout: float = 30.0,
        curve: CurveKeys | None = None,
        server_key: bytes | None = None,
    ) -> None:
        self._channel = Channel(address, timeout=timeout, curve=curve, server_key=server_key)

    @property
    def address(self) -> str:
        """The server's address."""
        return self._channel.address

    def put(self, batch: Batch, partition: str) -> None:
        """Store ``batch``'s fields for its global indexes in ``partition``."""
        self._channel.request({"op": "put", "partition": partition}, batch.to_frames())

    def get_meta(
        self, fields: Sequence[str], batch_size: int, partition: str, task: str
    ) -> BatchMeta:
        """Up to ``batch_size`` ready samples ``task`` has not had (see FieldTable.get_meta)."""
        _, payload = self._channel.request(
            {
                "op": "get_meta",
                "fields": list(fields),
                "batch_size": batch_size,
                "partition": partition,
                "task": task,
            }
        )
        if len(payload) != 1:
            raise FormatError(f"expected 1 frame, found {len(payload)}", path=self.address)
        return BatchMeta.from_bytes(payload[0])

    def get(self, meta: BatchMeta) -> Batch:
        """The Batch of ``meta``'s fields for its samples (one partition)."""
        partition = _partition_of(meta)
        indexes = np.ascontiguousarray(np.asarray(meta.global_indexes), dtype=_INDEX)
        _, payload = self._channel.request(
            {
                "op": "get",
                "fields": meta.field_names,
                "partition": partition,
                "indexes": indexes.tobytes(),
            }
        )
        batch = Batch.from_frames(payload)
        return Batch(meta.with_schema(batch.meta.field_schema), batch.to_numpy())

    def clear(self, partition: str) -> None:
        """Drop ``partition`` on the server."""
        self._channel.request({"op": "clear", "partition": partition})

    def close(self) -> None:
        """Close the connection (never blocks; idempotent)."""
        self._channel.close()

    def __enter__(self) -> FieldStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
