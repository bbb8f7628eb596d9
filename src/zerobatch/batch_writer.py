"""Seed 000's name for :mod:`zerobatch.llmbatch.writer`."""

from zerobatch.llmbatch.writer import write_batch_dataset, write_batch_file

__all__ = ["write_batch_dataset", "write_batch_file"]
