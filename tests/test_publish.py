"""Atomic publish: a writer SIGKILLed at every step of the publish sequence leaves
the old content or the new, never a manifest naming a missing or partial file;
a rerun cleans up what the dead writer left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.kill_writer import arm, write

from zerobatch import FormatError
from zerobatch.batch_loader import BatchFileReader
from zerobatch.batch_writer import write_batch_dataset, write_batch_file
from zerobatch.storage import publish
from zerobatch.storage.publish import publisher, remove_dead_temporaries
from zerobatch.stream import StreamWriter, combine, open_dataset, verify
from zerobatch.stream.manifest import MANIFEST
from zerobatch.tensors import load_file, save_file


def _tokens(location, **options) -> np.ndarray:
    with open_dataset(location, **options) as ds:
        return ds.documents().read(np.arange(ds.num_documents))["input_ids"].values.copy()


def _run_killed(folder: Path, kill_at: int, job: Callable[[], object] | None = None) -> int:
    """Run the writer (or ``job``) in a forked child killed at step ``kill_at``;
    its wait status."""
    with warnings.catch_warnings():  # the child touches no JAX, obstore or thread
        warnings.simplefilter("ignore", RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child: local files only (obstore is never used after a fork)
        code = 1
        try:
            arm(kill_at)
            if job is None:
                write(str(folder), seed=5)
            else:
                job()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def test_local_writer_killed_at_every_step(tmp_path):
    reference = tmp_path / "reference"
    write(str(reference), seed=5)
    want = _tokens(reference)
    steps = 0
    for kill_at in range(1, 200):
        folder = tmp_path / f"killed-{kill_at}"
        status = _run_killed(folder, kill_at)
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0
            break
        assert os.WTERMSIG(status) == signal.SIGKILL
        steps += 1
        if (folder / MANIFEST).exists():  # published: must be whole
            assert verify(folder) == [] and np.array_equal(_tokens(folder), want)
        else:
            write(str(folder), seed=5)  # the rerun cleans up and finishes
        assert verify(folder) == [] and np.array_equal(_tokens(folder), want)
        # a writer killed after its manifest went out may leave its (unheld) lock file
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert steps >= 10  # every fsync and rename of three shards and the manifest


def test_combine_killed_at_every_step_reruns(tmp_path):
    """A combine SIGKILLed at any fsync or rename: the output has no manifest
    (or a whole dataset) and rerunning the same combine cleans up and completes
    (it once refused: "not empty")."""
    parts = [tmp_path / "a", tmp_path / "b"]
    for seed, part in enumerate(parts):
        write(str(part), seed=seed)
    want = _tokens(combine(parts, tmp_path / "reference"))
    steps = 0
    for kill_at in range(1, 100):
        folder = tmp_path / f"killed-{kill_at}"
        status = _run_killed(folder, kill_at, lambda f=folder: combine(parts, f))
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0
            break
        assert os.WTERMSIG(status) == signal.SIGKILL
        steps += 1
        if not (folder / MANIFEST).exists():
            assert any(p.name.startswith((".0", "0")) for p in folder.iterdir())
            combine(parts, folder)  # the rerun cleans up and finishes
        assert verify(folder) == [] and np.array_equal(_tokens(folder), want)
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert steps >= 12  # the renames of six shards' two files, then the manifest's steps
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        combine(parts, tmp_path / "reference")


def test_a_live_writer_holds_its_folder(tmp_path):
    with StreamWriter(tmp_path / "ds") as writer:
        writer.add_document([1, 2, 3])
        with pytest.raises(FileExistsError, match="another writer"):
            StreamWriter(tmp_path / "ds")
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        StreamWriter(tmp_path / "ds")


def test_local_put_replaces_whole(tmp_path):
    out = publisher(tmp_path)
    out.put("a.json", b"old")
    out.put("a.json", b"new")
    assert (tmp_path / "a.json").read_bytes() == b"new"
    assert out.names() == ["a.json"]
    with pytest.raises(ValueError, match="apply only to object-store URLs"):
        publisher(tmp_path, config={})


@pytest.mark.parametrize("kill_at", [2, -1])
def test_remote_writer_killed_mid_upload(s3, kill_at):
    """Shards (two files each) then the manifest: killed at the 2nd upload
    (shards still in flight) and at the manifest's (-1)."""
    url = s3.url("killed")
    script = Path(__file__).parent / "support" / "kill_writer.py"
    done = subprocess.run([sys.executable, str(script), url, str(kill_at), "5", s3.endpoint],
                          timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL
    options = s3.storage_options()
    with pytest.raises((FileNotFoundError, FormatError), match=f"{url}/manifest.json"):
        open_dataset(url, storage_options=options)
    write(url, seed=5, options=options)
    assert verify(url, storage_options=options) == []
    assert np.array_equal(_tokens(url, storage_options=options),
                          _tokens_reference(s3, options))


def _tokens_reference(s3, options) -> np.ndarray:
    url = s3.url("reference")
    write(url, seed=5, options=options)
    return _tokens(url, storage_options=options)


def _batches(folder: Path) -> list[np.ndarray]:
    with BatchFileReader(folder) as reader:
        return [reader.read_batch(i).copy() for i in range(reader.num_batches)]


def test_batch_folder_rewrite_killed_at_every_step(tmp_path):
    """Replacing a shard folder: at every fsync and rename the folder opens as
    the old dataset or the new one, never nothing and never a mix."""
    rng = np.random.default_rng(2)
    old_tokens, new_tokens = rng.integers(0, 999, (96, 8)), rng.integers(0, 999, (80, 8))
    write_batch_dataset(tmp_path / "old", iter(old_tokens), 96, 4, 8, 1, batches_per_shard=5)
    write_batch_dataset(tmp_path / "new", iter(new_tokens), 80, 4, 8, 1, batches_per_shard=6)
    old, new = _batches(tmp_path / "old"), _batches(tmp_path / "new")
    for kill_at in range(1, 200):
        folder = tmp_path / f"killed-{kill_at}"
        write_batch_dataset(folder, iter(old_tokens), 96, 4, 8, 1, batches_per_shard=5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                arm(kill_at)
                write_batch_dataset(folder, iter(new_tokens), 80, 4, 8, 1, batches_per_shard=6)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        got = _batches(folder)
        assert len(got) in (len(old), len(new))
        want = old if len(got) == len(old) else new
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0 and len(got) == len(new)
            assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".batch")) \
                == sorted(f"{n}" for n in _shard_names(folder))
            break
    assert kill_at > 5


def _shard_names(folder: Path) -> list[str]:
    return [s["name"] for s in json.loads((folder / "manifest.json").read_text())["shards"]]


def _killed_at_first_fsync(write_it) -> None:
    """Run ``write_it()`` in a forked child SIGKILLed at its first fsync: its
    temporary file is complete then, and never renamed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        pid = os.fork()
    if pid == 0:
        try:
            arm(1)
            write_it()
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _temporaries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_killed_writers_temporaries_are_removed_by_the_next_write_not_a_live_ones(tmp_path):
    weights = {"w": np.arange(300_000, dtype=np.float32)}  # 1.2 MB: blocks reserved up front
    tokens = np.arange(64 * 16, dtype=np.int64).reshape(64, 16)
    _killed_at_first_fsync(lambda: save_file(weights, tmp_path / "model.safetensors",
                                             format="safetensors"))
    (dead_save,) = _temporaries(tmp_path)
    assert dead_save.name.startswith(".model.safetensors.")
    assert dead_save.stat().st_size > 1_200_000  # full size, as the finding says
    assert not (tmp_path / "model.safetensors").exists()

    live = publisher(tmp_path).file("other.bin")  # a live writer, holding its flock
    live.write(b"still being written")
    # unlocked, named after this live process, changed after it started: a writer
    # between creating its file and locking it
    creating = tmp_path / f".x.bin.{os.getpid()}.0123abcd.tmp"
    creating.write_bytes(b"x")
    not_ours = tmp_path / ".z.bin.1.tmp"  # another helper's naming: never touched
    not_ours.write_bytes(b"z")
    kept = sorted([live.tmp, creating, not_ours])

    # a write_batch_file killed the same way, in the same folder, removes the first
    # dead writer's file as it starts, and leaves its own
    _killed_at_first_fsync(lambda: write_batch_file(tmp_path / "train.batch", tokens, 4, 16))
    (dead_batch,) = set(_temporaries(tmp_path)) - set(kept)
    assert dead_batch.name.startswith(".train.batch.") and not dead_save.exists()
    assert not (tmp_path / "train.batch").exists()

    save_file(weights, tmp_path / "model.safetensors", format="safetensors")  # the later write
    assert _temporaries(tmp_path) == kept
    np.testing.assert_array_equal(load_file(tmp_path / "model.safetensors")["w"], weights["w"])
    live.commit()
    assert (tmp_path / "other.bin").read_bytes() == b"still being written"
    assert remove_dead_temporaries(tmp_path) == []


def test_a_killed_batch_writers_temporary_goes_at_its_rerun(tmp_path):
    tokens = np.arange(64 * 16, dtype=np.int64).reshape(64, 16)
    _killed_at_first_fsync(lambda: write_batch_file(tmp_path / "train.batch", tokens, 4, 16))
    assert len(_temporaries(tmp_path)) == 1
    assert write_batch_file(tmp_path / "train.batch", tokens, 4, 16) == 16
    assert _temporaries(tmp_path) == []


def test_a_reused_pid_does_not_keep_a_dead_writers_file(tmp_path):
    """The PID in a temporary file's name keeps it only while that process may
    be its writer: alive, and started before the file last changed. The
    changes are real files' ``st_ctime``, as the sweep reads them."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    written = tmp_path / "written-by-the-child"
    try:
        assert publish._started_at(child.pid) is not None
        written.write_bytes(b"x")  # changed after the child started: it may be the writer
        changed = written.stat().st_ctime
        assert publish._writer_may_live(child.pid, changed=changed)
        assert not publish._writer_may_live(child.pid, changed=changed - 3600)  # a reuser
    finally:
        child.communicate(b"")
    assert not publish._writer_may_live(child.pid, changed=changed)  # dead
