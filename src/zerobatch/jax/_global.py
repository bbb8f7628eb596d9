"""Global ``jax.Array``s from this process's rows, in seed 003's microbatch layout.

A training step of ``dp * batch_size`` windows of ``T`` tokens is laid out as
``(microbatch, dp * batch_size // microbatch, T)``: global row ``r`` of the
step (the step's ``r``-th observation) sits at ``[r // cols, r % cols]`` with
``cols = dp * batch_size // microbatch``. A usual sharding is
``NamedSharding(mesh, P("pp", "dp", "tp"))``: microbatches split over pipeline
stages, rows over data-parallel replicas, tokens over tensor-parallel ones.

With several processes, each process feeds only the rows its own devices hold
(``local_rows``); ``jax.make_array_from_process_local_data`` assembles the
global array and no process ever holds the whole step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import numpy.typing as npt

from zerobatch.columnar import Batch

__all__ = ["GlobalSteps", "JaxOutput", "check_layout", "check_sharding", "local_box",
           "local_rows", "row_sharding", "to_global"]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_layout(
    *, batch_size: int, microbatch: int, seq_len: int, dp: int = 1, pp: int = 1, tp: int = 1,
) -> tuple[int, int, int]:
    """Check seed 003's conditions and return one step's global shape
    ``(microbatch, dp * batch_size // microbatch, seq_len)``.

    ``batch_size`` is per data-parallel replica (windows); raises ``ValueError``
    naming the condition that fails: ``batch_size % microbatch``,
    ``microbatch % pp``, ``seq_len % tp``.
    """
    batch_size = _positive("batch_size", batch_size)
    microbatch = _positive("microbatch", microbatch)
    seq_len, dp = _positive("seq_len (T)", seq_len), _positive("dp", dp)
    pp, tp = _positive("pp", pp), _positive("tp", tp)
    if batch_size % microbatch:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of microbatch "
                         f"({microbatch}): each microbatch takes batch_size / microbatch rows "
                         "per data-parallel replica")
    if microbatch % pp:
        raise ValueError(f"microbatch ({microbatch}) must be a multiple of pp ({pp}): "
                         "microbatches are split evenly over pipeline stages")
    if seq_len % tp:
        raise ValueError(f"T / seq_len ({seq_len}) must be a multiple of tp ({tp}): tokens "
                         "are split evenly over tensor-parallel devices")
    return microbatch, dp * batch_size // microbatch, seq_len


def check_sharding(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` unless every dimension of ``global_shape`` splits
    evenly over the mesh axes ``sharding`` (a ``NamedSharding``) puts on it.
    Other shardings are left to JAX."""
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return
    names = _dim_names(len(global_shape))
    if len(tuple(spec)) > len(global_shape):
        layout = " x ".join(names)
        hint = ("pass microbatch= (JaxOutput(sharding, microbatch=...)) to lay each step out "
                "as (microbatch, rows // microbatch, seq_len), or " if len(global_shape) == 2
                else "")
        raise ValueError(f"the sharding's spec {spec} has {len(tuple(spec))} dimensions, each "
                         f"step's arrays have {len(global_shape)} ({layout}, global shape "
                         f"{tuple(global_shape)}): {hint}use a spec of {len(global_shape)} "
                         "dimensions")
    sizes = dict(mesh.shape)
    for d, axes in enumerate(tuple(spec)[: len(global_shape)]):
        if axes is None:
            continue
        group = (axes,) if isinstance(axes, str) else tuple(axes)
        parts = int(np.prod([sizes[a] for a in group]))
        if global_shape[d] % parts:
            raise ValueError(f"{names[d]} ({global_shape[d]}) must be a multiple of "
                             f"{' * '.join(group)} ({parts}): the sharding splits that "
                             f"dimension {parts} ways (global shape {tuple(global_shape)})")


def _dim_names(ndim: int) -> list[str]:
    names = ["microbatch", "rows per microbatch", "T / seq_len"]
    if ndim == 2:
        return ["rows", names[-1]]
    return ["step"] * max(0, ndim - 3) + names[-ndim:]


def local_box(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The part of the global array this process's devices hold: one slice per
    dimension (the whole dimension, or this process's contiguous slice)."""
    shape = tuple(int(n) for n in global_shape)
    box = [[n, 0] for n in shape]
    for index in sharding.addressable_devices_indices_map(shape).values():
        for d, part in enumerate(index or ()):
            start, stop, _ = part.indices(shape[d])
            box[d][0] = min(box[d][0], start)
            box[d][1] = max(box[d][1], stop)
    return tuple(slice(lo, hi) for lo, hi in box)


def local_rows(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]) -> npt.NDArray[
    np.int64
]:
    """The rows this process must feed, as flat positions over every dimension
    but the last (tokens), in C order: for a step ``(microbatch, cols, T)``,
    row ``m * cols + c``. Feed them, in this order, to ``to_global``."""
    shape = tuple(int(n) for n in global_shape)
    box = local_box(sharding, shape)
    grids = np.meshgrid(*[np.arange(s.start, s.stop) for s in box[:-1]], indexing="ij")
    return np.ravel_multi_index([g.ravel() for g in grids], shape[:-1]).astype(np.int64)


def _place(
    array: np.ndarray, name: str, sharding: jax.sharding.Sharding, shape: tuple[int, ...],
    box: tuple[slice, ...],
) -> jax.Array:
    box_shape = tuple(s.stop - s.start for s in box)
    rows = int(np.prod(box_shape[:-1]))
    array = np.asarray(array)
    if array.shape == box_shape:
        local = array
    elif array.ndim == 2 and array.shape[0] == rows and array.shape[1] in (
        shape[-1], box_shape[-1]
    ):
        local = array.reshape(*box_shape[:-1], array.shape[1])
        if array.shape[1] != box_shape[-1]:
            local = local[..., box[-1]]  # this process's tensor-parallel tokens only
    else:
        raise ValueError(f"{name}: expected this process's {rows} rows of {shape[-1]} tokens "
                         f"(local_rows order) or an array of shape {box_shape}, got "
                         f"{array.shape}; global shape {shape}")
    return jax.make_array_from_process_local_data(sharding, local, shape)


def row_sharding(sharding: jax.sharding.Sharding, ndim: int) -> jax.sharding.Sharding:
    """The sharding of a per-row column (``[rows]``, e.g. a mixture's
    ``source``) beside token columns of ``ndim`` dimensions placed with
    ``sharding``: a ``NamedSharding``'s spec without its token dimension (rows
    split as the tokens' rows are, replicated over the token axes); any other
    sharding as it is (a single device's)."""
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return sharding
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*tuple(spec)[:ndim - 1]))


def _place_rows(array: np.ndarray, name: str, sharding: jax.sharding.Sharding,
                shape: tuple[int, ...]) -> jax.Array:
    """A per-row column (this process's rows, ``local_rows`` order) as a global
    array of the step's shape without its token dimension."""
    rows_shape = shape[:-1]
    placed = row_sharding(sharding, len(shape))
    box = local_box(placed, rows_shape)
    box_shape = tuple(s.stop - s.start for s in box)
    array = np.asarray(array)
    if array.shape != (int(np.prod(box_shape)),) and array.shape != box_shape:
        raise ValueError(f"{name}: expected this process's {int(np.prod(box_shape))} rows "
                         f"(local_rows order), got shape {array.shape}; global shape "
                         f"{rows_shape}")
    return jax.make_array_from_process_local_data(placed, array.reshape(box_shape), rows_shape)


def to_global(
    batch: Any, sharding: jax.sharding.Sharding, *, global_shape: tuple[int, ...],
    fields: tuple[str, ...] | None = None,
) -> Any:
    """Global ``jax.Array``s of ``global_shape`` placed with ``sharding``, from
    this process's rows only.

    ``batch`` is an array, a mapping of arrays or a ``Batch``; each array holds
    this process's rows in ``local_rows(sharding, global_shape)`` order as
    ``[rows, T]`` (tokens outside this process's slice are dropped), or is
    already this process's block (``local_box``). Returns one array, or a dict
    for a mapping or a ``Batch`` (``fields``: which columns; default every
    dense ``[rows, T]`` column and every per-row ``[rows]`` one, such as a
    mixture's ``source``, which becomes an array of ``global_shape`` without
    its last dimension, placed with :func:`row_sharding`). The arrays are
    copied to the devices; the inputs may be reused afterwards.
    """
    shape = tuple(int(n) for n in global_shape)
    check_sharding(sharding, shape)
    box = local_box(sharding, shape)
    if isinstance(batch, (Batch, Mapping)):
        columns: dict[str, Any] = {name: batch[name] for name in (
            batch.fields if isinstance(batch, Batch) else batch)}
        names = fields if fields is not None else tuple(
            name for name, column in columns.items()
            if isinstance(column, np.ndarray) and column.ndim in (1, 2)
        )
        return {name: _place_rows(columns[name], name, sharding, shape)
                if np.ndim(columns[name]) == 1 else
                _place(columns[name], name, sharding, shape, box) for name in names}
    return _place(batch, "batch", sharding, shape, box)


class GlobalSteps:
    """How each step of a loader becomes global arrays (``Loader(output="jax")``).

    A step is ``rows`` windows of ``seq_len`` tokens (``batch_size *
    world_size`` for a Loader), laid out as ``(microbatch, rows // microbatch,
    seq_len)``, or ``(rows, seq_len)`` when ``microbatch`` is None. Step
    position ``p`` (0 <= p < rows) is the step's ``p``-th observation;
    ``positions`` are the ones this process reads, in the order ``__call__``
    expects them. Immutable and thread-safe.
    """

    def __init__(self, sharding: jax.sharding.Sharding, *, rows: int, seq_len: int,
                 microbatch: int | None = None,
                 collate: Callable[[Batch], Mapping[str, Any]] | None = None) -> None:
        rows, seq_len = _positive("rows", rows), _positive("seq_len", seq_len)
        if microbatch is None:
            self.shape: tuple[int, ...] = (rows, seq_len)
        else:
            microbatch = _positive("microbatch", microbatch)
            if rows % microbatch:
                raise ValueError(f"rows per step ({rows} = batch_size * world_size) must be "
                                 f"a multiple of microbatch ({microbatch})")
            self.shape = (microbatch, rows // microbatch, seq_len)
        check_sharding(sharding, self.shape)
        self.sharding = sharding
        self.positions = local_rows(sharding, self.shape)
        self._collate = collate

    def indices(self, consumed: int, order: Any = None) -> npt.NDArray[np.int64]:
        """The observations this process reads for the step starting at global
        position ``consumed``: ``order(consumed + positions)`` (``order``: a
        permutation such as ``Plan.order(epoch)``; None: no shuffle). Across
        processes these are exactly the step's positions, each read once."""
        positions = int(consumed) + self.positions
        return positions if order is None else np.asarray(order(positions), dtype=np.int64)

    def __call__(self, batch: Any) -> Any:
        """``(x, y)`` from a batch with ``input_ids`` and ``labels`` and no
        per-row column, else a dict of every dense ``[rows, seq_len]`` column
        and every per-row one (a mixture's ``source``: the step's shape
        without ``seq_len``, see :func:`to_global`). With ``collate`` (a
        source's own, e.g. packed rows' varlen contract with JAX's names), a
        dict of the dense columns it gives: ``input_ids``, ``labels``,
        ``segment_ids``, ``positions``."""
        if self._collate is not None:
            return to_global(self._collate(batch), self.sharding, global_shape=self.shape)
        arrays = to_global(batch, self.sharding, global_shape=self.shape)
        per_row = any(a.ndim < len(self.shape) for a in arrays.values())
        if "input_ids" in arrays and "labels" in arrays and not per_row:
            return arrays["input_ids"], arrays["labels"]
        return arrays


class JaxOutput:
    """``Loader(source, batch_size, output=JaxOutput(sharding, microbatch=...))``:
    each step becomes global ``jax.Array``s placed with ``sharding``.

    A step is ``batch_size * world_size`` windows (``batch_size`` per process,
    as everywhere in zerobatch), laid out ``(microbatch, rows // microbatch,
    seq_len)``, or ``(rows, seq_len)`` with ``microbatch`` None; it arrives as
    ``(x, y)`` (inputs, labels) or a dict of the dense columns
    (:class:`GlobalSteps`); a source that collates for JAX itself (``"jax"``
    in its ``collate_outputs``) gives the dict of that collation's dense
    columns (packed rows: ``input_ids``, ``labels``, ``segment_ids``,
    ``positions``). Each process reads only the rows its devices hold;
    ``rank`` and ``world_size`` default to JAX's process index and count. The
    source must have fixed-length windows (a ``seq_len``) and the Loader
    ``drop_last=True``. Immutable.
    """

    def __init__(self, sharding: jax.sharding.Sharding, *, microbatch: int | None = None) -> None:
        if not isinstance(sharding, jax.sharding.Sharding):
            raise ValueError(f"sharding must be a jax.sharding.Sharding of each step's global "
                             f"arrays, got {type(sharding).__name__}")
        self.sharding = sharding
        self.microbatch = None if microbatch is None else _positive("microbatch", microbatch)

    def __repr__(self) -> str:
        return f"JaxOutput({self.sharding!r}, microbatch={self.microbatch})"

    def ranks(self) -> tuple[int, int]:
        """This process's rank and the world size when the Loader is given neither."""
        return jax.process_index(), jax.process_count()

    def bind(self, plan: Any, source: Any) -> GlobalSteps:
        """The converter of ``plan``'s steps over ``source``."""
        if not plan.drop_last:
            raise ValueError("a JaxOutput needs the Loader's drop_last=True: every step fills "
                             "its global arrays")
        seq_len = getattr(source, "seq_len", None)
        if seq_len is None:
            raise ValueError(f"a JaxOutput needs a source of fixed-length windows (a seq_len "
                             f"attribute); got {type(source).__name__}")
        # a source that collates for JAX itself (packed rows: the contract, JAX's names)
        collate = (functools.partial(source.collate, output="jax")
                   if "jax" in getattr(source, "collate_outputs", ()) else None)
        return GlobalSteps(self.sharding, rows=plan.step_size, seq_len=seq_len,
                           microbatch=self.microbatch, collate=collate)
