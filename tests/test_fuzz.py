"""The fuzz driver's CI slice: a few thousand mutated inputs per reader, each
read in a forked child; every one must read or raise FormatError naming the
file (or frame) and the field. The driver itself is checked against a planted
reader that escapes, crashes, hangs and over-allocates."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fuzz

SLICE = {"stream": 1000, "npy-folder": 1500}  # the slow readers get fewer
GOOD = ("ok", "format_error")  # the only outcomes a reader may have


@pytest.mark.parametrize("name", sorted(fuzz.TARGETS))
def test_reader_slice(name: str, tmp_path: Path) -> None:
    count = SLICE.get(name, 2500)
    report, _ = fuzz.fuzz([name], per_target=count, seconds=None, seed=1, batch_size=400,
                          timeout=60, out=tmp_path)
    counts = report.totals()[name]
    assert sum(counts.values()) == count
    assert counts["format_error"] > 0
    allowed = (*GOOD, "error_reply") if name == "service" else GOOD  # a server's error replies
    problems = {k: v for k, v in counts.items() if k not in allowed}
    assert not problems, (problems, sorted(report.examples.items())[:5])


def _planted(folder: Path, files: fuzz.Files) -> None:
    data = files["x"]
    if data == b"escape":
        raise KeyError("planted")
    if data == b"crash":
        os.abort()
    if data == b"hang":
        time.sleep(60)
    if data == b"alloc":
        bytearray(3 << 30)
    if data == b"rss":
        block = bytearray(200 << 20)
        block[::4096] = b"x" * len(block[::4096])
    if data == b"bad":
        raise fuzz.FormatError("unnamed")
    if data == b"good":
        raise fuzz.FormatError("named", path="x", field="f")


def test_driver_attributes_every_failure(tmp_path: Path) -> None:
    target = fuzz.Target("planted", lambda: [{"x": b"ok"}], _planted, on_disk=False)
    names = [b"ok", b"escape", b"ok", b"crash", b"good", b"hang", b"ok", b"alloc", b"rss",
             b"bad", b"ok"]
    batch = [(f"x:{n.decode()}", {"x": n}) for n in names]
    report = fuzz.Report()
    fuzz.run_batch(target, batch, report, timeout=3, out=tmp_path)
    assert report.counts[("planted", "x")] == {
        "ok": 4, "escape": 1, "crash": 1, "format_error": 1, "hang": 1, "alloc": 2,
        "unnamed": 1,
    }
    kept = sorted(p.name.split("-")[0] for p in (tmp_path / "planted").iterdir())
    assert kept == ["alloc", "alloc", "crash", "escape", "hang", "unnamed"]
    for repro in (tmp_path / "planted").iterdir():
        outcome = (repro / "outcome.txt").read_text().split("\n")[0]
        assert (repro / "input" / "x").read_bytes().decode() in {
            "escape": "escape", "crash": "crash", "hang": "hang", "alloc": "alloc rss",
            "unnamed": "bad"}[outcome].split()


def test_structured_mutations_cover_every_file() -> None:
    seed = fuzz.TARGETS["stream"].seeds()[0]
    labels = [label for label, _ in fuzz.structured(seed)]
    touched = {label.split(":")[0] for label in labels}
    assert touched >= set(seed)
    kinds = {label.split(":")[1] for label in labels}
    assert {"edit", "drop", "deep", "u64", "u32", "truncate", "swap", "rename",
            "dropfile"} <= kinds
    first = {label.split(":")[0] for label in labels[: len(seed) + 1]}
    assert first >= set(seed)  # interleaved: any prefix touches every file
