"""Mixture spellings: Megatron's --data-path (real megatron-core files), JSON and
YAML files, and ``zerobatch inspect MIXTURE.yaml``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from zerobatch import Mixture, StreamWriter, open_dataset
from zerobatch.cli import main
from zerobatch.mixture.spec import parse_megatron, read_file


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spec")
    rng = np.random.default_rng(0)
    prefix = root / "web_text_document"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(80):
        builder.add_item(torch.from_numpy(rng.integers(0, 1000, int(rng.integers(1, 60)))))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    with StreamWriter(root / "code", shard_tokens=1_000) as writer:
        for _ in range(50):
            writer.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 50))))
    return {"megatron": prefix, "zerobatch": root / "code", "root": root}


def test_parse_megatron() -> None:
    assert parse_megatron(["0.3", "/d/web", "0.7", "/d/code"]) == [(0.3, "/d/web"),
                                                                   (0.7, "/d/code")]
    assert parse_megatron("1 a 2 b") == [(1.0, "a"), (2.0, "b")]
    assert parse_megatron(["a", "b"]) == [(1.0, "a"), (1.0, "b")]
    for bad, match in [([], "empty"), (["0.3", "a", "0.7"], "pair up"),
                       (["0.3", "a", "b", "c"], r"data_path\[2\] = 'b' is not a weight"),
                       (["a", "0.5"], "mixes paths and weights")]:
        with pytest.raises(ValueError, match=match):
            parse_megatron(bad)


def test_from_megatron_reads_megatron_and_zerobatch_datasets(data: dict[str, Path]) -> None:
    mix = Mixture.from_megatron(["0.3", str(data["megatron"]), "0.7", str(data["zerobatch"])],
                                seq_len=8, length=200, seed=5, block_size=20)
    assert mix.names == ("web_text_document", "code")
    windows = [open_dataset(data[k]).windows(8) for k in ("megatron", "zerobatch")]
    batch = mix.read(np.arange(200))
    sources, index = mix.locate(np.arange(200))
    assert (sources == 0).sum() == 60 and (sources == 1).sum() == 140
    for row in range(0, 200, 7):
        want = windows[int(sources[row])].read([int(index[row])])["input_ids"][0]
        np.testing.assert_array_equal(batch["input_ids"][row], want)
    documents = Mixture.from_megatron([str(data["megatron"])], max_passes=1)
    assert len(documents) == 80  # one source, documents, one pass


def test_json_and_yaml_files(data: dict[str, Path], tmp_path: Path) -> None:
    entries = {"web": {"path": str(data["megatron"]), "weight": 0.25},
               "code": {"path": f"../{data['root'].name}/code", "weight": 0.75,
                        "max_passes": 3}}
    folder = data["root"].parent / "files"
    folder.mkdir(exist_ok=True)
    (folder / "mix.json").write_text(json.dumps(entries))
    (folder / "mix.yaml").write_text(
        f"web: {{path: {data['megatron']}, weight: 0.25}}\n"
        f"code:\n  path: {data['zerobatch']}\n  weight: 0.75\n  max_passes: 3\n")
    a = Mixture.from_file(folder / "mix.yaml", seq_len=8)
    assert a.names == ("web", "code") and a.stages[0].weights == {"web": 0.25, "code": 0.75}
    assert a.describe()[1]["passes"] == 3  # code's third pass ends the mixture
    assert read_file(folder / "mix.json")["code"]["path"] == str(
        folder / f"../{data['root'].name}/code")
    assert Mixture.from_file(folder / "mix.json", seq_len=8).fingerprint == a.fingerprint
    for text, match in [('{"web": {"path": "x"}}', "'web' must have path and weight"),
                        ('{"web": {"path": "x", "weight": 1, "wieght": 2}}',
                         r"unknown keys \['wieght'\]"),
                        ("[1, 2]", "expected a mapping"), ("{", "not JSON")]:
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match=match):
            read_file(tmp_path / "bad.json")
    (tmp_path / "zero.json").write_text(json.dumps({"web": {"path": str(data["megatron"]),
                                                            "weight": 0}}))
    with pytest.raises(ValueError, match="weights"):
        Mixture.from_file(tmp_path / "zero.json", length=10)


def test_inspect_prints_the_mixture_and_plots_it(data: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(f"web: {{path: {data['megatron']}, weight: 1}}\n"
                    f"code: {{path: {data['zerobatch']}, weight: 3}}\n")
    assert main(["inspect", str(path), "--length", "1000", "--plot",
                 str(tmp_path / "shares.png")]) in (0, None)
    out = capsys.readouterr().out
    assert "mixture of 2 sources, 1,000 observations" in out
    assert "web" in out and "25.0000%" in out and "75.0000%" in out
    assert (tmp_path / "shares.png").stat().st_size > 1000
    main(["inspect", str(path), "--seq-len", "8"])
    assert "at " in capsys.readouterr().out
