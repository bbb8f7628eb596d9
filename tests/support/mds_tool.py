"""Run inside the MDS environment (``mds_env``), never the project's: writes
datasets with mosaicml-streaming's ``MDSWriter`` and dumps what its
``StreamingDataset`` returns, or times its iteration.

``python mds_tool.py jobs JOBS.json`` runs, in order, each ``write``
(``{"out", "columns", "size_limit", "npz", "samples"}``: sample ``i``'s
column ``c`` is ``npz[f"{c}.{i}"]``) and each ``read`` (``{"dir", "column",
"out", "dtype"}``: sample ``i``'s column saved as ``out[f"{i}"]``, in order; a
``bytes`` value as an array of ``dtype``).
``corpus`` jobs (``{"out", "column", "tokens", "ends", "size_limit"}``: one
sample per document, ``tokens`` an ``.npy`` of every token and ``ends`` one of
each document's end) write a benchmark corpus.
``python mds_tool.py bench DIR COLUMN BATCH SECONDS`` prints JSON: seconds to
the first batch and the peak RSS added meanwhile, then tokens per second, of a
shuffled ``StreamingDataset`` at its defaults but ``shuffle=True`` (a torch
``DataLoader`` of ``BATCH`` samples as a list, no workers).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def _value(encoding: str, array: np.ndarray):
    if encoding.startswith("ndarray"):
        return array
    if encoding == "str":
        return str(array.item())
    if encoding == "bytes":
        return array.tobytes()
    return array.item()


def write(job: dict) -> None:
    from streaming import MDSWriter

    data = np.load(job["npz"])
    with MDSWriter(out=job["out"], columns=job["columns"], size_limit=job["size_limit"],
                   compression=job.get("compression")) as writer:
        for i in range(job["samples"]):
            writer.write({c: _value(e, data[f"{c}.{i}"]) for c, e in job["columns"].items()})


def corpus(job: dict) -> None:
    from streaming import MDSWriter

    values = np.load(job["tokens"], mmap_mode="r")
    ends = np.load(job["ends"])
    columns = {job["column"]: f"ndarray:{values.dtype.name}"}
    with MDSWriter(out=job["out"], columns=columns, size_limit=job["size_limit"]) as writer:
        start = 0
        for end in ends.tolist():
            writer.write({job["column"]: np.asarray(values[start:end])})
            start = end


def read(job: dict) -> None:
    from streaming import StreamingDataset

    ds = StreamingDataset(local=job["dir"], shuffle=False, batch_size=1)

    def value(i: int) -> np.ndarray:
        got = ds[i][job["column"]]  # a bytes column: its bytes as the job's dtype
        return np.frombuffer(got, job["dtype"]) if isinstance(got, bytes) else np.asarray(got)

    np.savez(job["out"], **{str(i): value(i) for i in range(len(ds))})


def _rss(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def bench(folder: str, column: str, batch: int, seconds: float) -> None:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM restarts from VmRSS
    before = _rss("VmRSS")
    start = time.perf_counter()
    ds = StreamingDataset(local=folder, shuffle=True, batch_size=batch)
    loader = DataLoader(ds, batch_size=batch, num_workers=0, collate_fn=list)
    steps = iter(loader)
    next(steps)
    first_batch = time.perf_counter() - start
    added = _rss("VmHWM") - before
    tokens = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        try:
            tokens += sum(int(sample[column].size) for sample in next(steps))
        except StopIteration:
            steps = iter(loader)
    print(json.dumps({"s": first_batch, "rss": added,
                      "tokens_s": tokens / (time.perf_counter() - began)}))


def main() -> None:
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    if sys.argv[1] == "jobs":
        with open(sys.argv[2]) as handle:
            jobs = json.load(handle)
        for job in jobs.get("write", []):
            write(job)
        for job in jobs.get("corpus", []):
            corpus(job)
        for job in jobs.get("read", []):
            read(job)
    elif sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")


if __name__ == "__main__":
    main()
