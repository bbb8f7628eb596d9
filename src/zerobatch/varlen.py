"""The varlen contract: the columns that attention kernels with document masking read.

A batch of ``B`` rows of ``seq_len`` tokens where each row holds several
*segments* (documents, or pieces of documents) back to back, then padding.
The layout of a row is given by its segment lengths, ``seqlens``: row ``b``
holds segments of ``seqlens[b]`` tokens in order, their sum ``n_b <=
seq_len``, and positions ``n_b .. seq_len - 1`` are padding. This module turns
``input_ids`` and ``seqlens`` (with an optional per-token ``loss_mask``) into
the columns FlashAttention's varlen kernels, the transformers padding-free
path, Mamba layers and JAX's Grain/MaxText consume, computed by one Numba
kernel, no Python loop per row or segment:

==================  ================  ==========================================
name                shape, dtype      meaning
==================  ================  ==========================================
``input_ids``       [B, seq_len]      tokens; padding is ``pad_id`` (0)
``labels``          [B, seq_len]      see below; -100 where no loss is taken
``position_ids``    [B, seq_len] i32  0, 1, ... restarting at every segment
``cu_seqlens``      [S + 1] int32     ONE flat array over the flattened batch
                                      (``B * seq_len`` tokens): segment ``s``
                                      is tokens ``cu[s]:cu[s + 1]`` of
                                      ``input_ids.reshape(-1)``
``max_seqlen``      host ``int``      the longest segment in ``cu_seqlens``
``seq_idx``         [B, seq_len] i32  the segment (index into ``cu_seqlens``)
                                      each token belongs to
``attention_mask``  [B, seq_len] i64  1 on tokens, 0 on padding; only with
                                      ``attention_mask=True``
``segment_ids``     [B, seq_len] i32  JAX (``output="jax"``): 1, 2, ... per
                                      segment within the row, 0 on padding
``positions``       [B, seq_len] i32  JAX: ``position_ids``
==================  ================  ==========================================

A row's padding tail (when ``n_b < seq_len``) is a segment of its own in
``cu_seqlens``, ``seq_idx`` and ``position_ids`` (restarting at 0), so every
one of the ``B * seq_len`` tokens belongs to exactly one segment,
``cu_seqlens[-1] == B * seq_len`` and a varlen kernel never reads a token
outside a segment; its labels are -100, so it adds no loss. ``max_seqlen``
counts it as well. ``cu_seqlens_size=N`` pads ``cu_seqlens`` to the static
length ``N`` by repeating its last value (empty segments, as Megatron does
for CUDA graphs and ``torch.compile``); ``ValueError`` when a batch has more
than ``N - 1`` segments.

Labels, ``mode="shifted"`` (nanoGPT, zerobatch's default): ``labels[i] =
input_ids[i + 1]`` inside a segment; -100 at each segment's last token, on
padding, and where the *target* token's ``loss_mask`` is 0. ``mode="aligned"``
(Hugging Face; the model shifts): ``labels[i] = input_ids[i]``; -100 at each
segment's first token, on padding and where ``loss_mask[i]`` is 0. Either way
the loss of a token is taken exactly when its ``loss_mask`` is 1 and it is
not its segment's first token.

>>> import numpy as np
>>> cols = varlen_columns(np.array([[5, 6, 7, 8, 0]]), [[3, 1]], labels="aligned")
>>> cols["position_ids"].tolist(), cols["cu_seqlens"].tolist(), cols["max_seqlen"]
([[0, 1, 2, 0, 0]], [0, 3, 4, 5], 3)
>>> cols["labels"].tolist(), cols["seq_idx"].tolist()
([[-100, 6, 7, -100, -100]], [[0, 0, 0, 1, 2]])

Unpacked windows (``TokenWindows`` with ``document_masking=True``) carry the
same columns, computed by the read kernel; there every row is full (no
padding segment). In their ``Batch`` every column has one entry per row:
``cu_seqlens`` is a ``Jagged`` int32 of each row's segment starts then
``seq_len`` (row coordinates) and ``max_seqlen`` an int32 ``[B]`` of each
row's longest segment, so selecting, splitting and joining rows keeps them
right; :func:`row_columns` turns them into the contract's shapes
(``TokenWindows.collate``, which the Loader calls).

Thread-safe (pure functions). Cost: O(B * seq_len).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from zerobatch._column_hints import COLUMN_HINTS, missing_column
from zerobatch._jit import njit
from zerobatch.columnar import Jagged

__all__ = ["COLUMN_HINTS", "IGNORE_INDEX", "LABEL_MODES", "OUTPUTS", "Columns",
           "flat_cu_seqlens", "missing_column", "row_columns", "segment_layout",
           "static_cu_seqlens", "to_output", "varlen_columns"]

IGNORE_INDEX = -100
"""The label of a token that takes no loss (PyTorch's ``CrossEntropyLoss`` default)."""

LABEL_MODES = ("shifted", "aligned")
OUTPUTS = ("numpy", "torch", "jax")


@njit(cache=True, nogil=True)
def _columns(input_ids: np.ndarray, seg_values: np.ndarray, seg_offsets: np.ndarray,
             loss_mask: np.ndarray, has_mask: bool, mode: int, jax: bool,
             attention: bool, labels: np.ndarray, position_ids: np.ndarray,
             seq_idx: np.ndarray, segment_ids: np.ndarray, attention_mask: np.ndarray,
             cu: np.ndarray) -> tuple[int, int, int]:
    """Fill the per-token columns, ``cu`` (room for ``rows * (seq_len + 1) + 1``
    boundaries) and the labels in one pass over each row (``mode``: 0 no
    labels, 1 shifted, 2 aligned); ``segment_ids`` only with ``jax``,
    ``attention_mask`` only with ``attention``. Returns (segments, max_seqlen,
    bad row or -1)."""
    rows, seq_len = input_ids.shape
    s = 0
    longest = 0
    cu[0] = 0
    for b in range(rows):
        base = b * seq_len
        at = 0
        local = 1
        for j in range(seg_offsets[b], seg_offsets[b + 1]):
            n = seg_values[j]
            if n < 1 or at + n > seq_len:
                return s, longest, b
            for i in range(n):
                t = at + i
                position_ids[b, t] = i
                seq_idx[b, t] = s
                if jax:
                    segment_ids[b, t] = local
                if attention:
                    attention_mask[b, t] = 1
                if mode == 1:
                    value = -100
                    if i + 1 < n and (not has_mask or loss_mask[b, t + 1] != 0):
                        value = input_ids[b, t + 1]
                    labels[b, t] = value
                elif mode == 2:
                    value = -100
                    if i != 0 and (not has_mask or loss_mask[b, t] != 0):
                        value = input_ids[b, t]
                    labels[b, t] = value
            at += n
            s += 1
            local += 1
            cu[s] = base + at
            if n > longest:
                longest = n
        if at < seq_len:  # the padding tail: a segment of its own
            for i in range(seq_len - at):
                t = at + i
                position_ids[b, t] = i
                seq_idx[b, t] = s
                if jax:
                    segment_ids[b, t] = 0
                if attention:
                    attention_mask[b, t] = 0
                if mode != 0:
                    labels[b, t] = -100
            if seq_len - at > longest:
                longest = seq_len - at
            s += 1
            cu[s] = base + seq_len
    return s, longest, -1


def _as_jagged(seqlens: Any, rows: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(values, offsets) of ``seqlens``: a Jagged, a (values, offsets) pair or a
    list of per-row sequences."""
    if isinstance(seqlens, Jagged):
        values, offsets = seqlens.values, seqlens.offsets
    elif (isinstance(seqlens, tuple) and len(seqlens) == 2
          and isinstance(seqlens[0], np.ndarray)):
        values, offsets = seqlens
    else:
        per_row = [np.asarray(r, dtype=np.int64).reshape(-1) for r in seqlens]
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in per_row])])
        values = np.concatenate(per_row) if per_row else np.zeros(0, np.int64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets.shape != (rows + 1,):
        raise ValueError(f"seqlens has {offsets.shape[0] - 1} rows, input_ids has {rows}")
    return np.ascontiguousarray(values, dtype=np.int64), offsets


def segment_layout(seqlens: Any, rows: int, seq_len: int) -> dict[str, Any]:
    """The layout columns of ``rows`` rows of ``seq_len`` tokens whose segments
    have lengths ``seqlens`` (per row; a ``Jagged``, ``(values, offsets)`` or a
    list of lists): ``position_ids``, ``seq_idx``, ``segment_ids`` (JAX's,
    int32), ``cu_seqlens`` (int32, flat), ``max_seqlen`` (int) and ``used``
    (int64 ``[B]``: tokens before each row's padding). ValueError names a row
    whose segments are empty or overflow ``seq_len``."""
    values, offsets = _as_jagged(seqlens, rows)
    position_ids = np.empty((rows, seq_len), np.int32)
    seq_idx = np.empty((rows, seq_len), np.int32)
    segment_ids = np.empty((rows, seq_len), np.int32)
    cu = np.empty(values.shape[0] + rows + 1, np.int32)
    unused = np.zeros((0, 0), np.int64)  # mode 0 reads no tokens and writes no labels
    count, longest, bad = _columns(np.zeros((rows, seq_len), np.int64), values, offsets,
                                   np.zeros((0, 0), np.uint8), False, 0, True, False, unused,
                                   position_ids, seq_idx, segment_ids, unused, cu)
    if bad >= 0:
        lengths = values[offsets[bad]:offsets[bad + 1]].tolist()
        raise ValueError(f"row {bad}'s segment lengths {lengths} must each be >= 1 and sum "
                         f"to at most seq_len={seq_len}")
    if rows * seq_len >= 2**31:
        raise ValueError(f"{rows} rows of {seq_len} tokens overflow int32 cu_seqlens")
    used = np.add.reduceat(np.append(values, 0), offsets[:-1]) if rows else np.zeros(0)
    used[offsets[:-1] == offsets[1:]] = 0  # rows of no segment: reduceat gives the next value
    return {"position_ids": position_ids, "seq_idx": seq_idx, "segment_ids": segment_ids,
            "cu_seqlens": cu[:count + 1], "max_seqlen": int(longest),
            "used": used.astype(np.int64)}


def varlen_columns(
    input_ids: Any, seqlens: Any, *, labels: Literal["shifted", "aligned"] | None = "shifted",
    loss_mask: Any = None, attention_mask: bool = False, cu_seqlens_size: int | None = None,
    jax: bool = True,
) -> dict[str, Any]:
    """The varlen contract (module docstring) of ``input_ids`` (``[B, seq_len]``)
    whose rows hold segments of lengths ``seqlens``, as NumPy arrays (and the
    host int ``max_seqlen``). ``labels=None`` computes no labels; ``loss_mask``
    (``[B, seq_len]``, nonzero = take the loss) masks them. Also returns
    ``segment_ids`` and ``positions`` (JAX's names; ``jax=False`` skips
    them) -- drop what you do not use, or convert with :func:`to_output`."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, seq_len], got shape {ids.shape}")
    if labels is not None and labels not in LABEL_MODES:
        raise ValueError(f"labels must be one of {LABEL_MODES} or None, got {labels!r}")
    rows, seq_len = ids.shape
    values, offsets = _as_jagged(seqlens, rows)
    mask = np.zeros((0, 0), np.uint8) if loss_mask is None else np.asarray(loss_mask)
    if labels is not None and loss_mask is not None and mask.shape != ids.shape:
        raise ValueError(f"loss_mask has shape {mask.shape}, input_ids {ids.shape}")
    if cu_seqlens_size is not None and (isinstance(cu_seqlens_size, bool)
                                        or not isinstance(cu_seqlens_size, int)):
        raise TypeError(f"cu_seqlens_size must be an int, got {cu_seqlens_size!r}")
    # labels int64; one buffer for the int32 planes (position_ids, seq_idx, segment_ids).
    wide = np.empty((1, rows, seq_len), np.int64)
    narrow = np.empty((3 if jax else 2, rows, seq_len), np.int32)
    attention = (np.empty((rows, seq_len), np.int64) if attention_mask
                 else np.zeros((0, 0), np.int64))
    cu = np.empty(values.shape[0] + rows + 1, np.int32)
    mode = 0 if labels is None else 1 if labels == "shifted" else 2
    count, longest, bad = _columns(ids, values, offsets, mask, loss_mask is not None, mode,
                                   jax, attention_mask, wide[0], narrow[0], narrow[1],
                                   narrow[-1], attention, cu)
    if bad >= 0:
        lengths = values[offsets[bad]:offsets[bad + 1]].tolist()
        raise ValueError(f"row {bad}'s segment lengths {lengths} must each be >= 1 and sum "
                         f"to at most seq_len={seq_len}")
    if rows * seq_len >= 2**31:
        raise ValueError(f"{rows} rows of {seq_len} tokens overflow int32 cu_seqlens")
    cu = cu[:count + 1]
    if cu_seqlens_size is not None:
        cu = static_cu_seqlens(cu, cu_seqlens_size)
    out: dict[str, Any] = {"input_ids": ids}
    if labels is not None:
        out["labels"] = wide[0]
    out["position_ids"] = narrow[0]
    out["cu_seqlens"] = cu
    out["max_seqlen"] = int(longest)
    out["seq_idx"] = narrow[1]
    if jax:
        out["segment_ids"] = narrow[2]
        out["positions"] = narrow[0]
    if attention_mask:
        out["attention_mask"] = attention
    return out

def static_cu_seqlens(cu: npt.NDArray[np.int32], size: int) -> npt.NDArray[np.int32]:
    """``cu`` padded to the static length ``size`` by repeating its last value
    (empty segments); ValueError when it has more than ``size - 1`` segments."""
    if cu.shape[0] > size:
        raise ValueError(f"the batch has {cu.shape[0] - 1} segments, more than "
                         f"cu_seqlens_size={size} allows ({size - 1}); "
                         "raise cu_seqlens_size (at most batch_size * seq_len + 1)")
    padded = np.full(size, cu[-1], np.int32)
    padded[:cu.shape[0]] = cu
    return padded


_JAX_ONLY = ("segment_ids", "positions")
_NOT_JAX = ("position_ids", "cu_seqlens", "max_seqlen", "seq_idx")


def to_output(columns: Mapping[str, Any], output: str,
              keep: Sequence[str] | None = None) -> dict[str, Any]:
    """``columns`` (NumPy, from :func:`varlen_columns`, plus any other columns)
    for ``output``: ``"numpy"`` and ``"torch"`` (tensors sharing memory;
    ``max_seqlen`` stays a host int) drop JAX's ``segment_ids``/``positions``;
    ``"jax"`` keeps only those and the token columns (NumPy, for ``jax.device_put``).
    ``keep`` names extra columns to keep whatever the output."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    drop = _NOT_JAX if output == "jax" else _JAX_ONLY
    kept = set(keep or ())
    out = {name: value for name, value in columns.items() if name not in drop or name in kept}
    if output == "torch":
        import torch

        out = {name: torch.from_numpy(np.ascontiguousarray(value))
               if isinstance(value, np.ndarray) else value for name, value in out.items()}
    return out


class Columns(dict[str, Any]):
    """The dict a Loader yields (torch and numpy outputs): a plain ``dict`` whose
    missing key raises a ``KeyError`` naming the argument that adds it."""

    __slots__ = ()

    def __missing__(self, name: str) -> Any:
        raise KeyError(missing_column(name, self.keys()))


@njit(nogil=True, cache=True)
def _flatten(values: np.ndarray, offsets: np.ndarray, seq_len: int) -> np.ndarray:
    rows = offsets.shape[0] - 1
    flat = np.empty(offsets[rows] - offsets[0] - rows + 1, np.int32)
    q = 0
    for b in range(rows):
        base = b * seq_len
        for i in range(offsets[b], offsets[b + 1] - 1):  # the row's segment starts
            flat[q] = base + values[i]
            q += 1
    flat[q] = rows * seq_len
    return flat


def flat_cu_seqlens(
    rows: Jagged, seq_len: int | None = None
) -> npt.NDArray[np.int32]:
    """One int32 ``cu_seqlens`` over the flattened batch from per-row ones (each
    row: its segment starts, then ``seq_len``; ``seq_len`` defaults to the first
    row's last value). Cost: O(segments), one small allocation."""
    if len(rows) == 0:
        return np.zeros(1, np.int32)
    if seq_len is None:
        seq_len = int(rows.values[rows.offsets[1] - 1])
    return _flatten(rows.values, rows.offsets, seq_len)


def row_columns(columns: Mapping[str, Any]) -> Columns:
    """A window batch's columns (``Batch.to_numpy``) in the contract's shapes:
    per-row ``cu_seqlens`` flattened (``flat_cu_seqlens``), per-row
    ``max_seqlen`` one host int; every other column shared. Cost: O(columns +
    segments)."""
    columns = Columns(columns)
    rows = columns.get("cu_seqlens")
    if isinstance(rows, Jagged):
        inputs = columns.get("input_ids")
        seq_len = inputs.shape[1] if isinstance(inputs, np.ndarray) and inputs.ndim == 2 else None
        columns["cu_seqlens"] = flat_cu_seqlens(rows, seq_len)
    longest = columns.get("max_seqlen")
    if isinstance(longest, np.ndarray) and longest.ndim == 1:
        columns["max_seqlen"] = int(longest.max()) if longest.shape[0] else 0
    return columns
