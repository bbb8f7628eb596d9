from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zerobatch import FormatError
from zerobatch.cli import main
from zerobatch.convert import ByteEncoder, convert, map_spans
from zerobatch.convert.encoders import HFEncoder
from zerobatch.stream import open_dataset
from zerobatch.stream.manifest import read_manifest

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "naïve café — ünïcödé ✓ 日本語",
    "class Foo:\n    def bar(self):\n        pass\n",
    "x" * 300,
    "tokens\nacross\nlines\n" * 5,
]


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXTS * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _documents(path: Path) -> tuple[list[list[int]], list[Any]]:
    with open_dataset(path) as ds:
        docs = ds.documents().read(np.arange(ds.num_documents))
        ids = docs["input_ids"]
        tokens = [ids[i].tolist() for i in range(len(ids))]
        meta = [m.tolist() for m in docs["metadata"]] if ds.has_metadata else []
    return tokens, meta


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_round_trip_jsonl_parquet_text(tmp_path: Path, tokenizer_file: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _jsonl(corpus / "a.jsonl", [{"text": t, "url": f"u{i}"} for i, t in enumerate(TEXTS[:3])])
    table = pa.table({"text": TEXTS[3:], "url": [f"p{i}" for i in range(3)]})
    pq.write_table(table, corpus / "b.parquet", row_group_size=2)
    texts = tmp_path / "texts"
    texts.mkdir()
    for i, t in enumerate(TEXTS[:2]):
        (texts / f"{i}.txt").write_text(t)
    result = convert([corpus, texts], tmp_path / "out", tokenizer=tokenizer_file,
                     workers=1, quiet=True)
    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("<|endoftext|>")
    tokens, _ = _documents(tmp_path / "out")
    expected = [[*tok.encode(t).ids, eos] for t in [*TEXTS, *TEXTS[:2]]]
    assert tokens == expected
    assert result.documents == 8 and result.tokens == sum(map(len, expected))
    manifest = read_manifest(tmp_path / "out")
    assert manifest.tokenizer is not None
    assert (manifest.tokenizer.name, manifest.tokenizer.eos_id) == ("tokenizer", eos)
    assert manifest.tokenizer.vocab_size == tok.get_vocab_size()
    assert manifest.token_dtype == np.dtype("<u2")
    assert not (tmp_path / ".out.convert").exists()


def test_compressed_jsonl_metadata_and_bytes(tmp_path: Path) -> None:
    rows = [{"text": t, "source": "s", "n": i} for i, t in enumerate(TEXTS)]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    convert(str(tmp_path / "*.jsonl.*"), tmp_path / "out", tokenizer="bytes",
            metadata_fields=["source", "n"], append_eos=False, workers=1, quiet=True)
    tokens, meta = _documents(tmp_path / "out")
    expected = [list(t.encode()) for t in TEXTS] * 2
    assert tokens == expected
    assert meta == [[(0, len(e), {"source": "s", "n": i % 6})] for i, e in enumerate(expected)]


def test_format_batch(tmp_path: Path) -> None:
    from zerobatch.batch_loader import BatchFileReader

    _jsonl(tmp_path / "a.jsonl", [{"text": t} for t in TEXTS])
    convert(tmp_path / "a.jsonl", tmp_path / "out.batch", tokenizer="bytes", format="batch",
            seq_len=16, batch_size=4, workers=1, quiet=True)
    stream = np.concatenate([np.append(np.frombuffer(t.encode(), np.uint8), 256)
                             for t in TEXTS]).astype(np.int64)
    with BatchFileReader(tmp_path / "out.batch") as reader:
        rows = np.concatenate([np.asarray(reader.read_batch(i))
                               for i in range(reader.num_batches)])
    records = stream[: len(stream) // 16 * 16].reshape(-1, 16)
    assert len(rows) == len(records) // 4 * 4
    assert not Counter(map(tuple, rows.tolist())) - Counter(map(tuple, records.tolist()))


def test_nested_spans_and_document_metadata(tmp_path: Path) -> None:
    text = "class A:\n  def f(self):\n    pass\n"
    f_start = text.index("def")
    spans = [{"start": 0, "end": len(text), "value": "A"},
             {"start": f_start, "end": len(text), "value": "A.f"},
             {"start": f_start, "end": f_start + 3, "value": "kw"}]
    _jsonl(tmp_path / "a.jsonl", [{"text": text, "path": "a.py", "spans": spans}])
    convert(tmp_path / "a.jsonl", tmp_path / "out", tokenizer="bytes", spans_field="spans",
            metadata_fields=["path"], workers=1, quiet=True)
    n = len(text)
    path = {"path": "a.py"}
    with open_dataset(tmp_path / "out") as ds:
        document = ds.documents().read([0])
        window = ds.windows(8, columns="all").read([1])  # tokens 8..16, "def" at 11
    assert document["metadata"][0] == [
        (0, n + 1, path), (0, n, "A"),  # the document's own metadata covers the EOS token too
        (f_start, n, "A.f"), (f_start, f_start + 3, "kw"),
    ]
    assert document["document_metadata"][0] == [(0, n + 1, path)]
    assert window["metadata"][0] == [(0, 8, path), (0, 8, "A"), (3, 8, "A.f"), (3, 6, "kw")]
    assert window["document_metadata"][0] == [(0, 8, path)]


@st.composite
def _annotated(draw: st.DrawFn) -> tuple[str, list[tuple[int, int, int]]]:
    text = draw(st.text(st.characters(codec="utf-8"), min_size=1, max_size=40))
    bounds = st.tuples(st.integers(0, len(text) - 1), st.integers(1, len(text)))
    pairs = draw(st.lists(bounds.filter(lambda p: p[0] < p[1]), max_size=5))
    return text, [(s, e, i) for i, (s, e) in enumerate(pairs)]


@settings(max_examples=60, deadline=None)
@given(_annotated())
def test_spans_map_to_the_tokens_that_cover_them(
    tokenizer_file: Path, case: tuple[str, list[tuple[int, int, int]]]
) -> None:
    text, spans = case
    hf = Tokenizer.from_file(str(tokenizer_file))
    for encoder in (ByteEncoder(), HFEncoder(hf, "t", None)):
        (enc,) = encoder.encode([text])
        if isinstance(encoder, HFEncoder):
            assert enc.ids.tolist() == hf.encode(text).ids
        (fast,) = encoder.encode([text], offsets=False)  # encode_batch_fast for HF
        assert fast.ids.tolist() == enc.ids.tolist() and fast.starts.size == 0
        mapped = {v: (a, b) for a, b, v in map_spans(spans, enc)}
        for start, end, value in spans:
            covering = [i for i in range(len(enc.ids))
                        if enc.starts[i] < end and enc.ends[i] > start]
            if not covering:
                assert value not in mapped
                continue
            a, b = mapped[value]
            assert list(range(a, b)) == covering
            assert enc.starts[a] <= start and enc.ends[b - 1] >= end


def _corpus(folder: Path, files: int = 6) -> list[Path]:
    folder.mkdir(exist_ok=True)
    out = []
    for f in range(files):
        rows = [{"text": f"doc {f}-{i} " + TEXTS[i % len(TEXTS)] * (1 + i % 3),
                 "spans": [{"start": 0, "end": 3, "value": i}]} for i in range(40)]
        out.append(_jsonl(folder / f"{f}.jsonl", rows))
    return out


def test_identical_with_one_and_two_workers(tmp_path: Path, tokenizer_file: Path) -> None:
    inputs = _corpus(tmp_path / "c")
    options: dict[str, Any] = dict(tokenizer=tokenizer_file, spans_field="spans",
                                   task_bytes=2000, shard_tokens=3000, quiet=True)
    one = convert(inputs, tmp_path / "one", workers=1, **options)
    convert(inputs, tmp_path / "two", workers=2, **options)
    assert one.tasks > 10 and len(read_manifest(tmp_path / "one").shards) > 10
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    assert one.documents == 240


def test_a_rerun_clears_only_shard_files(tmp_path: Path) -> None:
    """What a killed combine left (shard files: ASCII digits) goes; a user's
    file whose name is other digits to ``str.isdigit`` stays."""
    from zerobatch.convert.api import _clear_partial

    names = ["00000.tokens", "00001.docs", ".00002.tokens.tmp", "\u00b2" * 5 + ".tokens",
             "notes.txt"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    _clear_partial(tmp_path, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[3:])


def test_killed_convert_reruns_to_the_same_dataset(tmp_path: Path) -> None:
    rows = [{"text": t} for t in TEXTS * 3]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a", "b"):
        (inputs / f"{name}.jsonl.gz").write_bytes(gzip.compress(data))
    # A FIFO third input blocks the third task: the kill lands after two tasks, always.
    os.mkfifo(inputs / "c.jsonl.gz")
    files = [str(inputs / f"{name}.jsonl.gz") for name in "abc"]
    script = ("import sys; from zerobatch.convert import convert; "
              "convert(sys.argv[2:], sys.argv[1], tokenizer='bytes', workers=1, quiet=True)")
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "out"), *files])
    work = tmp_path / ".out.convert"
    deadline = time.monotonic() + 60
    while not (work / "task-000001").is_dir() and child.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not (tmp_path / "out" / "manifest.json").exists()
    (inputs / "c.jsonl.gz").unlink()
    (inputs / "c.jsonl.gz").write_bytes(gzip.compress(data))
    result = convert(files, tmp_path / "out", tokenizer="bytes", workers=1, quiet=True)
    assert result.tasks_resumed == 2
    convert(files, tmp_path / "fresh", tokenizer="bytes", workers=1, quiet=True)
    assert _files(tmp_path / "out") == _files(tmp_path / "fresh")


BAD = [
    ('{"text": "ok"}\n{"text": oops}\n', "line 2", "malformed JSON"),
    ('{"text": "ok"}\n\n{"body": "x"}\n', "line 3", "missing text field 'text'"),
    ('{"text": 5}\n', "line 1", "not a string"),
    ('{"text": "abc", "spans": [{"start": 1, "end": 9, "value": 0}]}\n', "line 1",
     "outside the text"),
    ('{"text": "abc", "spans": [{"start": 2, "end": 1, "value": 0}]}\n', "line 1",
     "ends before it starts"),
]


@pytest.mark.parametrize(("content", "where", "message"), BAD)
def test_bad_input_names_file_and_line(
    tmp_path: Path, content: str, where: str, message: str
) -> None:
    (tmp_path / "in.jsonl").write_text(content)
    with pytest.raises(FormatError, match=message) as error:
        convert(tmp_path / "in.jsonl", tmp_path / "out", tokenizer="bytes",
                spans_field="spans", workers=1, quiet=True)
    assert error.value.path == str(tmp_path / "in.jsonl") and error.value.field == where
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_bad_bytes_and_skip_bad_counts(tmp_path: Path) -> None:
    good = '{"text": "fine"}\n{"text": ""}\n'
    (tmp_path / "in.jsonl").write_bytes(
        good.encode() + b'{"text": "\xff\xfe"}\n' + "".join(c for c, _, _ in BAD).encode())
    with pytest.raises(FormatError, match="not UTF-8") as error:
        convert(tmp_path / "in.jsonl", tmp_path / "out", tokenizer="bytes", workers=1,
                quiet=True)
    assert error.value.field == "line 3"
    result = convert(tmp_path / "in.jsonl", tmp_path / "out2", tokenizer="bytes",
                     spans_field="spans", skip_bad=True, workers=1, quiet=True)
    assert (result.documents, result.skipped_bad, result.skipped_empty) == (3, 6, 1)


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize(("cut", "where", "message"), [
    (lambda z: z[: len(z) // 2], "line 1", "cut short"),  # truncated mid-frame
    (lambda z: z[:6], "line 1", "cut short"),  # a frame header alone
    (lambda z: b"", "line 1", "empty"),
    (lambda z: z + b"trailing garbage", "line 201", "not zstd, or corrupt"),  # after the frame
    (lambda z: z + z[:9], "line 201", "cut short"),  # a second frame, truncated
])
def test_corrupt_zstd_fails_the_convert(
    tmp_path: Path, cut: Callable[[bytes], bytes], where: str, message: str
) -> None:
    """A corrupt .zst once converted to an empty dataset with exit status 0:
    it fails, naming the file and the line where decompression stopped, or with
    skip_bad is counted as one bad record."""
    lines = b"".join(b'{"text": "line %d"}\n' % i for i in range(200))
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(cut(_zstd(lines)))
    with pytest.raises(FormatError, match=message) as error:
        convert(path, tmp_path / "out", tokenizer="bytes", workers=1, quiet=True)
    assert error.value.path == str(path) and error.value.field == where
    assert "--skip-bad" in str(error.value)
    assert not (tmp_path / "out" / "manifest.json").exists()
    result = convert(path, tmp_path / "skip", tokenizer="bytes", workers=1, quiet=True,
                     skip_bad=True)
    assert result.skipped_bad == 1
    assert result.documents == int(where.split()[1]) - 1


def test_concatenated_zstd_frames_read_whole(tmp_path: Path) -> None:
    lines = [b'{"text": "line %d"}\n' % i for i in range(300)]
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(_zstd(b"".join(lines[:100])) + _zstd(b"".join(lines[100:])))
    result = convert(path, tmp_path / "out", tokenizer="bytes", workers=1, quiet=True)
    assert (result.documents, result.skipped_bad) == (300, 0)


def test_unreadable_tokenizer_and_parquet(tmp_path: Path) -> None:
    (tmp_path / "tok.json").write_text("{not json")
    _jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    with pytest.raises(FormatError, match="cannot read the tokenizer") as error:
        convert(tmp_path / "a.jsonl", tmp_path / "out", tokenizer=tmp_path / "tok.json",
                quiet=True)
    assert error.value.path == str(tmp_path / "tok.json")
    (tmp_path / "b.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(FormatError, match="Parquet"):
        convert(tmp_path / "b.parquet", tmp_path / "out", tokenizer="bytes", quiet=True)
    with pytest.raises(FileNotFoundError, match=r"nothing\.jsonl"):
        convert(tmp_path / "nothing.jsonl", tmp_path / "out", tokenizer="bytes", quiet=True)


def test_hf_save_to_disk_folder(tmp_path: Path) -> None:
    import datasets  # the hf extra, installed by make test
    ds = datasets.Dataset.from_dict({"text": TEXTS, "k": list(range(len(TEXTS)))})
    ds.save_to_disk(str(tmp_path / "hf"))
    convert(tmp_path / "hf", tmp_path / "out", tokenizer="bytes", metadata_fields=["k"],
            workers=1, quiet=True)
    tokens, meta = _documents(tmp_path / "out")
    assert tokens == [[*t.encode(), 256] for t in TEXTS]
    assert [m[0][2] for m in meta] == [{"k": i} for i in range(len(TEXTS))]


def test_identical_on_a_dask_cluster(tmp_path: Path, tokenizer_file: Path) -> None:
    import distributed  # the dask extra, installed by make test
    inputs = _corpus(tmp_path / "c", files=3)
    convert(inputs, tmp_path / "local", tokenizer=tokenizer_file, spans_field="spans",
            task_bytes=2000, workers=1, quiet=True)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        address = cluster.scheduler_address.removeprefix("tcp://")
        assert main(["convert", *map(str, inputs), "-o", str(tmp_path / "dask"), "--tokenizer",
                     str(tokenizer_file), "--spans-field", "spans", "--task-mb",
                     str(2000 / 2**20), "--executor", f"dask://{address}", "--quiet"]) == 0
    assert len(list((tmp_path / "dask").iterdir())) > 10
    assert _files(tmp_path / "local") == _files(tmp_path / "dask")
