"""``zerobatch verify`` and ``zerobatch inspect`` on token-stream dataset folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import zerobatch
from zerobatch.cli import main


def test_verify_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with zerobatch.StreamWriter(tmp_path / "ds", metadata="msgpack") as writer:
        writer.add_document(np.arange(10), spans=[(2, 5, {"concept": 1})])
    assert main(["verify", str(tmp_path / "ds")]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "token-stream dataset" in out and "metadata entries  1" in out
    tokens = tmp_path / "ds" / "00000.tokens"
    tokens.write_bytes(b"\xff" * tokens.stat().st_size)
    assert main(["verify", str(tmp_path / "ds")]) == 1
    out = capsys.readouterr().out
    assert "00000.tokens" in out and "xxh3_64" in out and "meta_id" in out
    assert zerobatch.verify(tmp_path / "ds")
    assert zerobatch.open_dataset(tmp_path / "ds").num_tokens == 10
    assert callable(zerobatch.combine)
