"""DataLoader workers over a Loader's plan give the Loader's own sequence."""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pytest
import torch.utils.data

from zerobatch import Loader, StreamWriter, open_dataset
from zerobatch.torch import DataLoader, LoaderDataset


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("adapter") / "corpus"
    rng = np.random.default_rng(1)
    with StreamWriter(folder) as writer:
        for _ in range(100):
            writer.add_document(rng.integers(0, 500, size=int(rng.integers(3, 40))))
    return open_dataset(folder).windows(8, columns="all")


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_matches_loader(windows, workers):
    expected = [b["input_ids"] for b in Loader(windows, 4, seed=2, rank=1, world_size=2)]
    loader = Loader(windows, 4, seed=2, rank=1, world_size=2)
    data = torch.utils.data.DataLoader(LoaderDataset(loader), batch_size=None,
                                       num_workers=workers)
    got = [b["input_ids"] for b in data]
    assert len(got) == len(expected) == len(loader)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_resume_with_another_worker_count(windows):
    full = [b["input_ids"] for b in Loader(windows, 4, seed=3)]
    first = Loader(windows, 4, seed=3)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    resumed = Loader(windows, 4, seed=3)
    resumed.load_state_dict(state)
    data = torch.utils.data.DataLoader(LoaderDataset(resumed), batch_size=None, num_workers=2)
    got = [b["input_ids"] for b in data]
    assert all(torch.equal(a, b) for a, b in zip(got, full[5:], strict=True))


def _stateful(loader: Loader, workers: int, **kwargs):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(LoaderDataset(loader), batch_size=None, num_workers=workers,
                              **kwargs)


def _take(iterator, steps: int) -> list[torch.Tensor]:
    return [next(iterator)["input_ids"] for _ in range(steps)]


def _same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [0, 1, 4, 7])
def test_stateful_dataloader_resumes_exactly(windows, workers, stop):
    """The state counts what the main process yielded, not what workers prefetched."""
    expected = [b["input_ids"] for b in Loader(windows, 4, seed=5, rank=1, world_size=2)]
    data = _stateful(Loader(windows, 4, seed=5, rank=1, world_size=2), workers)
    iterator = iter(data)
    got = _take(iterator, stop)
    saved = json.loads(json.dumps(data.state_dict()))  # the whole state is JSON-able
    got += _take(iterator, 2)  # moves on after the save: the resume must not see these
    del iterator
    resumed = _stateful(Loader(windows, 4, seed=5, rank=1, world_size=2), workers)
    resumed.load_state_dict(saved)
    _same(got[:stop] + [b["input_ids"] for b in resumed], expected)


@pytest.mark.parametrize(("before", "after", "every"), [(2, 0, 1), (0, 3, 1), (2, 3, 1), (3, 1, 3)])
def test_stateful_state_resumes_any_worker_count(windows, before, after, every):
    expected = [b["input_ids"] for b in Loader(windows, 4, seed=6, drop_last=False)]
    data = _stateful(Loader(windows, 4, seed=6, drop_last=False), before,
                     snapshot_every_n_steps=every)
    iterator = iter(data)
    got = _take(iterator, 5)
    saved = data.state_dict()
    del iterator
    loader = Loader(windows, 4, seed=6, drop_last=False)
    dataset = LoaderDataset(loader)
    loader.load_state_dict(dataset.loader_state(saved))
    assert loader.state_dict()["consumed"] == 5 * 4
    rest = [b["input_ids"] for b in _stateful(loader, after)]
    _same(got + rest, expected)


def test_stateful_resume_across_epochs(windows):
    """Saved after an epoch's last batch, the resume starts the next epoch and
    runs exactly as many epochs as were left."""
    expected = [b["input_ids"] for b in Loader(windows, 8, seed=7, epochs=2)]
    steps = len(Loader(windows, 8, seed=7))
    data = _stateful(Loader(windows, 8, seed=7, epochs=2), 2)
    iterator = iter(data)
    got = _take(iterator, steps)
    saved = data.state_dict()
    del iterator
    loader = Loader(windows, 8, seed=7, epochs=2)
    assert LoaderDataset(loader).loader_state(saved)["epoch"] == 1
    resumed = _stateful(loader, 2)
    resumed.load_state_dict(saved)
    _same(got + [b["input_ids"] for b in resumed], expected)


def test_stateful_bad_states(windows):
    dataset = LoaderDataset(Loader(windows, 4, seed=8))
    with pytest.raises(ValueError, match="holds no LoaderDataset iterator state"):
        dataset.loader_state({"_snapshot": {"_worker_snapshots": {}}})
    with pytest.raises(ValueError, match="version None"):
        dataset.loader_state({"fetcher_state": {"dataset_iter_state": {"x": 1}}})
    saved = _stateful(Loader(windows, 4, seed=9), 0).state_dict()
    with pytest.raises(ValueError, match="seed=9"):
        dataset.loader_state(saved)
    steps = iter(LoaderDataset(Loader(windows, 4, seed=8)))
    state = steps.state_dict()
    state["workers"] = 3
    with pytest.raises(ValueError, match=r"worker 0 of 3 loaded into worker 0 of 1.*loader_state"):
        steps.load_state_dict(state)
    with pytest.raises(ValueError, match="has version 99; this zerobatch reads version 2"):
        steps.load_state_dict({"version": 99})

def test_spawned_workers_over_s3(s3):
    url = s3.url("adapter")
    options = s3.storage_options()
    rng = np.random.default_rng(4)
    with StreamWriter(url, storage_options=options) as writer:
        for _ in range(60):
            writer.add_document(rng.integers(0, 500, size=int(rng.integers(3, 40))))
    dataset = open_dataset(url, storage_options={**options, "block_size": 64})
    windows = dataset.windows(8, document_masking=True)
    expected = [b["position_ids"] for b in Loader(windows, 4, seed=5)]
    data = torch.utils.data.DataLoader(LoaderDataset(Loader(windows, 4, seed=5)),
                                       batch_size=None, num_workers=2,
                                       multiprocessing_context="spawn")
    got = [b["position_ids"] for b in data]
    assert len(got) == len(expected) > 2
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


class Indices:
    """A source whose rows are the observations' own indices."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def read(self, indices):
        from zerobatch import Batch

        return Batch.from_columns({"index": np.asarray(indices, dtype=np.int64)})


def _indices(batches) -> list[int]:
    return [int(i) for b in batches for i in b["index"]]


def test_iterator_state_without_loader_key(windows):
    """Issue 25, finding 7: a malformed iterator state is a ValueError naming the field."""
    dataset = LoaderDataset(Loader(windows, 4, seed=8))
    steps = iter(dataset)
    for broken in ({k: v for k, v in steps.state_dict().items() if k != "loader"},
                   {**steps.state_dict(), "loader": [1, 2]}):
        with pytest.raises(ValueError, match="'loader' field"):
            steps.load_state_dict(broken)
        with pytest.raises(ValueError, match="'loader' field"):
            dataset.loader_state({"fetcher_state": {"dataset_iter_state": broken}})
    for name, value in (("step_size", 0), ("step_size", "4"), ("worker", -1),
                        ("workers", None), ("end_epoch", 1.5)):
        with pytest.raises(ValueError, match=f"{name}={value!r}"):
            steps.load_state_dict({**steps.state_dict(), name: value})
    with pytest.raises(ValueError, match="must be a dict"):
        dataset.loader_state([])
    # found by the fuzzer (state-loader-iterator): no end_epoch was a KeyError; it is None
    steps.load_state_dict({k: v for k, v in steps.state_dict().items() if k != "end_epoch"})
    assert steps.state_dict()["end_epoch"] is None


def test_steps_since_snapshot_is_o1_and_checked(windows):
    """Issue 25, finding 9: the count after the snapshot is validated and applied
    in O(1) (10**12 steps, across epochs), with the step size the state was made for."""
    loader = Loader(windows, 4, seed=8, drop_last=False)
    dataset = LoaderDataset(loader)
    saved = _stateful(Loader(windows, 4, seed=8, drop_last=False), 0).state_dict()
    for bad in (1.5, -1, True, "3"):
        with pytest.raises(ValueError, match="_steps_since_snapshot"):
            dataset.loader_state({**saved, "_steps_since_snapshot": bad})
    steps = len(loader)
    state = dataset.loader_state({**saved, "_steps_since_snapshot": 10**12})
    assert (state["epoch"], state["consumed"]) == (10**12 // steps, (10**12 % steps) * 4)
    # made for steps of 4, read by a loader of steps of 6: advances in steps of 4
    wider = LoaderDataset(Loader(windows, 3, world_size=2, seed=8, drop_last=False))
    state = wider.loader_state({**saved, "_steps_since_snapshot": 3})
    assert (state["epoch"], state["consumed"]) == (0, 12)


@pytest.mark.parametrize("workers", [0, 2])
def test_step_change_through_stateful_dataloader(workers):
    """The repeat-and-skip bug: 4 ranks x 6 saved, 3 ranks x 10 resumed. torchdata's
    own load is refused naming the fix; zerobatch.torch.DataLoader converts the
    saved workers' states to the one global position, and every observation of
    the epoch comes exactly once."""
    source = Indices(500)
    old = [Loader(source, 6, seed=4, rank=r, world_size=4, output="numpy") for r in range(4)]
    seen = [i for loader in old[1:] for i in _indices(itertools.islice(loader, 7))]
    data = _stateful(old[0], workers)
    iterator = iter(data)
    first = [next(iterator) for _ in range(7)]
    seen += _indices(first)
    saved = data.state_dict()
    del iterator
    refused = _stateful(Loader(source, 10, seed=4, rank=0, world_size=3, output="numpy"),
                        workers)
    refused.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"made for steps of 24.*zerobatch\.torch\.DataLoader"):
        next(iter(refused))
    for rank, new_workers in ((0, 0), (1, 2), (2, 1)):
        resumed = DataLoader(Loader(source, 10, seed=4, rank=rank, world_size=3,
                                    output="numpy"), num_workers=new_workers)
        resumed.load_state_dict(saved)
        seen += _indices(resumed)
    dropped = Loader(source, 10, world_size=3).plan.dropped(7 * 24)
    assert len(seen) == len(set(seen)) == 500 - dropped


def test_same_step_other_split_through_stateful_dataloader():
    """4 ranks x 6 resumed as 3 x 8 (the same step of 24) through torchdata's own
    load_state_dict: exact, with the same num_workers."""
    source = Indices(300)
    seen = [i for r in range(1, 4) for i in _indices(
        itertools.islice(Loader(source, 6, seed=1, rank=r, world_size=4, output="numpy"), 5))]
    data = _stateful(Loader(source, 6, seed=1, rank=0, world_size=4, output="numpy"), 2)
    iterator = iter(data)
    seen += _indices(next(iterator) for _ in range(5))
    saved = data.state_dict()
    del iterator
    for rank in range(3):
        resumed = _stateful(Loader(source, 8, seed=1, rank=rank, world_size=3, output="numpy"), 2)
        resumed.load_state_dict(saved)
        seen += _indices(resumed)
    assert len(seen) == len(set(seen)) == 300 - 300 % 24


def test_dataloader_moves_the_loader_and_resumes_any_worker_count(windows):
    expected = [b["input_ids"] for b in Loader(windows, 4, seed=3, epochs=2)]
    loader = Loader(windows, 4, seed=3, epochs=2)
    data = DataLoader(loader, num_workers=2)
    got = []
    for batch in data:
        got.append(batch["input_ids"])
        assert data.state_dict()["consumed"] == loader.state_dict()["consumed"]
        if len(got) == 9:
            break
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # this route's Loader state is exact: no warning
        saved = json.loads(json.dumps(loader.state_dict()))
    for workers in (0, 3):
        resumed = DataLoader(Loader(windows, 4, seed=3, epochs=2), num_workers=workers)
        resumed.load_state_dict(saved)
        _same(got + [b["input_ids"] for b in resumed], expected)
    with pytest.raises(ValueError, match="persistent_workers"):
        DataLoader(loader, persistent_workers=True)


def test_stale_loader_state_warns(windows):
    """On the LoaderDataset route the main process's Loader never moves: saving its
    state warns and names the fix; iterating the Loader itself clears it."""
    loader = Loader(windows, 4, seed=3)
    data = torch.utils.data.DataLoader(LoaderDataset(loader), batch_size=None)
    next(iter(data))
    with pytest.warns(UserWarning, match=r"does not move.*zerobatch\.torch\.DataLoader"):
        loader.state_dict()
    next(iter(loader))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loader.state_dict()["consumed"] == 4


@pytest.mark.parametrize("route", ["dataset", "dataloader"])
def test_set_epoch_reshuffles(windows, route):
    loader = Loader(windows, 4, seed=3)
    epochs = [[b["input_ids"] for b in Loader(windows, 4, seed=3).__iter__()]]
    reference = Loader(windows, 4, seed=3)
    reference.set_epoch(1)
    epochs.append([b["input_ids"] for b in reference])
    dataset = LoaderDataset(loader)
    data = (torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
            if route == "dataset" else DataLoader(loader, num_workers=2))
    for epoch in (0, 1):
        (dataset if route == "dataset" else data).set_epoch(epoch)
        _same([b["input_ids"] for b in data], epochs[epoch])
    assert not all(torch.equal(a, b) for a, b in zip(*epochs, strict=False))


def test_rank_is_resolved_at_first_iteration(monkeypatch):
    """A Loader built before the process group exists (mp.spawn) takes its rank
    when iterated, and warns if it was already read as rank 0 of 1."""
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    source = Indices(40)
    early = Loader(source, 2, seed=1, output="numpy")
    late = Loader(source, 2, seed=1, output="numpy")
    assert (early.rank, early.world_size) == (0, 1)
    next(iter(late))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    expected = _indices(Loader(source, 2, seed=1, rank=1, world_size=2, output="numpy"))
    assert _indices(early) == expected
    assert (early.rank, early.world_size) == (1, 2)
    with pytest.warns(UserWarning, match="already read as rank 0 of 1"):
        iter(late)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name)
    spawned = Loader(source, 2, seed=1, output="numpy")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert _indices(torch.utils.data.DataLoader(LoaderDataset(spawned), batch_size=None,
                                                num_workers=1)) == _indices(
        Loader(source, 2, seed=1, rank=0, world_size=4, output="numpy"))


@pytest.mark.frameworks
def test_loader_built_before_the_process_group_under_spawn(tmp_path, monkeypatch):
    """The trap of issue 26: under torch.multiprocessing.spawn a Loader built
    before init_process_group was rank 0 of 1 in every process (every rank read
    the same data). It now takes its rank when iterated."""
    import socket

    import torch.multiprocessing
    from support._spawn_ranks import read_share

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    loader = Loader(Indices(50), 4, seed=2, output="numpy")
    assert (loader.rank, loader.world_size) == (0, 1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.multiprocessing.spawn(read_share, args=(loader, 2, port, str(tmp_path / "ids")),
                                nprocs=2)
    shares = [json.loads((tmp_path / f"ids.{rank}").read_text()) for rank in (0, 1)]
    assert [(s["rank"], s["world_size"]) for s in shares] == [(0, 2), (1, 2)]
    seen = shares[0]["ids"] + shares[1]["ids"]
    assert len(seen) == len(set(seen)) == 48
