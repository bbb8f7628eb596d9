"""Lightning with the real package: the Loader returned by train_dataloader()
(the documented way) and zerobatch.torch.DataLoader with workers (the stateful
DataLoader route), SIGKILLed mid-epoch, then trainer.fit(ckpt_path=...) resumes
exactly, with 1 process (and another num_workers) and 2 processes under torchrun."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zerobatch import Loader, StreamWriter, open_dataset

from support.warm import warm_windows  # isort: skip

pytestmark = pytest.mark.frameworks

SCRIPT = Path(__file__).parent / "support" / "lightning_train.py"
SEQ_LEN, WINDOWS, STEPS = 8, 81, 30


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lightning")
    with StreamWriter(root / "corpus") as writer:  # window i starts with token i * SEQ_LEN
        writer.add_document(np.arange(WINDOWS * SEQ_LEN + 1, dtype=np.uint32))
    warm_windows(root / "corpus", SEQ_LEN, 4)
    return root / "corpus"


def _run(corpus: Path, *runs: dict, ranks: int = 1) -> None:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(ranks)] if ranks > 1 else [sys.executable])
    command = [*launch, str(SCRIPT), "--data", str(corpus)]
    for run in runs:
        command += ["--train", json.dumps({"steps": STEPS, "save_every": 10, **run})]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    killed = any("kill_at" in run for run in runs) and ranks > 1
    assert killed or done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _expected(corpus: Path, rank: int, ranks: int) -> dict[str, list[list[int]]]:
    """The uninterrupted run's batches: each route's Loader sequence (Lightning
    starts every epoch where the last ended)."""
    windows = open_dataset(corpus).windows(SEQ_LEN)
    return {name: [(b["input_ids"][:, 0] // SEQ_LEN).tolist() for b in itertools.islice(
                Loader(windows, 4, seed=seed, rank=rank, world_size=ranks, epochs=None), STEPS)]
            for name, seed in (("loader", 1), ("workers", 2))}


def _logged(path: Path) -> dict[str, list[list[int]]]:
    steps = [json.loads(line) for line in path.open()]
    return {name: [step[name] for step in steps] for name in ("loader", "workers")}


def _check(corpus: Path, root: Path, ranks: int, killed: int, saved: int) -> None:
    for rank in range(ranks):
        expected = _expected(corpus, rank, ranks)
        before, after = _logged(Path(f"{root}.log.{rank}")), _logged(Path(f"{root}.resumed.{rank}"))
        for name in expected:
            assert before[name] == expected[name][:killed], (rank, name)
            assert after[name] == expected[name][saved:], (rank, name)
    if ranks == 1:
        epoch = [i for step in _expected(corpus, 0, 1)["loader"][:WINDOWS // 4] for i in step]
        assert len(set(epoch)) == len(epoch) == WINDOWS // 4 * 4  # each window once ...
        later = _expected(corpus, 0, 1)["loader"][WINDOWS // 4:]
        assert later != _expected(corpus, 0, 1)["loader"][:len(later)]  # ... reshuffled


def test_one_process_resumes_with_another_worker_count(corpus, tmp_path):
    root = tmp_path / "one"
    _run(corpus,
         {"out": str(root), "log": f"{root}.log", "workers": 2, "kill_at": 13},
         {"out": str(root), "log": f"{root}.resumed", "workers": 1,
          "resume": str(root / "step=10.ckpt")})
    _check(corpus, root, 1, 13, 10)


def test_two_processes_resume(corpus, tmp_path):
    root = tmp_path / "two"
    _run(corpus, {"out": str(root), "log": f"{root}.log", "workers": 1, "kill_at": 12}, ranks=2)
    _run(corpus, {"out": str(root), "log": f"{root}.resumed", "workers": 0,
                  "resume": str(root / "step=10.ckpt")}, ranks=2)
    _check(corpus, root, 2, 12, 10)
