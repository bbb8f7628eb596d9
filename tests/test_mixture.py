"""Mixture: the pure order (hypothesis), resumes with changed weights, the Loader,
the torch adapter, output="jax", a SIGKILL-and-resume run and bad input."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerobatch import Batch, Jagged, Loader, Mixture, StreamWriter, open_dataset
from zerobatch.mixture import MixtureOrder, Stage
from zerobatch.mixture.order import pass_order
from zerobatch.plan import Plan

from support.resumed_loops import (  # isort: skip
    AFTER, BEFORE, CHANGE_FROM, kill_and_resume, mixture_loop, windows_mixture)

ALL = ("weights", "sources", "length")


class Tagged:
    """Observation ``i`` of source ``tag``: columns ``tag``, ``index`` and a
    jagged ``items`` (``i % 3 + 1`` copies of ``i``)."""

    def __init__(self, n: int, tag: int) -> None:
        self.n, self.tag = n, tag

    def __len__(self) -> int:
        return self.n

    def read(self, indices: Any) -> Batch:
        idx = np.asarray(indices, dtype=np.int64)
        assert idx.size == 0 or (idx.min() >= 0 and idx.max() < self.n)
        lengths = idx % 3 + 1
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return Batch.from_columns({"tag": np.full(idx.shape[0], self.tag), "index": idx,
                                   "items": Jagged(np.repeat(idx, lengths), offsets)})


def _sources(lengths: list[int]) -> dict[str, Tagged]:
    return {f"s{i}": Tagged(n, i) for i, n in enumerate(lengths)}


def _own_order(order: MixtureOrder, s: int, slots: np.ndarray) -> np.ndarray:
    """Source ``s``'s observations at ``slots``, straight from its per-pass Feistel."""
    n = int(order.lengths[s])
    return np.array([pass_order(n, order.keys[s], j // n)(j % n) for j in slots.tolist()],
                    dtype=np.int64)


def _check_sources(order: MixtureOrder, positions: np.ndarray) -> None:
    """Each source's observations at ``positions`` (all positions from 0, in
    order) are its slots 0, 1, 2, ... read through its own order."""
    sources, passes, index = order.observations(positions)
    for s in np.unique(sources).tolist():
        got = index[sources == s]
        np.testing.assert_array_equal(got, _own_order(order, s, np.arange(got.shape[0])))
        n = int(order.lengths[s])
        for p in range(got.shape[0] // n):  # whole passes hold every observation once
            assert sorted(got[p * n:(p + 1) * n].tolist()) == list(range(n))
        assert (passes[sources == s] == np.arange(got.shape[0]) // n).all()


weights_st = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def mixtures(draw: Any, max_sources: int = 50) -> tuple[list[int], list[Stage], int]:
    count = draw(st.integers(1, max_sources))
    lengths = draw(st.lists(st.integers(1, 10_000), min_size=count, max_size=count))
    block = draw(st.sampled_from([1, 2, 3, 7, 16, 64, 100, 256, 1024]))
    stages, start = [], 0
    for _ in range(draw(st.integers(1, 3))):
        chosen = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count,
                               unique=True))
        stages.append(Stage(start, {f"s{i}": draw(weights_st) for i in chosen},
                            draw(st.sampled_from([block, block + 1]))))
        start += draw(st.integers(1, 3000))
    return lengths, stages, draw(st.integers(0, 2**64 - 1))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixtures())
def test_blocks_hold_their_counts_and_sources_their_own_order(case: Any) -> None:
    lengths, stages, seed = case
    names = [f"s{i}" for i in range(len(lengths))]
    order = MixtureOrder(names, lengths, stages, seed=seed)
    end = stages[-1].start + 3 * stages[-1].block_size
    positions = np.arange(end, dtype=np.int64)
    sources, _ = order.locate(positions)
    for t, stage in enumerate(stages):
        stop = stages[t + 1].start if t + 1 < len(stages) else end
        weights = np.array([stage.weights.get(n, 0.0) for n in names])
        quota = stage.block_size * weights / weights.sum()
        for b in range((stop - stage.start) // stage.block_size):
            counts = order.block_counts(t, b)
            lo = stage.start + b * stage.block_size
            seen = np.bincount(sources[lo:lo + stage.block_size], minlength=len(names))
            np.testing.assert_array_equal(seen, counts)
            assert counts.sum() == stage.block_size
            assert ((counts == np.floor(quota)) | (counts == np.ceil(quota))
                    | np.isclose(counts, quota)).all()
    _check_sources(order, positions)
    # the slots before any position are the counts of the positions before it
    cut = int(np.random.default_rng(seed % 2**32).integers(0, end + 1))
    np.testing.assert_array_equal(order.slots_before(cut),
                                  np.bincount(sources[:cut], minlength=len(names)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixtures(max_sources=12), st.integers(1, 64), st.data())
def test_union_over_ranks_is_the_single_process_sequence(case: Any, world_size: int,
                                                         data: Any) -> None:
    lengths, stages, seed = case
    mix = Mixture(_sources(lengths), [(s.start, s.weights) for s in stages], seed=seed,
                  length=stages[-1].start + 2_000, block_size=stages[0].block_size)
    batch_size = data.draw(st.integers(1, 16))
    plan = Plan(len(mix), batch_size, world_size=world_size, shuffle=False)
    whole = mix.read(np.arange(len(mix)))
    for consumed in (0, plan.step_size * (plan.steps(0) // 2)):
        if plan.steps(consumed) == 0:
            continue
        rows = {}
        for rank in range(world_size):
            indices, _ = plan.indices(0, consumed, rank)
            batch = mix.read(indices)
            for position, tag, index in zip(indices.tolist(), batch["tag"].tolist(),
                                            batch["index"].tolist(), strict=True):
                rows[position] = (tag, index)
        assert sorted(rows) == list(range(consumed, consumed + plan.step_size))
        for position, pair in rows.items():
            assert pair == (int(whole["tag"][position]), int(whole["index"][position]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 30), st.data())
def test_resumes_with_changed_weights_never_repeat_or_skip(count: int, data: Any) -> None:
    lengths = data.draw(st.lists(st.integers(1, 300), min_size=count, max_size=count))
    seed = data.draw(st.integers(0, 2**32))
    sources = _sources(lengths)

    def draw_mixture() -> Mixture:
        chosen = data.draw(st.lists(st.sampled_from(sorted(sources)), min_size=1,
                                    max_size=count, unique=True))
        return Mixture({n: sources[n] for n in chosen},
                       {n: data.draw(weights_st) for n in chosen}, seed=seed, length=50_000,
                       block_size=data.draw(st.sampled_from([1, 5, 64, 256])))

    mix, consumed, log = draw_mixture(), 0, []
    for _ in range(data.draw(st.integers(1, 4))):
        # read some steps of some batch size and world size, then resume changed
        plan = Plan(len(mix), data.draw(st.integers(1, 32)),
                    world_size=data.draw(st.integers(1, 8)), shuffle=False)
        steps = data.draw(st.integers(0, 20))
        stop = consumed + steps * plan.step_size
        batch = mix.read(np.arange(consumed, stop))
        log.extend(zip(batch["source"].tolist(), batch["index"].tolist(), strict=True))
        state = {"epoch": 0, "consumed": stop}
        before = mix
        mix = draw_mixture().resumed(before.state_dict(), epoch=0, consumed=stop, allow=ALL)
        # the past is kept: the resumed mixture places the positions before the cut alike
        for a, b in zip(mix.order.locate(np.arange(stop)), before.order.locate(np.arange(stop)),
                        strict=True):
            np.testing.assert_array_equal(a, b)
        consumed = state["consumed"]
    order = mix.order
    for s in range(len(order.names)):
        got = np.array([i for src, i in log if src == s], dtype=np.int64)
        np.testing.assert_array_equal(got, _own_order(order, s, np.arange(got.shape[0])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixtures(max_sources=20), st.data())
def test_the_row_kernels_equal_the_pure_order(case: Any, data: Any) -> None:
    """``observe`` (one kernel for a step's positions, the per-row Feistel of
    ``pass_indices`` otherwise) gives what ``observations`` gives."""
    lengths, stages, seed = case
    lengths = [data.draw(st.sampled_from([n, 1, 2**40 + n, 2**62 + n])) for n in lengths]
    order = MixtureOrder([f"s{i}" for i in range(len(lengths))], lengths, stages, seed=seed)
    first = data.draw(st.integers(0, stages[-1].start + 5_000))
    width = data.draw(st.integers(1, 3 * max(s.block_size for s in stages) + 2))
    for positions in (np.arange(first, first + width, dtype=np.int64),
                      np.array(data.draw(st.lists(st.integers(0, 10**6), max_size=20)),
                               dtype=np.int64)):
        sources, _, index = order.observations(positions)
        got_sources, got_index, over = order.observe(positions, order.table())
        assert over == -1
        np.testing.assert_array_equal(got_sources, sources)
        np.testing.assert_array_equal(got_index, index)
    table = order.table([1] * len(lengths))  # one pass each: the first row past it is named
    positions = np.arange(first, first + width, dtype=np.int64)
    sources, passes, _ = order.observations(positions)
    late = np.flatnonzero(passes >= 1)
    assert order.observe(positions, table)[2] == (int(late[0]) if late.size else -1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixtures(max_sources=8), st.data())
def test_step_blocks_kept_between_calls_answer_as_fresh(case: Any, data: Any) -> None:
    """One order asked for many steps in a row (``step_blocks`` keeps its last
    answer and the ranges it holds for): each answer equals the pure order,
    across block and stage boundaries, with steps that go back, jump, shrink,
    end past the order's ``stop`` or start below 0."""
    lengths, stages, seed = case
    order = MixtureOrder([f"s{i}" for i in range(len(lengths))], lengths, stages, seed=seed)
    table = order.table()
    stops = [stages[-1].start + data.draw(st.integers(1, 4_000)) for _ in range(2)]
    widest = 2 * max(s.block_size for s in stages) + 1
    at = data.draw(st.integers(0, max(stops) - 1))
    for _ in range(data.draw(st.integers(2, 12))):
        stop = data.draw(st.sampled_from(stops))
        at = max(0, min(stop - 1, at + data.draw(st.integers(-300, 300))))
        positions = np.arange(at, min(stop, at + data.draw(st.integers(1, widest))),
                              dtype=np.int64)
        last = data.draw(st.sampled_from(["kept", "anywhere", "just before"]))
        if last == "anywhere":  # steps need not ascend
            positions[-1] = data.draw(st.integers(0, stop - 1))
        elif last == "just before":  # (the end of the block or stage before)
            positions[-1] = max(0, at - data.draw(st.integers(1, widest)))
        sources, _, index = order.observations(positions)
        got_sources, got_index, over = order.observe(positions, table, stop)
        assert over == -1
        np.testing.assert_array_equal(got_sources, sources)
        np.testing.assert_array_equal(got_index, index)
        kept = order.step_blocks(positions, stop)
        fresh = MixtureOrder(order.names, order.lengths, stages, seed=seed).step_blocks(
            positions, stop)
        assert (kept is None) == (fresh is None)
        if kept is not None:
            assert kept[1:5] == fresh[1:5]
            for at in (5, 8):  # each block's layout, then its passes and round keys
                np.testing.assert_array_equal(kept[at], fresh[at])
                present = np.unique(kept[at][0])  # (the rows of other sources are unset)
                for table_at in (at + 1, at + 2):
                    np.testing.assert_array_equal(kept[table_at][present],
                                                  fresh[table_at][present])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixtures(max_sources=8), st.data())
def test_steps_read_from_a_blocks_run_equal_the_pure_order(case: Any, data: Any) -> None:
    """A mixture's reads of steps (evenly spaced positions, a rank's: their
    block's run observed once and kept, ``Mixture._step_run``) and of
    positions that only look like one, in any order: each row is what the
    pure order places there; a bounded mixture's last steps read, and reads
    past its end raise."""
    lengths, stages, seed = case
    sources = _sources([min(n, 300) for n in lengths])
    length = stages[-1].start + data.draw(st.integers(1, 3_000))
    mixture = Mixture(sources, [(s.start, s.weights) for s in stages], seed=seed % 2**63,
                      length=length, block_size=stages[0].block_size)
    order = mixture.order
    for _ in range(data.draw(st.integers(1, 10))):
        stride = data.draw(st.integers(1, 9))
        count = data.draw(st.integers(1, 80))
        first = data.draw(st.integers(0, length - 1))
        positions = np.arange(first, first + stride * count, stride, dtype=np.int64)
        positions = positions[positions < length]
        shape = data.draw(st.sampled_from(["step", "one changed", "reversed"]))
        if shape == "one changed" and positions.shape[0] > 2:
            positions[data.draw(st.integers(1, positions.shape[0] - 2))] = data.draw(
                st.integers(0, length - 1))
        elif shape == "reversed":
            positions = positions[::-1].copy()
        expected_sources, _, expected_index = order.observations(positions)
        batch = mixture.read(positions)
        assert batch["source"].tolist() == expected_sources.tolist()
        assert batch["index"].tolist() == expected_index.tolist()
    bounded = Mixture(sources, [(s.start, s.weights) for s in stages], seed=seed % 2**63,
                      max_passes=1, block_size=stages[0].block_size)
    stop = len(bounded)
    with pytest.raises(IndexError):
        bounded.read(np.arange(stop - 1, stop + 40, dtype=np.int64))
    tail = np.arange(max(0, stop - 40), stop, dtype=np.int64)
    assert bounded.read(tail)["index"].tolist() == order.observations(tail)[2].tolist()


def test_positions_out_of_order_past_the_step_blocks():
    """Positions that do not ascend: the first and the last in one block, one
    between them in the next. The step kernels had read it from the first
    block's layout (found by hypothesis: observation 0 twice)."""
    order = MixtureOrder(["a", "b"], [2, 1], [Stage(0, {"a": 1.0}, block_size=1)], seed=0)
    positions = np.array([0, 1, 0], dtype=np.int64)
    sources, _, index = order.observations(positions)
    got_sources, got_index, over = order.observe(positions, order.table())
    assert over == -1 and index.tolist() == [0, 1, 0]
    assert got_sources.tolist() == sources.tolist() and got_index.tolist() == [0, 1, 0]
    mixture = Mixture(_sources([2, 1]), {"s0": 1.0}, length=4, block_size=1)
    assert mixture.read(positions)["index"].tolist() == [0, 1, 0]


def test_large_sizes_map_to_in_range_distinct_observations() -> None:
    rng = np.random.default_rng(5)
    count = 10_000
    lengths = rng.integers(1, 10**12, size=count, endpoint=True)
    lengths[:10] = [1, 2, 3, 10**12, 10**12 - 1, 7, 2**40, 5, 1, 999]
    names = [f"source-{i}" for i in range(count)]
    weights = dict(zip(names, rng.random(count) + 1e-3, strict=True))
    order = MixtureOrder(names, lengths.tolist(), [Stage(0, weights, 1024)], seed=3)
    positions = 10**15 + np.arange(4096, dtype=np.int64)
    sources, passes, index = order.observations(positions)
    assert (index >= 0).all() and (index < lengths[sources]).all()
    triples = set(zip(sources.tolist(), passes.tolist(), index.tolist(), strict=True))
    assert len(triples) == positions.shape[0]
    # a source seen in both blocks continues its slots
    slots = order.locate(positions)[1]
    for s in np.unique(sources)[:50].tolist():
        mine = slots[sources == s]
        assert (np.diff(mine) == 1).all()
        assert mine[0] == order.slots_before(int(positions[sources == s][0]))[s]
    # the long-run share is the weight: 10**15 positions in (931 periods of 2**30
    # blocks), every source within the rounding of its leftovers, < 1 slot a period
    before = order.slots_before(10**15)
    share = np.array(list(weights.values()))
    expected = 10**15 * share / share.sum()
    assert np.abs(before - expected).max() < 1_000
    assert before.sum() == 10**15


def test_weight_changes_keep_each_source_in_its_pass() -> None:
    sources = _sources([40, 25, 9, 60])
    mix = Mixture({n: sources[n] for n in ("s0", "s1", "s2")},
                  {"s0": 1.0, "s1": 2.0, "s2": 0.5}, seed=9, length=5_000, block_size=16)
    first = mix.read(np.arange(203))
    changed = Mixture({n: sources[n] for n in ("s0", "s1", "s3")},
                      {"s0": 5.0, "s1": 0.25, "s3": 1.0}, seed=9, length=5_000, block_size=16)
    with pytest.raises(ValueError, match=r"weights.*sources|sources.*weights") as error:
        changed.resumed(mix.state_dict(), epoch=0, consumed=203)
    assert "allow=" in str(error.value) and "'s2' 0.1429 -> 0" in str(error.value)
    with pytest.raises(ValueError, match="sources"):
        changed.resumed(mix.state_dict(), epoch=0, consumed=203, allow={"weights"})
    resumed = changed.resumed(mix.state_dict(), epoch=0, consumed=203,
                              allow={"weights", "sources"})
    assert [s.start for s in resumed.stages] == [0, 203]
    assert resumed.names == ("s0", "s1", "s2", "s3")
    later = resumed.read(np.arange(203, 2_000))
    log = list(zip(first["source"].tolist(), first["index"].tolist(), strict=True))
    log += zip(later["source"].tolist(), later["index"].tolist(), strict=True)
    for s in range(4):
        got = np.array([i for src, i in log if src == s])
        np.testing.assert_array_equal(got, _own_order(resumed.order, s, np.arange(len(got))))
    assert 2 not in later["source"].tolist()  # removed: never read after the cut
    # a fresh mixture with the final weights resumes the changed run unchanged
    state = resumed.state_dict()
    again = Mixture({n: sources[n] for n in ("s0", "s1", "s3")},
                    {"s3": 1.0, "s0": 5.0, "s1": 0.25}, seed=9, length=5_000, block_size=16)
    same = again.resumed(state, epoch=0, consumed=900)
    assert same.fingerprint == resumed.fingerprint
    np.testing.assert_array_equal(same.read(np.arange(900, 1_200))["index"],
                                  resumed.read(np.arange(900, 1_200))["index"])
    # a schedule is data: the same weights as stages give the same order
    scheduled = Mixture({n: sources[n] for n in ("s0", "s1", "s2", "s3")},
                        [(0, {"s0": 1.0, "s1": 2.0, "s2": 0.5}),
                         (203, {"s0": 5.0, "s1": 0.25, "s3": 1.0})], seed=9, length=5_000,
                        block_size=16)
    np.testing.assert_array_equal(scheduled.read(np.arange(2_000))["index"],
                                  np.concatenate([first["index"], later["index"]]))


def test_passes_and_length() -> None:
    sources = _sources([10, 100])
    mix = Mixture(sources, {"s0": 1.0, "s1": 1.0}, max_passes=2, block_size=8, seed=1)
    # s0 exhausts its 2 passes (20 observations) first: the mixture ends there
    tags = mix.read(np.arange(len(mix)))["tag"]
    assert (tags == 0).sum() == 20 and len(mix) < 45
    assert Mixture(sources, {"s0": 1.0, "s1": 1.0}, max_passes={"s1": 1},
                   block_size=8).describe()[1]["slots"] == 100
    short = Mixture(sources, {"s0": 1.0, "s1": 1.0}, max_passes=2, length=10, block_size=8)
    assert len(short) == 10
    with pytest.raises(IndexError, match="out of range"):
        mix.read([len(mix)])
    rows = Mixture(sources, {"s0": 1.0, "s1": 3.0}, length=4_096, block_size=64).describe()
    assert [r["name"] for r in rows] == ["s0", "s1"]
    assert rows[0]["weight"] == rows[0]["achieved"] == 0.25
    assert rows[0]["passes"] == 103 and rows[1]["slots"] == 3_072


def test_state_is_json_and_checked_against_the_fingerprint() -> None:
    sources = _sources([30, 20])
    mix = Mixture(sources, {"s0": 1.0, "s1": 2.0}, seed=4, length=600, block_size=8)
    loader = Loader(mix, 6, output="numpy", num_threads=0)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["fingerprint"] == mix.fingerprint and state["source"]["seed"] == 4
    rest = [b["index"].tolist() for b in it]
    fresh = Loader(Mixture(sources, {"s1": 2.0, "s0": 1.0}, seed=4, length=600, block_size=8),
                   6, output="numpy", num_threads=0)
    fresh.load_state_dict(state)
    assert [b["index"].tolist() for b in fresh] == rest
    other_seed = Loader(Mixture(sources, {"s0": 1.0, "s1": 2.0}, seed=5, length=600),
                        6, output="numpy")
    with pytest.raises(ValueError, match="another mixture"):
        other_seed.load_state_dict(state)
    other_data = Loader(Mixture({"s0": Tagged(31, 0), "s1": sources["s1"]},
                                {"s0": 1.0, "s1": 2.0}, seed=4, length=600), 6, output="numpy")
    with pytest.raises(ValueError, match="source 's0' changed"):
        other_data.load_state_dict(state)
    longer = Loader(Mixture(sources, {"s0": 1.0, "s1": 2.0}, seed=4, length=900,
                            block_size=8), 6, output="numpy")
    with pytest.raises(ValueError, match="length"):
        longer.load_state_dict(state)
    longer.load_state_dict(state, allow={"length"})
    assert [b["index"].tolist() for b in longer][:len(rest)] == rest
    plain = Loader(Tagged(600, 0), 6, output="numpy")
    with pytest.raises(ValueError, match="fingerprint"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="only a source that resumes"):
        plain.load_state_dict(plain.state_dict(), allow={"weights"})
    with pytest.raises(ValueError, match="another source"):
        Loader(mix, 6).load_state_dict({**state, "source": {"version": 7}})


def test_bad_input_names_the_argument() -> None:
    sources = _sources([5, 5])
    for weights, match in [({"s0": 0.0, "s1": 1.0}, "weights.*> 0"),
                           ({"s0": -1.0, "s1": 1.0}, "weights.*'s0'"),
                           ({"s0": math.nan, "s1": 1.0}, "weights.*'s0': nan"),
                           ({"s0": math.inf}, "weights.*'s0': inf"),
                           ({"s0": 1.0, "s9": 1.0}, "weights name sources.*s9"),
                           ({}, "weights"), ([(5, {"s0": 1.0})], r"weights\[0\] must start"),
                           ([(0, {"s0": 1.0}), (0, {"s1": 1.0})], "stage starts must increase"),
                           ({"s0": True}, "weights")]:
        with pytest.raises(ValueError, match=match):
            Mixture(sources, weights, length=10)
    with pytest.raises(ValueError, match="length"):
        Mixture(sources, {"s0": 1.0})
    with pytest.raises(ValueError, match="sources"):
        Mixture({}, {"s0": 1.0}, length=10)
    with pytest.raises(ValueError, match="block_size"):
        Mixture(sources, {"s0": 1.0}, length=10, block_size=0)
    with pytest.raises(ValueError, match="max_passes"):
        Mixture(sources, {"s0": 1.0}, max_passes={"s7": 1})
    with pytest.raises(ValueError, match="shuffle=True"):
        Loader(Mixture(sources, {"s0": 1.0}, length=10), 2, shuffle=True)


def test_windows_and_documents_do_not_mix(tmp_path: Path) -> None:
    folder = _corpus(tmp_path / "c", 0)
    ds = open_dataset(folder)
    with pytest.raises(ValueError, match=r"sources: .*'w' reads windows, 'd' reads documents"):
        Mixture({"w": ds.windows(8), "d": ds.documents()}, {"w": 1.0, "d": 1.0}, length=10)
    with pytest.raises(ValueError, match=r"seq_len=8.*16"):
        Mixture({"a": ds.windows(8), "b": ds.windows(16)}, {"a": 1.0, "b": 1.0}, length=10)

    packed = ds.documents().packed(16)
    with pytest.raises(ValueError, match="sources\\['p'\\] is PackedRows"):
        Mixture({"p": packed, "w": ds.windows(16)}, {"p": 1.0, "w": 1.0}, length=10)

    class Other(Tagged):
        def read(self, indices: Any) -> Batch:
            return Batch.from_columns({"tag": np.zeros(len(indices), np.float32)})

    mix = Mixture({"a": Tagged(50, 0), "b": Other(50, 1)}, {"a": 1.0, "b": 1.0}, length=100,
                  block_size=4)
    with pytest.raises(ValueError, match="'a' and 'b' give columns that cannot mix"):
        mix.read(np.arange(8))


def _corpus(folder: Path, seed: int, documents: int = 120) -> Path:
    rng = np.random.default_rng(seed)
    with StreamWriter(folder, shard_tokens=2_000) as writer:
        for _ in range(documents):
            writer.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 50))))
    return folder


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("mixture")
    return [_corpus(root / f"c{i}", i, 60 + 40 * i) for i in range(3)]


def test_through_the_loader_with_threads(corpora: list[Path]) -> None:
    mix = windows_mixture(corpora, {"c0": 0.2, "c1": 0.5, "c2": 0.3}, 1_000)
    expected_sources, expected_index = mix.locate(np.arange(len(mix)))
    windows = [mix.sources[f"c{i}"] for i in range(3)]
    for world_size in (1, 3):
        received: dict[int, tuple[int, int]] = {}
        for rank in range(world_size):
            loader = Loader(mix, 8, rank=rank, world_size=world_size, num_threads=2,
                            prefetch=3, output="batch")
            for batch in loader:
                positions = batch.meta.global_indexes.tolist()
                for row, (position, s) in enumerate(zip(positions, batch["source"].tolist(),
                                                        strict=True)):
                    received[position] = (s, int(expected_index[position]))
                    want = windows[s].read([expected_index[position]])["input_ids"][0]
                    np.testing.assert_array_equal(batch["input_ids"][row], want)
        assert sorted(received) == list(range(len(received)))
        assert [received[p][0] for p in sorted(received)] == expected_sources[
            :len(received)].tolist()


@pytest.mark.parametrize("masking", [False, True])
def test_steps_from_a_blocks_run_read_their_windows(corpora: list[Path], masking: bool) -> None:
    """Windows of local datasets read a step's rows gathered from its block's
    run (``Mixture._step_run``, one call with the read): through the Loader,
    with reader threads and two ranks, every row is the window the pure order
    names, with its document columns."""
    sources = {f"c{i}": open_dataset(p).windows(8, document_masking=masking)
               for i, p in enumerate(corpora)}
    mix = Mixture(sources, {"c0": 0.2, "c1": 0.5, "c2": 0.3}, seed=5, length=3_000,
                  block_size=512)
    expected_sources, expected_index = mix.locate(np.arange(len(mix)))
    windows = [sources[f"c{i}"] for i in range(3)]
    for world_size in (1, 2):
        seen = []
        for rank in range(world_size):
            loader = Loader(mix, 16, rank=rank, world_size=world_size, num_threads=2,
                            output="batch")
            for batch in loader:
                positions = batch.meta.global_indexes
                seen += positions.tolist()
                np.testing.assert_array_equal(batch["source"], expected_sources[positions])
                for row, position in enumerate(positions.tolist()):
                    want = windows[int(expected_sources[position])].read(
                        [expected_index[position]])
                    for name in ("input_ids", "labels", *(("position_ids",) if masking else ())):
                        np.testing.assert_array_equal(batch[name][row], want[name][0])
        assert mix._runs and mix._runs[0][0] == world_size  # the run path was taken
        assert sorted(seen) == list(range(len(seen)))
    clone = pickle.loads(pickle.dumps(mix))  # without the kept runs and their lock
    assert clone._runs == ()
    step = np.arange(512, 528, dtype=np.int64)
    for name in ("source", "input_ids"):
        np.testing.assert_array_equal(clone.read(step)[name], mix.read(step)[name])


def test_through_loader_dataset_with_two_workers() -> None:
    torch = pytest.importorskip("torch")
    from zerobatch.torch import LoaderDataset

    mix = Mixture(_sources([37, 50, 11]), {"s0": 1.0, "s1": 2.0, "s2": 0.5}, seed=2,
                  length=400, block_size=16)
    loader = Loader(mix, 8)
    expected = [(b["source"].tolist(), b["index"].tolist()) for b in Loader(mix, 8)]
    data = torch.utils.data.DataLoader(LoaderDataset(loader), batch_size=None, num_workers=2)
    got = [(b["source"].tolist(), b["index"].tolist()) for b in data]
    assert got == expected
    sources, index = mix.locate(np.arange(len(expected) * 8))
    assert [s for b in got for s in b[0]] == sources.tolist()
    assert [i for b in got for i in b[1]] == index.tolist()


def test_output_jax_on_eight_devices(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from zerobatch.stream.npy import open_npy

    windows = {}
    for i in range(3):
        folder = tmp_path / f"n{i}"
        folder.mkdir()
        np.save(folder / "0.npy", np.random.default_rng(i).integers(0, 30_000, size=600 + 200 * i,
                                                                    dtype=np.uint16))
        windows[f"n{i}"] = open_npy(folder).windows(8, dtype="int32")
    mix = Mixture(windows, {"n0": 1.0, "n1": 1.0, "n2": 2.0}, seed=3, length=160, block_size=16)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("pp", "dp", "tp"))
    sharding = NamedSharding(mesh, P("pp", "dp", "tp"))
    steps = list(Loader(mix, 8, output="jax", sharding=sharding, microbatch=2, num_threads=2))
    numpy = list(Loader(mix, 8, output="numpy"))
    assert len(steps) == len(numpy) == 20
    for step, batch in zip(steps, numpy, strict=True):
        assert set(step) == {"input_ids", "labels", "source"}
        assert step["input_ids"].shape == (2, 4, 8)
        np.testing.assert_array_equal(np.asarray(step["input_ids"]).reshape(8, 8),
                                      batch["input_ids"])
        np.testing.assert_array_equal(np.asarray(step["labels"]).reshape(8, 8), batch["labels"])
        # the per-row column: (microbatch, rows), split as the rows, replicated over tp
        source = step["source"]
        assert source.shape == (2, 4) and source.dtype == np.int32
        assert tuple(source.sharding.spec) == ("pp", "dp")
        np.testing.assert_array_equal(np.asarray(source).reshape(8), batch["source"])
        for shard in source.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data),
                                          np.asarray(source)[shard.index])
    # without microbatches: rows x tokens, rows over dp
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("dp", "tp"))
    flat = list(Loader(mix, 8, output="jax", sharding=NamedSharding(mesh, P("dp", "tp"))))
    for step, batch in zip(flat, numpy, strict=True):
        assert step["source"].shape == (8,)
        assert tuple(step["source"].sharding.spec) == ("dp",)
        np.testing.assert_array_equal(np.asarray(step["source"]), batch["source"])
        np.testing.assert_array_equal(np.asarray(step["input_ids"]), batch["input_ids"])


def test_kill_and_resume_with_a_weight_change(corpora: list[Path], tmp_path: Path) -> None:
    log, checkpoint = tmp_path / "log", tmp_path / "checkpoint.json"
    kill_and_resume(mixture_loop, (corpora, log, checkpoint), checkpoint, tmp_path / "done",
                    seed=1, ahead=8, timeout=120)
    got = [[tuple(int(v) for v in row.split(":")) for row in line.split()]
           for line in log.read_text().splitlines()]
    stages = json.loads(checkpoint.read_text())["state"]["source"]["stages"]
    assert len(stages) == 2 and stages[1]["start"] >= CHANGE_FROM * 4
    change = stages[1]["start"]
    # expected: the old weights up to the change, then the run resumed there with the new
    before = windows_mixture(corpora, BEFORE, 800)
    head = before.read(np.arange(change))
    after = windows_mixture(corpora, AFTER, 800).resumed(
        before.state_dict(), epoch=0, consumed=change, allow={"weights"})
    tail = after.read(np.arange(change, 800))
    expected_rows = list(zip(range(800), [*head["source"].tolist(), *tail["source"].tolist()],
                             [*head["input_ids"][:, 0].tolist(),
                              *tail["input_ids"][:, 0].tolist()], strict=True))
    assert got == [expected_rows[i:i + 4] for i in range(0, 800, 4)]
    # and each source read its own order without a repeat or a skip across the change
    index = np.concatenate([before.locate(np.arange(change))[1],
                            after.locate(np.arange(change, 800))[1]])
    sources = np.array([s for _, s, _ in expected_rows])
    for s in range(3):
        got_index = index[sources == s]
        np.testing.assert_array_equal(got_index, _own_order(after.order, s,
                                                            np.arange(got_index.shape[0])))


def test_through_the_batch_server() -> None:
    import threading

    from zerobatch.service import BatchClient, BatchServer

    mix = Mixture(_sources([37, 50, 11]), {"s0": 1.0, "s1": 2.0, "s2": 0.5}, seed=2,
                  length=200, block_size=16)
    expected = [(b["source"].tolist(), b["index"].tolist())
                for b in Loader(mix, 4, rank=1, world_size=2, output="numpy")]
    server = BatchServer(mix, "tcp://127.0.0.1:0")
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        with BatchClient(server.address, 4, rank=1, world_size=2, output="numpy",
                         timeout=20) as client:
            assert client.shuffle is False
            got = [(b["source"].tolist(), b["index"].tolist()) for b in client]
            state = client.state_dict()
        assert got == expected
        assert state["source"] == mix.state_dict() and state["fingerprint"] == mix.fingerprint
        with pytest.raises(ValueError, match="shuffle=True"):
            BatchClient(server.address, 4, shuffle=True, timeout=20)
    finally:
        server.stop()
        thread.join(10)


def test_stateful_dataloader_resumes_a_mixture() -> None:
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from zerobatch.torch import LoaderDataset

    mix = Mixture(_sources([37, 50, 11]), {"s0": 1.0, "s1": 2.0, "s2": 0.5}, seed=2,
                  length=400, block_size=16)
    expected = [b["index"].tolist() for b in Loader(mix, 8)]
    data = StatefulDataLoader(LoaderDataset(Loader(mix, 8)), batch_size=None, num_workers=2)
    it = iter(data)
    head = [next(it)["index"].tolist() for _ in range(7)]
    saved = data.state_dict()
    del it, data
    workers = saved["_snapshot"]["_worker_snapshots"].values()
    assert all("source" not in w["fetcher_state"]["dataset_iter_state"]["loader"]
               for w in workers)
    state = LoaderDataset(Loader(mix, 8)).loader_state(saved)
    assert state["source"] == mix.state_dict()
    resumed = Loader(Mixture(_sources([37, 50, 11]), {"s0": 1.0, "s1": 2.0, "s2": 0.5},
                             seed=2, length=400, block_size=16), 8)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert head + [b["index"].tolist() for b in resumed] == expected


def test_stateful_dataloader_resumes_a_changed_mixture() -> None:
    """A raw StatefulDataLoader state (2 workers) resumes a mixture whose
    weights changed: loader_state(..., allow=) gives the saved mixture's
    state at the step after the last batch, and the new loader continues it
    exactly as a plain Loader resumed there with the same change."""
    pytest.importorskip("torchdata")
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from zerobatch.torch import LoaderDataset

    before, after = {"s0": 1.0, "s1": 2.0, "s2": 0.5}, {"s0": 3.0, "s1": 0.5, "s2": 1.0}

    def mixture(weights: dict[str, float]) -> Mixture:
        return Mixture(_sources([37, 50, 11]), weights, seed=2, length=400, block_size=16)

    def rows(batch: Any) -> list[tuple[int, int]]:
        source, index = batch["source"], batch["index"]
        if isinstance(source, torch.Tensor):
            source, index = source.numpy(), index.numpy()
        return list(zip(source.tolist(), index.tolist(), strict=True))

    data = StatefulDataLoader(LoaderDataset(Loader(mixture(before), 8)), batch_size=None,
                              num_workers=2)
    it = iter(data)
    head = [rows(next(it)) for _ in range(7)]
    saved = json.loads(json.dumps(data.state_dict()))
    del it, data
    plain = Loader(mixture(before), 8)
    plain_it = iter(plain)
    assert [rows(next(plain_it)) for _ in range(7)] == head
    reference = Loader(mixture(after), 8)
    reference.load_state_dict(plain.state_dict(), allow={"weights"})
    expected = [rows(b) for b in reference]

    dataset = LoaderDataset(Loader(mixture(after), 8))
    with pytest.raises(ValueError, match="weights"):
        dataset.loader_state(saved)  # the mixture changed: refused without allow
    with pytest.raises(ValueError, match="weights"):
        dataset.loader_state(saved, allow={"length"})
    state = dataset.loader_state(saved, allow={"weights"})
    assert state["consumed"] == 56 and state["source"] == mixture(before).state_dict()
    dataset.load_state_dict(state, allow={"weights"})
    resumed = StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    got = [rows(b) for b in resumed]
    assert got == expected
    # each source goes on in its own order: no observation repeated within its pass
    seen: dict[int, list[int]] = {}
    for batch in head + got:
        for s, i in batch:
            seen.setdefault(s, []).append(i)
    for s, indices in seen.items():
        n = [37, 50, 11][s]
        for p in range(0, len(indices), n):
            chunk = indices[p:p + n]
            assert len(set(chunk)) == len(chunk)
