"""Seed 000's name for :mod:`zerobatch.llmbatch.reader` and
:mod:`zerobatch.llmbatch.loader`."""

from zerobatch.llmbatch.loader import BatchNativeLoader
from zerobatch.llmbatch.reader import BatchFileReader, describe, is_batch_file

__all__ = ["BatchFileReader", "BatchNativeLoader", "describe", "is_batch_file"]
