"""docs/ARCHITECTURE.md stays true: it names every module of the package."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_architecture_names_every_module() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    package = ROOT / "src" / "zerobatch"
    missing = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
               if f"`{path.relative_to(package).as_posix()}`" not in text]
    assert not missing, (f"docs/ARCHITECTURE.md does not name {missing}: add each to the "
                         "'Who owns what' table (and to a layer) with what it owns")
