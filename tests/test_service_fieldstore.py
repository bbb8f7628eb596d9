"""FieldStore: the table's semantics, and producers and consumers in real processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import numpy as np
import pytest
from support._service_procs import GROUPS, produce, sample_columns, serve_fieldstore

from zerobatch.columnar import Batch, BatchMeta, Jagged
from zerobatch.service import FieldStore, FieldTable, ServiceError

SPAWN = multiprocessing.get_context("spawn")


def _batch(indexes: list[int], group: str, partition: str = "p") -> Batch:
    meta = BatchMeta(indexes, partition_ids=partition, production_status=np.ones(len(indexes)))
    return Batch.from_columns(sample_columns(np.array(indexes), group), meta)


def _check(batch: Batch) -> None:
    """Every field of ``batch`` equals what the producers wrote for its indexes."""
    indexes = np.asarray(batch.meta.global_indexes)
    for group, names in GROUPS.items():
        expected = sample_columns(indexes, group)
        for name in names:
            if name not in batch:
                continue
            got, want = batch[name], expected[name]
            if isinstance(want, Jagged):
                assert isinstance(got, Jagged)
                np.testing.assert_array_equal(got.offsets - got.offsets[0], want.offsets)
                np.testing.assert_array_equal(got.compact().values, want.values)
            elif isinstance(want, list):
                assert got == want
            else:
                np.testing.assert_array_equal(got, want)
                assert got.dtype == want.dtype


def test_table_only_complete_samples_once_per_task() -> None:
    table = FieldTable()
    table.put(_batch([3, 1, 7], "dense"), "p")
    table.put(_batch([7, 3], "objects"), "p")
    fields = ["logprobs", "prompt"]
    meta = table.get_meta(fields, 10, "p", "a")
    assert list(meta.global_indexes) == [3, 7]
    assert meta.is_ready and list(meta.partition_ids) == ["p", "p"]
    assert len(table.get_meta(fields, 10, "p", "a")) == 0
    assert list(table.get_meta(fields, 1, "p", "b").global_indexes) == [3]
    table.put(_batch([1], "objects"), "p")
    assert list(table.get_meta(fields, 10, "p", "a").global_indexes) == [1]
    _check(table.get(meta))
    assert len(table.get_meta(["response"], 4, "p", "a")) == 0
    assert len(table.get_meta(fields, 4, "other", "a")) == 0


def test_table_jagged_and_rejections() -> None:
    table = FieldTable(max_samples=100)
    table.put(_batch([9, 4, 5, 0], "jagged"), "p")
    table.put(_batch([4], "jagged"), "p")  # replaced: the arena grows, values stay right
    meta = table.get_meta(["response"], 8, "p", "t")
    assert list(meta.global_indexes) == [0, 4, 5, 9]
    assert list(meta.field_schema["response"].lengths) == [0, 4, 0, 4]
    _check(table.get(meta))
    with pytest.raises(ValueError, match="global index 100 outside"):
        table.put(_batch([100], "dense"), "p")
    with pytest.raises(ValueError, match="appears twice"):
        table.put(_batch([1, 1], "dense"), "p")
    wrong = Batch.from_columns({"response": np.zeros((1, 2), np.int32)}, BatchMeta([1]))
    with pytest.raises(ValueError, match=r"'response' is .* but"):
        table.put(wrong, "p")
    with pytest.raises(ValueError, match="not produced for global index 2"):
        table.take("p", [0, 2], ["response"])
    with pytest.raises(ValueError, match="unknown partition 'q'"):
        table.take("q", [0], ["response"])
    table.clear("p")
    assert table.partitions == []
    with pytest.raises(ValueError, match="unknown partition 'p'"):
        table.clear("p")


@pytest.fixture(scope="module")
def store_address() -> Iterator[str]:
    queue = SPAWN.Queue()
    process = SPAWN.Process(target=serve_fieldstore, args=("tcp://127.0.0.1:*", queue), daemon=True)
    process.start()
    try:
        yield queue.get(timeout=60)
    finally:
        process.kill()
        process.join()


def test_three_producers_two_tasks_exactly_once(store_address: str) -> None:
    count, partition = 300, "train@step_1"
    producers = [
        SPAWN.Process(target=produce, args=(store_address, partition, group, count, seed))
        for seed, group in enumerate(GROUPS)
    ]
    for p in producers:
        p.start()
    fields = [name for names in GROUPS.values() for name in names]
    seen: dict[str, list[np.ndarray]] = {"actor": [], "critic": []}
    with FieldStore(store_address, timeout=20) as store:
        while any(sum(map(len, parts)) < count for parts in seen.values()):
            if not any(p.is_alive() for p in producers) and all(p.exitcode for p in producers):
                pytest.fail("every producer failed")
            for task, parts in seen.items():
                meta = store.get_meta(fields, 64, partition, task)
                if len(meta):
                    batch = store.get(meta)
                    assert batch.fields == fields
                    _check(batch)
                    parts.append(np.asarray(batch.meta.global_indexes))
        for p in producers:
            p.join()
            assert p.exitcode == 0
        for parts in seen.values():
            indexes = np.concatenate(parts)
            assert len(indexes) == count
            assert sorted(indexes.tolist()) == list(range(count))
        store.clear(partition)
        with pytest.raises(ServiceError, match="unknown partition"):
            store.get(BatchMeta([0], partition_ids=partition))


def _raw(address: str, frames: list[bytes]) -> dict:
    """Send raw frames, return the decoded reply header."""
    import zmq

    from zerobatch.service._transport import parse_header

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(frames)
        assert sock.poll(20_000), "no reply to a hostile request"
        return parse_header(sock.recv_multipart()[0])
    finally:
        sock.close()
        context.term()


def _put_frames(partition: str) -> list[bytes]:
    from zerobatch.service._transport import encode_header

    frames = [bytes(f) for f in _batch([0, 1], "jagged", partition).to_frames()]
    return [encode_header({"op": "put", "id": 5, "partition": partition}), *frames]


def test_hostile_requests_get_errors(store_address: str) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from zerobatch.columnar.wire import pack
    from zerobatch.service._transport import encode_header

    good = _put_frames("hostile")
    cases = {
        "empty header": ([b""], "not a valid msgpack"),
        "bad msgpack": ([b"\xc1"], "not a valid msgpack"),
        "wrong version": ([pack({"v": 2, "id": 1})], "protocol version"),
        "no op": ([encode_header({"id": 1})], "missing key 'op'"),
        "unknown op": ([encode_header({"id": 1, "op": "boom"})], "unknown op 'boom'"),
        "missing frame": (good[:-1], "frames"),
        "extra frame": ([*good, b"x"], "frames"),
        "truncated column": ([*good[:-1], good[-1][:-3]], "truncated"),
        "get bad indexes": (
            [
                encode_header(
                    {"id": 1, "op": "get", "fields": [], "partition": "x", "indexes": b"12"}
                )
            ],
            "whole number",
        ),
        "unknown partition": (
            [encode_header({"id": 1, "op": "clear", "partition": "nope"})],
            "unknown partition 'nope'",
        ),
    }
    for name, (frames, message) in cases.items():
        reply = _raw(store_address, frames)
        assert reply["ok"] is False and message in reply["error"], (name, reply)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        frames = list(good)
        i = data.draw(st.integers(0, len(frames) - 1))
        cut = data.draw(st.integers(0, max(len(frames[i]) - 1, 0)))
        mode = data.draw(st.sampled_from(["truncate", "flip", "drop"]))
        if mode == "truncate":
            frames[i] = frames[i][:cut]
        elif mode == "flip":
            frames[i] = frames[i][:cut] + bytes([frames[i][cut] ^ 0xFF]) + frames[i][cut + 1 :]
        else:
            del frames[i]
        reply = _raw(store_address, frames)
        assert isinstance(reply.get("ok"), bool)

    fuzz()
    huge = [encode_header({"op": "put", "id": 7, "partition": "h"}), *good[1:]]
    header = bytearray(huge[1])
    at = header.find(b"\x92")  # the [nbytes, items] pair of the only column
    assert at > 0
    huge[1] = (
        bytes(header[:at]) + b"\x92\xcf" + (1 << 62).to_bytes(8, "big") + bytes(header[at + 3 :])
    )
    assert _raw(store_address, huge)["ok"] is False
    assert _raw(store_address, good) == {"v": 1, "id": 5, "ok": True}


def test_curve_wrong_key_refused() -> None:
    from zerobatch.service import CurveKeys

    server_keys, client_keys = CurveKeys.generate(), CurveKeys.generate()
    queue = SPAWN.Queue()
    options = {"curve": server_keys, "allowed_clients": [client_keys.public]}
    process = SPAWN.Process(
        target=serve_fieldstore, args=("tcp://127.0.0.1:*", queue), kwargs=options, daemon=True
    )
    process.start()
    try:
        address = queue.get(timeout=60)
        with FieldStore(
            address, timeout=20, curve=client_keys, server_key=server_keys.public
        ) as ok:
            ok.put(_batch([0], "dense"), "c")
            assert len(ok.get_meta(["reward"], 1, "c", "t")) == 1
        stranger = FieldStore(address, timeout=0.5, server_key=server_keys.public)
        with stranger, pytest.raises(TimeoutError, match=address):
            stranger.get_meta(["reward"], 1, "c", "t")
        plain = FieldStore(address, timeout=0.5)
        with plain, pytest.raises(TimeoutError, match="no reply"):
            plain.get_meta(["reward"], 1, "c", "t")
    finally:
        process.kill()
        process.join()


def test_non_loopback_bind_needs_keys() -> None:
    from zerobatch.service import FieldStoreServer

    with pytest.raises(ValueError, match="not loopback: pass curve"):
        FieldStoreServer("tcp://0.0.0.0:5556")
    with pytest.raises(ValueError, match="allowed_clients needs curve"):
        FieldStoreServer("tcp://127.0.0.1:*", allowed_clients=[b"x" * 40])
