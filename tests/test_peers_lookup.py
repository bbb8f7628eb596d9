"""peers._lookup: searches and gathers in sorted tables inside files, mapped
locally and by block ranges over object storage, equal to NumPy's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch.peers._lookup import Column, Lookup
from zerobatch.storage import LocalStorage


class _Blocks:
    """A block cache's interface over bytes in memory, counting the blocks read."""

    def __init__(self, files: dict[str, bytes], block_size: int) -> None:
        self.files, self.block_size, self.blocks = files, block_size, set()

    def read(self, requests):
        out = []
        for name, start, end in requests:
            assert 0 <= start <= end <= len(self.files[name])
            self.blocks.update((name, b) for b in range(start // self.block_size,
                                                        -(-end // self.block_size)))
            out.append(np.frombuffer(self.files[name][start:end], np.uint8))
        return out


class _Remote:
    def __init__(self, blocks: _Blocks) -> None:
        self.blocks = blocks


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 2_000), min_size=1, max_size=3_000),
       queries=st.lists(st.integers(-5, 2_100), min_size=1, max_size=40),
       dtype=st.sampled_from(["<u4", "<u8", "<i8", "<i4"]),
       head=st.integers(0, 9), block=st.sampled_from([8, 64, 1024, 16_384]))
def test_search_and_take_equal_numpy(values, queries, dtype, head, block):
    table = np.sort(np.array(values, dtype))
    raw = b"\x01" * head + table.tobytes() + b"\x02" * 3
    column = Column("t", head, table.shape[0], np.dtype(dtype), int(table[0]), int(table[-1]))
    blocks = _Blocks({"t": raw}, block)
    remote = Lookup(_Remote(blocks))  # type: ignore[arg-type]  # only .blocks is used
    asked = np.clip(np.array(queries), 0 if dtype[1] == "u" else -5, None)
    want = np.searchsorted(table, asked.astype(dtype), side="right")
    np.testing.assert_array_equal(remote.search(column, asked), want)
    positions = np.array(queries, np.int64) % table.shape[0]
    np.testing.assert_array_equal(remote.take(column, positions), table[positions])
    assert remote.ranged


def test_local_search_maps_once(tmp_path):
    table = np.cumsum(np.random.default_rng(0).integers(0, 5, 10_000)).astype("<u8")
    (tmp_path / "t").write_bytes(b"head" + table.tobytes())
    lookup = Lookup(LocalStorage(tmp_path))
    column = Column("t", 4, table.shape[0], np.dtype("<u8"), 0, int(table[-1]))
    asked = np.array([0, 7, int(table[-1]), int(table[-1]) + 1, int(table[5000])])
    np.testing.assert_array_equal(lookup.search(column, asked),
                                  np.searchsorted(table, asked.astype("<u8"), side="right"))
    np.testing.assert_array_equal(lookup.take(column, np.array([0, 9_999, 17])),
                                  table[[0, 9_999, 17]])
    assert not lookup.ranged


def test_ranged_search_reads_few_blocks():
    """Interpolation finds entries of an evenly growing table in a block or two
    each, not a bisection's log2(blocks)."""
    table = np.arange(0, 8 * 1_000_000, 8, dtype="<u8")  # 8 MB, 2,000 blocks of 4 KiB
    blocks = _Blocks({"t": table.tobytes()}, 4096)
    remote = Lookup(_Remote(blocks))  # type: ignore[arg-type]
    column = Column("t", 0, table.shape[0], np.dtype("<u8"), 0, int(table[-1]))
    asked = np.random.default_rng(1).integers(0, int(table[-1]), 32)
    np.testing.assert_array_equal(remote.search(column, asked),
                                  np.searchsorted(table, asked.astype("<u8"), side="right"))
    assert len(blocks.blocks) <= 2 * 32
