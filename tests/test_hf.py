"""zerobatch.hf.Trainer with the real transformers and accelerate: a tiny GPT-2
from a config, SIGKILLed and resumed, compared sample by sample with the
uninterrupted run; two ranks under torchrun; the loss of a plain loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zerobatch import StreamWriter, open_dataset

pytestmark = pytest.mark.frameworks

SCRIPT = Path(__file__).parent / "support" / "hf_train.py"
STEPS, SEQ_LEN, BATCH = 30, 16, 4


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": src + (os.pathsep + path if path else ""),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


def _rows(log: Path) -> list[list[tuple[int, ...]]]:
    return [[tuple(row) for row in json.loads(line)["rows"]] for line in log.open()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every single-process run, forked from one process: the reference (and a
    plain loop), workers 0 killed after step 13 and resumed from step 10, and
    workers 2 killed after step 22 and resumed from step 20."""
    root = tmp_path_factory.mktemp("hf")
    rng = np.random.default_rng(0)
    with StreamWriter(root / "corpus") as writer:
        for _ in range(40):
            writer.add_document(rng.integers(1, 512, size=int(rng.integers(3, 40))))
    runs = [{"out": str(root / "ref"), "log": str(root / "ref.log"), "plain": True},
            {"out": str(root / "w0"), "log": str(root / "w0.log"), "kill_at": 13},
            {"out": str(root / "w0"), "log": str(root / "w0.resumed"), "resume": True},
            {"out": str(root / "w2"), "log": str(root / "w2.log"), "kill_at": 22, "workers": 2},
            {"out": str(root / "w2"), "log": str(root / "w2.resumed"), "resume": True,
             "workers": 2}]
    args = [sys.executable, str(SCRIPT), "--data", str(root / "corpus")]
    for run in runs:
        args += ["--train", json.dumps({"steps": STEPS, **run})]
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root


def _windows(root: Path) -> dict[tuple[int, ...], int]:
    windows = open_dataset(root / "corpus").windows(SEQ_LEN, labels="aligned")
    rows = windows.read(np.arange(len(windows)))["input_ids"]
    table = {tuple(int(t) for t in row): i for i, row in enumerate(rows)}
    assert len(table) == len(windows)  # every window is told apart by its tokens
    return table


def test_epochs_cover_once_and_reshuffle(runs):
    table = _windows(runs)
    steps = len(table) // BATCH
    order = [table[row] for step in _rows(runs / "ref.log") for row in step]
    epochs = [order[e * steps * BATCH:(e + 1) * steps * BATCH] for e in range(STEPS // steps)]
    assert len(epochs) == 2
    for epoch in epochs:
        assert sorted(epoch) == sorted(set(epoch)) and len(epoch) == steps * BATCH
    assert epochs[0] != epochs[1]  # reshuffled


def test_loss_matches_a_plain_loop(runs):
    trainer = [json.loads(line)["loss"] for line in (runs / "ref.log").open()]
    plain = json.loads((runs / "ref.log.plain").read_text())
    np.testing.assert_allclose(trainer, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "killed", "saved"), [("w0", 13, 10), ("w2", 22, 20)])
def test_sigkill_and_resume_is_exact(runs, name, killed, saved):
    reference = _rows(runs / "ref.log")
    before, after = _rows(runs / f"{name}.log"), _rows(runs / f"{name}.resumed")
    assert before == reference[:killed]
    assert after == reference[saved:]  # sample by sample, across the epoch's end
    state = json.loads((runs / name / f"checkpoint-{saved}" / "zerobatch_loader.json").read_text())
    assert state["consumed"] + state["epoch"] * 15 * BATCH == saved * BATCH


def test_resume_replays_nothing(runs):
    """The Trainer's batch skipping is bypassed: the resumed run read only the
    steps it trained on."""
    produced = json.loads((runs / "w0.resumed.produced").read_text())
    assert len(produced) == STEPS - 10


def test_checkpoint_without_loader_state_is_refused(runs, tmp_path):
    from zerobatch.hf import _read_state

    with pytest.raises(ValueError, match=r"zerobatch_loader\.json is missing"):
        _read_state(str(tmp_path))
    (tmp_path / "zerobatch_loader.json").write_text("[1]")
    with pytest.raises(ValueError, match="not a Loader state"):
        _read_state(str(tmp_path))


def test_two_ranks_under_torchrun_read_each_observation_once(runs, tmp_path):
    """torchrun + accelerate (DDP on gloo): each rank reads its own share once,
    never split a second time by accelerate."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", str(SCRIPT), "--data", str(runs / "corpus"), "--train",
            json.dumps({"out": str(tmp_path / "out"), "log": str(tmp_path / "log"), "steps": 7})]
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = _windows(runs)
    seen = [table[row] for rank in (0, 1) for step in _rows(tmp_path / f"log.{rank}")
            for row in step]
    assert len(seen) == len(set(seen)) == 7 * 2 * BATCH == len(table) - len(table) % 8


def test_a_source_with_its_own_label_convention(tmp_path):
    """Packed documents with labels='aligned' (padding, -100 at document starts)
    pass through as they are; labels='shifted' is refused; windows get
    aligned labels derived from input_ids and position_ids."""
    from zerobatch import Loader
    from zerobatch.hf import IGNORE_INDEX, _TrainerData, aligned_labels

    rng = np.random.default_rng(2)
    with StreamWriter(tmp_path / "corpus") as writer:
        for _ in range(30):
            writer.add_document(rng.integers(1, 512, size=int(rng.integers(3, 20))))
    documents = open_dataset(tmp_path / "corpus").documents()
    aligned = documents.packed(SEQ_LEN, labels="aligned")
    data = _TrainerData(Loader(aligned, BATCH, seed=1), ("input_ids", "labels"))
    expected = [b["labels"] for b in Loader(aligned, BATCH, seed=1)]
    got = [b["labels"] for b in data]
    assert len(got) == len(expected) > 0
    assert all(a.equal(b) for a, b in zip(got, expected, strict=True))
    with pytest.raises(ValueError, match="labels='aligned'"):
        _TrainerData(Loader(documents.packed(SEQ_LEN), BATCH), ("input_ids", "labels"))
    # Windows with labels="aligned" pass through; windows with shifted labels (the
    # default) are refused, as any source that names "shifted".
    windows = open_dataset(tmp_path / "corpus").windows(SEQ_LEN, labels="aligned")
    batch = next(iter(_TrainerData(Loader(windows, BATCH, seed=1), ("input_ids", "labels"))))
    raw = next(iter(Loader(windows, BATCH, seed=1)))
    assert batch["labels"].equal(raw["labels"]) and (raw["labels"] == IGNORE_INDEX).any()
    with pytest.raises(ValueError, match="labels='aligned'"):
        _TrainerData(Loader(open_dataset(tmp_path / "corpus").windows(SEQ_LEN), BATCH),
                     ("input_ids", "labels"))
    # A source naming no convention: aligned labels derived from position_ids.
    masked = open_dataset(tmp_path / "corpus").windows(SEQ_LEN, document_masking=True)
    derived = aligned_labels(next(iter(Loader(masked, BATCH, seed=1))))
    assert derived["labels"].shape == (BATCH, SEQ_LEN)


def test_int32_position_ids_give_the_same_loss_as_int64(tmp_path):
    """Window batches carry int32 position_ids (half the bytes of int64): a tiny
    Llama built from a config, on the padding-free path (no attention mask: the
    model finds the documents from position_ids), gives the same logits and loss
    as with the same ids cast to int64, and other logits than without them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from zerobatch import Loader

    rng = np.random.default_rng(4)
    with StreamWriter(tmp_path / "corpus") as writer:
        for _ in range(30):
            writer.add_document(rng.integers(1, 300, size=int(rng.integers(3, 30))))
    windows = open_dataset(tmp_path / "corpus").windows(48, labels="aligned",
                                                        document_masking=True)
    batch = next(iter(Loader(windows, 2, seed=1)))
    assert batch["position_ids"].dtype == torch.int32
    assert int((batch["position_ids"] == 0).sum()) > 2  # documents inside the rows
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    for attention in ("sdpa", "eager"):
        model = transformers.LlamaForCausalLM(config).eval()
        model.config._attn_implementation = attention
        inputs = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
        with torch.no_grad():
            narrow = model(**inputs, position_ids=batch["position_ids"])
            wide = model(**inputs, position_ids=batch["position_ids"].long())
            whole = model(**inputs)
        assert torch.equal(narrow.logits, wide.logits)
        assert narrow.loss.item() == wide.loss.item()
        assert not torch.allclose(narrow.logits, whole.logits)  # the documents were seen
