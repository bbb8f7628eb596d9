"""torchrun with 4 gloo ranks on 127.0.0.1 checkpointing through
torch.distributed.checkpoint, SIGKILLed, resumed with 4, 2 and 3 ranks and
another batch size: on the Loader path and the worker DataLoader path, every
observation of the epoch exactly once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zerobatch import StreamWriter

from support.warm import warm_windows  # isort: skip

pytestmark = pytest.mark.frameworks

SCRIPT = Path(__file__).parent / "support" / "dcp_train.py"
SEQ_LEN, WINDOWS, SAVE_AT = 8, 300, 5


def _torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(ranks), str(SCRIPT), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def _read(log: Path, ranks: int) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {"loader": [], "workers": [], "torchdata": []}
    for rank in range(ranks):
        for line in Path(f"{log}.{rank}").read_text().splitlines():
            step = json.loads(line)
            if step["saved"]:
                seen[step["path"]] += step["ids"]
    return seen


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 ranks x 6 windows, checkpointed after step 5, SIGKILLed after step 7."""
    root = tmp_path_factory.mktemp("dcp")
    with StreamWriter(root / "corpus") as writer:  # window i starts with token i * SEQ_LEN
        writer.add_document(np.arange(WINDOWS * SEQ_LEN + 1, dtype=np.uint32))
    warm_windows(root / "corpus", SEQ_LEN, 6)
    done = _torchrun(4, "--data", str(root / "corpus"), "--checkpoint", str(root / "ckpt"),
                     "--record", str(root / "before"), "--batch-size", "6",
                     "--save-at", str(SAVE_AT))
    assert done.returncode != 0, "the job should have been SIGKILLed"
    assert (root / "ckpt" / ".metadata").exists(), done.stderr[-3000:]
    return root


@pytest.mark.parametrize(("ranks", "batch_size", "workers"), [(4, 6, 1), (2, 12, 0), (3, 10, 2)])
def test_resume_every_observation_once(killed, tmp_path, ranks, batch_size, workers):
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(killed / "ckpt", checkpoint)
    done = _torchrun(ranks, "--data", str(killed / "corpus"), "--checkpoint", str(checkpoint),
                     "--record", str(tmp_path / "after"), "--batch-size", str(batch_size),
                     "--workers", str(workers), "--resume")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    before, after = _read(killed / "before", 4), _read(tmp_path / "after", ranks)
    consumed = SAVE_AT * 4 * 6
    tail = (WINDOWS - consumed) % (ranks * batch_size)  # the resumed epoch's dropped tail
    for path in ("loader", "workers", "torchdata"):
        assert len(before[path]) == consumed
        seen = before[path] + after[path]
        assert len(seen) == len(set(seen)) == WINDOWS - tail, path
