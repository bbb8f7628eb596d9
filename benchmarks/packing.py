"""Packing: speed, efficiency and Loader throughput, against TRL and greedy next-fit.

1. Speed: documents packed per second for one window of 10^4 and of 10^5
   documents (lognormal conversation lengths, seq_len 4,096): zerobatch's
   window packing (``PackedRows._pack``: the window's document ids from the
   Feistel order, their lengths from the ``.docs`` offsets, pieces,
   best-fit decreasing, the rows' order) against TRL's ``pack_dataset(strategy=
   "bfd")`` on the same lengths (the whole call over a ``datasets.Dataset``
   with one map batch per window, and its packing function ``_pack_bfd`` on
   the Arrow table alone). Then a resume: ``load_state_dict`` of a state in
   the middle of a window at the default window, and the first batch after it.
2. Efficiency: padding and dropped-token fractions on three length
   distributions -- lognormal conversations, a code-like heavy tail, and the
   demo's corpus (standard-library files, byte-level BPE of 8,192 ids trained
   here) -- for zerobatch at its default window (``"split"`` and
   ``"truncate"``), TRL's BFD (its default map batch of 1,000 documents, and
   one batch of all) and greedy next-fit in order (split).
3. Throughput: ``Loader`` tokens/s over packed rows with the full varlen
   contract (input_ids, labels from a loss mask, position_ids, cu_seqlens,
   max_seqlen, seq_idx) against ``Loader`` over ``windows`` of the same
   dataset and records (its default columns: int64 input_ids and shifted
   labels, and the loss_mask field as a view of the read records; no mask
   applied), output numpy, batch 8. Slots/s counts ``rows * seq_len``;
   packed rows also hold padding. First per CPU second of the calling thread
   (num_threads=0, interleaved, more than an epoch each), which a loaded
   machine blurs less than wall time, also for packed rows without a loss
   mask (labels from the tokens alone); then the planes the outputs write
   (a ceiling for a read bound by its stores), then wall time with 1 reader
   thread.

    python benchmarks/packing.py [--quick] [--part N ...]

Part 3 alone (the 0.7 target; ~1 min): ``python benchmarks/packing.py --part 3``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _plot import bars, groups, scratch_images
from datasets.utils.logging import disable_progress_bar
from numba import njit

from zerobatch import Loader, StreamWriter, open_dataset
from zerobatch import _packing_kernels as pk
from zerobatch.packing import DEFAULT_WINDOW

SEQ_LEN = 4096


def _best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def conversations(n: int, seed: int = 0) -> np.ndarray:
    """Lognormal conversation lengths: median ~400 tokens, a few over 4,096."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.0, 0.9, n), 8, 32768).astype(np.int64)


def code_like(n: int, seed: int = 1) -> np.ndarray:
    """A code corpus's heavy tail: median ~1,100 tokens, 10% over 8,192."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(7.0, 1.4, n), 16, 200_000).astype(np.int64)


def demo_lengths(limit_bytes: int) -> np.ndarray:
    """Token counts of the demo's corpus (standard-library .py files)."""
    from tokenizers import Tokenizer

    from zerobatch.demo import _train_tokenizer, corpus_files

    files = corpus_files(limit_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        _train_tokenizer(files, path, 8192)
        tok = Tokenizer.from_file(str(path))
        texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
        return np.array([len(e.ids) for e in tok.encode_batch(texts)], np.int64)


def write(folder: Path, lengths: np.ndarray) -> Path:
    rng = np.random.default_rng(0)
    pool = rng.integers(1, 60000, int(lengths.max()) + 1).astype(np.uint16)
    with StreamWriter(folder, fields={"loss_mask": "u1"}) as writer:
        for n in lengths.tolist():
            mask = np.zeros(n, np.uint8)
            mask[n // 3:] = 1
            writer.add_document(pool[:n], fields={"loss_mask": mask})
    return folder


# -- packers over plain length arrays -------------------------------------------

def zb_pack(lengths: np.ndarray, window: int, policy: str) -> tuple[int, int, int]:
    """(rows, tokens placed, tokens dropped) of zerobatch's packing."""
    rows = placed = dropped = 0
    for start in range(0, len(lengths), window):
        _, _, size, stats = pk.make_pieces(lengths[start:start + window], SEQ_LEN,
                                           pk.POLICIES[policy])
        rows += pk.best_fit_decreasing(size, SEQ_LEN)[1]
        placed += int(stats[3])
        dropped += int(stats[1])
    return rows, placed, dropped


def next_fit(lengths: np.ndarray) -> tuple[int, int, int]:
    """Greedy next-fit in order, long documents split: a row closes when the
    next piece does not fit."""
    rows, room = 0, 0
    for n in lengths.tolist():
        while n > 0:
            piece = min(n, SEQ_LEN)
            if piece > room:
                rows += 1
                room = SEQ_LEN
            room -= piece
            n -= piece
    return rows, int(lengths.sum()), 0


def _arrow(lengths: np.ndarray) -> Any:
    import pyarrow as pa

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = pa.array(np.zeros(int(offsets[-1]), np.int32))
    return pa.Table.from_arrays([pa.LargeListArray.from_arrays(pa.array(offsets), values)],
                                names=["input_ids"])


def trl_pack(lengths: np.ndarray, batch: int, strategy: str = "bfd") -> tuple[int, int, int]:
    from datasets import Dataset
    from trl import pack_dataset

    ds = Dataset(_arrow(lengths))
    packed = pack_dataset(ds, SEQ_LEN, strategy=strategy, map_kwargs={"batch_size": batch})
    seq = packed.with_format("arrow")["seq_lengths"]
    placed = int(sum(int(np.sum(s.values.to_numpy())) for s in seq.chunks)
                 if hasattr(seq, "chunks") else np.sum(seq.values))
    return len(packed), placed, int(lengths.sum()) - placed


def efficiency(name: str, lengths: np.ndarray, trl: bool) -> dict[str, float]:
    """Prints rows, padding and dropped tokens of each packer on ``lengths``;
    returns each packer's padding in percent."""
    total = int(lengths.sum())
    print(f"\n{name}: {len(lengths)} documents, {total / 1e6:.1f} M tokens, "
          f"median {int(np.median(lengths))}, {100 * (lengths > SEQ_LEN).mean():.1f}% "
          f"longer than {SEQ_LEN}")
    rows_of: list[tuple[str, tuple[int, int, int]]] = [
        (f"zerobatch BFD window {DEFAULT_WINDOW}, split", zb_pack(lengths, DEFAULT_WINDOW,
                                                                  "split")),
        (f"zerobatch BFD window {DEFAULT_WINDOW}, truncate",
         zb_pack(lengths, DEFAULT_WINDOW, "truncate")),
        ("zerobatch BFD window 1000, split", zb_pack(lengths, 1000, "split")),
        ("greedy next-fit, split", next_fit(lengths)),
    ]
    if trl:
        rows_of += [("TRL bfd (truncate), map batch 1000", trl_pack(lengths, 1000)),
                    ("TRL bfd (truncate), one batch of all", trl_pack(lengths, len(lengths))),
                    ("TRL bfd_split, map batch 1000", trl_pack(lengths, 1000, "bfd_split"))]
    paddings = {}
    for label, (rows, placed, dropped) in rows_of:
        padding = 1 - placed / (rows * SEQ_LEN)
        paddings[label] = 100 * padding
        print(f"  {label:<42} rows {rows:>8}  padding {100 * padding:6.2f}%  "
              f"dropped {100 * dropped / total:6.2f}%")
    return paddings


def speed(root: Path, n: int, repeat: int, trl: bool) -> dict[str, float]:
    """Prints and returns each packer's M documents/s on one window of ``n``."""
    lengths = conversations(n, seed=n)
    docs = open_dataset(write(root / f"speed{n}", lengths)).documents()
    packed = docs.packed(SEQ_LEN, window=n)
    packed._pack(0, 0)  # compile / map
    ours = _best(lambda: packed._pack(0, 0), repeat)
    line = (f"  one window of {n:>6}: zerobatch {n / ours / 1e6:7.2f} M docs/s "
            f"({ours * 1e3:7.1f} ms)")
    rates = {"zerobatch window packing": n / ours / 1e6}
    if trl:
        from datasets import Dataset
        from trl import pack_dataset
        from trl.data_utils import _pack_bfd

        table = _arrow(lengths)
        core = _best(lambda: _pack_bfd(table, SEQ_LEN), repeat)
        ds = Dataset(table)
        whole = _best(lambda: pack_dataset(ds, SEQ_LEN, strategy="bfd",
                                           map_kwargs={"batch_size": n,
                                                       "load_from_cache_file": False}),
                      max(1, repeat // 2))
        line += (f"; TRL _pack_bfd {n / core / 1e6:6.3f} M docs/s ({core * 1e3:7.1f} ms, "
                 f"zerobatch {core / ours:5.1f}x); pack_dataset {n / whole / 1e6:6.3f} M docs/s "
                 f"({whole * 1e3:7.1f} ms, zerobatch {whole / ours:5.1f}x)")
        rates["TRL _pack_bfd"] = n / core / 1e6
        rates["TRL pack_dataset"] = n / whole / 1e6
    print(line)
    return rates


def resume(root: Path, repeat: int) -> None:
    lengths = conversations(60_000, seed=3)
    folder = write(root / "resume", lengths)
    packed = open_dataset(folder).documents().packed(SEQ_LEN)
    loader = Loader(packed, 8, seed=1, output="numpy", num_threads=0)
    it = iter(loader)
    for _ in range(700):  # into the second window, mid-way
        next(it)
    state = loader.state_dict()
    loader.close()

    def restore() -> float:
        fresh = open_dataset(folder).documents().packed(SEQ_LEN)
        other = Loader(fresh, 4, world_size=2, rank=1, seed=1, output="numpy", num_threads=0)
        start = time.perf_counter()
        other.load_state_dict(state)
        mid = time.perf_counter()
        next(iter(other))
        end = time.perf_counter()
        other.close()
        times.append((mid - start, end - start))
        return end - start

    times: list[tuple[float, float]] = []
    for _ in range(repeat):
        restore()
    load, first = min(t[0] for t in times), min(t[1] for t in times)
    print(f"  resume at row {state['consumed']} (window from document "
          f"{state['window_documents']}, {state['window_rows']} rows in), window "
          f"{DEFAULT_WINDOW}, world_size 1 -> 2: load_state_dict {load * 1e3:.1f} ms, "
          f"to the first batch {first * 1e3:.1f} ms")


def throughput(root: Path, seconds: float) -> None:
    lengths = conversations(20_000, seed=4)
    folder = write(root / "throughput", lengths)
    ds = open_dataset(folder)
    packed = ds.documents().packed(SEQ_LEN, loss_mask="loss_mask", labels="aligned")
    windows = ds.windows(SEQ_LEN)

    def run(source: Any) -> tuple[float, float]:
        best_slots = best_real = 0.0
        for _ in range(3):
            loader = Loader(source, 8, seed=2, output="numpy", num_threads=1, epochs=None)
            slots = real = 0
            start = time.perf_counter()
            for batch in loader:
                slots += batch["input_ids"].size
                real += int((batch["labels"] != -100).sum()) if "cu_seqlens" in batch \
                    else batch["input_ids"].size
                if time.perf_counter() - start > seconds:
                    break
            elapsed = time.perf_counter() - start
            loader.close()
            best_slots = max(best_slots, slots / elapsed)
            best_real = max(best_real, real / elapsed)
        return best_slots, best_real

    def cpu(source: Any, batches: int = 400) -> float:
        """Tokens per CPU second of the calling thread over ``batches`` batches
        read in it (num_threads=0; more than an epoch of packed rows, so window
        packing, the steps across two windows and the epoch's end count):
        what a loaded machine cannot blur as it blurs wall time."""
        loader = Loader(source, 8, seed=2, output="numpy", num_threads=0, epochs=None)
        steps = iter(loader)
        for _ in range(5):  # warm: the first window packed
            next(steps)
        tokens, start = 0, time.thread_time()
        for _ in range(batches):
            tokens += next(steps)["input_ids"].size
        elapsed = time.thread_time() - start
        loader.close()
        return tokens / elapsed

    bare = ds.documents().packed(SEQ_LEN, labels="aligned")  # the same rows, no loss mask
    for source in (windows, packed, bare):  # compiled, mapped, an epoch's windows packed
        cpu(source)
    cpu_ratios, bare_ratios, w_cpus = [], [], []
    for _ in range(3):  # interleaved, so all see the same load
        w_cpu, p_cpu, b_cpu = cpu(windows), cpu(packed), cpu(bare)
        cpu_ratios.append(p_cpu / w_cpu)
        bare_ratios.append(b_cpu / w_cpu)
        w_cpus.append(w_cpu)
        print(f"  CPU time, calling thread: windows {w_cpu / 1e6:7.1f} M tokens/CPU-s, "
              f"packed rows {p_cpu / 1e6:7.1f} M slots/CPU-s: {p_cpu / w_cpu:.2f}x; "
              f"without the loss mask {b_cpu / 1e6:7.1f}: {b_cpu / w_cpu:.2f}x")
    print(f"  CPU-time ratio packed / windows, median of 3: {sorted(cpu_ratios)[1]:.2f}x "
          f"(target >= 0.7); packed without a loss mask: {sorted(bare_ratios)[1]:.2f}x")
    bars("packing_throughput", {"zerobatch windows (input_ids, labels)": 1.0,
                                "zerobatch packed rows, varlen contract + loss mask":
                                    sorted(cpu_ratios)[1],
                                "zerobatch packed rows, varlen contract": sorted(bare_ratios)[1]},
         limit=0.7, limit_label="target 0.7",
         xlabel="slots per CPU second of the calling thread, as a share of windows "
                "(median of 3)", title=f"Loader over packed rows against windows (batch 8, "
                                       f"seq_len {SEQ_LEN}, output numpy)")
    floor_windows, floor_packed = planes_floor(8, SEQ_LEN)
    step = 8 * SEQ_LEN / sorted(w_cpus)[1] * 1e6  # us of CPU per windows step
    print(f"  the output planes alone (written, nothing read; 8 x {SEQ_LEN}): windows' "
          f"int64 input_ids + labels {floor_windows:.1f} us, the contract's + int32 "
          f"position_ids + seq_idx {floor_packed:.1f} us: {floor_windows / floor_packed:.2f}x "
          f"for a read bound by its stores alone; a windows step ({step:.1f} us) plus the "
          f"extra planes: {step / (step + floor_packed - floor_windows):.2f}x")
    w_slots, _ = run(windows)
    wall_slots, _ = run(ds.windows(SEQ_LEN, columns=("input_ids", "labels", "position_ids",
                                                     "cu_seqlens", "doc_ids")))
    p_slots, _ = run(packed)
    d = packed.describe()
    print(f"  Loader over windows:      {w_slots / 1e6:7.1f} M tokens/s "
          f"(with per-row cu_seqlens and doc_ids: {wall_slots / 1e6:.1f})")
    print(f"  Loader over packed rows:  {p_slots / 1e6:7.1f} M slots/s "
          f"({(1 - d['padding']) * p_slots / 1e6:.1f} M document tokens/s at "
          f"{100 * d['padding']:.2f}% padding): {p_slots / w_slots:.2f}x windows, "
          f"{p_slots / wall_slots:.2f}x windows with cu_seqlens (target >= 0.7)")


@njit(nogil=True)
def _write_planes(wide: Any, narrow: Any) -> None:
    for k in range(wide.shape[0]):
        for b in range(wide.shape[1]):
            row = wide[k, b]
            for i in range(row.shape[0]):
                row[i] = i
    for k in range(narrow.shape[0]):
        for b in range(narrow.shape[1]):
            row32 = narrow[k, b]
            for i in range(row32.shape[0]):
                row32[i] = b


def planes_floor(rows: int, seq_len: int, repeat: int = 2000) -> tuple[float, float]:
    """CPU microseconds to write windows' output planes (int64 input_ids and
    labels) and the packed contract's (those, int32 position_ids and int32
    seq_idx, as ``read_collated`` writes them) into recycled buffers, nothing
    read: what a read that is bound by its stores cannot beat."""
    wide = np.empty((2, rows, seq_len), np.int64)
    narrow = np.empty((2, rows, seq_len), np.int32)
    times = []
    for small in (narrow[:0], narrow):
        _write_planes(wide, small)
        start = time.process_time()
        for _ in range(repeat):
            _write_planes(wide, small)
        times.append((time.process_time() - start) / repeat * 1e6)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--part", type=int, choices=(1, 2, 3), action="append",
                        help="run only this part (repeatable): 1 speed, 2 efficiency, "
                        "3 Loader throughput")
    args = parser.parse_args()
    parts = set(args.part or (1, 2, 3))
    if args.quick:
        scratch_images()
    disable_progress_bar()
    trl = not args.no_trl
    if trl and parts & {1, 2}:
        try:
            import trl as _trl  # noqa: F401
        except ImportError:
            print("trl is not installed: TRL columns skipped")
            trl = False
    print(f"nproc {os.cpu_count()}, load {os.getloadavg()[0]:.1f}, seq_len {SEQ_LEN}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if 1 in parts:
            print("\n1. packing speed (best of several)")
            speeds = {f"one window of {n:,} documents": speed(root, n, 3 if args.quick else 7,
                                                               trl)
                      for n in ((10_000,) if args.quick else (10_000, 100_000))}
            groups("packing_speed", speeds, log=True, fmt="{:.3g}",
                   title=f"Best-fit decreasing packing, seq_len {SEQ_LEN} (lognormal "
                         "conversation lengths)", xlabel="M documents/s (log)")
            resume(root, 3 if args.quick else 7)
        if 2 in parts:
            print("\n2. efficiency")
            count = 20_000 if args.quick else 100_000
            paddings = {
                "lognormal conversations": efficiency("lognormal conversations",
                                                      conversations(count), trl),
                "code-like": efficiency("code-like", code_like(count), trl),
                "demo corpus": efficiency("demo corpus",
                                          demo_lengths(4 << 20 if args.quick else 16 << 20), trl),
            }
            methods = list(next(iter(paddings.values())))
            groups("packing_padding", {m: {d: p[m] for d, p in paddings.items()} for m in methods},
                   fmt="{:.2f}%", title=f"Padding of packed rows of {SEQ_LEN} tokens, by "
                                        "length distribution", xlabel="padding, % of the slots")
        if 3 in parts:
            print("\n3. Loader throughput, batch 8, 1 thread, output numpy")
            throughput(root, 2.0 if args.quick else 5.0)


if __name__ == "__main__":
    main()
