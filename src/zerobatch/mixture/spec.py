"""Users' spellings of a mixture: Megatron's ``--data-path`` list and a JSON or
YAML file of ``{name: {path, weight}}``; and the report ``zerobatch inspect``
prints for one.

A mixture file maps each source's name to its dataset and weight::

    web:  {path: /data/web,  weight: 0.7}
    code: {path: data/code,  weight: 0.3, max_passes: 2}

``path`` is anything :func:`zerobatch.open_dataset` opens (a zerobatch
dataset, a Megatron prefix or another peer format, a URL); a relative path is
relative to the file's folder. ``weight`` is a float > 0; ``max_passes`` (an
int) is optional. Every other key is an error (a typo must not pass silently).
Each dataset is read as windows of ``seq_len`` tokens, or as documents when
``seq_len`` is None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["describe_text", "file_sources", "is_mixture_file", "megatron_sources",
           "parse_megatron", "plot_shares", "read_file"]

_KEYS = {"path", "weight", "max_passes"}


def parse_megatron(data_path: str | Sequence[str]) -> list[tuple[float, str]]:
    """``(weight, path)`` pairs from a Megatron ``--data-path``: ``["0.3",
    "/data/web", "0.7", "/data/code"]`` (or the same as one string), or paths
    alone (weight 1 each). ValueError names the item that is not a weight."""
    items = data_path.split() if isinstance(data_path, str) else [str(x) for x in data_path]
    if not items:
        raise ValueError("data_path is empty: give [weight, path, weight, path, ...] or paths")

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    if number(items[0]) is None:  # paths alone
        bad = [x for x in items if number(x) is not None]
        if bad:
            raise ValueError(f"data_path mixes paths and weights ({bad}); give "
                             "[weight, path, weight, path, ...] or paths alone")
        return [(1.0, x) for x in items]
    if len(items) % 2:
        raise ValueError(f"data_path has {len(items)} items; weights and paths must pair up "
                         "as [weight, path, weight, path, ...]")
    pairs = []
    for i in range(0, len(items), 2):
        weight = number(items[i])
        if weight is None:
            raise ValueError(f"data_path[{i}] = {items[i]!r} is not a weight; expected "
                             "[weight, path, weight, path, ...]")
        pairs.append((weight, items[i + 1]))
    return pairs


def _names(paths: Sequence[str]) -> list[str]:
    """A distinct readable name per path: its last component, numbered on clashes."""
    names: list[str] = []
    for path in paths:
        base = os.path.basename(path.rstrip("/")) or path
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return names


def _open(path: str, seq_len: int | None, storage_options: Mapping[str, Any] | None) -> Any:
    from zerobatch.stream import open_dataset

    dataset: Any = open_dataset(path, storage_options=dict(storage_options or {}))
    return dataset.documents() if seq_len is None else dataset.windows(seq_len)


def megatron_sources(data_path: str | Sequence[str], *, seq_len: int | None = None,
                     storage_options: Mapping[str, Any] | None = None
                     ) -> tuple[dict[str, Any], dict[str, float]]:
    """The sources and weights of a Megatron ``--data-path`` (:func:`parse_megatron`),
    for ``Mixture.from_megatron``: each path opened with
    :func:`zerobatch.open_dataset` (Megatron ``.bin``/``.idx`` prefixes and
    zerobatch datasets alike), read as windows of ``seq_len`` tokens
    (documents when None), named by its last path component."""
    pairs = parse_megatron(data_path)
    names = _names([p for _, p in pairs])
    sources = {n: _open(p, seq_len, storage_options) for n, (_, p) in zip(names, pairs,
                                                                          strict=True)}
    return sources, {n: w for n, (w, _) in zip(names, pairs, strict=True)}


def is_mixture_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a local ``.yaml``/``.yml``/``.json`` file whose
    entries all have a ``weight`` (what ``zerobatch inspect`` treats as a mixture)."""
    path = Path(path)
    if path.suffix.lower() not in (".yaml", ".yml", ".json") or not path.is_file():
        return False
    try:
        entries = read_file(path)
    except (ValueError, ImportError, OSError):
        return path.suffix.lower() != ".json"  # YAML: say what is wrong with it
    return bool(entries)


def read_file(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """A mixture file (module docstring) as ``{name: {path, weight[, max_passes]}}``,
    paths made absolute. ValueError names the file and the entry that is wrong."""
    path = Path(path)
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError("reading a YAML mixture file needs PyYAML: pip install "
                              "zerobatch[yaml] (or write it as JSON)") from None
        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON ({error}); a mixture file is JSON or YAML "
                             "(.yaml, .yml) of {name: {path, weight}}") from None
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{path}: expected a mapping of source names to {{path, weight}}, "
                         f"got {type(data).__name__}")
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, Mapping) or not {"path", "weight"} <= set(entry):
            raise ValueError(f"{path}: source {name!r} must have path and weight, got "
                             f"{entry!r:.200}")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ValueError(f"{path}: source {name!r} has unknown keys {unknown}; allowed: "
                             f"{sorted(_KEYS)}")
        where = str(entry["path"])
        if "://" not in where and not os.path.isabs(where):
            where = str(path.parent / where)
        out[str(name)] = {**entry, "path": where}
    return out


def file_sources(path: str | os.PathLike[str], *, seq_len: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, **options: Any
                 ) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """The sources, weights and ``Mixture`` options of a JSON or YAML file
    (module docstring), for ``Mixture.from_file``: a file's ``max_passes``
    entries win over the ``options``' own."""
    entries = read_file(path)
    sources = {n: _open(e["path"], seq_len, storage_options) for n, e in entries.items()}
    weights = {n: e["weight"] for n, e in entries.items()}
    passes = {n: e["max_passes"] for n, e in entries.items() if "max_passes" in e}
    if passes:  # the file's own limits win over a limit for all
        base = options.get("max_passes")
        merged = ({} if base is None else dict(base) if isinstance(base, Mapping)
                  else dict.fromkeys(entries, base))
        options["max_passes"] = {**merged, **passes}
    return sources, weights, options


class _Described(Protocol):
    """What the report and the plot read of a ``Mixture`` (which imports this
    module for its ``from_megatron`` and ``from_file``)."""

    def __len__(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def stages(self) -> Sequence[Any]: ...
    @property
    def names(self) -> Sequence[str]: ...
    @property
    def order(self) -> Any: ...
    def describe(self, length: int) -> list[dict[str, Any]]: ...


def describe_text(mixture: _Described, length: int | None = None) -> str:
    """The table ``zerobatch inspect MIXTURE`` prints: per source its
    observations, asked and achieved share, slots and passes at ``length``."""
    at = len(mixture) if length is None else length
    rows = mixture.describe(at)
    lines = [f"mixture of {len(rows)} sources, {len(mixture):,} observations, "
             f"{len(mixture.stages)} stage(s), block_size {mixture.stages[-1].block_size}, "
             f"seed {mixture.seed}; at {at:,}:",
             f"{'source':<24} {'observations':>14} {'weight':>9} {'achieved':>9} "
             f"{'read':>14} {'passes':>7}"]
    for r in rows:
        lines.append(f"{r['name']:<24} {r['observations']:>14,} {r['weight']:>9.4%} "
                     f"{r['achieved']:>9.4%} {r['slots']:>14,} {r['passes']:>7}")
    for t, stage in enumerate(mixture.stages[:-1]):
        lines.append(f"stage {t} from {stage.start:,}: {dict(stage.weights)}")
    return "\n".join(lines)


def plot_shares(mixture: _Described, path: str | os.PathLike[str], *, length: int | None = None,
                points: int = 200) -> None:
    """A stacked area plot of each source's share over the run (``points``
    windows of the positions), stage starts marked, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    end = len(mixture) if length is None else length
    edges = np.unique(np.linspace(0, end, points + 1).astype(np.int64))
    counts = np.stack([mixture.order.slots_before(int(e)) for e in edges])
    shares = np.diff(counts, axis=0) / np.diff(edges)[:, None]
    figure, axes = plt.subplots(figsize=(10, 5))
    axes.stackplot(edges[:-1], shares.T, labels=list(mixture.names), step="post")
    for stage in mixture.stages[1:]:
        axes.axvline(stage.start, color="black", linestyle="--", linewidth=1)
    axes.set(xlabel="position (observations)", ylabel="share", xlim=(0, end), ylim=(0, 1),
             title=f"{len(mixture.names)} sources, {len(mixture.stages)} stage(s)")
    if len(mixture.names) <= 20:
        axes.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
