"""DataLoader workers over a Loader's plan give the Loader's own sequence."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch.utils.data

from zerobatch import Loader, StreamWriter, open_dataset
from zerobatch.torch import LoaderDataset


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("adapter") / "corpus"
    rng = np.random.default_rng(1)
    with StreamWriter(folder) as writer:
        for _ in range(100):
            writer.add_document(rng.integers(0, 500, size=int(rng.integers(3, 40))))
    return open_dataset(folder).windows(8)


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
    with pytest.raises(ValueError, match="holds no LoaderDataset iterator state"):
        dataset.loader_state({"fetcher_state": {"dataset_iter_state": {"x": 1}}})
    saved = _stateful(Loader(windows, 4, seed=9), 0).state_dict()
    with pytest.raises(ValueError, match="seed=9"):
        dataset.loader_state(saved)
    steps = iter(LoaderDataset(Loader(windows, 4, seed=8)))
    state = steps.state_dict()
    state["workers"] = 3
    with pytest.raises(ValueError, match=r"worker 0 of 3 loaded into worker 0 of 1.*loader_state"):
        steps.load_state_dict(state)
    with pytest.raises(ValueError, match="not a LoaderDataset iterator state"):
        steps.load_state_dict({"version": 99})

def test_spawned_workers_over_s3(s3):
    url = s3.url("adapter")
    options = s3.storage_options()
    rng = np.random.default_rng(4)
    with StreamWriter(url, storage_options=options) as writer:
        for _ in range(60):
            writer.add_document(rng.integers(0, 500, size=int(rng.integers(3, 40))))
    windows = open_dataset(url, storage_options={**options, "block_size": 64}).windows(8)
    expected = [b["position_ids"] for b in Loader(windows, 4, seed=5)]
    data = torch.utils.data.DataLoader(LoaderDataset(Loader(windows, 4, seed=5)),
                                       batch_size=None, num_workers=2,
                                       multiprocessing_context="spawn")
    got = [b["position_ids"] for b in data]
    assert len(got) == len(expected) > 2
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
