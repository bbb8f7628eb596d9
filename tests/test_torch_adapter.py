"""DataLoader workers over a Loader's plan give the Loader's own sequence."""

from __future__ import annotations

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
