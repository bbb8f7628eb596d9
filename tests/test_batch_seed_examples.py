"""Every code example of seed 000, run as written (on smaller data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # the seed's spelling

RECORDS = 32 * 6 + 5
SEQ_LEN = 512


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    tokens = np.random.default_rng(0).integers(0, 1000, size=(RECORDS, SEQ_LEN), dtype=np.uint32)
    np.save("tokenized_data.npy", tokens)
    Path("data").mkdir()
    return tmp_path


def test_writing_api(in_tmp: Path) -> None:
    tokens = np.load("tokenized_data.npy")
    from zerobatch.batch_writer import write_batch_file

    num_batches = write_batch_file(
        output_path="dataset.batch",
        tokens_array=tokens,  # np.ndarray, shape (N, seq_len), dtype uint32
        batch_size=32,
        seq_len=512,
        seed=42,
    )
    assert num_batches == RECORDS // 32
    assert Path("dataset.batch").stat().st_size == 4096 + num_batches * 65536


def token_generator():  # type: ignore[no-untyped-def]
    yield from np.load("tokenized_data.npy")


def test_streaming_writer_api(in_tmp: Path) -> None:
    from zerobatch.batch_writer import write_batch_dataset

    num_batches = write_batch_dataset(
        output_path="dataset.batch",
        tokens_iter=token_generator(),  # yields 1D arrays of shape (seq_len,)
        total_records=RECORDS,
        batch_size=32,
        seq_len=512,
        seed=42,
    )
    assert num_batches == RECORDS // 32


def test_reader_api(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zerobatch.batch_writer import write_batch_file

    write_batch_file("dataset.batch", np.load("tokenized_data.npy"), 32, 512, 42)
    from zerobatch.batch_loader import BatchFileReader

    reader = BatchFileReader("dataset.batch")
    print(reader.num_batches)  # 3275
    print(reader.batch_size)  # 32
    print(reader.seq_len)  # 512

    # Zero-copy numpy view into mmap
    arr = reader.read_batch(0)  # shape (32, 512), dtype uint32

    # PyTorch tensor (requires uint32 → int64 copy)
    tensor = reader.read_batch_torch(0)  # shape (32, 512), dtype int64

    assert capsys.readouterr().out.split() == [str(RECORDS // 32), "32", "512"]
    assert arr.shape == (32, 512) and arr.dtype == np.uint32
    assert tensor.shape == (32, 512) and tensor.dtype == torch.int64
    assert np.array_equal(tensor.numpy(), arr)
    reader.close()


class MyModel(torch.nn.Module):
    def __init__(self, vocab_size: int = 1000) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, 16)
        self.head = torch.nn.Linear(16, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def test_loader_api(in_tmp: Path) -> None:
    from zerobatch.batch_writer import write_batch_file

    write_batch_file("dataset.batch", np.load("tokenized_data.npy"), 32, 512, 42)
    from zerobatch.batch_loader import BatchNativeLoader

    loader = BatchNativeLoader(
        path="dataset.batch",
        block_size=256,  # batches per super-block
        shuffle=True,
        seed=42,
        epoch=0,
    )

    def model(batch: torch.Tensor) -> torch.Tensor:
        return MyModel()(batch).mean()

    seen = 0
    for batch in loader:
        # batch: torch.LongTensor, shape (32, 512)
        loss = model(batch)
        loss.backward()
        assert batch.dtype == torch.int64 and batch.shape == (32, 512)
        seen += 1
    assert seen == RECORDS // 32

    num_epochs = 2
    orders = []
    for epoch in range(num_epochs):
        loader.set_epoch(epoch)  # changes shuffle order
        order = []
        for batch in loader:
            order.append(int(batch[0, 0]))
        orders.append(order)
    assert sorted(orders[0]) == sorted(orders[1])


def test_training_loop(in_tmp: Path) -> None:
    from zerobatch.batch_writer import write_batch_file

    write_batch_file("data/dataset.batch", np.load("tokenized_data.npy"), 32, 512, 42)
    vocab_size = 1000
    num_epochs = 2
    from zerobatch.batch_loader import BatchNativeLoader

    loader = BatchNativeLoader("data/dataset.batch", seed=42)

    model = MyModel()
    optimizer = torch.optim.Adam(model.parameters())

    for epoch in range(num_epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            # batch: torch.LongTensor, shape (batch_size, seq_len)
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.view(-1, vocab_size), batch[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert torch.isfinite(loss)


def test_creating_a_dataset(in_tmp: Path) -> None:
    import numpy as np

    from zerobatch.batch_writer import write_batch_file

    # tokens: numpy array of shape (num_records, seq_len), dtype uint32
    # e.g., from tokenizing a text corpus
    tokens = np.load("tokenized_data.npy").astype(np.uint32)

    write_batch_file(
        output_path="dataset.batch",
        tokens_array=tokens,
        batch_size=32,
        seq_len=512,
        seed=42,
    )
    assert Path("dataset.batch").read_bytes()[:8] == b"LLMBATCH"
