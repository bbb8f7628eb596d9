"""BatchServer and BatchClient: servers in child processes, clients in the test."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support._service_procs import serve_batches

from zerobatch.columnar import Batch
from zerobatch.plan import Plan
from zerobatch.service import BatchClient, ServiceError
from zerobatch.stream import StreamWriter, open_dataset

SPAWN = multiprocessing.get_context("spawn")
SEQ_LEN = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("service") / "corpus"
    rng = np.random.default_rng(0)
    with StreamWriter(path) as writer:
        for _ in range(60):
            writer.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 60))))
    return str(path)


class _Servers:
    """Start, kill and restart BatchServer processes over one corpus."""

    def __init__(self, corpus: str) -> None:
        self.corpus = corpus
        self.processes: dict[str, Any] = {}

    def start(self, address: str = "tcp://127.0.0.1:*", **options: Any) -> str:
        queue = SPAWN.Queue()
        process = SPAWN.Process(
            target=serve_batches,
            args=(self.corpus, SEQ_LEN, address, queue),
            kwargs=options,
            daemon=True,
        )
        process.start()
        bound = queue.get(timeout=60)
        self.processes[bound] = process
        return bound

    def kill(self, address: str) -> None:
        process = self.processes.pop(address)
        process.kill()
        process.join()

    def close(self) -> None:
        for address in list(self.processes):
            self.kill(address)


@pytest.fixture(scope="module")
def servers(corpus: str) -> Iterator[_Servers]:
    started = _Servers(corpus)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="module")
def shared(servers: _Servers) -> str:
    return servers.start()


def _expected(corpus: str, batch_size: int, world_size: int, rank: int, start: int = 0) -> list:
    """(global indexes, input_ids) a local reader gets for ``rank`` from position ``start``."""
    windows = open_dataset(corpus).windows(SEQ_LEN)
    plan = Plan(len(windows), batch_size, world_size=world_size, seed=3)
    out = []
    for k in range(plan.steps(start)):
        indices, _ = plan.indices(0, start + k * plan.step_size, rank)
        batch = windows.read(indices)
        out.append((np.asarray(batch.meta.global_indexes), batch["input_ids"]))
    return out


def _received(client: BatchClient, steps: int | None = None) -> list:
    out = []
    for batch in client:
        assert isinstance(batch, Batch)
        out.append((np.asarray(batch.meta.global_indexes), np.asarray(batch["input_ids"])))
        if steps is not None and len(out) == steps:
            break
    return out


def _same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (gi, gx), (wi, wx) in zip(got, want, strict=True):
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(gx, wx)


def test_four_ranks_then_two_resume(corpus: str, shared: str) -> None:
    clients = [
        BatchClient(shared, 4, seed=3, rank=r, world_size=4, output="batch", timeout=20)
        for r in range(4)
    ]
    states = []
    for rank, client in enumerate(clients):
        with client:
            assert len(client) == len(_expected(corpus, 4, 4, rank))
            _same(_received(client, 2), _expected(corpus, 4, 4, rank)[:2])
            states.append(client.state_dict())
    assert all(state == states[0] for state in states)
    start = states[0]["consumed"]
    assert start == 2 * 4 * 4
    seen = [np.asarray(i) for r in range(4) for i, _ in _expected(corpus, 4, 4, r)[:2]]
    for rank in range(2):
        with BatchClient(shared, 4, seed=3, rank=rank, world_size=2, output="batch") as client:
            client.load_state_dict(states[rank])
            got = _received(client)
            _same(got, _expected(corpus, 4, 2, rank, start))
            seen += [i for i, _ in got]
    indexes = np.concatenate(seen)
    assert len(np.unique(indexes)) == len(indexes)


def test_outputs_and_state_json(shared: str) -> None:
    import json

    import torch

    with BatchClient(shared, 2, seed=3, output="torch") as client:
        batch = next(iter(client))
        assert isinstance(batch["input_ids"], torch.Tensor)
        assert json.loads(json.dumps(client.state_dict())) == client.state_dict()
    with BatchClient(shared, 2, seed=3, output="numpy") as client:
        assert isinstance(next(iter(client))["labels"], np.ndarray)


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def test_server_killed_and_restarted(corpus: str, servers: _Servers) -> None:
    address = servers.start(_free_address())
    with BatchClient(address, 3, seed=3, output="batch", prefetch=4, timeout=30) as client:
        iterator = iter(client)
        got = [next(iterator) for _ in range(3)]
        servers.kill(address)
        servers.start(address)
        got += list(iterator)
    _same(
        [(np.asarray(b.meta.global_indexes), b["input_ids"]) for b in got],
        _expected(corpus, 3, 1, 0),
    )
    servers.kill(address)


def test_two_servers_one_killed(corpus: str, servers: _Servers, shared: str) -> None:
    first, second = servers.start(), shared
    with BatchClient([first, second], 2, seed=3, output="batch", prefetch=6, timeout=30) as client:
        iterator = iter(client)
        got = [next(iterator) for _ in range(4)]
        servers.kill(first)
        got += list(iterator)
    _same(
        [(np.asarray(b.meta.global_indexes), b["input_ids"]) for b in got],
        _expected(corpus, 2, 1, 0),
    )


def test_resume_mid_step_from_another_batch_size(corpus: str, shared: str) -> None:
    """An elastic resume: a state saved by batch_size 3 (consumed 6) continues in a
    client of batch_size 4 from position 6, as a Loader does (the server once
    refused any position that was not the start of one of its steps)."""
    with BatchClient(shared, 3, seed=3, output="batch", timeout=20) as first:
        _received(first, 2)
        state = first.state_dict()
    assert state["consumed"] == 6
    with BatchClient(shared, 4, seed=3, output="batch", timeout=20) as client:
        client.load_state_dict(state)
        _same(_received(client), _expected(corpus, 4, 1, 0, start=6))


def test_bad_requests_and_silence(shared: str) -> None:
    from zerobatch.service._fetch import Fetcher

    fetcher = Fetcher([shared], timeout=20, window=1)
    try:
        good = {
            "op": "batch",
            "seed": 3,
            "epoch": 0,
            "consumed": 0,
            "rank": 0,
            "world_size": 1,
            "batch_size": 2,
            "shuffle": True,
            "drop_last": True,
            "block_size": None,
        }
        for change, message in [
            ({"rank": 1}, "rank 1 outside"),
            ({"consumed": 10**9}, "consumed=1000000000 has no step left"),
            ({"consumed": -1}, "consumed=-1 has no step left"),
            ({"epoch": 2**63}, "outside \\[0, 2\\*\\*63\\)"),
            ({"batch_size": "2"}, "key 'batch_size': expected int"),
            ({"op": "nope"}, "unknown op 'nope'"),
        ]:
            with pytest.raises(ServiceError, match=message):
                fetcher.request({**good, **change})
        _, frames = fetcher.request(good)
        assert len(Batch.from_frames(frames)) == 2
        _fuzz_plan_keys(fetcher, good)
    finally:
        fetcher.close()
    silent = _free_address()
    with pytest.raises(TimeoutError, match=silent):
        BatchClient(silent, 2, timeout=0.5)


def _fuzz_plan_keys(fetcher: Any, good: dict[str, Any]) -> None:
    """Hostile plan values (huge, negative, wrong types) get error replies or a batch."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    values = st.one_of(
        st.integers(-(2**63), 2**64 - 1),
        st.none(),
        st.booleans(),
        st.text(max_size=3),
        st.binary(max_size=3),
    )

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(sorted(good)), values, max_size=3))
    def fuzz(change: dict[str, Any]) -> None:
        try:
            _, frames = fetcher.request({**good, **change})
        except ServiceError:
            return
        Batch.from_frames(frames)

    fuzz()
    _, frames = fetcher.request(good)
    assert len(Batch.from_frames(frames)) == 2


def test_cli_serve(corpus: str) -> None:
    import subprocess
    import sys

    command = [sys.executable, "-m", "zerobatch.cli", "serve", corpus, "--seq-len", str(SEQ_LEN)]
    process = subprocess.Popen(
        [*command, "--bind", "tcp://127.0.0.1:*"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        address = line.split(" on ")[-1].strip()
        assert address.startswith("tcp://127.0.0.1:"), line
        with BatchClient(address, 4, seed=3, output="batch", timeout=20) as client:
            got = _received(client, 1)
        _same(got, _expected(corpus, 4, 1, 0)[:1])
    finally:
        process.kill()
        process.wait()


def _columns_equal(got: Any, want: Any) -> None:
    from zerobatch.columnar import Jagged

    if isinstance(want, Jagged):
        assert isinstance(got, Jagged)
        np.testing.assert_array_equal(got.offsets - got.offsets[0], want.offsets - want.offsets[0])
        np.testing.assert_array_equal(got.compact().values, want.compact().values)
    elif isinstance(want, list):
        assert [list(x) if isinstance(x, tuple) else x for x in got] == [
            list(x) if isinstance(x, tuple) else x for x in want
        ]
    else:
        np.testing.assert_array_equal(got, want)


def test_same_as_loader_and_its_state(corpus: str, shared: str) -> None:
    from zerobatch import Loader

    windows = open_dataset(corpus).windows(SEQ_LEN)
    options: dict[str, Any] = {"seed": 3, "world_size": 4, "output": "batch", "drop_last": False}
    for rank in range(4):
        with Loader(windows, 4, rank=rank, **options) as loader:
            local = list(loader)
            state = loader.state_dict()
        with BatchClient(shared, 4, rank=rank, **options) as client:
            remote = list(client)
            assert client.state_dict() == state
        assert [b.fields for b in remote] == [b.fields for b in local]
        for got, want in zip(remote, local, strict=True):
            for name in want.fields:
                _columns_equal(got[name], want[name])
    with Loader(windows, 4, seed=3, output="batch") as loader:
        next(iter(loader))
        state = loader.state_dict()
        rest = [np.asarray(b.meta.global_indexes) for b in loader]
    with BatchClient(shared, 4, seed=3, output="batch") as client:
        client.load_state_dict(state)
        got = [np.asarray(b.meta.global_indexes) for b in client]
    assert len(got) == len(rest) > 0
    for a, b in zip(got, rest, strict=True):
        np.testing.assert_array_equal(a, b)
