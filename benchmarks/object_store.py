"""Token-stream reads from an object store: zerobatch against raw obstore.

moto's S3 server runs on 127.0.0.1 in a child process, behind the tests' fault
proxy adding ``--latency`` seconds (default 20 ms) to every request: a stand-in
for an object store's first-byte latency. One run measures:

1. Shuffled windows (``--seq-len`` 2,048 tokens, batch 32) over ``s3://``:
   batches per second with 0, 4 and 16 batches in flight (a thread pool of
   that size calling ``TokenWindows.read``: the Loader's prefetch threads, which
   are not on main yet), against raw obstore fetching the same byte ranges
   (``get_ranges`` per object, every object at once) with the same number of
   batches in flight. The target is a ratio of at least 0.8.
2. Requests per batch and bytes fetched per token delivered, with obstore's
   coalescing (ranges closer than 1 MiB merged) and without (``coalesce=0``),
   with and without span metadata, and with blocks of consecutive windows;
   (2b) the ``meta.*`` bytes and time of a first batch of a dataset with
   dense span metadata, by block against the files mapped whole.
3. Time to the first batch of the dataset (``--gb``, default 1 GB) against
   downloading a whole shard first (MosaicML, LitData and seed 003 do that),
   and against raw obstore fetching the batch's token ranges alone from a
   fresh store (what the server costs for those ranges).
4. Bytes transferred to read one tensor of a tensor file, against its size.
5. GET requests per second at 1,000 and 10,000 ranks (one step per second,
   windows of 4,096 tokens, batch 32), from the requests per batch measured in
   2, against S3's ~5,500 GETs/s per prefix.

    python benchmarks/object_store.py [--gb 1.0] [--shard-mb 32] [--latency 0.02]
        [--seconds 4] [--first-batch-only]

moto serves a range GET by copying the whole object, so its cost per request
grows with the shard size: keep shards small (32 MiB) or moto, not the client,
sets the pace (it did at 256 MiB).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import obstore
from _plot import bars

from zerobatch.loader import Loader
from zerobatch.storage import ObjectStorage
from zerobatch.stream import StreamWriter, open_dataset
from zerobatch.stream.manifest import META_DATA, META_INDEX, META_SPANS
from zerobatch.tensors import safe_open, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.s3_server import ACCESS, retry_options

SERVE = """
import sys, threading
from support.s3_server import FaultProxy, S3Server
server = S3Server().start()
proxy = FaultProxy(server.endpoint)
proxy.state.latency = float(sys.argv[1])
print(server.endpoint, proxy.endpoint, flush=True)
threading.Event().wait()
"""
BATCH = 32


def options(endpoint: str) -> dict[str, Any]:
    return {"config": {**ACCESS, "endpoint": endpoint}, **retry_options(timeout=30, budget=120)}


class WholeFiles(ObjectStorage):
    """An ``ObjectStorage`` without a block cache: a dataset maps its index
    files whole on first use (how version-2 metadata was read before it went
    through the cache)."""

    blocks = None


class Recording:
    """Wraps a storage: records each ``read_into`` call's (object, offset, length)."""

    def __init__(self, inner: ObjectStorage) -> None:
        self.inner = inner
        self.calls: list[list[tuple[str, int, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read_into(self, handles: Any, offsets: Any, lengths: Any, buffer: Any,
                  destinations: Any) -> int:
        keys = self.inner._keys
        self.calls.append([(keys[int(h)], int(o), int(n))
                           for h, o, n in zip(handles, offsets, lengths, strict=True)])
        return self.inner.read_into(handles, offsets, lengths, buffer, destinations)


def write_dataset(url: str, endpoint: str, tokens: int, shard_tokens: int,
                  metadata: bool, span_every: int = 5_000) -> None:
    rng = np.random.default_rng(0)
    doc = 50_000
    with StreamWriter(url, shard_tokens=shard_tokens, metadata="msgpack" if metadata else None,
                      storage_options=options(endpoint)) as writer:
        for d in range(tokens // doc):
            ids = rng.integers(0, 50_000, doc, dtype=np.uint16)
            spans = [(s, min(s + 100, doc), {"doc": d, "at": s})
                     for s in range(0, doc, span_every)] if metadata else None
            writer.add_document(ids, spans=spans)


def loader_rate(windows: Any, settings: dict[str, Any], step: float, seconds: float) -> float:
    """Batches/s of ``Loader(windows, BATCH, **settings)`` with a consumer that
    sleeps ``step`` seconds a batch (GIL free, as a GPU step), for ``seconds``."""
    with Loader(windows, BATCH, seed=1, epochs=None, output="numpy", **settings) as loader:
        batches = iter(loader)
        next(batches)
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            next(batches)
            count += 1
            if step:
                time.sleep(step)
        return count / (time.perf_counter() - started)


def in_flight(read: Any, batches: list[np.ndarray], depth: int, seconds: float) -> float:
    """Batches per second reading ``batches`` in order with ``depth`` in flight."""
    done, start = 0, time.perf_counter()
    if depth == 0:
        for idx in batches:
            read(idx)
            done += 1
            if time.perf_counter() - start > seconds:
                break
        return done / (time.perf_counter() - start)
    with concurrent.futures.ThreadPoolExecutor(depth) as pool:
        pending = [pool.submit(read, idx) for idx in batches[:depth]]
        nxt = depth
        while pending:
            pending.pop(0).result()
            done += 1
            if nxt < len(batches) and time.perf_counter() - start < seconds:
                pending.append(pool.submit(read, batches[nxt]))
                nxt += 1
    return done / (time.perf_counter() - start)


def raw_reader(store: Any, prefix: str) -> Any:
    """Raw obstore: one batch's recorded ranges, every object's get_ranges at once."""
    loop = asyncio.new_event_loop()

    async def fetch(call: list[tuple[str, int, int]]) -> int:
        by_key: dict[str, list[tuple[int, int]]] = {}
        for key, offset, length in call:
            by_key.setdefault(key, []).append((offset, offset + length))
        parts = await asyncio.gather(*(
            obstore.get_ranges_async(store, f"{prefix}/{key}", starts=[a for a, _ in r],
                                     ends=[b for _, b in r]) for key, r in by_key.items()))
        return sum(len(memoryview(b)) for part in parts for b in part)

    runner = concurrent.futures.ThreadPoolExecutor(1)
    runner.submit(loop.run_forever)

    def read(call: list[tuple[str, int, int]]) -> int:
        return asyncio.run_coroutine_threadsafe(fetch(call), loop).result()

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        runner.shutdown()

    return read, stop


def count_gets(proxy_log: Any, run: Any) -> tuple[int, int]:
    """(GET requests, bytes in their Range headers) during ``run()``."""
    before = proxy_log()
    run()
    after = proxy_log()
    gets = [r for r in after[len(before):] if r[0] == "GET" and r[2]]
    total = 0
    for _, _, span in gets:
        a, b = span.removeprefix("bytes=").split("-")
        total += int(b) - int(a) + 1
    return len(gets), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--shard-mb", type=int, default=32)
    parser.add_argument("--first-batch-only", action="store_true", help="run part 3 alone")
    args = parser.parse_args()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"nproc={os.cpu_count()}  RAM={ram:.1f} GiB  load={os.getloadavg()[0]:.2f}  "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
          f"latency={args.latency * 1e3:.0f} ms per request")
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(args.latency)],
                              stdout=subprocess.PIPE, text=True, cwd=tests,
                              env={**os.environ, "PYTHONPATH": tests})
    try:
        assert server.stdout is not None
        direct, proxied = server.stdout.readline().split()
        run(args, direct, proxied)
    finally:
        server.terminate()
        server.wait()


def run(args: argparse.Namespace, direct: str, proxied: str) -> None:
    tokens = int(args.gb * 2**30 / 2)
    shard_tokens = args.shard_mb * 2**19  # uint16 tokens; moto copies a whole object per GET
    url = "s3://zerobatch-test/bench"
    started = time.perf_counter()
    write_dataset(url, direct, tokens, shard_tokens, metadata=False)
    print(f"wrote {tokens * 2 / 2**30:.2f} GiB ({tokens:,} tokens, "
          f"{-(-tokens // shard_tokens)} shards) in {time.perf_counter() - started:.1f} s")
    seq = args.seq_len

    # 3. first batch, before anything else touches the dataset (kernels compiled first,
    # on a small local dataset: JIT compilation is not a storage cost)
    with tempfile.TemporaryDirectory() as tmp:
        with StreamWriter(tmp + "/warm") as writer:
            writer.add_document(np.arange(10_000) % 1000)
        open_dataset(tmp + "/warm").windows(seq).read(np.arange(BATCH) % 4)
    rng = np.random.default_rng(1)
    started = time.perf_counter()
    first_storage = Recording(ObjectStorage(url, **options(proxied)))
    ds = open_dataset(url, storage=first_storage)
    windows = ds.windows(seq)
    windows.read(rng.integers(0, len(windows), BATCH))
    first = time.perf_counter() - started
    store = obstore.store.from_url("s3://zerobatch-test", **options(proxied))
    started = time.perf_counter()
    whole = obstore.get(store, "bench/00000.tokens").bytes()
    np.frombuffer(whole, dtype=np.uint16)[:BATCH * (seq + 1)].copy()
    download = time.perf_counter() - started
    fresh = obstore.store.from_url("s3://zerobatch-test", **options(proxied))
    raw, stop = raw_reader(fresh, "bench")
    started = time.perf_counter()
    raw(first_storage.calls[0])
    ranges = time.perf_counter() - started
    stop()
    print(f"\n3. first batch: zerobatch {first * 1e3:.0f} ms; download a whole "
          f"{len(whole) / 2**20:.0f} MiB shard first {download * 1e3:.0f} ms "
          f"({download / first:.2f}x zerobatch's time); raw obstore, the batch's token "
          f"ranges alone from a fresh store, {ranges * 1e3:.0f} ms")
    del whole
    if args.first_batch_only:
        return

    # 1. shuffled windows against raw obstore, same ranges, same batches in flight
    recording = Recording(ObjectStorage(url, **options(proxied)))
    ds = open_dataset(url, storage=recording)
    windows = ds.windows(seq)
    batches = [rng.integers(0, len(windows), BATCH) for _ in range(150)]
    for idx in batches:
        windows.read(idx)
    calls = recording.calls[-len(batches):]
    raw, stop = raw_reader(store, "bench")
    print(f"\n1. shuffled windows, seq_len {seq}, batch {BATCH}, over s3:// "
          f"(batches/s; {args.seconds:.0f} s each)")
    print(f"{'in flight':>10} {'zerobatch':>10} {'raw obstore':>12} {'ratio':>6}")
    for depth in (0, 4, 16):
        ours = in_flight(windows.read, batches, depth, args.seconds)
        theirs = in_flight(raw, calls, depth, args.seconds)
        print(f"{depth:>10} {ours:>10.1f} {theirs:>12.1f} {ours / theirs:>6.2f}")
    stop()
    print("\n1b. the Loader over s3:// at its defaults (reads wait: one reader thread) "
          "against num_threads=0, a consumer step of 0 and 50 ms (time.sleep), batches/s")
    print(f"{'step ms':>8} {'defaults':>9} {'threads=0':>10} {'ratio':>6}")
    for step in (0.0, 0.05):
        default = loader_rate(windows, {}, step, args.seconds)
        caller = loader_rate(windows, {"num_threads": 0}, step, args.seconds)
        print(f"{step * 1e3:>8.0f} {default:>9.1f} {caller:>10.1f} {default / caller:>6.2f}")

    # 2. requests per batch and bytes per token
    print("\n2. GETs per batch and bytes fetched per token delivered (32 batches each)")
    print(f"{'case':<44} {'GETs/batch':>10} {'bytes/token':>12}")
    meta_url = "s3://zerobatch-test/bench-meta"
    write_dataset(meta_url, direct, 2**24, 2**22, metadata=True)
    log = proxy_log_reader(proxied)
    per_batch: dict[str, float] = {}
    per_byte: dict[str, float] = {}
    for name, location, coalesce, block, kind in (
        ("shuffled windows, coalesce 1 MiB", url, 1 << 20, 1, ObjectStorage),
        ("shuffled windows, coalesce 0", url, 0, 1, ObjectStorage),
        ("blocks of 8 consecutive windows", url, 1 << 20, 8, ObjectStorage),
        ("blocks of 32 consecutive windows", url, 1 << 20, 32, ObjectStorage),
        ("with span metadata, meta files whole", meta_url, 1 << 20, 1, WholeFiles),
        ("with span metadata (index files by block)", meta_url, 1 << 20, 1, ObjectStorage),
    ):
        storage = kind(location, coalesce=coalesce, **options(proxied))
        dataset = open_dataset(location, storage=storage)
        src = dataset.windows(seq, columns="all")  # with span metadata, its columns too
        picks = []
        pick = np.random.default_rng(2) if dataset.has_metadata else rng  # the same batches
        for _ in range(32):
            starts = pick.integers(0, len(src) - block, BATCH // block)
            picks.append((starts[:, None] + np.arange(block)).ravel())
        before = log()
        gets, fetched = count_gets(log, lambda s=src, p=picks: [s.read(i) for i in p])
        per_batch[name] = gets / 32
        per_byte[name] = fetched / (32 * BATCH * seq * 2)  # uint16 tokens: 2 useful bytes each
        print(f"{name:<44} {gets / 32:>10.1f} {fetched / (32 * BATCH * seq):>12.2f}")
        if dataset.has_metadata:
            meta = [r for r in log()[len(before):] if r[0] == "GET" and ".meta." in r[1]]
            ranged = [r for r in meta if r[2]]
            size = sum(storage.size(shard.file(suffix)) for shard in dataset.manifest.shards
                       for suffix in (META_INDEX, META_DATA, META_SPANS))
            meta_bytes = sum(int(b) - int(a) + 1 for a, b in (
                r[2].removeprefix("bytes=").split("-") for r in ranged))
            print(f"{'  of which meta.* files':<44} {len(meta) / 32:>10.1f} "
                  f"{meta_bytes / (32 * BATCH * seq):>12.3f}  ({len(meta) - len(ranged)} "
                  f"whole-file GETs; {meta_bytes:,} bytes in range GETs of {size:,} in the "
                  f"files)")

    bars("object_store_gets", per_batch, title=f"GETs per batch over s3:// ({BATCH} shuffled "
         f"windows of {seq} tokens)", xlabel="GETs per batch", limit=float(BATCH),
         limit_label="one GET per window")
    bars("object_store_bytes", per_byte, title="Bytes fetched per useful byte over s3://",
         xlabel="bytes fetched / token bytes delivered", limit=1.0, limit_label="no waste")

    # 2b. dense span metadata: what the first batch fetches of the meta.* files
    dense_url = "s3://zerobatch-test/bench-dense"
    write_dataset(dense_url, direct, 2**23, 2**21, metadata=True, span_every=50)
    print("\n2b. first batch of dense span metadata (a span every 50 tokens, 4 shards): "
          "meta.* GETs, bytes, and the batch's ms, fresh storage each (best of 3, alternated)")
    print(f"{'case':<44} {'GETs':>6} {'meta bytes':>12} {'of files':>10} {'ms':>8}")
    idx = np.random.default_rng(3).integers(0, 2**23 // (seq + 1) - 1, BATCH)
    for coalesce in (1 << 16, 1 << 20):
        best: dict[str, tuple[float, int, int, int]] = {}
        for _ in range(3):
            for name, kind in (("meta files whole", WholeFiles), ("by block", ObjectStorage)):
                storage = kind(dense_url, coalesce=coalesce, **options(proxied))
                dataset = open_dataset(dense_url, storage=storage)
                src = dataset.windows(seq)
                before = log()
                started = time.perf_counter()
                src.read(idx)
                elapsed = time.perf_counter() - started
                meta = [r for r in log()[len(before):] if r[0] == "GET" and ".meta." in r[1]]
                got = sum(int(b) - int(a) + 1 for a, b in (
                    r[2].removeprefix("bytes=").split("-") for r in meta if r[2]))
                size = sum(storage.size(shard.file(suffix)) for shard in dataset.manifest.shards
                           for suffix in (META_INDEX, META_DATA, META_SPANS))
                if name not in best or elapsed < best[name][0]:
                    best[name] = (elapsed, len(meta), got, size)
                dataset.close()
        for name, (elapsed, count, got, size) in best.items():
            label = f"{name}, coalesce {coalesce >> 10} KiB"
            print(f"{label:<44} {count:>6} {got:>12,} {got / size:>10.3f} {elapsed * 1e3:>8.0f}")

    # 4. one tensor out of a tensor file
    tensors = {f"layer{i}": np.zeros((1024, 1024), np.float32) for i in range(16)}
    tensor_url = "s3://zerobatch-test/bench-tensors/model.bt"
    save_file(tensors, tensor_url, storage_options=options(direct))
    size = ObjectStorage("s3://zerobatch-test/bench-tensors", **options(direct)).size("model.bt")
    with safe_open(tensor_url, "np", storage_options=options(proxied)) as file:
        gets, fetched = count_gets(log, lambda: file.get_tensor("layer7"))
    print(f"\n4. one tensor of {size / 2**20:.0f} MiB file: {gets} GET, "
          f"{fetched / 2**20:.1f} MiB ({fetched / size:.3f} of the file)")

    # 5. at scale, on paper
    print("\n5. GETs/s at one step per second, windows of 4,096 tokens, batch 32 "
          "(S3: ~5,500 GETs/s per prefix)")
    for name in ("shuffled windows, coalesce 1 MiB", "blocks of 8 consecutive windows",
                 "blocks of 32 consecutive windows"):
        rate = per_batch[name]
        print(f"  {name:<34} 1,000 ranks: {rate * 1000:>9,.0f}/s   "
              f"10,000 ranks: {rate * 10000:>10,.0f}/s   "
              f"prefixes needed at 10,000: {int(np.ceil(rate * 10000 / 5500))}")


def proxy_log_reader(endpoint: str) -> Any:
    """The proxy's request log, asked over HTTP (it runs in the server process)."""
    import json
    import urllib.request

    def read() -> list[tuple[str, str, str | None]]:
        with urllib.request.urlopen(f"{endpoint}/__requests__", timeout=10) as response:
            return [tuple(r) for r in json.loads(response.read())]  # type: ignore[misc]
    return read


if __name__ == "__main__":
    main()
