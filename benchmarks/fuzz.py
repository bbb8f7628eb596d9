"""One fuzz driver for every zerobatch surface: mutated inputs must read or raise
``FormatError`` naming the file (or frame) and the field, within a small
multiple of their size in memory, without crashing or hanging.

Each surface is a ``Target`` in ``TARGETS``: a name, its valid seed inputs (a
mapping of file name to bytes; frames are named ``frame0``, ``frame1``, ...)
and a read function that takes a folder holding those files (or the mapping
itself, for in-memory readers). Register another with ``register``; a read
function turns its surface's contract into these outcomes (raise
``FormatError`` for an expected refusal, anything else is an escape).

Surfaces: the readers (``stream``, ``stream-s3``, ``stream-ranged`` (the
reader object storage gets, its ``RangedIndex`` walking offset and metadata
files by block, over local files: ``stream-s3`` without the server's cost per
input), ``llmbatch`` (with its
``verify``: a read failing where it passed is a false pass), ``frames``,
``batchmeta``, ``safetensors``, ``bintensors``, ``npy-folder``, ``npy-dtypes`` (with
``verify_npy`` for each output dtype)
and the peer formats ``megatron``, ``datatrove``, ``litdata``, ``hf``, ``mds``,
``mds-mapped`` (every file mapped, as large shards are), ``mds-bytes``);
``stream-sealed`` (token-stream datasets whose manifest
checksums are recomputed after each mutation, so ``verify``'s checks past the
checksum judge it: a read failing where ``verify`` passed is a false pass);
``cli`` (``zerobatch`` commands but ``serve``: exit 0, or one error line and a
non-zero exit); ``state-*`` (``load_state_dict`` of ``Loader``,
``BatchNativeLoader``, ``LoaderDataset``, its iterator,
``LoaderDataset.loader_state`` of a StatefulDataLoader state, ``BatchClient``
and ``ShardDataset``, then one step: ``ValueError`` is the contract); and the
service wire (``service``: FieldStore requests; ``batch-wire``: BatchServer
requests, its replies decoded as a client does).

Inputs are structure-aware mutations of the seeds (boundary integers at every
4- and 8-byte position of headers and offset tables, truncation at every
boundary, swapped, renamed, dropped and duplicated files, JSON and msgpack
headers edited field by field), then random ones (bit flips, byte writes,
splices, inserts, deletes). They run in forked children, many per child: a
child reports after each input, so a crash (the child dies), a hang (no report
after ``--timeout`` seconds of the child's CPU time plus ``--cpu-per-gib`` for
each GiB it read meanwhile, so a large valid input is not a hang; or
``--blocked`` seconds without using CPU or reading) or an allocation over
budget (``RLIMIT_AS`` set to the child's current size plus the budget; peak
RSS growth checked too) is attributed to one input, which is kept as a repro under ``--out``.

Outcomes per input: ``ok`` (read fine), ``format_error``, ``unnamed`` (a
FormatError without a file or field), ``escape`` (any other exception),
``false_pass`` (``verify`` found nothing but the read failed), ``crash``,
``hang``, ``alloc``.

Run::

    python benchmarks/fuzz.py --seconds 600 --out fuzz-out
    python benchmarks/fuzz.py --targets stream,frames --inputs 100000
    python benchmarks/fuzz.py --engine atheris --targets frames   # coverage-guided
    python benchmarks/fuzz.py --targets stream-s3 --inputs 5000   # starts moto on 127.0.0.1

Remote targets (``stream-s3``) read inputs uploaded to a moto S3 server on
127.0.0.1: the one named by ``ZEROBATCH_FUZZ_S3`` and the AWS variables, or one
the command line starts. obstore is not fork-safe once used, so such a target
runs in a spawned interpreter that warms up locally and forks the children,
and each child makes its own connections.

``--engine atheris`` (``pip install atheris``) drives one target in process
with libFuzzer, these mutators as its custom mutator, and libFuzzer's own
crash, timeout and ``-malloc_limit_mb`` checks.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import faulthandler
import functools
import gc
import hashlib
import http.client
import importlib
import io
import json
import multiprocessing
import os
import random
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import urllib.parse
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from zerobatch.errors import FormatError

Files = dict[str, bytes]
OUTCOMES = ("ok", "format_error", "error_reply", "unnamed", "escape", "false_pass", "crash",
            "hang", "alloc", "cold")
MIN_BUDGET = 512 << 20  # address space a child may add per input, at least (bytes)
RSS_FACTOR = 64  # and at most this many times the input's size of resident memory...
MIN_RSS = 96 << 20  # ...or this much, whichever is larger


@dataclass(frozen=True)
class Target:
    """A reader under test: ``read(folder, files)`` reads the input (written
    into ``folder`` when ``on_disk``) and raises on anything wrong."""

    name: str
    seeds: Callable[[], list[Files]]
    read: Callable[[Path, Files], None]
    on_disk: bool = True
    warm: Callable[[], list[Files]] = list
    """More valid inputs the parent reads before forking (beside the seeds), so
    children share what their first read compiles or imports."""
    refused: Callable[[], list[Files]] = list
    """Inputs the reader refuses with a ``FormatError``, read by the parent
    before forking too: the kernels of its error paths (a local MDS read that
    fails is read again by the scattered path, which valid inputs never take)."""
    remote: Callable[[Path, Files], None] | None = None
    """For a reader of object storage, the local reader of the same format: the
    parent warms up with it (obstore is not fork-safe once used), and the target
    runs in a spawned process whose forked children are the first to use S3."""


TARGETS: dict[str, Target] = {}


def register(target: Target) -> Target:
    """Add a reader to ``TARGETS`` (replaces one of the same name)."""
    TARGETS[target.name] = target
    return target


class FalsePass(Exception):
    """``verify`` found no problem in a dataset whose read failed."""


class ErrorReply(Exception):
    """A server answered a request with an error reply (a ValueError, KeyError,
    TypeError or IndexError its handler raised and the server caught)."""


# ----------------------------------------------------------------- seeds and readers


def _folder_files(folder: Path) -> Files:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _stream_seeds() -> list[Files]:
    from zerobatch.stream import StreamWriter

    rng = np.random.default_rng(0)
    seeds = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (metadata, fields, shard_tokens) in enumerate([
            ("msgpack", {"mask": "u1"}, 40), (None, None, 30), ("json", None, 1000),
            ("numpy", {"w": "<f4"}, 50),
        ]):
            folder = Path(tmp) / str(k)
            with StreamWriter(folder, metadata=metadata, fields=fields,
                              shard_tokens=shard_tokens, token_dtype="<u4" if k % 2 else "<u2",
                              tokenizer={"name": "t", "vocab_size": 50000}) as writer:
                for d in range(6):
                    n = int(rng.integers(1, 25))
                    value = np.arange(3, dtype="<i4") if metadata == "numpy" else {"d": d}
                    writer.add_document(  # nested and overlapping spans, some document metadata
                        rng.integers(0, 50000, n),
                        metadata=value if metadata and d % 2 else None,
                        spans=[(0, max(1, n // 2), value), (0, n, value),
                               (n // 3, n, value)] if metadata else None,
                        fields={name: np.ones(n, dt) for name, dt in (fields or {}).items()},
                    )
            seeds.append(_folder_files(folder))
    return seeds


_V1 = Path(__file__).resolve().parents[1] / "tests" / "data" / "stream-v1-metadata"
"""A dataset written by a version-1 writer (metadata without span files)."""


def _stream_warm() -> list[Files]:
    """Each seed's manifest with no shards: the empty-dataset kernels compile once,
    in the parent; and a version-1 dataset, whose metadata reads run other
    kernels (a seed's manifest edited to version 1 reaches them)."""
    warm = []
    for seed in _stream_seeds():
        manifest = json.loads(seed["manifest.json"])
        warm.append({"manifest.json": json.dumps({**manifest, "shards": []}).encode()})
    if _V1.is_dir():
        warm.append(_folder_files(_V1))
    return warm


def _read_stream(folder: Path, files: Files) -> None:
    _read_stream_at(folder, files)


def _read_stream_at(
    location: Path | str, files: Files, options: dict[str, Any] | None = None,
    storage: Any = None,
) -> None:
    from zerobatch import stream

    manifest = files.get("manifest.json", b"")
    metadata = "numpy" if b'"numpy"' in manifest else None
    try:
        with stream.open_dataset(location, metadata=metadata, storage_options=options,
                                 storage=storage) as ds:
            windows = ds.windows(4)
            for batch in (windows.read(np.arange(len(windows))),
                          ds.documents().read(np.arange(ds.num_documents))):
                for column in ("metadata", "document_metadata"):
                    if column in batch:
                        for spans in batch[column]:
                            list(spans)
    except FormatError as error:
        if not stream.verify(location, metadata=metadata, storage_options=options):
            raise FalsePass(str(error)) from error
        raise
    stream.verify(location, metadata=metadata, storage_options=options)


class _RangedFiles:
    """Local files read the way object storage reads them: not a
    ``LocalStorage`` (so a dataset takes its remote path), with a
    ``BlockCache`` (so its index is the ``RangedIndex`` that walks the offset
    and metadata files by block, as over ``s3://``). The format parsing of
    ``stream-s3`` without a server: what one input costs is its reads."""

    def __init__(self, folder: Path) -> None:
        from zerobatch.storage import LocalStorage
        from zerobatch.storage.blocks import BlockCache

        self._files = LocalStorage(folder, method="pread")
        self._folder = folder
        self.blocks = BlockCache(self, block_size=64)  # small blocks: many block edges

    def url_of(self, name: str) -> str:
        return str(self._folder / name)

    def version(self, name: str) -> str:
        return f"{self.url_of(name)}\0{self.size(name)}"

    def size(self, name: str) -> int:
        return self._files.size(name)

    def open(self, name: str) -> int:
        return self._files.open(name)

    def read_into(self, *args: Any) -> int:
        return self._files.read_into(*args)

    def readinto(self, handle: int, offset: int, buffer: Any) -> int:
        return self._files.readinto(handle, offset, buffer)

    def map(self, name: str) -> Any:
        return self._files.map(name)  # object storage: the whole object by one GET

    def close(self) -> None:
        self._files.close()


def _read_stream_ranged(folder: Path, files: Files) -> None:
    _read_stream_at(folder, files, storage=_RangedFiles(folder))


S3_ENV = "ZEROBATCH_FUZZ_S3"
"""The bucket (``s3://name``) remote targets write their inputs into. The
endpoint and keys come from the AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...), as ``tests/support/s3_server.py``'s ``S3Server.env()``
gives them for a moto server on 127.0.0.1."""

_S3_OPTIONS = {  # fail fast: a slow answer is the server's, not the reader's
    "client_options": {"allow_http": True, "timeout": "5s", "connect_timeout": "1s"},
    "retry_config": {"max_retries": 2, "retry_timeout": dt.timedelta(seconds=5),
                     "backoff": {"init_backoff": dt.timedelta(milliseconds=5),
                                 "max_backoff": dt.timedelta(milliseconds=50), "base": 2}},
}


_PLACEHOLDER_AUTH = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, " \
    "SignedHeaders=host, Signature=0"


class _Prefix:
    """A prefix of the ``S3_ENV`` bucket, one per process, holding the previous
    input: ``put`` uploads only the objects that changed and deletes the ones
    gone, by plain HTTP to the endpoint with a placeholder signature (moto
    checks none; the reader under test signs its own requests)."""

    def __init__(self) -> None:
        endpoint = urllib.parse.urlparse(os.environ["AWS_ENDPOINT_URL"])
        bucket = os.environ[S3_ENV].removeprefix("s3://").strip("/")
        self.pid = os.getpid()
        self.path = f"/{bucket}/fuzz-{self.pid}-{time.monotonic_ns()}"
        self.url = f"s3:/{self.path}"
        self._connection = http.client.HTTPConnection(endpoint.hostname or "", endpoint.port,
                                                      timeout=10)
        self._held: Files = {}

    def _request(self, method: str, name: str, body: bytes | None = None) -> None:
        self._connection.request(method, f"{self.path}/{urllib.parse.quote(name)}", body=body,
                                 headers={"Authorization": _PLACEHOLDER_AUTH})
        response = self._connection.getresponse()
        response.read()
        if response.status >= 300:
            raise RuntimeError(f"fuzz harness: {method} {name!r} answered {response.status}")

    def put(self, files: Files) -> None:
        """Make the prefix hold exactly ``files``."""
        for name in [n for n in self._held if files.get(n) is not self._held[n]]:
            self._request("DELETE", name)
            del self._held[name]
        for name, data in files.items():
            if name not in self._held:
                self._request("PUT", name, data)
                self._held[name] = data


_PREFIX: list[_Prefix] = []  # this process's, created on first use


def _read_stream_s3(folder: Path, files: Files) -> None:
    if not _PREFIX or _PREFIX[0].pid != os.getpid():  # a forked child makes its own
        _PREFIX[:] = [_Prefix()]
    _PREFIX[0].put(files)
    _read_stream_at(_PREFIX[0].url, files, _S3_OPTIONS)


def _batch_seeds() -> list[Files]:
    from zerobatch.batch_writer import write_batch_dataset, write_batch_file

    tokens = np.arange(60 * 8, dtype=np.uint32).reshape(60, 8)
    with tempfile.TemporaryDirectory() as tmp:
        write_batch_file(Path(tmp) / "a.batch", tokens, 4, 8, 3)
        write_batch_file(Path(tmp) / "b.batch", tokens[:7].astype(np.uint16), 2, 8, 1,
                         dtype="uint16")
        single = [{"data.batch": (Path(tmp) / n).read_bytes()} for n in ("a.batch", "b.batch")]
        write_batch_dataset(Path(tmp) / "s", iter(tokens), 60, 4, 8, 3, batches_per_shard=5)
        return [*single, _folder_files(Path(tmp) / "s")]


def _read_batch(folder: Path, files: Files) -> None:
    from zerobatch.batch_loader import BatchFileReader, is_batch_file
    from zerobatch.llmbatch.verify import verify

    path = folder if "manifest.json" in files else folder / next(iter(files), "data.batch")
    is_batch_file(path)
    try:
        with BatchFileReader(path) as reader:
            for i in range(len(reader)):
                int(np.asarray(reader.read_batch(i), dtype=np.int64).sum())
            reader.fingerprint  # noqa: B018  (reads the first and last batches)
    except FormatError as error:
        if not verify(path):
            raise FalsePass(str(error)) from error
        raise
    verify(path)


def _columnar_batch() -> Any:
    from zerobatch.columnar import Batch, Jagged

    return Batch.from_columns({
        "x": np.arange(12, dtype=np.int32).reshape(3, 4),
        "j": Jagged(np.arange(5, dtype=np.float32), np.array([0, 2, 2, 5])),
        "o": ["a", {"k": 1}, None],
        "m": np.ones((3, 2, 2), dtype=np.uint8),
    })


def _frame_seeds() -> list[Files]:
    frames = _columnar_batch().to_frames()
    return [{f"frame{i}": bytes(memoryview(f)) for i, f in enumerate(frames)}]


def _frames(files: Files) -> list[bytes]:
    names = sorted((k for k in files if k.startswith("frame") and k[5:].isdigit()),
                   key=lambda k: int(k[5:]))
    return [files[k] for k in names]


def _read_frames(folder: Path, files: Files) -> None:
    from zerobatch.columnar import Batch

    batch = Batch.from_frames(_frames(files))
    for name in batch.fields:
        column = batch[name]
        len(column)


def _meta_seeds() -> list[Files]:
    return [{"meta": _columnar_batch().meta.to_bytes()}]


def _read_meta(folder: Path, files: Files) -> None:
    from zerobatch.columnar import BatchMeta

    meta = BatchMeta.from_bytes(files.get("meta", b""))
    meta.select(np.arange(len(meta)))


def _tensor_seeds(fmt: str) -> Callable[[], list[Files]]:
    def seeds() -> list[Files]:
        import zerobatch.tensors as zt

        tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                   "b": np.arange(3, dtype=np.int64), "e": np.zeros((0, 2), np.float16)}
        return [{"t": zt.save(tensors, {"k": "v"}, format=fmt)},
                {"t": zt.save({"x": np.zeros(2, np.uint8)}, format=fmt)}]
    return seeds


def _read_tensors(folder: Path, files: Files) -> None:
    import zerobatch.tensors as zt

    for array in zt.load_file(folder / "t").values():
        np.asarray(array).sum()


def _npy_seeds() -> list[Files]:
    out = {}
    for i, n in enumerate((10, 7, 1)):
        buffer = io.BytesIO()
        np.save(buffer, np.arange(n, dtype="<u2"))
        out[f"{i:05d}.npy"] = buffer.getvalue()
    return [out]


def _read_npy(folder: Path, files: Files) -> None:
    from zerobatch import stream

    with stream.open_dataset(folder) as tokens:
        windows = tokens.windows(3)
        windows.read(np.arange(len(windows)))


def _service_seeds() -> list[Files]:
    from zerobatch.service._transport import encode_header

    frames = _columnar_batch().to_frames()
    indexes = np.array([0, 2], dtype="<i8").tobytes()
    requests = [
        ({"op": "put", "partition": "p"}, frames),
        ({"op": "get_meta", "fields": ["x", "j"], "batch_size": 2, "partition": "p",
          "task": "t"}, []),
        ({"op": "get", "fields": ["x", "o"], "indexes": indexes, "partition": "p"}, []),
        ({"op": "clear", "partition": "p"}, []),
    ]
    return [{f"frame{i}": bytes(memoryview(f))
             for i, f in enumerate([encode_header({"id": 1, **header}), *payload])}
            for header, payload in requests]


def _read_service(folder: Path, files: Files) -> None:
    """A FieldStoreServer's request path without the socket: header, id, handler
    on a table holding one partition."""
    from zerobatch.service._transport import parse_header
    from zerobatch.service.fieldstore import FieldTable, _handle

    table = FieldTable(max_samples=64)
    table.put(_columnar_batch(), "p")
    frames = _frames(files)
    if not frames:
        raise FormatError("empty message: expected a header frame", path="header", field="v")
    header = parse_header(frames[0])
    try:
        _handle(table)(header, [memoryview(f) for f in frames[1:]])
    except FormatError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as error:  # what the server answers
        raise ErrorReply(f"{type(error).__name__}: {error}") from error


for _target in (
    Target("stream", _stream_seeds, _read_stream, warm=_stream_warm),
    Target("stream-s3", _stream_seeds, _read_stream_s3, on_disk=False, warm=_stream_warm,
           remote=_read_stream),
    Target("stream-ranged", _stream_seeds, _read_stream_ranged, warm=_stream_warm),
    Target("llmbatch", _batch_seeds, _read_batch),
    Target("frames", _frame_seeds, _read_frames, on_disk=False),
    Target("batchmeta", _meta_seeds, _read_meta, on_disk=False),
    # load_file sniffs either format: each target warms up with both (a mutated
    # header may read as the other's)
    Target("safetensors", _tensor_seeds("safetensors"), _read_tensors,
           warm=_tensor_seeds("bintensors")),
    Target("bintensors", _tensor_seeds("bintensors"), _read_tensors,
           warm=_tensor_seeds("safetensors")),
    Target("npy-folder", _npy_seeds, _read_npy),
    Target("service", _service_seeds, _read_service, on_disk=False),
):
    register(_target)


# ------------------------------------------------ peer formats (zerobatch.peers)
# Seeds are written by each peer's own package (megatron-core, datatrove,
# litdata, datasets), imported in the parent only.


def _megatron_seeds() -> list[Files]:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(0)
    seeds = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, dtype in enumerate((np.uint16, np.int32)):
            folder = Path(tmp) / str(k)
            folder.mkdir()
            for part in range(2):
                builder = IndexedDatasetBuilder(str(folder / f"p{part}.bin"), dtype=dtype)
                for _ in range(4):
                    for _ in range(int(rng.integers(1, 3))):
                        builder.add_item(torch.from_numpy(rng.integers(0, 5000, 9)))
                    builder.end_document()
                builder.finalize(str(folder / f"p{part}.idx"))
            seeds.append(_folder_files(folder))
    return seeds


def _datatrove_seeds() -> list[Files]:
    from datatrove.pipeline.tokens.tokenizer import TokenizedFile

    rng = np.random.default_rng(1)
    seeds = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in (2, 4):
            folder = Path(tmp) / str(size)
            for part in range(2):
                file = TokenizedFile(str(folder), f"{part}.ds", save_loss_metadata=True,
                                     token_size=size, save_final_metadata=True)
                for _ in range(4):
                    tokens = rng.integers(0, 5000, int(rng.integers(1, 9))).tolist()
                    file.write(tokens, rng.random(len(tokens)) < 0.5)
                file.close()
            seeds.append(_folder_files(folder))
    return seeds


def _litdata_seeds() -> list[Files]:
    """Chunks by litdata's BinaryWriter, the writer ``optimize`` runs in its workers."""
    import torch
    from litdata import TokensLoader
    from litdata.streaming.writer import BinaryWriter

    with tempfile.TemporaryDirectory() as tmp:
        writer = BinaryWriter(tmp, chunk_size=40, item_loader=TokensLoader())
        for k in range(18):
            writer[k] = torch.arange(k, k + 5 + k % 3, dtype=torch.int32)
        writer.done()
        writer.merge()
        return [_folder_files(Path(tmp))]


def _hf_seeds() -> list[Files]:
    import datasets

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    rows = [list(range(i, i + 1 + i % 5)) for i in range(30)]
    with tempfile.TemporaryDirectory() as tmp:
        datasets.Dataset.from_dict({"input_ids": rows}, features=features).save_to_disk(tmp)
        return [_folder_files(Path(tmp))]


def _mds_seeds() -> list[Files]:
    """Shards by mosaicml-streaming's own MDSWriter, run in its separate
    environment (tests/support/mds_env.py, built once): tokens alone (dynamic
    shape, several shards), tokens after fixed and variable columns, and a
    fixed shape."""
    return _mds_written()[:3]


def _mds_bytes_seeds() -> list[Files]:
    """MDSWriter's shards of int64 tokens in a bytes column (read with dtype=)."""
    return _mds_written()[3:]


@functools.cache
def _mds_written() -> tuple[Files, ...]:
    """The four MDS seed datasets, written by one run of MDS's environment."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "mds_env", Path(__file__).resolve().parents[1] / "tests" / "support" / "mds_env.py")
    assert spec is not None and spec.loader is not None
    mds_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mds_env)
    rng = np.random.default_rng(2)
    layouts = ({"tokens": "ndarray:uint16"}, {"id": "int64", "text": "str", "tokens":
                                              "ndarray:int32"}, {"tokens": "ndarray:uint32:4"},
               {"id": "int64", "tokens": "bytes"})
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for k, columns in enumerate(layouts):
            arrays = {}
            for i in range(6):
                arrays[f"tokens.{i}"] = rng.integers(
                    0, 5000, 4 if k == 2 else int(rng.integers(0 if k == 3 else 1, 9))).astype(
                    "int64" if k == 3 else columns["tokens"].split(":")[1])
                arrays[f"id.{i}"], arrays[f"text.{i}"] = np.array(i), np.array("ab"[:i % 3])
            np.savez(Path(tmp) / f"{k}.npz", **arrays)
            jobs.append({"out": str(Path(tmp) / str(k)), "columns": columns, "size_limit": 200,
                         "npz": str(Path(tmp) / f"{k}.npz"), "samples": 6})
        (Path(tmp) / "jobs.json").write_text(json.dumps({"write": jobs}))
        mds_env.run("jobs", str(Path(tmp) / "jobs.json"))
        return tuple(_folder_files(Path(tmp) / str(k)) for k in range(len(layouts)))


def _mds_refused(seeds: Callable[[], list[Files]], **options: Any) -> Callable[[], list[Files]]:
    """Each of ``seeds`` with its first sample's header made to lie (a 2-D
    shape; the offsets-table entry of a fixed-size sample): reads refuse it
    only once they read that sample."""
    def refused() -> list[Files]:
        from zerobatch import open_dataset

        out = []
        for files in seeds():
            with tempfile.TemporaryDirectory() as tmp:
                for name, data in files.items():
                    (Path(tmp) / name).write_bytes(data)
                with open_dataset(tmp, format="mds", **options) as ds:
                    mds = ds.files
                    shard = next(i for i, s in enumerate(mds.shards) if s.records)
                    name = mds.shards[shard].tokens
                    _, _, value, head, _ = mds.table(shard).sample(0)
                    raw = bytearray(files[name])
                    if head:  # the shape header's ndim byte
                        at = value - head
                        raw[at] = 2 << 2 | (raw[at] & 3)
                    else:  # sample 0's end in the offsets table
                        raw[8:12] = (int.from_bytes(raw[8:12], "little") + 1).to_bytes(4, "little")
            out.append({**files, name: bytes(raw)})
        return out
    return refused


def _read_peer(format: str, **options: Any) -> Callable[[Path, Files], None]:
    def read(folder: Path, files: Files) -> None:
        from zerobatch import open_dataset

        with open_dataset(folder, format=format, **options) as ds:
            try:
                windows = ds.windows(4)
                windows.read(np.arange(len(windows)))
                masked = ds.windows(3, document_masking=True)  # offsets looked up per batch
                masked.read(np.arange(len(masked)))
                ds.documents().read(np.arange(ds.num_documents))
            except FormatError as error:
                if not ds.verify():
                    raise FalsePass(str(error)) from error
                raise
            ds.verify()
    return read


def _read_mapped(read: Callable[[Path, Files], None]) -> Callable[[Path, Files], None]:
    """``read`` with every non-empty file mapped (``MAP_FROM`` 1 byte): the
    small seeds are otherwise read by ``pread``, and the MDS kernels check a
    mapped shard's sample headers in place."""
    def mapped(folder: Path, files: Files) -> None:
        from zerobatch.storage import local

        saved, local.MAP_FROM = local.MAP_FROM, 1
        try:
            read(folder, files)
        finally:
            local.MAP_FROM = saved
    return mapped


def _read_hf_ranged(folder: Path, files: Files) -> None:
    """The HF reader that object storage gets (message headers walked by range,
    ``peers.arrow_ipc``), run over the local files."""
    from zerobatch.peers import PeerDataset
    from zerobatch.peers._base import Location
    from zerobatch.peers.hf import HFFiles
    from zerobatch.storage import LocalStorage

    storage = LocalStorage(folder)
    location = Location(str(folder), storage, tuple(sorted(os.listdir(folder))), None)
    with PeerDataset(HFFiles(location, {})) as ds:
        try:
            masked = ds.windows(3, document_masking=True)
            masked.read(np.arange(len(masked)))
            ds.documents().read(np.arange(ds.num_documents))
        except FormatError as error:
            if not ds.verify():
                raise FalsePass(str(error)) from error
            raise
        ds.verify()


PEERS = ("megatron", "datatrove", "litdata", "hf", "hf_ranged", "mds", "mds-mapped",
         "mds-bytes")
for _target in (
    Target("hf_ranged", _hf_seeds, _read_hf_ranged),
    Target("megatron", _megatron_seeds, _read_peer("megatron")),
    Target("datatrove", _datatrove_seeds, _read_peer("datatrove")),
    Target("litdata", _litdata_seeds, _read_peer("litdata")),
    Target("hf", _hf_seeds, _read_peer("hf")),
    Target("mds", _mds_seeds, _read_peer("mds"), refused=_mds_refused(_mds_seeds)),
    Target("mds-mapped", _mds_seeds, _read_mapped(_read_peer("mds")),
           refused=_mds_refused(_mds_seeds)),
    Target("mds-bytes", _mds_bytes_seeds, _read_peer("mds", dtype="int64"),
           refused=_mds_refused(_mds_bytes_seeds, dtype="int64")),
):
    register(_target)


# ----------------------------------------------------------------- verify with checksums kept


def _reseal(folder: Path, files: Files) -> None:
    """Give the manifest in ``folder`` each file's real checksum (when the
    manifest still parses as one), so ``verify``'s checks past the checksum
    are what judges the input: a read that fails where ``verify`` passes is a
    false pass."""
    import xxhash

    try:
        manifest = json.loads(files.get("manifest.json", b""))
        for shard in manifest["shards"]:
            for suffix, entry in shard["files"].items():
                data = files.get(f"{shard['name']}.{suffix}")
                if data is not None and isinstance(entry, dict):
                    entry["xxh3_64"] = xxhash.xxh3_64_hexdigest(data)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return
    (folder / "manifest.json").write_bytes(json.dumps(manifest).encode())
    files["manifest.json"] = (folder / "manifest.json").read_bytes()


def _read_stream_sealed(folder: Path, files: Files) -> None:
    _reseal(folder, files)
    _read_stream_at(folder, files)


# ----------------------------------------------------------------- the command line


def _cli_seeds() -> list[Files]:
    """Inputs of every ``zerobatch`` command but ``serve`` (it never returns):
    ``argv.json`` (the arguments; ``{dir}`` is the input folder) and the files."""
    import zstandard

    from zerobatch.batch_writer import write_batch_file

    lines = b"".join(json.dumps({"text": f"doc {i} " * (i % 5 + 1), "url": f"u{i}",
                                 "spans": [{"start": 0, "end": 3, "value": i}]}).encode()
                     + b"\n" for i in range(12))
    convert = ["convert", "{dir}/in.jsonl", "-o", "{dir}/out", "--tokenizer", "bytes",
               "--workers", "1", "--quiet", "--metadata-field", "url"]
    seeds: list[Files] = [
        {"argv.json": json.dumps(convert).encode(), "in.jsonl": lines},
        {"argv.json": json.dumps([*convert[:1], "{dir}/in.jsonl.zst", *convert[2:],
                                  "--spans-field", "spans"]).encode(),
         "in.jsonl.zst": zstandard.ZstdCompressor().compress(lines)},
        {"argv.json": json.dumps([*convert, "--format", "batch", "--seq-len", "8",
                                  "--batch-size", "2", "--seed", "3"]).encode(),
         "in.jsonl": lines},
    ]
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "doc": 1, "</s>": 2, **{
        str(i): 3 + i for i in range(12)}}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    seeds.append({"argv.json": json.dumps([*convert[:5], "{dir}/tok.json",
                                           *convert[6:]]).encode(),
                  "in.jsonl": lines, "tok.json": words.to_str().encode()})
    for stream_seed in _stream_seeds()[:2]:
        for argv in (["verify", "{dir}"], ["inspect", "{dir}"],
                     ["bench", "{dir}", "--seq-len", "4", "--batch-size", "2", "--seconds",
                      "0.01"]):
            seeds.append({"argv.json": json.dumps(argv).encode(), **stream_seed})
    with tempfile.TemporaryDirectory() as tmp:
        write_batch_file(Path(tmp) / "a.batch", np.arange(64, dtype=np.uint32).reshape(8, 8),
                         2, 8, 1)
        seeds.append({"argv.json": b'["inspect", "{dir}/a.batch"]',
                      "a.batch": (Path(tmp) / "a.batch").read_bytes()})
    for fmt in ("safetensors", "bintensors"):  # inspect sniffs a mutated .batch as either
        seeds.append({"argv.json": b'["inspect", "{dir}/t"]', **_tensor_seeds(fmt)()[0]})
    return seeds


def _cli_warm() -> list[Files]:
    """A convert with its progress bar (the seeds pass ``--quiet``): an input
    that drops the flag draws tqdm's first bar, which imports
    ``multiprocessing.synchronize`` (its write lock)."""
    seed = _cli_seeds()[0]
    argv = [a for a in json.loads(seed["argv.json"]) if a != "--quiet"]
    return [{**seed, "argv.json": json.dumps(argv).encode()}]


_PARSERS: dict[Callable[[], Any], Any] = {}  # zerobatch's argument parser, built once


@contextlib.contextmanager
def _cli_repeats_once() -> Iterator[None]:
    """While inside, ``zerobatch.cli.main`` reuses one argument parser and
    ``bench`` times one pass per reader instead of three.

    Both were most of the CPU of a CLI input and neither depends on it: ``main``
    builds its parser (every command and option: argparse's and gettext's
    work) anew on each call, though the parser does not depend on the
    arguments and parsing never changes it (a fresh namespace per call;
    ``append`` options copy their default); ``bench``'s second and third passes
    read the same batches of the same dataset again (a fresh iterator with the
    same seed). The originals are put back after each input: other users of
    the modules see them untouched."""
    cli: Any = importlib.import_module("zerobatch.cli")
    bench: Any = importlib.import_module("zerobatch.tools.bench")  # not the function bench()
    build, rates = cli._build_parser, bench.rates
    parser = _PARSERS.get(build)
    if parser is None:
        parser = _PARSERS[build] = build()
    cli._build_parser = lambda: parser
    bench.rates = functools.partial(rates, passes=1)
    try:
        yield
    finally:
        cli._build_parser, bench.rates = build, rates


def _read_cli(folder: Path, files: Files) -> None:
    """``zerobatch.cli.main`` on the input: the contract is exit status 0, or a
    non-zero one with exactly one line on stderr saying what is wrong (argparse's
    usage errors: status 2, its usage and one error line). A traceback, an
    exception out of ``main`` or several lines is an escape."""
    from zerobatch.cli import main

    try:
        argv = json.loads(files.get("argv.json", b""))
    except (ValueError, RecursionError):
        raise FormatError("not JSON", path="argv.json", field="argv") from None
    if not isinstance(argv, list) or not argv:
        raise FormatError("not a list of arguments", path="argv.json", field="argv")
    argv = [str(a).replace("{dir}", str(folder)) for a in argv]
    if argv and argv[0] == "serve":
        raise FormatError("serve never returns: not run", path="argv.json", field="argv")
    if any(".." in a or (a.startswith("/") and not a.startswith(str(folder))) for a in argv):
        raise FormatError("not run: names a path outside the input folder", path="argv.json",
                          field="argv")
    for i in range(1, len(argv)):  # bench runs as long as asked: a short while here
        with contextlib.suppress(ValueError, OverflowError):
            if argv[i - 1] == "--seconds" and float(argv[i]) > 0.002:
                argv[i] = "0.002"
    for name in ("out", ".out.convert", "cwd"):  # what the previous input wrote
        shutil.rmtree(folder / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            (folder / name).unlink()  # a .batch file
    (folder / "cwd").mkdir()
    err, out = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(folder / "cwd")  # relative paths land in the input folder
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), \
                _cli_repeats_once():
            try:
                status = main(argv)
            except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
                status = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os.chdir(here)
    lines = [line for line in err.getvalue().strip().splitlines()
             if not line.startswith("convert: ")]  # convert's progress bar, without --quiet
    if "Traceback" in err.getvalue():
        raise CliEscape(f"status {status}, a traceback: {lines[-1] if lines else ''}")
    if status == 0:
        return
    if argv[0] == "verify" and status == 1 and not lines and "problem(s)" in out.getvalue():
        raise FormatError(out.getvalue().splitlines()[1], path="argv.json", field="verify")
    if status == 2:
        lines = [line for line in lines if not line.startswith(("usage:", " "))]
    if len(lines) != 1 or not lines[0].startswith("zerobatch"):
        raise CliEscape(f"status {status} with {len(lines)} error lines: {lines[:3]}")
    raise FormatError(lines[0], path="argv.json", field=argv[0] if argv else "argv")


class CliEscape(Exception):
    """The command line broke its contract (see ``_read_cli``)."""


# ----------------------------------------------------------------- load_state_dict


_DATA: dict[int, Path] = {}  # per process: the data the state targets read


def _state_data() -> Path:
    """A token-stream dataset, a ``.batch`` file and a ``.npy`` split, made once
    per process tree (children read the parent's)."""
    if not _DATA:
        import atexit

        from zerobatch.batch_writer import write_batch_file
        from zerobatch.stream import StreamWriter

        root = Path(tempfile.mkdtemp(prefix="zbfuzz-state-", dir=_scratch()))
        atexit.register(shutil.rmtree, root, True)
        rng = np.random.default_rng(5)
        with StreamWriter(root / "ds", shard_tokens=100) as writer:
            for _ in range(20):
                writer.add_document(rng.integers(0, 1000, int(rng.integers(5, 30))))
        write_batch_file(root / "a.batch", np.arange(40 * 8, dtype=np.uint32).reshape(40, 8),
                         4, 8, 1)
        (root / "train").mkdir()
        for i in range(2):
            np.save(root / "train" / f"{i:05d}.npy", np.arange(300, dtype=np.uint16) + i)
        _DATA[0] = root
    return _DATA[0]


def _loader() -> Any:
    from zerobatch.loader import Loader
    from zerobatch.stream import open_dataset

    source = open_dataset(_state_data() / "ds").windows(8)
    return Loader(source, 4, seed=3, num_threads=0, output="numpy", epochs=2)


def _state_loader(state: Any) -> None:
    loader = _loader()
    loader.load_state_dict(state)
    next(iter(loader), None)


def _state_batch_loader(state: Any) -> None:
    from zerobatch.llmbatch import BatchNativeLoader

    loader = BatchNativeLoader(_state_data() / "a.batch", block_size=2, seed=7,
                               output="numpy")
    loader.load_state_dict(state)
    next(iter(loader), None)


def _state_loader_dataset(state: Any) -> None:
    from zerobatch.torch import LoaderDataset

    dataset = LoaderDataset(_loader())
    dataset.load_state_dict(state)
    next(iter(dataset), None)


def _state_loader_iterator(state: Any) -> None:
    from zerobatch.torch import LoaderDataset

    steps = iter(LoaderDataset(_loader()))
    steps.load_state_dict(state)  # type: ignore[attr-defined]
    next(steps, None)


def _state_dataloader(state: Any) -> None:
    """``LoaderDataset.loader_state`` of a StatefulDataLoader state, loaded."""
    from zerobatch.torch import LoaderDataset

    loader = _loader()
    loader.load_state_dict(LoaderDataset(loader).loader_state(state))
    next(iter(loader), None)


_SHARDS: list[Any] = []  # one ShardDataset, made before forking: children never call JAX


def _shard_dataset() -> Any:
    if not _SHARDS:
        from zerobatch.jax import ShardDataset

        _SHARDS.append(ShardDataset(_state_data(), "train", 8, 2, 1, shuffle=True, seed=4,
                                    prefetch=0))
    return _SHARDS[0]


def _state_shard_dataset(state: Any) -> None:
    dataset = _shard_dataset()
    dataset.load_state_dict(state)
    dataset.state_dict()


_SERVERS: dict[int, Any] = {}  # per process: a BatchServer serving from a thread


def _server() -> Any:
    """This process's BatchServer (made on first use, in the process that uses it:
    ZeroMQ contexts do not survive a fork)."""
    server = _SERVERS.get(os.getpid())
    if server is None:
        import logging
        import threading

        # a client closed with replies in flight is logged, and is no finding here
        logging.getLogger("zerobatch.service").setLevel(logging.ERROR)

        from zerobatch.service import BatchServer
        from zerobatch.stream import open_dataset

        server = BatchServer(open_dataset(_state_data() / "ds").windows(8),
                             "tcp://127.0.0.1:0")
        threading.Thread(target=server.serve, daemon=True).start()
        _SERVERS[os.getpid()] = server
    return server


def _state_batch_client(state: Any) -> None:
    from zerobatch.service import BatchClient

    client = BatchClient(_server().address, 4, seed=3, output="numpy", epochs=2, timeout=20)
    try:
        client.load_state_dict(state)
        next(iter(client), None)
    finally:
        client.close()


def _state_seeds(load: Callable[[Any], None], make: Callable[[], list[Any]]
                 ) -> Callable[[], list[Files]]:
    def seeds() -> list[Files]:
        out = [{"state.json": json.dumps(state).encode()} for state in make()]
        for files in out:  # each must load: a seed that does not is a harness bug
            load(json.loads(files["state.json"]))
        return out
    return seeds


def _loader_states() -> list[Any]:
    loader = _loader()
    states = [loader.state_dict()]
    for _, _ in zip(range(7), loader, strict=False):
        states.append(loader.state_dict())
    return states[::3]


def _batch_loader_states() -> list[Any]:
    from zerobatch.llmbatch import BatchNativeLoader

    loader = BatchNativeLoader(_state_data() / "a.batch", block_size=2, seed=7,
                               output="numpy")
    states = [loader.state_dict()]
    for _, _ in zip(range(3), loader, strict=False):
        states.append(loader.state_dict())
    return states


def _iterator_states() -> list[Any]:
    from zerobatch.torch import LoaderDataset

    steps = iter(LoaderDataset(_loader()))
    states = [steps.state_dict()]  # type: ignore[attr-defined]
    next(steps)
    states.append(steps.state_dict())  # type: ignore[attr-defined]
    return states


def _dataloader_states() -> list[Any]:
    """StatefulDataLoader states without workers and with two (their shape)."""
    one, two = _iterator_states()
    return [
        {"_num_yielded": 1, "_steps_since_snapshot": 0,
         "fetcher_state": {"dataset_iter_state": two}},
        {"_num_yielded": 3, "_steps_since_snapshot": 2, "_snapshot_step": 1, "_snapshot": {
            "_snapshot_step": 1, "_main_snapshot": {},
            "_worker_snapshots": {
                f"worker_{w}": {"worker_id": w, "fetcher_state": {"dataset_iter_state": {
                    **one, "worker": w, "workers": 2}}} for w in range(2)}}},
    ]


def _shard_states() -> list[Any]:
    state = _shard_dataset().state_dict()
    return [state, {**state, "consumed": 2 * 8}]


def _client_states() -> list[Any]:
    return _loader_states()[:2]  # a client resumes from a Loader's state (same keys)


def _read_state(load: Callable[[Any], None]) -> Callable[[Path, Files], None]:
    """Load the state in ``state.json``, then take a step: ``ValueError`` is the
    contract (its message names the field); anything else is an escape."""
    def read(folder: Path, files: Files) -> None:
        try:
            state = json.loads(files.get("state.json", b""))
        except (ValueError, RecursionError):
            raise FormatError("not JSON", path="state.json", field="state") from None
        try:
            load(state)
        except FormatError:
            raise
        except ValueError as error:
            raise FormatError(str(error), path="state.json", field="state") from error
    return read


# ----------------------------------------------------------------- the BatchServer wire


def _wire_seeds() -> list[Files]:
    from zerobatch.service._transport import encode_header

    batch = {"op": "batch", "seed": 3, "epoch": 0, "consumed": 0, "rank": 0, "world_size": 1,
             "batch_size": 4, "shuffle": True, "drop_last": True, "block_size": None}
    return [{"frame0": encode_header({"id": 1, **header})} for header in (
        {"op": "info"}, batch, {**batch, "consumed": 8, "world_size": 2, "rank": 1},
        {**batch, "drop_last": False, "shuffle": False, "block_size": 4, "epoch": 3})]


def _read_wire(folder: Path, files: Files) -> None:
    """A BatchServer's request path without the socket: header, then handler;
    its replies are checked by decoding them as a client does."""
    from zerobatch.columnar import Batch
    from zerobatch.service._transport import parse_header

    frames = _frames(files)
    if not frames:
        raise FormatError("empty message: expected a header frame", path="header", field="v")
    header = parse_header(frames[0])
    try:
        _reply, payload = _server()._handle(header, [memoryview(f) for f in frames[1:]])
    except FormatError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as error:  # what the server answers
        raise ErrorReply(f"{type(error).__name__}: {error}") from error
    if payload:
        Batch.from_frames([bytes(memoryview(f)) for f in payload])


def _npy_more_seeds() -> list[Files]:
    """Token files of every dtype a folder may hold, ids at the edges a read
    takes (0 and the int32 output's largest id; mutations reach past them, where
    reads must refuse with FormatError)."""
    out = []
    for dtype in ("<i4", "<u8", "<i8", "|u1", "<u4", "<i2"):
        top = min(int(np.iinfo(dtype).max), 2**31 - 1)
        values = np.array([0, 1, top, top // 2, 7, 3, top - 1, 0], dtype=dtype)
        files = {}
        for i, part in enumerate((values, values[::-1], values[:3])):
            buffer = io.BytesIO()
            np.save(buffer, part)
            files[f"{i:05d}.npy"] = buffer.getvalue()
        out.append(files)
    return out


_NPY_OUTPUTS = ((3, "int64"), (2, "int32"))  # (seq_len, output dtype) each npy read takes


def _read_npy_all(folder: Path, files: Files,
                  outputs: tuple[tuple[int, str], ...] = _NPY_OUTPUTS) -> None:
    from zerobatch import stream
    from zerobatch.stream.npy import verify_npy

    for seq_len, dtype in outputs:
        try:
            with stream.open_dataset(folder) as tokens:
                windows = tokens.windows(seq_len, dtype=dtype)
                windows.read(np.arange(len(windows)))
        except FormatError as error:
            if not verify_npy(folder, dtype=dtype):
                raise FalsePass(f"dtype {dtype}: {error}") from error
            raise
        verify_npy(folder, dtype=dtype)


for _target in (
    Target("stream-sealed", _stream_seeds, _read_stream_sealed, warm=_stream_warm),
    Target("npy-dtypes", lambda: _npy_seeds() + _npy_more_seeds(), _read_npy_all),
    Target("cli", _cli_seeds, _read_cli, warm=_cli_warm),
    Target("state-loader", _state_seeds(_state_loader, _loader_states),
           _read_state(_state_loader), on_disk=False),
    Target("state-batch-loader", _state_seeds(_state_batch_loader, _batch_loader_states),
           _read_state(_state_batch_loader), on_disk=False),
    Target("state-loader-dataset", _state_seeds(_state_loader_dataset, _loader_states),
           _read_state(_state_loader_dataset), on_disk=False),
    Target("state-loader-iterator", _state_seeds(_state_loader_iterator, _iterator_states),
           _read_state(_state_loader_iterator), on_disk=False),
    Target("state-dataloader", _state_seeds(_state_dataloader, _dataloader_states),
           _read_state(_state_dataloader), on_disk=False),
    Target("state-batch-client", _state_seeds(_state_batch_client, _client_states),
           _read_state(_state_batch_client), on_disk=False),
    Target("state-shard-dataset", _state_seeds(_state_shard_dataset, _shard_states),
           _read_state(_state_shard_dataset), on_disk=False),
    Target("batch-wire", _wire_seeds, _read_wire, on_disk=False),
):
    register(_target)


# ----------------------------------------------------------------- mutators

_INTS = (0, 1, 2, 7, 8, 255, 256, 2**15, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1,
         2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
_HOSTILE: tuple[Any, ...] = (
    None, True, -1, 0, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 1.5, float("inf"), "", "x" * 300,
    "a/b", "../x", "a\x00b", ".hidden", "<c8", "<U4", "<M8[s]", "|O", [], {}, [[]], ["<u2"],
    {"a": 1}, [["token", "<u2"], ["z", "<c16"]], "\u00e9", "custom:",
)


def _kind(name: str) -> str:
    """What a file is, for the report: its suffix after the shard stem."""
    if name.startswith("frame"):
        return "frame0" if name == "frame0" else "frames"
    if name == "manifest.json":
        return "manifest"
    parts = name.split(".", 1)
    return parts[1] if len(parts) == 2 else name


def _walk(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key in value:
            yield from _walk(value[key], (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, (*path, i))


def _replace(value: Any, path: tuple[Any, ...], new: Any, *, delete: bool = False) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        out = dict(value)
        if delete and not rest:
            out.pop(head, None)
        else:
            out[head] = _replace(value[head], rest, new, delete=delete)
        return out
    out_list = list(value)
    if delete and not rest:
        del out_list[head]
    else:
        out_list[head] = _replace(value[head], rest, new, delete=delete)
    return out_list


def _codec(name: str, data: bytes) -> tuple[Any, Callable[[Any], bytes]] | None:
    """The decoded document of a structured file and how to encode it again."""
    try:
        if name.endswith(".json"):
            return json.loads(data), lambda v: json.dumps(v).encode()
        if name in ("frame0", "meta"):
            value = msgpack.unpackb(data, raw=False, strict_map_key=False)
            return value, lambda v: msgpack.packb(v, use_bin_type=True)
        if name == "t" and data[8:9] == b"{":  # safetensors: u64 length, JSON
            (length,) = struct.unpack_from("<Q", data)
            rest = data[8 + length:]

            def encode(v: Any) -> bytes:
                head = json.dumps(v).encode()
                head += b" " * (-len(head) % 8)
                return struct.pack("<Q", len(head)) + head + rest
            return json.loads(data[8 : 8 + length]), encode
    except (ValueError, struct.error, msgpack.ExtraData):
        return None
    return None


def _fit(value: Any) -> Any:
    return value if not isinstance(value, str) else value.encode("utf-8", "surrogatepass")


def _structured_file(seed: Files, name: str) -> Iterator[tuple[str, Files]]:
    """Every structure-aware mutation of file ``name`` of ``seed``."""
    data = seed[name]
    decoded = _codec(name, data)
    if decoded is not None:  # JSON and msgpack documents, edited field by field
        document, encode = decoded
        for path in _walk(document):
            for new in _HOSTILE:
                with contextlib.suppress(TypeError, ValueError, OverflowError):
                    yield f"{name}:edit", {**seed, name: encode(_replace(document, path, new))}
            if path:
                with contextlib.suppress(TypeError, ValueError, OverflowError):
                    yield f"{name}:drop", {
                        **seed, name: encode(_replace(document, path, None, delete=True))}
        yield f"{name}:deep", {**seed, name: b"[" * 100_000 + b"]" * 100_000}
    # boundary integers: every 8-byte position of offset tables and of the first
    # 256 bytes of other files, every 4-byte position of the first 64 bytes
    table = name.endswith((".docs", ".meta.index", ".meta.spans"))
    positions = range(0, len(data) - 7, 8) if table else range(0, min(len(data) - 7, 256), 8)
    for at in positions:
        for value in (*_INTS, len(data), len(data) + 1):
            buffer = bytearray(data)
            buffer[at : at + 8] = (value % 2**64).to_bytes(8, "little")
            yield f"{name}:u64", {**seed, name: bytes(buffer)}
    for at in range(0, min(len(data) - 3, 64), 4):
        for value in _INTS[:13]:
            buffer = bytearray(data)
            buffer[at : at + 4] = (value % 2**32).to_bytes(4, "little")
            yield f"{name}:u32", {**seed, name: bytes(buffer)}
    # truncation at every boundary
    for cut in sorted({*range(min(len(data), 128)), *range(0, len(data), 8), len(data) - 1}):
        yield f"{name}:truncate", {**seed, name: data[:cut]}
    yield f"{name}:extend", {**seed, name: data + bytes(8)}
    yield f"{name}:empty", {**seed, name: b""}


def _structured_set(seed: Files) -> Iterator[tuple[str, Files]]:
    """Swapped, renamed, dropped and duplicated files of a multi-file input."""
    names = list(seed)
    if len(names) < 2:
        return
    for a in names:
        yield f"{a}:dropfile", {k: v for k, v in seed.items() if k != a}
        for b in names:
            if a < b and _kind(a) == _kind(b):
                yield f"{a}:swap", {**seed, a: seed[b], b: seed[a]}
                yield f"{a}:duplicate", {**seed, b: seed[a]}
        _, dot, suffix = a.partition(".")
        for other in ("99999", "x" * 300, "gone"):
            renamed = other + dot + suffix if dot else other
            yield f"{a}:rename", {**{k: v for k, v in seed.items() if k != a}, renamed: seed[a]}


def structured(seed: Files) -> Iterator[tuple[str, Files]]:
    """Every structure-aware mutation of ``seed``: (label, input), the files'
    mutations interleaved so any prefix touches every file."""
    streams = [_structured_file(seed, name) for name in seed] + [_structured_set(seed)]
    while streams:
        for stream in list(streams):
            item = next(stream, None)
            if item is None:
                streams.remove(stream)
            else:
                yield item


def random_mutation(seed: Files, rng: random.Random, pool: list[Files]) -> tuple[str, Files]:
    """One random mutation of one file of ``seed`` (a few edits at once)."""
    name = rng.choice(list(seed))
    data = bytearray(seed[name])
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        op = rng.randrange(6)
        at = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op == 2:
            width = rng.choice((1, 2, 4, 8))
            value = rng.choice(_INTS) + rng.choice((-1, 0, 0, 1))
            data[at : at + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
        elif op == 3:
            del data[at : at + rng.randrange(1, 17)]
        elif op == 4:
            data[at:at] = rng.randbytes(rng.randrange(1, 17))
        else:
            other = rng.choice(pool)
            source = other.get(name) or rng.choice(list(other.values()))
            start = rng.randrange(len(source) + 1)
            data[at:] = source[start : start + rng.randrange(1, 64)] + data[at:]
    return f"{name}:random", {**seed, name: bytes(data)}


def inputs(target: Target, count: int | None, seed: int) -> Iterator[tuple[str, Files]]:
    """``count`` inputs (None: without end): structured mutations of every seed,
    interleaved, alternating with random ones; random ones alone once the
    structured ones are spent."""
    seeds = target.seeds()
    rng = random.Random(seed)
    streams = [structured(base) for base in seeds]
    made = 0
    while count is None or made < count:
        item = None
        while streams and item is None:
            stream = streams[made % len(streams)]
            item = next(stream, None)
            if item is None:
                streams.remove(stream)
        if item is not None and made % 2 == 0:
            made += 1
            yield item
            if count is not None and made >= count:
                return
        made += 1
        yield random_mutation(rng.choice(seeds), rng, seeds)


# ----------------------------------------------------------------- running


def _size(files: Files) -> int:
    return sum(len(v) for v in files.values())


def _vm_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class Scratch:
    """The folder inputs are written into, and what it holds: ``write`` replaces
    only the files that differ from the previous input's (most inputs change
    one file of a seed), each as a new file, so a mapping of the old one never
    sees its bytes change."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._held: Files | None = None  # None: unknown, cleared on the next write

    def write(self, files: Files) -> None:
        """Make the folder hold exactly ``files`` (names it cannot hold are left out)."""
        held = self._held
        if held is None:
            for entry in self.folder.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            held = {}
        for name in [n for n in held if files.get(n) is not held[n]]:
            os.unlink(os.path.join(self.folder, name))
            del held[name]
        for name, data in files.items():
            if name not in held:
                with contextlib.suppress(OSError, ValueError):
                    descriptor = os.open(os.path.join(self.folder, name),
                                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    try:
                        os.write(descriptor, data)
                    finally:
                        os.close(descriptor)
                    held[name] = data
        self._held = held


class Warmth:
    """What this process has loaded: its modules and the Numba kernel
    specializations of zerobatch's kernels (compiled, or loaded from the
    on-disk cache). ``gained()`` names what was added since the last call.

    A forked child that imports a module or adds a kernel specialization its
    parent's warm-up did not pays for it in memory: compiling one kernel with
    LLVM grows a child's peak RSS by 85-135 MiB (loading it from a warm Numba
    cache, about 11 MiB), which the RSS budget would charge to the input. So
    the driver reports such an input as ``cold`` (a gap in the target's
    warm-up, whatever the state of the Numba cache), never as ``alloc``."""

    def __init__(self) -> None:
        self._modules: set[str] = set(sys.modules)
        self._kernels = self._find_kernels()
        self._counts = self._count()

    @staticmethod
    def _find_kernels() -> list[Any]:
        try:
            from numba.core.registry import CPUDispatcher
        except ImportError:  # pragma: no cover - zerobatch needs numba
            return []
        found: dict[int, Any] = {}
        for name, module in list(sys.modules.items()):
            if name.split(".")[0] != "zerobatch" or module is None:
                continue
            for value in list(vars(module).values()):
                if isinstance(value, CPUDispatcher):
                    found[id(value)] = value
        return list(found.values())

    def _count(self) -> dict[int, int]:
        return {id(kernel): len(kernel.overloads) for kernel in self._kernels}

    def gained(self) -> str:
        """Modules imported and kernel specializations added since the last
        call ("" for none)."""
        parts: list[str] = []
        if len(sys.modules) != len(self._modules):
            parts += [f"imported {name}" for name in sorted(set(sys.modules) - self._modules)[:3]]
            self._modules = set(sys.modules)
            self._kernels = self._find_kernels()  # a new module may hold kernels
        counts = self._count()
        if counts != self._counts:
            parts += [f"added a specialization of {kernel.py_func.__name__}"
                      for kernel in self._kernels
                      if counts[id(kernel)] != self._counts.get(id(kernel), 0)][:3]
            self._counts = counts
        return "; ".join(parts)


def run_one(target: Target, scratch: Scratch, files: Files,
            warmth: Warmth | None = None) -> tuple[str, str]:
    """Read one input in this process: (outcome, detail). With ``warmth``, an
    input that made this process import a module or add a kernel
    specialization is ``cold`` unless its read escaped or failed otherwise."""
    folder = scratch.folder
    if target.on_disk:
        scratch.write(files)
    size = _size(files)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_bytes() + max(MIN_BUDGET, RSS_FACTOR * size)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard < 0 else min(limit, hard), hard))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        target.read(folder, files)
        outcome, detail = "ok", ""
    except FalsePass as error:
        outcome, detail = "false_pass", str(error)[:300]
    except CliEscape as error:
        outcome, detail = "escape", str(error)[:300]
    except ErrorReply as error:
        outcome, detail = "error_reply", str(error)[:300]
    except FormatError as error:
        named = error.path is not None and error.field is not None
        outcome, detail = ("format_error" if named else "unnamed"), str(error)[:300]
    except MemoryError as error:
        outcome, detail = "alloc", f"MemoryError {error}"[:300]
    except Exception as error:
        outcome, detail = "escape", f"{type(error).__name__}: {error}"[:300]
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    gained = warmth.gained() if warmth is not None else ""
    if gained and outcome in ("ok", "format_error", "alloc"):
        outcome, detail = "cold", f"{gained} (peak RSS grew {grown >> 20} MiB)"
    elif outcome != "alloc" and grown > max(MIN_RSS, RSS_FACTOR * size):
        outcome, detail = "alloc", f"peak RSS grew {grown >> 20} MiB for {size} input bytes"
    return outcome, detail.replace("\n", " ").replace("\t", " ")


def _child(
    target: Target, batch: list[tuple[str, Files]], start: int, fd: int, folder: Path
) -> None:
    scratch = Scratch(folder)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    faulthandler.disable()  # a crash is the parent's to report, without a traceback dump
    warmth = Warmth()
    for i in range(start, len(batch)):
        outcome, detail = run_one(target, scratch, batch[i][1], warmth)
        line = f"{i}\t{time.process_time()}\t{_bytes_read('self')}\t{outcome}\t{detail}\n"
        os.write(fd, line.encode("utf-8", "replace"))


def _scratch() -> str | None:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@dataclass
class Report:
    """Counts per target and mutated file kind, and where repros were kept."""

    counts: dict[tuple[str, str], Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter))
    examples: dict[tuple[str, str], str] = field(default_factory=dict)
    repros: list[Path] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # s per target, driver and children

    def merge(self, other: Report) -> None:
        """Add ``other``'s counts, examples and repros to this report."""
        for key, counts in other.counts.items():
            self.counts[key].update(counts)
        for signature, example in other.examples.items():
            self.examples.setdefault(signature, example)
        self.repros.extend(other.repros)
        self.cpu.update(other.cpu)

    def add(self, target: str, label: str, outcome: str) -> None:
        self.counts[(target, _kind(label.split(":", 1)[0]))][outcome] += 1

    def totals(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for (target, _), counts in self.counts.items():
            out[target].update(counts)
        return out

    def table(self, *, by_file: bool = True) -> str:
        rows = [("reader", "file", "inputs", *OUTCOMES)]
        keys = sorted(self.counts) if by_file else [(t, "all") for t in sorted(self.totals())]
        totals = self.totals()
        for key in keys:
            counts = self.counts[key] if by_file else totals[key[0]]
            rows.append((*key, str(sum(counts.values())), *(str(counts[o]) for o in OUTCOMES)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                         for r in rows)


def _keep(out: Path | None, report: Report, target: str, label: str, files: Files,
          outcome: str, detail: str) -> None:
    signature = (target, f"{outcome}:{detail.split(':', 1)[0][:60]}")
    report.examples.setdefault(signature, f"{label}: {detail}")
    if out is None:
        return
    digest = hashlib.sha1(b"".join(k.encode() + v for k, v in sorted(files.items()))).hexdigest()
    folder = out / target / f"{outcome}-{digest[:12]}"
    if folder.exists() or sum(1 for p in report.repros if p.parent.name == target) >= 200:
        return
    (folder / "input").mkdir(parents=True)
    for name, data in files.items():
        with contextlib.suppress(OSError, ValueError):
            (folder / "input" / name).write_bytes(data)
    (folder / "outcome.txt").write_text(f"{outcome}\n{label}\n{detail}\n")
    report.repros.append(folder)


CPU_PER_GIB = 20.0
"""CPU seconds an input may use per GiB it reads, beyond ``timeout`` (hangs)."""


def run_batch(target: Target, batch: list[tuple[str, Files]], report: Report, *,
              timeout: float, out: Path | None, blocked: float | None = None,
              cpu_per_gib: float = CPU_PER_GIB) -> None:
    """Run ``batch`` in forked children; a crash or hang is pinned on one input
    and the rest of the batch goes on in a fresh child. A hang is judged by
    CPU time per byte read: no answer after ``timeout`` seconds of the child's
    CPU time plus ``cpu_per_gib`` seconds for each GiB it read meanwhile (a
    large valid input that keeps reading is not a hang; a loop that reads
    nothing is), or after ``blocked`` seconds (default 10 x ``timeout``) in
    which it neither used CPU nor read (asleep or blocked: on a loaded machine a
    niced child may wait long for its share, so only a standstill counts)."""
    scratch = Path(tempfile.mkdtemp(prefix="zbfuzz-", dir=_scratch()))  # the parent removes it
    try:
        _run_children(target, batch, report, timeout=timeout,
                      blocked=10 * timeout if blocked is None else blocked, out=out,
                      scratch=scratch, per_byte=cpu_per_gib / 2**30)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (s); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _bytes_read(pid: int | str) -> int:
    """Bytes process ``pid`` (or ``"self"``) has read so far: through read calls
    (``rchar``: files, pipes, sockets) plus a page per page fault (mapped files;
    also fresh memory, which the memory budget bounds). 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/io", "rb") as file:
            rchar = int(file.read().split(b"rchar:", 1)[1].split()[0])
    except (OSError, IndexError, ValueError):
        return 0
    return rchar + (int(fields[7]) + int(fields[9])) * _PAGE


def _run_children(target: Target, batch: list[tuple[str, Files]], report: Report, *,
                  timeout: float, blocked: float, out: Path | None, scratch: Path,
                  per_byte: float) -> None:
    start = 0
    while start < len(batch):
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():  # JAX's warning: the children never call JAX
            warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
            pid = os.fork()
        if pid == 0:  # the child
            # The parent's objects stay out of the child's collections: a collection
            # touching a large parent heap (a test process) copies its pages on write,
            # which the RSS budget would count against the input being read.
            gc.freeze()
            os.close(read_fd)
            code = 0
            try:
                _child(target, batch, start, write_fd, scratch)
            except BaseException:
                code = 3
            os._exit(code)
        os.close(write_fd)
        pending = b""
        current = start
        status = None
        answered_cpu = 0.0  # a child's CPU clock starts at 0
        answered_bytes = _bytes_read(pid)  # what the fork itself counted
        moved, last = time.monotonic(), (0.0, answered_bytes)  # its last sign of progress
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                ready, _, _ = select.select([pipe], [], [], min(timeout, 1.0))
                if not ready:
                    now = (_cpu_seconds(pid), _bytes_read(pid))  # CPU in ticks of 10 ms
                    if now != last:
                        moved, last = time.monotonic(), now
                    cpu = max(0.0, now[0] - answered_cpu)
                    read = max(0, now[1] - answered_bytes)
                    still = time.monotonic() - moved
                    if cpu < timeout + read * per_byte and still < blocked:
                        continue
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    status = "hang"
                    end_detail = (f"no answer after {cpu:.1f} s of CPU time, having read "
                                  f"{read >> 20} MiB ({still:.0f} s without progress)")
                    break
                chunk = pipe.read(1 << 16)
                if not chunk:
                    _, wait = os.waitpid(pid, 0)
                    status = None if current >= len(batch) else "crash"
                    if status == "crash":
                        code = os.waitstatus_to_exitcode(wait)
                        end_detail = f"child exited with {code}"
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    index, cpu_text, bytes_text, outcome, detail = line.decode(
                        "utf-8", "replace").split("\t", 4)
                    i = int(index)
                    answered_cpu, answered_bytes = float(cpu_text), int(bytes_text)
                    moved = time.monotonic()
                    label, files = batch[i]
                    report.add(target.name, label, outcome)
                    if outcome not in ("ok", "format_error"):
                        _keep(out, report, target.name, label, files, outcome, detail)
                    current = i + 1
        if status is not None:
            label, files = batch[current]
            report.add(target.name, label, status)
            _keep(out, report, target.name, label, files, status, end_detail)
            current += 1
        start = current


def _cpu_used() -> float:
    """CPU seconds used by this process and its children waited for."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


_warmed_token_kernels = False


def _empty_peer_inputs() -> list[Files]:
    """An empty LitData dataset (no chunk) of each integer token dtype. A peer
    dataset whose shards all start at byte 0 (Megatron, datatrove, or one with
    no shard at all) reads windows through the direct path of native datasets
    with its own token dtype: an input that empties a peer dataset (an hf
    ``state.json`` listing no file, a LitData index with no chunk) or edits
    its dtype reaches a specialization of ``read_windows`` no seed does. The
    peer targets read these (as LitData: the kernels do not depend on the
    format) before forking."""
    from zerobatch.peers.litdata import INDEX, NUMPY_CODES

    return [{INDEX: json.dumps({"chunks": [], "config": {
        "data_format": [f"no_header_numpy:{code}"], "item_loader": "TokensLoader",
        "compression": None, "encryption": None}}).encode()} for code in NUMPY_CODES]


def _warm_token_kernels() -> None:
    """Read windows of every stored token dtype into the default int64 output
    once in this process: an input that changes a format's dtype would
    otherwise add a kernel specialization in a forked child (``Warmth``: the
    input is ``cold``). Only ``npy-dtypes`` reads other outputs, and its own
    seeds warm those (each specialization compiles for ~10 s cold)."""
    global _warmed_token_kernels
    if _warmed_token_kernels:
        return
    with tempfile.TemporaryDirectory(dir=_scratch()) as tmp:
        for i, files in enumerate(_npy_seeds() + _npy_more_seeds()):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            for name, data in files.items():
                (folder / name).write_bytes(data)
            _read_npy_all(folder, files, outputs=_NPY_OUTPUTS[:1])  # int64
    _warmed_token_kernels = True


def _warm_lazy_imports() -> None:
    """Import what the reads import lazily on first use, so that a mutated
    input reaching it first in a forked child does not: the codecs
    ``json.loads`` picks for bytes by their first bytes (UTF-16 and UTF-32,
    either order), and ``np.ma`` (NumPy 2's ``np.unique`` asks it whether its
    input is masked)."""
    import encodings.utf_16
    import encodings.utf_16_be
    import encodings.utf_16_le
    import encodings.utf_32
    import encodings.utf_32_be
    import encodings.utf_32_le  # noqa: F401

    import numpy.ma  # noqa: F401


def warm_up(target: Target) -> None:
    """Read every seed and warm-up input once in this process (imports, compiled
    kernels), so forked children start warm; one that does not read is a
    harness bug."""
    read = target.remote or target.read
    _warm_lazy_imports()
    if target.on_disk or target.remote is not None:  # a remote target reads the same tokens
        _warm_token_kernels()
    with tempfile.TemporaryDirectory(dir=_scratch()) as tmp:
        scratch = Scratch(Path(tmp))
        for files in [*target.seeds(), *target.warm()]:
            if target.on_disk or target.remote:
                scratch.write(files)
            read(Path(tmp), files)
        for files in target.refused():
            scratch.write(files)
            try:
                read(Path(tmp), files)
            except FormatError:
                continue
            raise AssertionError(f"{target.name}: a refused warm-up input was read")
        if target.name in PEERS:
            for files in _empty_peer_inputs():
                scratch.write(files)
                _read_peer("litdata")(Path(tmp), files)
    if target.remote:  # imported, never used, before forking
        import encodings.idna  # noqa: F401  (URLs' host names)

        import obstore  # noqa: F401

        import zerobatch.storage.object  # noqa: F401


def fuzz(names: list[str], *, per_target: int | None, seconds: float | None, seed: int,
         batch_size: int = 500, timeout: float = 20.0, blocked: float | None = None,
         cpu_per_gib: float = CPU_PER_GIB, out: Path | None = None,
         progress: bool = False) -> tuple[Report, dict[str, float]]:
    """Fuzz each named target in turn, ``per_target`` inputs or ``seconds`` each
    (whichever ends first). Returns the report and the seconds each took.
    Multiprocessing's global start method is as it was on return (the peers'
    packages that write seeds, and the remote target's pool, fix it)."""
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        return _fuzz(names, per_target=per_target, seconds=seconds, seed=seed,
                     batch_size=batch_size, timeout=timeout, blocked=blocked,
                     cpu_per_gib=cpu_per_gib, out=out, progress=progress)
    finally:
        multiprocessing.set_start_method(method, force=True)


def _fuzz(names: list[str], *, per_target: int | None, seconds: float | None, seed: int,
          batch_size: int, timeout: float, blocked: float | None, cpu_per_gib: float,
          out: Path | None, progress: bool) -> tuple[Report, dict[str, float]]:
    report = Report()
    elapsed: dict[str, float] = {}
    for name in names:
        target = TARGETS[name]
        if target.remote and multiprocessing.parent_process() is None:
            # a fresh interpreter, in which S3 was never used, forks the children
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                part, seconds_taken = pool.apply(fuzz, ([name],), {
                    "per_target": per_target, "seconds": seconds, "seed": seed,
                    "batch_size": batch_size, "timeout": timeout, "blocked": blocked,
                    "cpu_per_gib": cpu_per_gib, "out": out, "progress": progress})
            report.merge(part)
            elapsed.update(seconds_taken)
            continue
        warm_up(target)
        began, cpu = time.perf_counter(), _cpu_used()
        stream = inputs(target, per_target, seed)
        while True:
            batch = [item for _, item in zip(range(batch_size), stream, strict=False)]
            if not batch:
                break
            run_batch(target, batch, report, timeout=timeout, blocked=blocked, out=out,
                      cpu_per_gib=cpu_per_gib)
            if progress:
                counts = report.totals()[name]  # all of them: a run cut short still tells
                print(f"  {name}: {sum(counts.values())} inputs, "
                      f"{time.perf_counter() - began:.0f} s, {_cpu_used() - cpu:.0f} CPU s, "
                      f"{dict(sorted(counts.items()))}", file=sys.stderr, flush=True)
            if seconds is not None and time.perf_counter() - began >= seconds:
                break
        elapsed[name] = time.perf_counter() - began
        report.cpu[name] = _cpu_used() - cpu
    return report, elapsed


# ----------------------------------------------------------------- atheris


def _encode_input(files: Files) -> bytes:
    return msgpack.packb(files, use_bin_type=True)


def _decode_input(data: bytes) -> Files | None:
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False, max_bin_len=len(data))
    except Exception:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, bytes) for k, v in value.items()):
        return None
    return value


def run_atheris(name: str, argv: list[str]) -> None:
    """Coverage-guided fuzzing of one target with atheris and these mutators."""
    import importlib

    import atheris

    global FormatError
    # Instrument zerobatch alone (all of NumPy and Numba would take minutes):
    # import it afresh under atheris, then use the fresh error class.
    package = Path(sys.modules["zerobatch"].__file__ or "").parent
    jitted = [  # Numba compiles these from bytecode: they must stay as written
        "zerobatch." + ".".join(p.relative_to(package).with_suffix("").parts)
        for p in package.rglob("*.py") if "njit" in p.read_text()
    ]
    for module in [m for m in sys.modules if m == "zerobatch" or m.startswith("zerobatch.")]:
        del sys.modules[module]
    with atheris.instrument_imports(include=["zerobatch"], exclude=jitted):
        importlib.import_module("zerobatch")
        importlib.import_module("zerobatch.stream")
        importlib.import_module("zerobatch.columnar")
        importlib.import_module("zerobatch.batch_loader")
        importlib.import_module("zerobatch.tensors")
    FormatError = sys.modules["zerobatch.errors"].FormatError  # type: ignore[misc]
    target = TARGETS[name]
    seeds = target.seeds()
    scratch = Scratch(Path(tempfile.mkdtemp(prefix="zbfuzz-", dir=_scratch())))
    rng = random.Random(0)

    def test_one(data: bytes) -> None:
        files = _decode_input(data) or rng.choice(seeds)
        outcome, detail = run_one(target, scratch, files)
        if outcome not in ("ok", "format_error"):
            raise RuntimeError(f"{outcome}: {detail}")

    def mutate(data: bytes, max_size: int, seed_value: int) -> bytes:
        local = random.Random(seed_value)
        files = _decode_input(data) or local.choice(seeds)
        return _encode_input(random_mutation(files, local, seeds)[1])[:max_size]

    atheris.Setup([sys.argv[0], *argv], test_one, custom_mutator=mutate)
    atheris.Fuzz()


# ----------------------------------------------------------------- command line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    parser.add_argument("--inputs", type=int, default=None, help="per target")
    parser.add_argument("--seconds", type=float, default=None, help="per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=500, help="inputs per forked child")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="hang limit per input (s of the child's CPU time), plus "
                             "--cpu-per-gib for each GiB it reads")
    parser.add_argument("--cpu-per-gib", type=float, default=CPU_PER_GIB,
                        help="CPU seconds an input may use per GiB it reads (default "
                             f"{CPU_PER_GIB:g})")
    parser.add_argument("--blocked", type=float, default=None,
                        help="hang limit per input that neither uses CPU nor reads (s; "
                             "default 10 x --timeout)")
    parser.add_argument("--out", type=Path, default=None, help="keep repros here")
    parser.add_argument("--engine", choices=("fork", "atheris"), default="fork")
    parser.add_argument("--figure", default=None,
                        help="also draw the outcomes per target into docs/img/FIGURE.png")
    args, rest = parser.parse_known_args()
    names = args.targets.split(",")
    if args.engine == "atheris":
        run_atheris(names[0], rest)
        return
    if args.inputs is None and args.seconds is None:
        args.seconds = 30.0
    if any(TARGETS[n].remote for n in names) and S3_ENV not in os.environ:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from support.s3_server import S3Server

        server = S3Server().start()  # in this process; children reach it by loopback
        os.environ.update({**server.env(), S3_ENV: f"s3://{server.bucket}"})
    load = os.getloadavg()
    report, elapsed = fuzz(names, per_target=args.inputs, seconds=args.seconds, seed=args.seed,
                           batch_size=args.batch, timeout=args.timeout, blocked=args.blocked,
                           cpu_per_gib=args.cpu_per_gib, out=args.out, progress=True)
    print(f"nproc {os.cpu_count()}, load before {load[0]:.2f} {load[1]:.2f}, after "
          f"{os.getloadavg()[0]:.2f}")
    print(report.table(by_file=False))
    print()
    print(report.table())
    for name, seconds in elapsed.items():
        done = sum(report.totals()[name].values())
        cpu = report.cpu.get(name, 0.0)
        print(f"{name}: {done} inputs in {seconds:.1f} s ({done / max(seconds, 1e-9):.0f}/s); "
              f"{cpu:.1f} CPU s ({done / max(cpu, 1e-9):.0f} per CPU s)")
    for (target, signature), example in sorted(report.examples.items()):
        print(f"{target} {signature}: {example[:200]}")
    if args.out is not None:
        print(f"{len(report.repros)} repros under {args.out}")
    if args.figure:
        from _plot import groups  # matplotlib: only when a figure is asked for

        totals = report.totals()
        drawn = {f"{name} ({sum(totals[name].values()):,})": {
            outcome: float(totals[name][outcome]) for outcome in OUTCOMES
            if totals[name][outcome]} for name in elapsed}
        groups(args.figure, drawn, log=True, fmt="{:,.0f}", xlabel="inputs (log)",
               title=f"Hostile inputs per reader, by outcome (seed {args.seed}; ok, format_error "
                     "and the service's error_reply are the accepted ones)")


if __name__ == "__main__":
    main()
