"""The exceptions the safetensors-compatible API raises, all :class:`FormatError`.

safetensors raises one class, ``SafetensorError``, for malformed files, closed
handles, unknown tensor names and refused slices. zerobatch raises
:class:`zerobatch.FormatError` (exported as ``SafetensorError`` too), or a
subclass that is also the matching built-in lookup error, so code written for
either library catches it.
"""

from __future__ import annotations

from zerobatch.errors import FormatError

__all__ = ["SafetensorError", "SliceError", "TensorNotFound"]

SafetensorError = FormatError
"""Alias: ``except SafetensorError`` catches every error a safetensors call would raise."""


class TensorNotFound(FormatError, KeyError):
    """The file has no tensor of that name (also a ``KeyError``)."""

    __str__ = FormatError.__str__


class SliceError(FormatError, IndexError):
    """``get_slice(name)[index]`` with an index safetensors refuses (also an ``IndexError``)."""
