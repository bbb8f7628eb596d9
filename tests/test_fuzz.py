"""The fuzz driver's CI slice: a few thousand mutated inputs per reader, each
read in a forked child; every one must read or raise FormatError naming the
file (or frame) and the field. The driver itself is checked against a planted
reader that escapes, crashes, hangs and over-allocates."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fuzz
from support.s3_server import S3Server

SLICE = {"stream": 1000, "npy-folder": 1500,  # the slow readers get fewer (datatrove ~0.15 s)
         "megatron": 500, "datatrove": 150, "litdata": 500, "hf": 500, "mds": 200,
         "mds-mapped": 100, "mds-bytes": 100,
         "hf_ranged": 300, "stream-ranged": 500,
         "stream-sealed": 200, "npy-dtypes": 300, "cli": 150, "batch-wire": 300,
         **{name: 150 for name in fuzz.TARGETS if name.startswith("state-")}}
GOOD = ("ok", "format_error")  # the only outcomes a reader may have


@pytest.mark.parametrize("name", sorted(n for n, t in fuzz.TARGETS.items() if not t.remote))
def test_reader_slice(name: str, tmp_path: Path) -> None:
    count = SLICE.get(name, 2500)
    report, _ = fuzz.fuzz([name], per_target=count, seconds=None, seed=1, batch_size=400,
                          timeout=60, out=tmp_path)
    counts = report.totals()[name]
    assert sum(counts.values()) == count
    assert counts["format_error"] > 0
    allowed = (*GOOD, "error_reply") if name in ("service", "batch-wire") else GOOD  # replies
    problems = {k: v for k, v in counts.items() if k not in allowed}
    assert not problems, (problems, sorted(report.examples.items())[:5])


def test_remote_slice(s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Token-stream datasets read over s3:// from forked children of a spawned
    interpreter: a few dozen inputs (each one uploads, reads and verifies through
    the server)."""
    for key, value in {**s3.env(), fuzz.S3_ENV: f"s3://{s3.bucket}"}.items():
        monkeypatch.setenv(key, value)
    report, _ = fuzz.fuzz(["stream-s3"], per_target=40, seconds=None, seed=1,
                          batch_size=20, timeout=60, out=tmp_path)
    counts = report.totals()["stream-s3"]
    assert sum(counts.values()) == 40
    assert counts["format_error"] > 0 and counts["ok"] > 0
    assert set(counts) <= set(GOOD), (counts, sorted(report.examples.items())[:5])


def _planted(folder: Path, files: fuzz.Files) -> None:
    data = files["x"]
    started = time.process_time()
    if data == b"escape":
        raise KeyError("planted")
    if data == b"crash":
        os.abort()
    if data == b"hang":
        time.sleep(60)
    if data == b"spin":
        while True:
            pass
    if data == b"read":  # busy reading: CPU well past the limit, but per byte read modest
        with open("/dev/zero", "rb", buffering=0) as zero:
            buffer = bytearray(1 << 20)
            while time.process_time() - started < 2.0:
                zero.readinto(buffer)
    if data == b"alloc":
        bytearray(3 << 30)
    if data == b"rss":
        block = bytearray(200 << 20)
        block[::4096] = b"x" * len(block[::4096])
    if data == b"import":  # a module the parent never imported (frozen, prints nothing)
        import __phello__  # noqa: F401
    if data == b"kernel":  # a kernel specialization the parent never made
        sys.modules["zerobatch.errors"]._planted_kernel(1.5)  # type: ignore[attr-defined]
    if data == b"bad":
        raise fuzz.FormatError("unnamed")
    if data == b"good":
        raise fuzz.FormatError("named", path="x", field="f")


def test_driver_attributes_every_failure(tmp_path: Path) -> None:
    target = fuzz.Target("planted", lambda: [{"x": b"ok"}], _planted, on_disk=False)
    names = [b"ok", b"escape", b"ok", b"crash", b"good", b"hang", b"ok", b"alloc", b"rss",
             b"bad", b"spin", b"ok"]
    batch = [(f"x:{n.decode()}", {"x": n}) for n in names]
    report = fuzz.Report()
    fuzz.run_batch(target, batch, report, timeout=1, blocked=3, out=tmp_path)
    assert report.counts[("planted", "x")] == {
        "ok": 4, "escape": 1, "crash": 1, "format_error": 1, "hang": 2, "alloc": 2,
        "unnamed": 1,
    }
    kept = sorted(p.name.split("-")[0] for p in (tmp_path / "planted").iterdir())
    assert kept == ["alloc", "alloc", "crash", "escape", "hang", "hang", "unnamed"]
    for repro in (tmp_path / "planted").iterdir():
        outcome, _, detail = (repro / "outcome.txt").read_text().split("\n")[:3]
        planted = (repro / "input" / "x").read_bytes().decode()
        assert planted in {"escape": "escape", "crash": "crash", "hang": "hang spin",
                           "alloc": "alloc rss", "unnamed": "bad"}[outcome].split()
        assert outcome != "hang" or detail.startswith("no answer after "), detail


def test_cold_children_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input that makes a forked child import a module or add a Numba kernel
    specialization its parent's warm-up did not is ``cold``, whatever the RSS
    it cost (compiling a kernel grows a child by 85-135 MiB, loading it from a
    warm Numba cache by about 11 MiB: an input counted as an allocation over
    budget in a clean clone only). The inputs after it in the same child are
    judged as usual."""
    from numba import njit

    kernel = njit(lambda x: x + 1)
    kernel(1)  # the parent's specialization: int64
    monkeypatch.setattr(sys.modules["zerobatch.errors"], "_planted_kernel", kernel,
                        raising=False)
    target = fuzz.Target("planted", lambda: [{"x": b"ok"}], _planted, on_disk=False)
    report = fuzz.Report()
    batch = [(f"x:{n.decode()}", {"x": n}) for n in (b"ok", b"import", b"import", b"kernel",
                                                       b"kernel", b"ok")]
    fuzz.run_batch(target, batch, report, timeout=60, out=None)
    assert report.counts[("planted", "x")] == {"ok": 4, "cold": 2}
    examples = sorted(report.examples.values())
    assert "imported __phello__" in examples[0], examples
    assert "added a specialization of <lambda>" in examples[1], examples


@pytest.mark.parametrize(("planted", "timeout", "blocked", "cpu"), [
    (b"hang", 60.0, 2.0, (0.0, 0.5)),  # asleep: caught by the wait, having used no CPU
    # busy: caught by its CPU time (checked once a second, so up to about twice the
    # limit on a loaded machine), long before the 600 s wait
    (b"spin", 1.0, 600.0, (1.0, 10.0)),
])
def test_hang_is_timed_by_cpu_or_wait(planted: bytes, timeout: float, blocked: float,
                                      cpu: tuple[float, float]) -> None:
    target = fuzz.Target("planted", lambda: [{"x": b"ok"}], _planted, on_disk=False)
    report = fuzz.Report()
    fuzz.run_batch(target, [("x:ok", {"x": b"ok"}), ("x:p", {"x": planted})], report,
                   timeout=timeout, blocked=blocked, out=None)
    assert report.counts[("planted", "x")] == {"ok": 1, "hang": 1}
    (example,) = report.examples.values()
    used = float(example.split("no answer after ")[1].split(" s of CPU")[0])
    assert cpu[0] <= used < cpu[1], example


def test_hang_is_judged_by_cpu_time_per_byte_read() -> None:
    """An input that keeps reading (a large valid one) may use more CPU than
    the limit: its budget grows with the bytes it reads. A loop that reads
    nothing is a hang at the same limit."""
    target = fuzz.Target("planted", lambda: [{"x": b"ok"}], _planted, on_disk=False)
    report = fuzz.Report()
    fuzz.run_batch(target, [("x:read", {"x": b"read"}), ("x:spin", {"x": b"spin"})], report,
                   timeout=0.5, blocked=600, out=None)
    assert report.counts[("planted", "x")] == {"ok": 1, "hang": 1}
    (example,) = report.examples.values()
    assert example.startswith("x:spin") and "having read 0 MiB" in example, example


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


_CLI_PROGRESS_BAR = r'''
import json, sys
sys.path.insert(0, "benchmarks")
import fuzz
assert "multiprocessing.synchronize" not in sys.modules  # else the check below cannot fail
target = fuzz.TARGETS["cli"]
fuzz.warm_up(target)
seed = target.seeds()[0]
argv = [a for a in json.loads(seed["argv.json"]) if a != "--quiet"]
report = fuzz.Report()
fuzz.run_batch(target, [("argv.json:drop", {**seed, "argv.json": json.dumps(argv).encode()})],
               report, timeout=60, out=None)
print(dict(report.totals()["cli"]))
'''


def test_cli_warm_up_draws_a_progress_bar() -> None:
    """Found by the fifth round: a convert input without ``--quiet`` (the flag
    dropped or mutated away) drew tqdm's first progress bar in the child, which
    imports ``multiprocessing.synchronize`` (its write lock): ``cold``. The cli
    target's warm-up now converts once with the bar. Run in a fresh interpreter,
    where nothing imported that module before."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _CLI_PROGRESS_BAR], cwd=root,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "{'ok': 1}", done.stdout
