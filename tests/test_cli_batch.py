from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zerobatch.batch_writer import write_batch_dataset, write_batch_file
from zerobatch.cli import main


@pytest.fixture
def batch_file(tmp_path: Path) -> Path:
    tokens = np.arange(100 * 300, dtype=np.uint32).reshape(100, 300) % 1000
    write_batch_file(tmp_path / "d.batch", tokens, 8, 300, 5, dtype="uint16")
    return tmp_path / "d.batch"


def test_inspect_prints_header_and_derived_sizes(
    batch_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(batch_file)]) == 0
    out = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert out["format"] == "LLMBATCH version 1"
    assert out["batch_size"] == "8 records"
    assert out["seq_len"] == "300 tokens"
    assert out["num_batches"] == "12"
    assert out["dtype"] == "1 (uint16)"
    assert out["total_records"] == "100"
    assert out["dropped_records"] == "4"
    assert out["raw_batch_bytes"] == "4,800"
    assert out["padded_batch_bytes"] == "8,192"
    assert out["file_bytes"] == f"{4096 + 12 * 8192:,}"


def test_inspect_shard_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = np.zeros((64, 16), dtype=np.uint32)
    write_batch_dataset(tmp_path / "s", iter(tokens), 64, 4, 16, 1, batches_per_shard=5)
    assert main(["inspect", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "shards              4" in out and "num_batches         16" in out


def test_inspect_bad_files_exit_1_with_the_reason(
    batch_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = bytearray(batch_file.read_bytes())
    batch_file.write_bytes(bytes(raw[:5000]))
    assert main(["inspect", str(batch_file)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zerobatch inspect: ") and "not fully written" in err
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    assert main(["inspect", str(other)]) == 1
    assert "not a file zerobatch knows" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing")]) == 1


def test_console_script_runs(batch_file: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "zerobatch.cli", "inspect", str(batch_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "LLMBATCH version 1" in done.stdout


def test_verify_batch_files_and_npy_folders(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """zerobatch verify checks a .batch file, a shard folder and a .npy folder
    with their own validators: OK and 0, or one line per problem and 1
    (``--dtype int32``: ids an int32 read would wrap)."""
    tokens = np.arange(16 * 4, dtype=np.uint32).reshape(16, 4)
    write_batch_file(tmp_path / "a.batch", tokens, 2, 4, 1)
    write_batch_dataset(tmp_path / "s", iter(tokens), 16, 2, 4, 1, batches_per_shard=3)
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "0.npy", np.array([1, 2, 2**31], dtype="<u8"))
    for path in ("a.batch", "s", "npy"):
        assert main(["verify", str(tmp_path / path)]) == 0
        assert capsys.readouterr().out.strip().endswith(": OK")
    assert main(["verify", str(tmp_path / "npy"), "--dtype", "int32"]) == 1
    out = capsys.readouterr().out
    assert "1 problem(s)" in out and "0.npy: data: token id 2147483648 at record 2" in out
    raw = bytearray((tmp_path / "a.batch").read_bytes())
    raw[12:16] = (3).to_bytes(4, "little")  # batch_size: the size no longer matches
    (tmp_path / "a.batch").write_bytes(bytes(raw))
    raw[:8] = b"NOTBATCH"  # and a file that lost its magic is still checked as one
    (tmp_path / "b.batch").write_bytes(bytes(raw))
    for name, field in (("a.batch", "total_records"), ("b.batch", "magic")):
        assert main(["verify", str(tmp_path / name)]) == 1
        assert f"{name}: {field}: " in capsys.readouterr().out
