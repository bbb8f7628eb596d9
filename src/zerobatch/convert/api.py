"""``convert``: texts in, a token-stream (or LLMBATCH) dataset out.

The inputs are cut into tasks (``inputs.plan_tasks``); each task writes its
own small dataset under a work folder beside the output (``.NAME.convert``);
one ``combine`` joins them in task order without re-encoding, and the work
folder is removed. Inputs and the output may be object-store URLs: tasks read
their bytes by range GETs and write locally (the work folder of a URL output
is under the system's temporary folder), and ``combine`` uploads the shards
and publishes the manifest last. The task plan and options are saved first: a convert that
was killed and is run again with the same arguments skips the finished tasks.
The output appears only when complete (its manifest is written last).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from zerobatch.convert.encoders import EncoderSpec, resolve_tokenizer
from zerobatch.convert.inputs import Task, expand_inputs, plan_tasks
from zerobatch.convert.tasks import Job, TaskStats, run_task
from zerobatch.storage import is_url, open_storage
from zerobatch.stream.combine import combine
from zerobatch.stream.manifest import MANIFEST, TOKEN, TOKENS, read_manifest, shard_name
from zerobatch.stream.writer import DEFAULT_SHARD_TOKENS

__all__ = ["ConvertResult", "convert", "work_folder"]

PLAN = "plan.json"
DEFAULT_TASK_BYTES = 64 << 20
_CHUNK_RECORDS = 1 << 22


@dataclass(frozen=True)
class ConvertResult:
    """What ``convert`` wrote: counts, and seconds of wall time."""

    path: Path | str
    documents: int
    tokens: int
    input_bytes: int
    skipped_bad: int
    skipped_empty: int
    tasks: int
    tasks_resumed: int
    seconds: float

    def summary(self) -> str:
        """One line for people."""
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return (f"converted {self.documents:,} documents, {self.tokens:,} tokens "
                f"({self.input_bytes / 1e6:,.1f} MB read) into {self.path} in "
                f"{self.seconds:.1f} s ({rate:,.0f} tokens/s); skipped "
                f"{self.skipped_bad:,} bad and {self.skipped_empty:,} empty documents; "
                f"{self.tasks} tasks, {self.tasks_resumed} already done")


def work_folder(output: Path | str) -> Path:
    """The folder where tasks of a convert into ``output`` are written: beside
    a local output; for a URL, one named after it in the temporary folder."""
    if isinstance(output, str):
        digest = xxhash.xxh3_64_hexdigest(output.encode())
        return Path(tempfile.gettempdir()) / "zerobatch-convert" / f".{digest}.convert"
    return output.parent / f".{output.name}.convert"


def _check_plan(work: Path, plan: dict[str, Any]) -> None:
    """Save the plan, or check it equals the saved one (a resumed convert)."""
    path = work / PLAN
    if path.is_file():
        if json.loads(path.read_text()) != plan:
            raise ValueError(f"{work} holds an unfinished convert with other inputs or "
                             "options; run it again with the same arguments, or remove "
                             "that folder to start over")
        return
    tmp = work / f".{PLAN}.tmp"
    tmp.write_text(json.dumps(plan))
    os.replace(tmp, path)


def _default_executor(workers: int, remote: bool) -> cf.Executor:
    # fork is fastest, but obstore is not fork-safe: once this process used a
    # store (``remote``), workers start from a fork server.
    method = "fork" if sys.platform.startswith("linux") and not remote else "forkserver"
    if not sys.platform.startswith("linux"):
        method = "spawn"
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method))


class _Progress:
    """A tqdm bar over input bytes with documents/s and tokens/s, or nothing."""

    def __init__(self, total_bytes: int, quiet: bool) -> None:
        self._bar: Any = None
        self._started = time.perf_counter()
        self.stats = TaskStats()
        if not quiet:
            from tqdm import tqdm

            self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="convert",
                             file=sys.stderr, dynamic_ncols=True)

    def update(self, stats: TaskStats) -> None:
        self.stats.add(stats)
        if self._bar is not None:
            elapsed = max(time.perf_counter() - self._started, 1e-9)
            self._bar.set_postfix_str(f"{self.stats.documents / elapsed:,.0f} docs/s, "
                                      f"{self.stats.tokens / elapsed:,.0f} tokens/s",
                                      refresh=False)
            self._bar.update(stats.input_bytes)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _run(jobs: list[Job], workers: int, executor: cf.Executor | None,
         progress: _Progress, remote: bool) -> None:
    workers = min(workers, len(jobs))  # a fork pool starts all its processes at once
    if executor is None and workers <= 1:
        for job in jobs:
            progress.update(run_task(job))
        return
    pool = _default_executor(workers, remote) if executor is None else executor
    try:
        futures = [pool.submit(run_task, job) for job in jobs]
        try:
            for future in cf.as_completed(futures):
                progress.update(future.result())
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    finally:
        if executor is None:
            pool.shutdown(wait=True, cancel_futures=True)


def _is_shard_file(name: str) -> bool:
    stem = name.lstrip(".").split(".")[0]
    return stem.isascii() and stem.isdigit() and len(stem) >= len(shard_name(0))


def _clear_partial(output: Path | str, options: Mapping[str, Any]) -> None:
    """Remove shard files a combine killed midway left in ``output`` (no manifest)."""
    if isinstance(output, str):
        storage = open_storage(output, **options)
        try:
            for name in storage.names():
                if _is_shard_file(name):
                    storage.remove(name)
        finally:
            storage.close()
    elif output.is_dir():
        for path in output.iterdir():
            if _is_shard_file(path.name):
                path.unlink()


def _has_manifest(output: Path | str, options: Mapping[str, Any]) -> bool:
    if isinstance(output, Path):
        return (output / MANIFEST).exists()
    storage = open_storage(output, **options)
    try:
        return MANIFEST in storage.names()
    finally:
        storage.close()


def _write_batch(stream: Path, output: Path, seq_len: int, batch_size: int, seed: int) -> None:
    """LLMBATCH from a token stream: records of ``seq_len`` tokens, read in chunks."""
    from zerobatch.llmbatch import write_batch_dataset

    manifest = read_manifest(stream)
    total = sum(shard.records for shard in manifest.shards) // seq_len
    dtype = "uint16" if manifest.token_dtype.itemsize == 2 else "uint32"

    def records() -> Iterator[np.ndarray]:
        carry = np.empty(0, dtype=manifest.token_dtype)
        for shard in manifest.shards:
            data = np.memmap(stream / shard.file(TOKENS), dtype=manifest.record_dtype,
                             mode="r", shape=(shard.records,))
            for start in range(0, shard.records, _CHUNK_RECORDS):
                piece = data[start:start + _CHUNK_RECORDS]
                tokens = piece if manifest.token_field is None else piece[TOKEN]
                carry = np.concatenate([carry, tokens])
                usable = carry.shape[0] // seq_len * seq_len
                yield carry[:usable].reshape(-1, seq_len)
                carry = carry[usable:]

    write_batch_dataset(output, records(), total, batch_size, seq_len, seed, dtype=dtype)


def convert(
    inputs: Any,
    output: str | os.PathLike[str],
    *,
    tokenizer: Any,
    text_field: str = "text",
    metadata_fields: Sequence[str] = (),
    spans_field: str | None = None,
    append_eos: bool = True,
    eos: int | str | None = None,
    format: str = "stream",
    seq_len: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    workers: int | None = None,
    executor: cf.Executor | None = None,
    skip_bad: bool = False,
    task_bytes: int = DEFAULT_TASK_BYTES,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    quiet: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> ConvertResult:
    """Tokenize ``inputs`` into a dataset at ``output``.

    Args:
        inputs: a file, glob, folder, ``datasets.Dataset`` or a list of these:
            JSONL (plain, ``.gz``, ``.zst``; one object per line), Parquet (read
            one row group at a time), Arrow files (``save_to_disk`` folders),
            text files (one document each; their ``path`` is a field too); any
            as an object-store URL: an object, a prefix or a glob (see
            ``zerobatch.convert.inputs``).
        output: the dataset folder or prefix URL (``format="stream"``) or a
            local ``.batch`` file (``format="batch"``, LLMBATCH with
            ``seq_len``, ``batch_size`` and ``seed``, the write seed). Must not exist yet.
        tokenizer: ``"bytes"`` (ids 0..255, EOS 256), a ``tokenizers`` JSON
            file, a folder holding ``tokenizer.json``, or a
            ``tokenizers.Tokenizer``. Its name, vocabulary size and EOS id go
            into the manifest; tokens are ``<u2`` up to 65,536 ids.
        text_field: the field holding the text.
        metadata_fields: fields stored as each document's metadata (a dict).
        spans_field: a field holding ``[{start, end, value}, ...]`` in
            characters, mapped to token spans (see ``zerobatch.convert.tasks``).
        append_eos: append the end-of-document id ``eos`` to every document.
        eos: that id or token; by default a usual EOS token of the tokenizer.
        workers: worker processes (default ``os.cpu_count()``); 1 runs in
            this process.
        executor: any ``concurrent.futures.Executor`` to run tasks on instead
            (e.g. ``distributed.Client(...).get_executor()``).
        skip_bad: count and skip bad records instead of raising.
        task_bytes: input bytes per task (the unit of parallel work and resume).
        shard_tokens: tokens per shard, at most.
        quiet: no progress bar.
        storage_options: for URL inputs and output, obstore's options (see
            ``zerobatch.storage.open_storage``); passed to the workers.

    The dataset is byte-identical for any ``workers`` and executor. Raises
    ``FormatError`` naming the file and line (or row group) of bad input.
    """
    started = time.perf_counter()
    if format not in ("stream", "batch"):
        raise ValueError(f"format must be 'stream' or 'batch', got {format!r}")
    if format == "batch" and (seq_len is None or batch_size is None):
        raise ValueError("format='batch' needs seq_len and batch_size")
    for name, flag, value in (("seq_len", "--seq-len", seq_len),
                              ("batch_size", "--batch-size", batch_size),
                              ("task_bytes", "--task-mb", task_bytes),
                              ("shard_tokens", "", shard_tokens),
                              ("workers", "--workers", workers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name}{f' ({flag})' if flag else ''} must be a positive "
                             f"integer, got {value!r}")
    options = dict(storage_options or {})
    out: Path | str = str(output).rstrip("/") if is_url(output) else Path(output)
    if isinstance(out, str) and format == "batch":
        raise ValueError("format='batch' writes a local .batch file; pass a local output "
                         "(a URL output needs format='stream')")
    if _has_manifest(out, options) or (format == "batch" and Path(out).exists()):
        raise FileExistsError(f"{out} already exists; choose another output or remove it")
    if format == "stream" and isinstance(out, Path) and out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file; a dataset is a folder: choose another "
                              "output or remove it")
    work = work_folder(out)
    work.mkdir(parents=True, exist_ok=True)
    files = expand_inputs(inputs, options)
    remote = isinstance(out, str) or any(is_url(f.location) for f in files)
    tasks: list[Task] = plan_tasks(files, task_bytes, options)
    encoder: EncoderSpec = resolve_tokenizer(tokenizer, work, eos=eos)
    fields = tuple(metadata_fields)
    _check_plan(work, {
        "tasks": [t.to_json() for t in tasks], "encoder": asdict(encoder),
        "text_field": text_field, "metadata_fields": list(fields), "spans_field": spans_field,
        "append_eos": append_eos, "skip_bad": skip_bad, "shard_tokens": shard_tokens,
    })
    folders = [work / f"task-{i:06d}" for i in range(len(tasks))]
    resumed = sum(1 for f in folders if f.is_dir())
    jobs = [Job(t, str(f), encoder, text_field, fields, spans_field, append_eos, skip_bad,
                shard_tokens, options) for t, f in zip(tasks, folders, strict=True)]
    progress = _Progress(sum(f.size for f in files), quiet)
    try:
        _run(jobs, workers or os.cpu_count() or 1, executor, progress, remote)
    finally:
        progress.close()
    if format == "stream":
        _clear_partial(out, options)
        combine(folders, out, storage_options=options)
    else:
        stream = work / "stream"
        shutil.rmtree(stream, ignore_errors=True)
        combine(folders, stream)
        assert seq_len is not None and batch_size is not None
        _write_batch(stream, Path(out), seq_len, batch_size, seed)
    shutil.rmtree(work, ignore_errors=True)
    s = progress.stats
    result = ConvertResult(out, s.documents, s.tokens, s.input_bytes, s.skipped_bad,
                           s.skipped_empty, len(tasks), resumed,
                           time.perf_counter() - started)
    if not quiet:
        print(result.summary(), file=sys.stderr)
    return result
