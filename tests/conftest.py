"""Test-session setup shared by every test file."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator

import pytest
from support.s3_server import FaultProxy, S3Server

from zerobatch.storage import local as local_storage

# JAX reads these once, when it first starts: 8 CPU devices for the mesh tests.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
# No token-count cache (zerobatch.peers._counts) unless a test names one.
os.environ["ZEROBATCH_CACHE_DIR"] = ""



@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 with one bucket. ``s3.url("name")`` is a fresh
    ``s3://`` prefix; ``s3.storage_options()`` (or ``s3.env()``) reach it."""
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_proxy(s3: S3Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of ``s3``: ``s3.storage_options(s3_proxy.endpoint)``
    goes through it; ``with s3_proxy.faults(rate=0.2): ...`` injects faults."""
    proxy = FaultProxy(s3.endpoint)
    yield proxy
    proxy.stop()


# Fix the platform's default start method now, as a full run's imports do: the
# first test that asked for it would otherwise "change" it from None.
multiprocessing.get_start_method()


@pytest.fixture(autouse=True)
def _small_files_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Map every file ``method="mmap"`` opens in this process, however small
    (``MAP_FROM`` 0): the tests' files are all small, and the mapped read path
    would otherwise go untested. ``tests/test_storage.py`` tests the threshold
    itself; processes the tests start keep the default."""
    monkeypatch.setattr(local_storage, "MAP_FROM", 0)


@pytest.fixture(autouse=True)
def _start_method_kept() -> Iterator[None]:
    """A test that changes multiprocessing's global start method (litdata's
    optimize sets spawn) fails: every later DataLoader of the session would start
    its workers another way than the tests mean (spawned workers cost seconds)."""
    method = multiprocessing.get_start_method(allow_none=True)
    yield
    after = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(method, force=True)
    assert after == method, f"the start method changed from {method} to {after}: restore it"

