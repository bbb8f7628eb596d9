"""docs/training.md runs as written: every python block, section by section,
in order, with the real frameworks (the names DATA, SHARDS and CHECKPOINT
given)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zerobatch import StreamWriter

pytestmark = pytest.mark.frameworks

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def _sections() -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for part in re.split(r"^## ", GUIDE.read_text(), flags=re.MULTILINE)[1:]:
        title, _, body = part.partition("\n")
        blocks = re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL)
        if blocks:
            sections[title.strip()] = blocks
    return sections


SECTIONS = _sections()


def test_the_guide_covers_every_framework_and_the_readme_links_it() -> None:
    assert list(SECTIONS) == [
        "Plain PyTorch", "torchrun with DDP or FSDP", "torch.distributed.checkpoint (DCP)",
        "DataLoader worker processes", "Hugging Face Trainer", "Lightning", "JAX with orbax",
        "Seed 003's interface"]
    assert "docs/training.md" in (GUIDE.parents[1] / "README.md").read_text()


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("guide")
    rng = np.random.default_rng(0)
    with StreamWriter(root / "data") as writer:
        for _ in range(200):  # about 190 windows of 128 tokens
            writer.add_document(rng.integers(1, 512, size=int(rng.integers(50, 200))))
    for split in ("train", "val"):
        (root / "shards" / split).mkdir(parents=True)
        for i in range(2):
            np.save(root / "shards" / split / f"shard_{i:03d}.npy",
                    rng.integers(0, 512, size=400).astype(np.uint16))
    (root / "checkpoint").mkdir()
    return {"DATA": str(root / "data"), "SHARDS": str(root / "shards"),
            "CHECKPOINT": str(root / "checkpoint")}


# Sections that start a torch.distributed process group run in a child process: a
# gloo group's threads left in this process would be copied into the DataLoader
# workers later tests fork (seen: a worker aborting in a clean-clone run).
IN_A_CHILD = ("torchrun", "torch.distributed.checkpoint")


@pytest.mark.parametrize("title", list(SECTIONS))
def test_recipe_runs(title: str, names: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                     tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    if title.startswith("torchrun"):  # one rank of the job torchrun would start
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
            monkeypatch.setenv(name, value)
    if title.startswith(IN_A_CHILD):
        script = "".join(f"{name} = {value!r}\n" for name, value in names.items())
        script += "\n".join(SECTIONS[title])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(GUIDE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{title}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return
    namespace: dict[str, object] = dict(names)
    for block in SECTIONS[title]:
        exec(compile(block, f"{GUIDE}:{title}", "exec"), namespace)
