"""Shared checks of the peer-format tests: a peer dataset against the tokens
and documents the peer's own reader returns."""

from __future__ import annotations

import json
import pickle

import numpy as np

from zerobatch import Loader


def check_against(ds, tokens: np.ndarray, documents: list[np.ndarray], *, seq_len: int = 7,
                  stride: int | None = None) -> None:
    """Every window, label, position and document of ``ds`` equals what the
    peer's reader gives (``tokens``: every token in order; ``documents``: the
    peer's documents in its order, empty ones too, which keep their ids)."""
    assert ds.num_tokens == tokens.shape[0]
    assert ds.num_documents == len(documents)
    starts = np.concatenate([[0], np.cumsum([len(d) for d in documents])])
    assert starts[-1] == tokens.shape[0]
    windows = ds.windows(seq_len, stride=stride, document_masking=True,
                         columns=["input_ids", "labels", "position_ids", "doc_ids"])
    step = stride or seq_len
    assert len(windows) == (tokens.shape[0] - seq_len - 1) // step + 1
    order = np.random.default_rng(0).permutation(len(windows))
    batch = windows.read(order)
    at = order[:, None] * step + np.arange(seq_len)
    np.testing.assert_array_equal(batch["input_ids"], tokens[at].astype(np.int64))
    np.testing.assert_array_equal(batch["labels"], tokens[at + 1].astype(np.int64))
    doc_of = np.searchsorted(starts, at, side="right") - 1
    expected = np.minimum(at - starts[doc_of], at - order[:, None] * step)
    np.testing.assert_array_equal(batch["position_ids"], expected)
    for row, ids in zip(doc_of, batch["doc_ids"], strict=True):  # the peer's ids (empty: never)
        np.testing.assert_array_equal(np.asarray(ids), np.unique(row))
    stored = ds.windows(seq_len, stride=stride, dtype="stored").read(order[:3])
    assert stored["input_ids"].dtype == tokens.dtype
    docs = ds.documents().read(np.arange(len(documents))[::-1])
    for got, want in zip(docs["input_ids"], documents[::-1], strict=True):
        np.testing.assert_array_equal(np.asarray(got), want.astype(np.int64))
    again = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(again.windows(seq_len, stride=stride).read(order[:5])
                                  ["input_ids"], batch["input_ids"][:5])
    assert again.fingerprint == ds.fingerprint


def check_each_once(ds, *, seq_len: int = 5, batch_size: int = 6) -> None:
    """The Loader over ``ds``'s windows yields each window exactly once an epoch,
    also when its state is saved after three steps and loaded (JSON) by a new
    Loader with another world size (two ranks)."""
    windows = ds.windows(seq_len)
    loader = Loader(windows, batch_size, seed=3, output="batch", epochs=1, drop_last=False)
    seen = np.concatenate([np.asarray(b.meta.global_indexes)[~np.asarray(b["padding"])]
                           for b in loader])
    assert np.array_equal(np.sort(seen), np.arange(len(windows)))
    first = Loader(windows, batch_size, seed=3, output="batch", epochs=1, drop_last=False)
    steps = iter(first)
    head = [np.asarray(next(steps).meta.global_indexes) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    rest = []
    for rank in range(2):
        again = Loader(pickle.loads(pickle.dumps(ds)).windows(seq_len), batch_size // 2,
                       seed=3, rank=rank, world_size=2, output="batch", epochs=1,
                       drop_last=False)
        again.load_state_dict(state)
        rest += [np.asarray(b.meta.global_indexes)[~np.asarray(b["padding"])] for b in again]
    got = np.concatenate(head + rest)
    assert np.array_equal(np.sort(got), np.arange(len(windows)))


def upload(folder, s3, names=None) -> str:
    """The files of ``folder`` (or ``names`` of them) copied to a fresh prefix of
    moto's S3; returns its URL."""
    from zerobatch.storage import open_storage

    url = s3.url("peer")
    store = open_storage(url, **s3.storage_options())
    for path in sorted(folder.iterdir()):
        if path.is_file() and (names is None or path.name in names):
            store.put(path.name, path)
    store.close()
    return url


def check_same(local, remote, *, seq_len: int = 7) -> None:
    """``remote`` reads what ``local`` reads: windows (every column), documents."""
    assert (remote.num_tokens, remote.num_documents) == (local.num_tokens, local.num_documents)
    assert remote.describe().split("\n")[2:] == local.describe().split("\n")[2:]
    windows = local.windows(seq_len, columns="all")
    order = np.random.default_rng(1).permutation(len(windows))[:40]
    a, b = windows.read(order), remote.windows(seq_len, columns="all").read(order)
    assert a.fields == b.fields
    for name in a.fields:
        for part in ("values", "offsets") if hasattr(a[name], "offsets") else (None,):
            x, y = (a[name], b[name]) if part is None else (getattr(a[name], part),
                                                            getattr(b[name], part))
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    docs = np.arange(local.num_documents)[::-3]
    for x, y in zip(local.documents().read(docs)["input_ids"],
                    remote.documents().read(docs)["input_ids"], strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    check_each_once(remote)
