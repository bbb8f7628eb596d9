"""JAX outputs: global arrays in seed 003's microbatch layout, and ``ShardDataset``.

Imported on demand (``import zerobatch.jax``); the rest of zerobatch never
imports JAX.
"""

from __future__ import annotations

from zerobatch.jax._global import check_layout, local_box, local_rows, to_global

__all__ = ["check_layout", "local_box", "local_rows", "to_global"]
