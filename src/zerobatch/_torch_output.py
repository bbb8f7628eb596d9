"""``TorchOutput``: a Loader's steps as torch tensors, pinned and moved to a
device. Exported as ``zerobatch.torch.TorchOutput``; a module of its own so the
Loader can build it for the deprecated ``pin_memory=``/``device=`` keywords
without importing the ``DataLoader`` adapter (which imports the Loader).

Copies to a CUDA device run on a copy stream of the reader thread's own, not
on the stream the training step runs on: a copy issued there from a reader
thread would queue behind every kernel the step has already launched (and a
pageable copy would block the reader until the GPU drained its queue), so
the read-ahead could not run ahead of the GPU. The reader waits for its own
copy alone (tens of microseconds for a batch of tokens); where the consumer
receives the step, each tensor is marked as used by the consumer's current
stream (``Tensor.record_stream``, the output's ``received`` hook), so the
caching allocator never hands its memory to a later copy while the step
still reads it. Sources that say which arenas their reads write into (``arenas()``) get
pinned ones, so a step is read straight into pinned memory and copied once;
other steps are staged into pinned memory with one ``np.copyto``
(``Tensor.pin_memory()`` copies with torch's thread pool, whose spinning
threads cost ~20x the CPU time). ``benchmarks/device.py`` measures each of
these choices on a GPU."""

from __future__ import annotations

import mmap
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from zerobatch.columnar import Batch

__all__ = ["TorchOutput"]


class TorchOutput:
    """``Loader(source, batch_size, output=TorchOutput(pin_memory=True,
    device="cuda"))``: each step as a dict of tensors sharing the batch's
    memory, pinned in the reader threads (``pin_memory``) and copied to
    ``device``. ``output="torch"`` is ``TorchOutput()``.

    On a CUDA device each reader thread copies on a stream of its own and
    waits for that copy only, so a step arrives on the device complete, never
    queued behind the GPU's work; the copy is staged in pinned memory whether
    or not ``pin_memory`` is set. Each step's tensors are marked as used by
    the stream current where ``next()`` returns it (the default one, or a
    ``torch.cuda.stream(...)`` around the loop). Without CUDA,
    ``pin_memory=True`` warns once and yields unpinned tensors. Immutable."""

    _warned_pin = False

    def __init__(self, *, pin_memory: bool = False, device: Any = None) -> None:
        self.pin_memory = bool(pin_memory)
        self.device = None if device is None else torch.device(device)

    def __repr__(self) -> str:
        return f"TorchOutput(pin_memory={self.pin_memory}, device={self.device})"

    def ranks(self) -> None:
        """No rank of its own: the Loader resolves it (torch.distributed, RANK)."""
        return None

    def bind(self, plan: Any, source: Any) -> Any:
        """The converter of each step's ``Batch``."""
        return self.after(Batch.to_torch, source)

    def after(self, tensors: Callable[..., dict[str, Any]], source: Any = None
              ) -> Callable[..., dict[str, Any]]:
        """``tensors`` (a step's dict of CPU tensors, from any arguments), then
        those tensors pinned and on ``device`` (on CUDA, the Loader passes each
        step to the result's ``received`` in the consumer's thread). The
        arenas ``source`` reads into (``source.arenas()``) become pinned."""
        pin_memory, device = self.pin_memory, self.device
        to_cuda = device is not None and device.type == "cuda"
        if to_cuda and not torch.cuda.is_available():
            raise ValueError(f"{self!r}: this torch ({torch.__version__}) sees no CUDA device; "
                             "drop device= to get CPU tensors, or check CUDA_VISIBLE_DEVICES "
                             "and that torch is a CUDA build")
        if pin_memory and not torch.cuda.is_available():
            if not TorchOutput._warned_pin:
                warnings.warn("pin_memory=True but no CUDA device is available: batches are "
                              "not pinned", stacklevel=5)
                TorchOutput._warned_pin = True
            pin_memory = False
        if pin_memory or to_cuda:
            arenas = getattr(source, "arenas", None)
            for arena in arenas() if callable(arenas) else ():
                arena.allocate_with(_pinned_buffer)
        if to_cuda:
            assert device is not None
            return _CudaCopies(tensors, device)
        if device is None and not pin_memory:
            return tensors

        def move(tensor: torch.Tensor) -> torch.Tensor:
            tensor = _pinned(tensor) if pin_memory else tensor
            return tensor if device is None else tensor.to(device)

        return lambda *args: _each_tensor(tensors(*args), move)


class _CudaCopies:
    """Steps of CPU tensors copied to a CUDA device on each thread's own copy
    stream (see the module docstring); :meth:`received` marks a step's tensors
    as used by the stream current where the consumer receives it."""

    def __init__(self, tensors: Callable[..., dict[str, Any]], device: torch.device) -> None:
        self._tensors = tensors
        self._device = device
        self._local = threading.local()

    def __call__(self, *args: Any) -> dict[str, Any]:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self._device)
        host = self._tensors(*args)
        device = self._device
        with torch.cuda.stream(stream):
            out = _each_tensor(host, lambda tensor: _pinned(tensor).to(device, non_blocking=True))
        # This copy only (the consumer's stream is not waited for), and before
        # the read buffers can be recycled for a later step.
        stream.synchronize()
        return out

    def received(self, step: dict[str, Any]) -> dict[str, Any]:
        """``step``, its tensors marked as used by the consumer's current
        stream: the caching allocator recycles their memory only once that
        stream's work queued before they are freed is done."""
        stream = torch.cuda.current_stream(self._device)
        _each_tensor(step, lambda tensor: _used_on(tensor, stream))
        return step


def _used_on(tensor: torch.Tensor, stream: Any) -> torch.Tensor:
    tensor.record_stream(stream)
    return tensor


def _pinned_buffer(nbytes: int) -> np.ndarray:
    """An arena buffer in page-locked host memory: anonymous pages of its own,
    registered with CUDA (``cudaHostRegister``) and unregistered when the
    buffer dies, by the process that registered them. Not torch's pinned
    allocator: a forked child (a ``DataLoader`` worker) that frees such a
    tensor calls CUDA and is terminated, and a garbage-collected dataset's
    arena can be freed in any child. In a forked child, or where the
    registration fails, a plain buffer."""
    mapping = mmap.mmap(-1, nbytes)
    buffer = np.frombuffer(mapping, np.uint8)  # views of it hold it: the arena sees them
    if torch.cuda._is_in_bad_fork():
        return buffer
    address = buffer.ctypes.data
    if int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)) != 0:
        return buffer
    weakref.finalize(buffer, _unregister, address, os.getpid()).atexit = False
    return buffer


def _unregister(address: int, pid: int) -> None:
    if os.getpid() == pid:  # never in a forked child: it must not call CUDA
        torch.cuda.cudart().cudaHostUnregister(address)


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in pinned host memory: itself when it already is (read into
    a pinned arena), else a copy made by ``np.copyto`` in this thread."""
    if tensor.is_pinned():
        return tensor
    out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    try:
        np.copyto(out.numpy(), tensor.numpy())
    except TypeError:  # a dtype NumPy lacks (bfloat16)
        out.copy_(tensor)
    return out


def _each_tensor(step: dict[str, Any], move: Callable[[torch.Tensor], torch.Tensor]
                 ) -> dict[str, Any]:
    """``step`` with ``move`` applied to each tensor: plain ones, the parts of
    a jagged nested tensor, and ``(values, offsets)`` pairs; other values
    (host ints, lists) as they are."""
    def each(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                return torch.nested.nested_tensor_from_jagged(move(value.values()),
                                                              move(value.offsets()))  # type: ignore[attr-defined]
            return move(value)
        if isinstance(value, tuple):
            return tuple(each(part) for part in value)
        return value

    return {name: each(value) for name, value in step.items()}
