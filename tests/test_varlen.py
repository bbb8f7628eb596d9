"""The varlen contract (zerobatch.varlen) against a plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch.varlen import IGNORE_INDEX, segment_layout, to_output, varlen_columns


@st.composite
def _rows(draw: st.DrawFn) -> tuple[int, list[list[int]]]:
    seq_len = draw(st.integers(1, 12))
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        left, row = seq_len, []
        while left and draw(st.booleans()):
            n = draw(st.integers(1, left))
            row.append(n)
            left -= n
        rows.append(row)
    return seq_len, rows


@settings(max_examples=150, deadline=None)
@given(_rows(), st.sampled_from(["shifted", "aligned"]), st.booleans(), st.integers(0, 2**32))
def test_matches_reference(layout: tuple[int, list[list[int]]], mode: str, masked: bool,
                           seed: int) -> None:
    seq_len, seqlens = layout
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 1000, (len(seqlens), seq_len))
    mask = rng.integers(0, 2, ids.shape) if masked else None
    cols = varlen_columns(ids, seqlens, labels=mode, loss_mask=mask,  # type: ignore[arg-type]
                          attention_mask=True)
    cu, seg, pos, labels = [0], [], [], []
    for b, row in enumerate(seqlens):
        pieces = row + ([seq_len - sum(row)] if sum(row) < seq_len else [])
        at = 0
        for k, n in enumerate(pieces):
            padding = k == len(row)
            for i in range(n):
                seg.append(len(cu) - 1)
                pos.append(i)
                t = at + i
                if padding:
                    labels.append(IGNORE_INDEX)
                elif mode == "aligned":
                    ok = i > 0 and (mask is None or mask[b, t])
                    labels.append(int(ids[b, t]) if ok else IGNORE_INDEX)
                else:
                    ok = i + 1 < n and (mask is None or mask[b, t + 1])
                    labels.append(int(ids[b, t + 1]) if ok else IGNORE_INDEX)
            at += n
            cu.append(cu[-1] + n)
    assert cols["cu_seqlens"].dtype == np.int32
    assert cols["cu_seqlens"].tolist() == cu
    assert cols["seq_idx"].reshape(-1).tolist() == seg
    assert cols["position_ids"].reshape(-1).tolist() == pos
    assert cols["labels"].reshape(-1).tolist() == labels
    assert cols["max_seqlen"] == max(np.diff(cu)) and isinstance(cols["max_seqlen"], int)
    used = [sum(r) for r in seqlens]
    assert cols["attention_mask"].sum(1).tolist() == used
    assert ((cols["segment_ids"] == 0).sum(1) == seq_len - np.array(used)).all()


def test_fixed_shape_cu_seqlens() -> None:
    cols = varlen_columns(np.ones((2, 4), np.int64), [[2, 2], [1]], cu_seqlens_size=8)
    assert cols["cu_seqlens"].tolist() == [0, 2, 4, 5, 8, 8, 8, 8]
    with pytest.raises(ValueError, match="cu_seqlens_size=3"):
        varlen_columns(np.ones((2, 4), np.int64), [[2, 2], [1]], cu_seqlens_size=3)


def test_bad_layouts() -> None:
    with pytest.raises(ValueError, match="row 0"):
        varlen_columns(np.ones((1, 4), np.int64), [[3, 2]])
    with pytest.raises(ValueError, match="row 1"):
        varlen_columns(np.ones((2, 4), np.int64), [[1], [0]])
    with pytest.raises(ValueError, match="labels must be"):
        varlen_columns(np.ones((1, 4), np.int64), [[1]], labels="left")  # type: ignore[arg-type]


def test_outputs() -> None:
    cols = varlen_columns(np.ones((1, 4), np.int64), [[4]])
    torch_cols = to_output(cols, "torch")
    assert "segment_ids" not in torch_cols and isinstance(torch_cols["max_seqlen"], int)
    assert str(torch_cols["cu_seqlens"].dtype) == "torch.int32"
    jax_cols = to_output(cols, "jax")
    assert set(jax_cols) == {"input_ids", "labels", "segment_ids", "positions"}


@given(st.lists(st.lists(st.integers(1, 5), max_size=4), min_size=0, max_size=5))
@settings(max_examples=60, deadline=None)
def test_segment_layout_is_the_contracts_layout(rows: list[list[int]]) -> None:
    seq_len = 20
    layout = segment_layout(rows, len(rows), seq_len)
    ids = np.zeros((len(rows), seq_len), np.int64)
    full = varlen_columns(ids, rows, labels=None)
    for name in ("position_ids", "seq_idx", "segment_ids", "cu_seqlens"):
        np.testing.assert_array_equal(layout[name], full[name])
    assert layout["max_seqlen"] == full["max_seqlen"]
    assert layout["used"].tolist() == [sum(row) for row in rows]
    with pytest.raises(ValueError, match="row 0"):
        segment_layout([[seq_len + 1]], 1, seq_len)
