"""Peer formats read in place: time to the first batch, memory, shuffled tokens/s.

The same random corpus (uint16 tokens, documents of about 1,000 tokens) is
written by each peer's own writer: Megatron (megatron-core's
``IndexedDatasetBuilder``), datatrove (``TokenizedFile``), LitData
(``BinaryWriter``, what ``optimize`` runs; ``TokensLoader``), Hugging Face
(``save_to_disk`` of a ``list<uint16>`` column), MosaicML Streaming
(``MDSWriter``, one ``ndarray:uint16`` sample per document; run in its own
environment, tests/support/mds_env.py, built once), and zerobatch's own
``StreamWriter`` (the native baseline). Then, each in a fresh process:

1. **First batch**: wall time from opening the files to the first shuffled
   batch (imports excluded, printed apart), and the peak RSS the process
   added over that span (``VmHWM`` after minus ``VmRSS`` before, the peak reset
   through ``/proc/self/clear_refs`` first; for zerobatch also the part of
   it that is file pages mapped by the reads, ``RssFile``: page cache the
   kernel maps a folio at a time, up to 2 MiB per window touched on recent
   kernels, shared and reclaimable, not memory the reader allocated; the run
   first prints what this kernel maps per 4 KiB page first touched in a
   warm file, the unit of that part). zerobatch:
   ``open_dataset`` + ``Loader`` over ``windows(2048, document_masking=True)``
   (positions and ``cu_seqlens``: document offsets looked up) + ``next``, in
   a process started after one that ran the same (which compiles what the
   Numba cache lacks, as a user's first run on a machine does, and caches
   MDS's token counts, ``zerobatch.peers._counts``: MDS is also timed with
   ``cache_dir=False``, its counts derived from every sample). Megatron:
   ``IndexedDataset`` + ``GPTDataset`` (building its document, sample and
   shuffle indices, in a fresh cache folder) + a ``DataLoader`` batch.
   datatrove: ``DatatroveFolderDataset`` + a shuffled ``DataLoader`` batch.
   LitData: ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``.
   HF: ``load_from_disk`` + one batch of shuffled rows (documents).
2. **Shuffled tokens/s** for ``--seconds``: zerobatch's Loader (windows of
   2,048 tokens, batch 8, int64, default threads) on each peer's files and on
   its own format, against each peer's own loader on the same files
   (documents for HF: zerobatch's ``documents()`` against ``ds[indices]``).
   Each zerobatch run on a format is followed by one on the native copy,
   ``--rounds`` times: "/ native" is the median of those pairs' ratios, and
   their range is printed. A VM's speed moves by a fifth between runs
   seconds apart: one native run set against every format put MDS windows
   at 0.66 of native, and five pairs two minutes later ranged 0.78-1.05.

   MDS: ``StreamingDataset(shuffle=True)`` (its defaults otherwise) with a
   ``DataLoader`` of 8 samples (documents), in its environment; zerobatch's
   windows and documents on the same shards.

    python benchmarks/peer_formats.py [--tokens 1e8] [--seconds 5] [--rounds 3] [--out DIR]
        [--megatron-only]
    python benchmarks/peer_formats.py --mds-only [--tokens 1e8]   # MDS and native only

Figures go to BENCHMARKS.md with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _files import warm
from _plot import groups

SEQ, BATCH = 2048, 8

_RSS = '''
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
'''

_PRELUDE = "import time, json, numpy as np\n" + _RSS


def build(root: Path, tokens: int, formats: list[str]) -> dict[str, Path]:
    """The corpus in every format under ``root`` (kept between runs)."""
    rng = np.random.default_rng(0)
    values = rng.integers(0, 50_000, tokens, dtype=np.uint16)
    lengths = np.maximum(1, rng.exponential(1000, tokens // 500).astype(np.int64))
    ends = np.cumsum(lengths)
    ends = np.append(ends[ends < tokens], tokens)
    starts = np.concatenate([[0], ends[:-1]])
    out = {}
    for name in formats:
        folder = root / name
        out[name] = folder
        if (folder / ".done").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        globals()[f"_write_{name}"](folder, values, starts, ends)
        (folder / ".done").write_text("")
        print(f"wrote {name}: {time.perf_counter() - t:.1f} s", flush=True)
    return out


def _write_megatron(folder: Path, values: np.ndarray, starts: np.ndarray,
                    ends: np.ndarray) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(folder / "corpus.bin"), dtype=np.uint16)
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        builder.add_item(torch.from_numpy(values[a:b]))
        builder.end_document()
    builder.finalize(str(folder / "corpus.idx"))


def _write_datatrove(folder: Path, values: np.ndarray, starts: np.ndarray,
                     ends: np.ndarray) -> None:
    from datatrove.pipeline.tokens.tokenizer import TokenizedFile

    file = TokenizedFile(str(folder), "000_corpus.ds", token_size=2, save_final_metadata=True)
    step = 1 << 24
    for a in range(0, values.shape[0], step):
        inside = ends[(ends > a) & (ends <= a + step)] - a
        file.write_bytes(values[a:a + step].tobytes(), inside.tolist())
    file.close()


def _write_litdata(folder: Path, values: np.ndarray, starts: np.ndarray,
                   ends: np.ndarray) -> None:
    import torch
    from litdata import TokensLoader
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(folder), chunk_bytes="64MB", item_loader=TokensLoader())
    for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        writer[k] = torch.from_numpy(values[a:b])
    writer.done()
    writer.merge()


def _write_hf(folder: Path, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    import datasets
    import pyarrow as pa

    offsets = pa.array(np.append(starts, ends[-1]).astype(np.int32))
    column = pa.ListArray.from_arrays(offsets, pa.array(values))
    table = pa.table({"input_ids": column})
    datasets.Dataset(table).save_to_disk(str(folder))


def _write_mds(folder: Path, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support import mds_env

    shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "tokens.npy", values)
        np.save(Path(tmp) / "ends.npy", ends)
        job = {"out": str(folder), "column": "tokens", "tokens": str(Path(tmp) / "tokens.npy"),
               "ends": str(Path(tmp) / "ends.npy"), "size_limit": 1 << 26}
        (Path(tmp) / "jobs.json").write_text(json.dumps({"corpus": [job]}))
        mds_env.run("jobs", str(Path(tmp) / "jobs.json"), timeout=3600)


def _mds(path: Path, seconds: float) -> dict[str, float]:
    """MDS's own StreamingDataset on ``path``, in its environment."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support import mds_env

    lines = mds_env.run("bench", str(path), "tokens", str(BATCH), str(seconds)).splitlines()
    return json.loads([line for line in lines if line.startswith("{")][-1])


def _write_native(folder: Path, values: np.ndarray, starts: np.ndarray,
                  ends: np.ndarray) -> None:
    import shutil

    from zerobatch.stream import StreamWriter

    shutil.rmtree(folder)
    with StreamWriter(folder, token_dtype="<u2") as writer:
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            writer.add_document(values[a:b])


# ------------------------------------------------------------------ runners (child code)

def _zerobatch_first(path: Path, fmt: str, options: str = "") -> str:
    return f'''
import zerobatch
from zerobatch import Loader, open_dataset
def first():
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM restarts from VmRSS
    before, mapped = rss("VmRSS"), rss("RssFile"); t = time.perf_counter()
    ds = open_dataset({str(path)!r}{options})
    source = (ds.windows({SEQ}, document_masking=True) if {fmt!r} != "docs"
              else ds.documents())
    batch = next(iter(Loader(source, {BATCH}, seed=1, output="numpy")))
    s = time.perf_counter() - t
    mapped = rss("RssFile") - mapped  # file pages mapped by the reads: page cache, not heap
    ds.close()
    return s, rss("VmHWM") - before, mapped
cold, cold_rss, cold_file = first()
warm, warm_rss, warm_file = first()
print(json.dumps({{"s": cold, "rss": cold_rss, "warm": warm, "warm_rss": warm_rss,
                  "file": cold_file, "warm_file": warm_file}}))
'''


def _megatron_first(path: Path, cache: str) -> str:
    return f'''
import torch, types
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.utils import Split
tok = types.SimpleNamespace(vocab_size=50_000, eod=0, pad=1, unique_identifiers={{"t": 1}})
before = rss("VmRSS"); t = time.perf_counter()
indexed = IndexedDataset({str(path / "corpus")!r})
config = GPTDatasetConfig(random_seed=1, sequence_length={SEQ}, split="1,0,0",
    reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
    tokenizer=tok, path_to_cache={cache!r}, create_attention_mask=False)
ds = GPTDataset(indexed, {str(path / "corpus")!r}, np.arange(len(indexed)), None, Split.train,
                config)
loader = torch.utils.data.DataLoader(ds, batch_size={BATCH})
batch = next(iter(loader))
print(json.dumps({{"s": time.perf_counter() - t, "rss": rss("VmHWM") - before}}))
'''


def _datatrove_first(path: Path) -> str:
    return f'''
import torch
from datatrove.utils.dataset import DatatroveFolderDataset
before = rss("VmRSS"); t = time.perf_counter()
ds = DatatroveFolderDataset({str(path)!r}, {SEQ}, token_size=2, shuffle=True)
batch = next(iter(torch.utils.data.DataLoader(ds, batch_size={BATCH}, shuffle=True)))
print(json.dumps({{"s": time.perf_counter() - t, "rss": rss("VmHWM") - before}}))
'''


def _litdata_first(path: Path) -> str:
    return f'''
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
before = rss("VmRSS"); t = time.perf_counter()
ds = StreamingDataset({str(path)!r}, item_loader=TokensLoader(block_size={SEQ + 1}),
                      shuffle=True)
batch = next(iter(StreamingDataLoader(ds, batch_size={BATCH})))
print(json.dumps({{"s": time.perf_counter() - t, "rss": rss("VmHWM") - before}}))
'''


def _hf_first(path: Path) -> str:
    return f'''
import datasets
before = rss("VmRSS"); t = time.perf_counter()
ds = datasets.load_from_disk({str(path)!r}).with_format("numpy")
order = np.random.default_rng(1).permutation(len(ds))
batch = ds[order[:{BATCH}].tolist()]["input_ids"]
print(json.dumps({{"s": time.perf_counter() - t, "rss": rss("VmHWM") - before}}))
'''


def _zerobatch_rate(path: Path, fmt: str, seconds: float) -> str:
    return f'''
from zerobatch import Loader, open_dataset
ds = open_dataset({str(path)!r})
docs = {fmt!r} == "docs"
source = ds.documents() if docs else ds.windows({SEQ})
# not timed: the kernels loaded, and past the reads that look document offsets up
# before the direct kernel takes over (zerobatch.peers: 16 reads; 64 here)
for _ in zip(range(64), Loader(source, {BATCH}, seed=99, output="batch")):
    pass
n = 0; t = time.perf_counter()
for epoch in range(100):
    for batch in Loader(source, {BATCH}, seed=epoch, output="batch", epochs=1):
        n += batch["input_ids"].values.shape[0] if docs else batch["input_ids"].size
        if time.perf_counter() - t > {seconds}:
            break
    else:
        continue
    break
print(json.dumps({{"tokens_s": n / (time.perf_counter() - t)}}))
'''


def _timed_loop(make: str, count: str, seconds: float) -> str:
    return f'''
{make}
next(iter(loader))  # the first batch is not timed
n = 0; t = time.perf_counter()
while time.perf_counter() - t < {seconds}:
    for batch in loader:
        n += {count}
        if time.perf_counter() - t > {seconds}:
            break
print(json.dumps({{"tokens_s": n / (time.perf_counter() - t)}}))
'''


def _megatron_rate(path: Path, cache: str, seconds: float) -> str:
    make = _megatron_first(path, cache).split("batch = next")[0]
    return make + _timed_loop("loader = torch.utils.data.DataLoader(ds, batch_size="
                              f"{BATCH}, shuffle=False)", 'batch["tokens"].numel()', seconds)


def _datatrove_rate(path: Path, seconds: float) -> str:
    make = _datatrove_first(path).split("batch = next")[0]
    return make + _timed_loop("loader = torch.utils.data.DataLoader(ds, batch_size="
                              f"{BATCH}, shuffle=True)", 'batch["input_ids"].numel()',
                              seconds)


def _litdata_rate(path: Path, seconds: float) -> str:
    make = _litdata_first(path).split("batch = next")[0]
    return make + _timed_loop(f"loader = StreamingDataLoader(ds, batch_size={BATCH})",
                              "batch.numel()", seconds)


def _hf_rate(path: Path, seconds: float) -> str:
    make = _hf_first(path).split("batch = ds[")[0]
    # an iterable, not a generator: the timed loop starts a new epoch when one ends
    return make + _timed_loop(
        "class Rows:\n"
        "    def __iter__(self):\n"
        f"        for i in range(0, len(order), {BATCH}):\n"
        f"            yield ds[order[i:i + {BATCH}].tolist()]['input_ids']\n"
        "loader = Rows()", "sum(len(x) for x in batch)", seconds)


def run(code: str, path: Path) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter, ``path``'s files in the page cache
    first (``_files.warm``); its last line of JSON."""
    warm(path)
    done = subprocess.run([sys.executable, "-c", _PRELUDE + code], capture_output=True,
                          text=True, timeout=3600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def _mapped_per_touch(folder: Path, touches: int = 8) -> tuple[float, float]:
    """Bytes of file pages (``RssFile``) a process gains per 4 KiB page it
    first reads through a mapping of the largest file under ``folder`` (in
    the page cache: read whole first), plainly and after
    ``madvise(MADV_RANDOM)``: what any mapped reader pays per window on this
    kernel, whoever wrote or read the file before."""
    import mmap

    def mapped() -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) << 10 for line in status
                        if line.startswith("RssFile:"))

    path = max((f for f in folder.iterdir() if f.is_file()), key=lambda f: f.stat().st_size)
    warm(folder)
    found = []
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        for random in (False, True):
            view = mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ)
            if random:
                view.madvise(mmap.MADV_RANDOM)
            before = mapped()
            for at in np.random.default_rng(7 + random).integers(0, size - 4096,
                                                                 touches).tolist():
                view[at:at + 4096]
            found.append((mapped() - before) / touches)
            view.close()
    return found[0], found[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=float, default=1e8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of zerobatch on each format, each next to one on the native "
                             "copy (the ratio to native is their median: a VM's speed moves "
                             "by 20 %% between runs a few seconds apart)")
    parser.add_argument("--out", type=Path, default=None, help="keep the corpora here")
    parser.add_argument("--megatron-only", action="store_true",
                        help="only the first-batch comparison with Megatron's GPTDataset")
    parser.add_argument("--mds-only", action="store_true",
                        help="only MDS (against MDS's StreamingDataset) and the native baseline")
    parser.add_argument("--formats", default=None,
                        help="comma-separated formats (the native baseline is always added)")
    args = parser.parse_args()
    tokens = int(args.tokens)
    root = args.out or Path(tempfile.mkdtemp(prefix="zb-peers-"))
    formats = ["megatron"] if args.megatron_only else ["mds", "native"] if args.mds_only else [
        "megatron", "datatrove", "litdata", "hf", "mds", "native"]
    if args.formats:
        formats = [*dict.fromkeys([*args.formats.split(","), "native"])]
    paths = build(root / f"{tokens}", tokens, formats)
    # MDS's token counts (zerobatch.peers._counts): cached here, not in the user's cache
    os.environ["ZEROBATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="zb-counts-")
    print(f"tokens {tokens:,}, seq_len {SEQ}, batch {BATCH}; load {os.getloadavg()}")
    touch, random_touch = _mapped_per_touch(paths["native"])
    print(f"page cache this kernel maps a process per 4 KiB first touched in a warm file: "
          f"{touch / 2**20:.2f} MiB (large folios, mapped whole; madvise(MADV_RANDOM) "
          f"{random_touch / 2**20:.2f} MiB)")
    print("\nfirst batch (fresh process; imports excluded)")
    print("zerobatch: cold = a fresh process (its Numba kernels load from the cache); "
          "warm = opening again in that process")
    print(f"{'format':<10} {'reader':<34} {'seconds':>9} {'added RSS MiB':>14}")
    peers = {
        "megatron": lambda p: _megatron_first(p, tempfile.mkdtemp(prefix="zb-mcache-")),
        "datatrove": _datatrove_first, "litdata": _litdata_first, "hf": _hf_first,
    }
    first: dict[str, dict[str, float]] = {}
    drawn_ms: dict[str, dict[str, float]] = {}  # format -> reader -> ms (the figures)
    drawn_rss: dict[str, dict[str, float]] = {}
    mds_rate = None
    for name, path in paths.items():
        mode = "docs" if name == "hf" else "windows"
        if name == "mds":  # its first batch and rate in one run of its environment
            warm(path)
            mds_rate = _mds(path, args.seconds)
            # zerobatch with MDS's token counts derived from every sample: no count cache
            run(_zerobatch_first(path, mode, ", cache_dir=False"), path)  # compiles: not timed
            uncached = run(_zerobatch_first(path, mode, ", cache_dir=False"), path)
            print(f"{name:<10} {'zerobatch Loader, cold, no cache':<34} {uncached['s']:>9.4f} "
                  f"{uncached['rss'] / 2**20:>14.1f}   (mapped file pages "
                  f"{uncached['file'] / 2**20:.1f})", flush=True)
        run(_zerobatch_first(path, mode), path)  # compiles, counts MDS's tokens: not timed
        ours = run(_zerobatch_first(path, mode), path)
        first[name] = ours
        print(f"{name:<10} {'zerobatch Loader, cold':<34} {ours['s']:>9.4f} "
              f"{ours['rss'] / 2**20:>14.1f}   (mapped file pages "
              f"{ours['file'] / 2**20:.1f})", flush=True)
        print(f"{name:<10} {'zerobatch Loader, warm':<34} {ours['warm']:>9.4f} "
              f"{ours['warm_rss'] / 2**20:>14.1f}   (mapped file pages "
              f"{ours['warm_file'] / 2**20:.1f})", flush=True)
        drawn_ms[name] = {"zerobatch Loader, fresh process (Numba kernels load)": ours["s"] * 1e3,
                          "zerobatch Loader, opened again": ours["warm"] * 1e3}
        drawn_rss[name] = {"zerobatch Loader, fresh process": ours["rss"] / 2**20}
        if name in peers or name == "mds":
            theirs = mds_rate if name == "mds" else run(peers[name](path), path)
            assert theirs is not None
            label = {"megatron": "GPTDataset (builds its indices)", "datatrove":
                     "DatatroveFolderDataset+DataLoader", "litdata": "StreamingDataset",
                     "hf": "load_from_disk + rows", "mds": "MDS StreamingDataset"}[name]
            print(f"{name:<10} {label:<34} {theirs['s']:>9.4f} {theirs['rss'] / 2**20:>14.1f}"
                  f"   / zerobatch: cold {theirs['s'] / ours['s']:.2f}x, warm "
                  f"{theirs['s'] / ours['warm']:.1f}x", flush=True)
            drawn_ms[name]["the peer's own loader"] = theirs["s"] * 1e3
            drawn_rss[name]["the peer's own loader"] = theirs["rss"] / 2**20
    groups("peer_formats_first", drawn_ms, log=True, fmt="{:.3g} ms",
           title=f"First shuffled batch on each peer's own files ({tokens:.0e} tokens; target "
                 "zerobatch < 50 ms)", xlabel="ms from opening the files to the first batch (log)")
    groups("peer_formats_memory", drawn_rss, fmt="{:.3g} MiB",
           title=f"Peak RSS added to the first batch ({tokens:.0e} tokens; target zerobatch "
                 "< 20 MB)", xlabel="MiB (zerobatch: includes mapped file pages)")
    if args.megatron_only:
        return
    print(f"\nshuffled tokens/s ({args.seconds:g} s each; HF: documents); zerobatch: the "
          f"median of {args.rounds} runs, each next to a run on the native copy; / native: "
          "the median of those pairs' ratios (their range after it)")
    print(f"{'format':<10} {'peer loader':>14} {'zerobatch':>14} {'x peer':>8} {'/ native':>9}")
    natives: dict[str, list[float]] = {"windows": [], "docs": []}

    def paired(name: str, mode: str) -> tuple[float, float, str]:
        """zerobatch's tokens/s on ``name``'s files and its ratio to the native copy."""
        ours, ratios = [], []
        for _ in range(max(1, args.rounds)):
            ours.append(run(_zerobatch_rate(paths[name], mode, args.seconds),
                            paths[name])["tokens_s"])
            base = run(_zerobatch_rate(paths["native"], mode, args.seconds),
                       paths["native"])["tokens_s"]
            natives[mode].append(base)
            ratios.append(ours[-1] / base)
        return (float(np.median(ours)), float(np.median(ratios)),
                f"({min(ratios):.2f}-{max(ratios):.2f})")

    rates = {
        "megatron": lambda p: _megatron_rate(p, tempfile.mkdtemp(prefix="zb-mcache-"),
                                             args.seconds),
        "datatrove": lambda p: _datatrove_rate(p, args.seconds),
        "litdata": lambda p: _litdata_rate(p, args.seconds),
        "hf": lambda p: _hf_rate(p, args.seconds),
    }
    drawn_rates: dict[str, dict[str, float]] = {}  # format -> reader -> Mtok/s
    if mds_rate is not None:
        for mode in ("windows", "docs"):
            ours, ratio, spread = paired("mds", mode)
            print(f"{'mds ' + mode:<10} {mds_rate['tokens_s']:>14,.0f} {ours:>14,.0f} "
                  f"{ours / mds_rate['tokens_s']:>8.1f} {ratio:>9.2f} {spread}", flush=True)
            drawn_rates[f"mds {mode}"] = {"zerobatch Loader": ours / 1e6,
                                          "the peer's own loader": mds_rate["tokens_s"] / 1e6}
    if args.mds_only:
        rates = {}  # no other peer
    for name, make in rates.items():
        if name not in paths:
            continue
        mode = "docs" if name == "hf" else "windows"
        ours, ratio, spread = paired(name, mode)
        theirs = run(make(paths[name]), paths[name])["tokens_s"]
        print(f"{name:<10} {theirs:>14,.0f} {ours:>14,.0f} {ours / theirs:>8.1f} "
              f"{ratio:>9.2f} {spread}", flush=True)
        drawn_rates[name] = {"zerobatch Loader": ours / 1e6,
                             "the peer's own loader": theirs / 1e6}
    if not natives["windows"]:  # no other format: the native copy alone
        paired("native", "windows")
    native = float(np.median(natives["windows"]))
    documents = f"{np.median(natives['docs']):,.0f}" if natives["docs"] else "not run"
    print(f"{'native':<10} {'':>14} {native:>14,.0f} (the median of its "
          f"{len(natives['windows'])} runs, {min(natives['windows']) / 1e6:,.0f}-"
          f"{max(natives['windows']) / 1e6:,.0f} M; documents: {documents})")
    drawn_rates["native (zerobatch's own files)"] = {"zerobatch Loader": native / 1e6}
    groups("peer_formats_rates" + ("_mds" if args.mds_only else ""), drawn_rates, log=True,
           fmt="{:.3g}", title=f"Shuffled tokens/s on each peer's files (batch {BATCH}, windows "
                               f"of {SEQ}; HF: documents)", xlabel="M tokens/s (log)")


if __name__ == "__main__":
    main()
