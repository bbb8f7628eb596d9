"""A short run of ``make demo``'s whole pipeline: tokenizer, convert with
spans, Loader training, SIGKILL and resume, the span window, the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerobatch.demo import code_spans, main

SOURCE = '''class A:
    def f(self):
        return 1

    class B:
        async def g(self):
            pass


def h():
    pass
'''


def test_code_spans_nest_over_whole_lines() -> None:
    spans = {s["value"]: SOURCE[s["start"]:s["end"]] for s in code_spans(SOURCE)}
    assert list(spans) == ["A", "A.f", "A.B", "A.B.g", "h"]
    assert spans["A.f"] == "    def f(self):\n        return 1\n"
    assert spans["A"].startswith("class A:") and spans["A"].endswith("            pass\n")
    assert code_spans("def broken(:\n") == []


def test_short_demo_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = main(["--out", str(tmp_path), "--corpus-bytes", "150000", "--vocab-size", "300",
                 "--seq-len", "32", "--batch-size", "4", "--steps", "10",
                 "--checkpoint-every", "3", "--workers", "1"])
    out = capsys.readouterr().out
    assert same and "trained on EQUAL the uninterrupted run's" in out
    assert "SIGKILLed the training process at step" in out
    assert "% of it waiting for data" in out
    assert "code spans it contains" in out
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    steps = [json.loads(line) for line in
             (tmp_path / "uninterrupted.jsonl").read_text().splitlines()]
    assert [len(step["ids"]) for step in steps] == [4] * 10
