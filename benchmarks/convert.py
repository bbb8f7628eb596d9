"""How fast is ``convert``, and how much memory does it take?

1. Speed: tokens per CPU second of ``convert`` (workers=1, in this process)
   against raw ``tokenizers`` ``encode_batch`` (and ``encode_batch_fast``) over
   the same texts in one thread (the per-worker ceiling), interleaved, best of
   ``--passes`` (CPU time, so a loaded machine's waits do not count); then, in
   wall time, ``convert`` with 2 workers (scaling) and LitData's ``optimize``
   on the same JSONL files (its documented LLM pattern: a generator of token
   tensors, ``TokensLoader``), all in this run. Tokenizers run one thread per
   worker.
2. Memory: peak RSS of a child process converting a JSONL file of each size
   (the byte tokenizer, so the pipeline, not the tokenizer, is what is measured).

    python benchmarks/convert.py [--mb 24] [--passes 3] [--memory-mb 100,1000]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one tokenizer thread per worker
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import functools
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _plot import bars

from zerobatch.convert import convert


def _stdlib_texts() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(encoding="utf-8", errors="replace")
            for p in sorted(root.rglob("*.py")) if "site-packages" not in p.parts]


def _write_jsonl(folder: Path, texts: list[str], megabytes: float, files: int) -> list[Path]:
    """``files`` JSONL files of about ``megabytes`` in all, the texts repeated."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    per_file = megabytes * 1e6 / files
    paths = []
    i = 0
    for f in range(files):
        path = folder / f"{f:03d}.jsonl"
        size = 0
        with open(path, "w", encoding="utf-8") as out:
            while size < per_file:
                out.write(lines[i % len(lines)])
                size += len(lines[i % len(lines)])
                i += 1
        paths.append(path)
    return paths


def _tokenizer(texts: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts[:400], trainer)
    tok.save(str(path))


def _raw(paths: list[Path], tok: Any, *, fast: bool = False,
         clock: Callable[[], float] = time.perf_counter) -> tuple[int, float]:
    """encode_batch (``fast``: encode_batch_fast) of the loaded tokenizer ``tok``
    over the non-empty texts of ``paths`` (parsing excluded), 512 at a time,
    timed by ``clock``; convert skips empty documents too. One tokenizer for
    every pass, as convert keeps one per process: both have a warm BPE cache
    after their first pass."""
    texts = []
    for path in paths:
        with open(path, encoding="utf-8") as file:
            texts.extend(t for line in file if (t := json.loads(line)["text"]))
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    started = clock()
    tokens = 0
    for i in range(0, len(texts), 512):
        tokens += sum(len(e.ids) + 1 for e in encode(texts[i:i + 512]))
    return tokens, clock() - started


def _litdata_tokens(path: str, tokenizer: str) -> Iterator[object]:
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    eos = tok.token_to_id("<|endoftext|>")
    with open(path, encoding="utf-8") as file:
        for line in file:
            ids = tok.encode(json.loads(line)["text"]).ids
            yield torch.tensor([*ids, eos], dtype=torch.int32)


def _litdata(paths: list[Path], tokenizer: Path, output: Path, workers: int) -> float:
    from litdata import TokensLoader, optimize

    started = time.perf_counter()
    optimize(fn=functools.partial(_litdata_tokens, tokenizer=str(tokenizer)),
             inputs=[str(p) for p in paths], output_dir=str(output), chunk_size=(2049 * 8012),
             item_loader=TokensLoader(), num_workers=workers)
    return time.perf_counter() - started


def _peak_rss(inputs: Path, output: Path) -> tuple[float, float]:
    """Seconds and peak RSS (bytes) of a child converting ``inputs``."""
    code = ("import resource, sys, time; from zerobatch.convert import convert; t = "
            "time.perf_counter(); convert(sys.argv[1], sys.argv[2], tokenizer='bytes', "
            "workers=1, quiet=True); print(time.perf_counter() - t, "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    done = subprocess.run([sys.executable, "-c", code, str(inputs), str(output)],
                          capture_output=True, text=True, check=True)
    seconds, rss = done.stdout.split()
    return float(seconds), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=24.0, help="speed corpus size (MB)")
    parser.add_argument("--passes", type=int, default=3, help="interleaved CPU-time passes")
    parser.add_argument("--memory-mb", default="100,1000",
                        help="sizes for the memory test ('' skips it)")
    parser.add_argument("--skip-litdata", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zerobatch-convert-bench-"))
    try:
        texts = _stdlib_texts()
        tokenizer = work / "tokenizer.json"
        _tokenizer(texts, tokenizer)
        paths = _write_jsonl(work / "speed", texts, args.mb, files=8)
        print(f"speed corpus: {sum(p.stat().st_size for p in paths) / 1e6:.1f} MB of JSONL "
              f"(standard-library sources), BPE vocabulary 8192, nproc {os.cpu_count()}, "
              f"load {os.getloadavg()[0]:.1f}")
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer))
        cpu: dict[str, list[float]] = {"raw": [], "fast": [], "convert": []}  # CPU s per pass
        for k in range(args.passes):
            tokens, seconds = _raw(paths, tok, clock=time.process_time)
            cpu["raw"].append(seconds)
            cpu["fast"].append(_raw(paths, tok, fast=True, clock=time.process_time)[1])
            started = time.process_time()
            result = convert(paths, work / f"cpu{k}", tokenizer=tokenizer, workers=1,
                             task_bytes=4 << 20, quiet=True)
            cpu["convert"].append(time.process_time() - started)
            assert result.tokens == tokens, (result.tokens, tokens)
            shutil.rmtree(work / f"cpu{k}")
        raw_cpu = tokens / min(cpu["raw"])
        rows = [("raw encode_batch, 1 thread (CPU)", raw_cpu, 1.0),
                ("raw encode_batch_fast, 1 thread (CPU)", tokens / min(cpu["fast"]),
                 min(cpu["raw"]) / min(cpu["fast"])),
                ("zerobatch convert, 1 worker (CPU)", tokens / min(cpu["convert"]),
                 min(cpu["raw"]) / min(cpu["convert"]))]
        tokens, raw_s = _raw(paths, tok)
        rows.append(("raw encode_batch, 1 thread (wall)", tokens / raw_s, 1.0))
        for workers in (1, 2):
            result = convert(paths, work / f"out{workers}", tokenizer=tokenizer,
                             workers=workers, task_bytes=4 << 20, quiet=True)
            assert result.tokens == tokens, (result.tokens, tokens)
            rate = tokens / result.seconds
            rows.append((f"zerobatch convert, {workers} worker(s) (wall)", rate,
                         rate / rows[3][1]))
        if not args.skip_litdata:
            for workers in (1, 2):
                seconds = _litdata(paths, tokenizer, work / f"litdata{workers}", workers)
                rows.append((f"litdata optimize, {workers} worker(s) (wall)",
                             tokens / seconds, tokens / seconds / rows[3][1]))
        print(f"{'':44s} {'tokens/s':>12s} {'vs raw':>8s}")
        for name, rate, ratio in rows:
            print(f"{name:44s} {rate:12,.0f} {ratio:8.2f}")
        bars("convert", {name: rate / 1e6 for name, rate, _ in rows},
             title="Tokenizing JSONL: convert against raw tokenizers and LitData (same texts)",
             xlabel="M tokens/s (CPU rows: per CPU second; wall rows: per wall second)",
             labels={name: f"{rate / 1e6:.2f} ({ratio:.2f} of raw)" for name, rate, ratio in rows})
        print("CPU passes (s): " + ", ".join(
            f"{name} {' '.join(f'{t:.2f}' for t in times)}" for name, times in cpu.items()))
        print(f"convert scaling 1 -> 2 workers (wall): {rows[5][1] / rows[4][1]:.2f}x; "
              f"load {os.getloadavg()[0]:.1f} at the end")
        for megabytes in (float(m) for m in args.memory_mb.split(",") if m):
            big = _write_jsonl(work / f"mem{megabytes:.0f}", texts, megabytes, files=1)[0]
            seconds, rss = _peak_rss(big, work / f"memout{megabytes:.0f}")
            print(f"memory: {big.stat().st_size / 1e6:,.0f} MB JSONL -> peak RSS "
                  f"{rss / 2**20:,.0f} MiB ({seconds:.1f} s, byte tokenizer, 1 worker)")
            shutil.rmtree(work / f"memout{megabytes:.0f}")
            big.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
