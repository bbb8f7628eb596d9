"""OLMo raw token arrays read in place: headerless .npy files with the dtype
given by the caller, documents from a Dolma-style .csv.gz or EOS tokens."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from support._peers import check_against, check_each_once

from zerobatch import FormatError, open_dataset

EOS = 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two raw uint32 files, as OLMo's memmaps are written (ndarray.tofile), each
    document ending in EOS; the first with a csv.gz of its documents."""
    folder = tmp_path_factory.mktemp("olmo")
    rng = np.random.default_rng(8)
    documents = []
    for part in range(2):
        docs = [np.append(rng.integers(1, 100_000, int(rng.integers(1, 30))), EOS)
                .astype(np.uint32) for _ in range(30)]
        np.concatenate(docs).tofile(folder / f"part-{part}-00000.npy")
        documents += docs
        if part == 0:
            ends = np.cumsum([len(d) for d in docs])
            lines = "".join(f"{a},{b},doc{i},src\n"
                            for i, (a, b) in enumerate(zip(ends - [len(d) for d in docs], ends,
                                                           strict=True)))
            (folder / "part-0-00000.csv.gz").write_bytes(gzip.compress(lines.encode()))
    return folder, documents


def test_windows_and_documents(corpus):
    folder, documents = corpus
    tokens = np.concatenate(documents)
    with open_dataset(folder, format="olmo", dtype="uint32", eos_id=EOS) as ds:
        assert ds.verify() == []
        check_against(ds, tokens, documents)
        check_each_once(ds)


def test_dtype_is_required_and_numpy_headers_refused(corpus, tmp_path):
    folder, _ = corpus
    with pytest.raises(ValueError, match="dtype="):
        open_dataset(folder, format="olmo")
    with pytest.raises(FormatError, match="eos_id"):
        open_dataset(folder, format="olmo", dtype="uint32")  # part 1 has no csv.gz
    np.save(tmp_path / "real.npy", np.arange(10, dtype=np.uint16))
    with pytest.raises(FormatError, match="NumPy header") as error:
        open_dataset(tmp_path, format="olmo", dtype="uint16", eos_id=0)
    assert error.value.field == "magic"
    (tmp_path / "real.npy").write_bytes(b"\x01\x00\x02")
    with pytest.raises(FormatError, match="whole number"):
        open_dataset(tmp_path, format="olmo", dtype="uint16", eos_id=0)


def test_a_csv_gz_that_lies(corpus, tmp_path):
    folder, _ = corpus
    target = tmp_path / "o"
    target.mkdir()
    (target / "a.npy").write_bytes((folder / "part-0-00000.npy").read_bytes())
    (target / "a.csv.gz").write_bytes(gzip.compress(b"0,5\n6,9\n"))
    with open_dataset(target, format="olmo", dtype="uint32") as ds:
        with pytest.raises(FormatError, match="tile"):
            ds.documents().read([0])
        assert [p.field for p in ds.verify()] == ["documents"]
    (target / "a.csv.gz").write_bytes(b"not gzip")
    with open_dataset(target, format="olmo", dtype="uint32") as ds, \
            pytest.raises(FormatError, match="gzip"):
        ds.windows(4, document_masking=True).read([0])  # documents need the csv.gz
