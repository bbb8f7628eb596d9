"""The README's tour runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tour_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no python tour"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    state = namespace["state"]
    assert {key: state[key] for key in ("version", "epoch", "consumed", "seed", "block_size",  # type: ignore[index]
                                        "shuffle", "length")} == {
        "version": 1, "epoch": 0, "consumed": 20, "seed": 42, "block_size": 16,
        "shuffle": True, "length": 128,
    }
    checkpoint = namespace["checkpoint"]
    assert checkpoint["epoch"] == 1 and checkpoint["consumed"] == 0  # type: ignore[index]
    assert len(namespace["frames"]) == len(namespace["batch"].fields) + 1  # type: ignore[arg-type, attr-defined]


def test_readme_shows_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    assert "docs/FORMAT.md" in text and "BENCHMARKS.md" in text
    assert "docs/ARCHITECTURE.md" in text and "make docs" in text


def test_readme_tour_leads_with_the_loader() -> None:
    tour = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)[0]
    assert tour.index("zerobatch.Loader(") < tour.index("BatchNativeLoader(")
