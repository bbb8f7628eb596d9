"""``convert`` with object-store URLs (moto S3 on loopback): inputs by glob,
prefix or list, output to an ``s3://`` dataset, byte-identical to local."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zerobatch.cli import main
from zerobatch.convert import convert
from zerobatch.errors import FormatError
from zerobatch.storage import ObjectStorage
from zerobatch.stream import open_dataset

TEXTS = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "héllo wörld ✓",
         "the quick brown fox jumps over the lazy dog " * 3]


def _corpus(folder: Path) -> list[Path]:
    """JSONL (plain and zstd), Parquet (two row groups) and text files, with spans."""
    folder.mkdir()
    rows = [{"text": f"{i}: {TEXTS[i % len(TEXTS)]}", "source": f"s{i % 3}",
             "spans": [{"start": 0, "end": 2, "value": i}, {"start": 1, "end": 4, "value": -i}]}
            for i in range(60)]
    lines = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (folder / "a.jsonl").write_bytes(lines)
    (folder / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.Table.from_pylist(rows[:20]), folder / "c.parquet", row_group_size=10)
    (folder / "sub").mkdir()
    (folder / "sub" / "d.txt").write_text(TEXTS[0] * 5)
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _upload(files: list[Path], root: Path, url: str, options: dict[str, Any]) -> None:
    store = ObjectStorage(url, **options)
    try:
        for path in files:
            store.put(path.relative_to(root).as_posix(), path)
    finally:
        store.close()


def _objects(url: str, options: dict[str, Any]) -> dict[str, bytes]:
    store = ObjectStorage(url, **options)
    try:
        return {name: store.map(name).tobytes() for name in store.names()}
    finally:
        store.close()


@pytest.fixture(scope="module")
def uploaded(s3, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], str]:
    root = tmp_path_factory.mktemp("convert-s3") / "corpus"
    files = _corpus(root)
    url = s3.url("corpus")
    _upload(files, root, url, s3.storage_options())
    return root, files, url


OPTIONS: dict[str, Any] = dict(tokenizer="bytes", metadata_fields=["source"],
                               spans_field="spans", task_bytes=1500, shard_tokens=2000,
                               quiet=True)


def test_s3_inputs_and_output_equal_local_bytes(s3, uploaded, tmp_path: Path) -> None:
    _, files, url = uploaded
    options = s3.storage_options()
    named = {f.name: f for f in files}
    cases = [  # remote inputs, the same files locally
        ([f"{url}/a.jsonl", f"{url}/b.jsonl.zst", f"{url}/c.parquet"],
         [named["a.jsonl"], named["b.jsonl.zst"], named["c.parquet"]]),
        (f"{url}/*.jsonl*", [named["a.jsonl"], named["b.jsonl.zst"]]),  # a glob
    ]
    for k, (inputs, same) in enumerate(cases):
        local = convert(same, tmp_path / f"local{k}", workers=2, **OPTIONS)
        assert local.tasks > 4  # byte ranges of a.jsonl (and row groups of c.parquet)
        out = s3.url("converted")
        result = convert(inputs, out, workers=2, storage_options=options, **OPTIONS)
        assert (result.documents, result.tokens) == (local.documents, local.tokens)
        assert _objects(out, options) == {
            p.name: p.read_bytes() for p in sorted((tmp_path / f"local{k}").iterdir())}
    with open_dataset(out, storage_options=options) as ds:
        assert ds.documents().read([0])["document_metadata"][0] == [
            (0, len(TEXTS[0]) + 4, {"source": "s0"})]  # "0: " + text + EOS


def test_a_prefix_reads_every_known_file_under_it(s3, uploaded, tmp_path: Path) -> None:
    root, _, url = uploaded
    options = s3.storage_options()
    local = convert(root, tmp_path / "local", workers=1, tokenizer="bytes", quiet=True)
    remote = convert(f"{url}/", tmp_path / "remote", workers=2, tokenizer="bytes", quiet=True,
                     storage_options=options)
    assert (remote.documents, remote.input_bytes) == (local.documents, local.input_bytes)
    assert remote.tasks == local.tasks > 4
    assert {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "remote").iterdir()}


def test_bad_remote_input_names_the_object_and_line(s3, tmp_path: Path) -> None:
    options = s3.storage_options()
    url = s3.url("bad")
    (tmp_path / "x.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    _upload([tmp_path / "x.jsonl"], tmp_path, url, options)
    with pytest.raises(FormatError, match=r"x\.jsonl.*line 2.*malformed JSON"):
        convert(f"{url}/x.jsonl", tmp_path / "out", tokenizer="bytes", workers=1, quiet=True,
                storage_options=options)
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        convert(f"{url}/missing.jsonl", tmp_path / "out2", tokenizer="bytes", workers=1,
                quiet=True, storage_options=options)
    with pytest.raises(ValueError, match="format='batch' writes a local"):
        convert(f"{url}/x.jsonl", s3.url("batch"), tokenizer="bytes", format="batch",
                seq_len=4, batch_size=2, quiet=True, storage_options=options)


def test_cli_converts_between_urls(s3, uploaded, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _, files, url = uploaded
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    out = s3.url("cli")
    assert main(["convert", f"{url}/a.jsonl", "-o", out, "--tokenizer", "bytes",
                 "--metadata-field", "source", "--workers", "1", "--quiet"]) == 0
    local = tmp_path / "local"
    convert([f for f in files if f.name == "a.jsonl"], local, tokenizer="bytes",
            metadata_fields=["source"], workers=1, quiet=True)
    assert _objects(out, s3.storage_options()) == {
        p.name: p.read_bytes() for p in sorted(local.iterdir())}
