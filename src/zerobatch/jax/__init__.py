"""JAX outputs: global arrays in seed 003's microbatch layout, and ``ShardDataset``.

Imported on demand (``import zerobatch.jax``); the rest of zerobatch never
imports JAX.
"""

from __future__ import annotations

from zerobatch.jax._global import (
    GlobalSteps,
    JaxOutput,
    check_layout,
    check_sharding,
    local_box,
    local_rows,
    row_sharding,
    to_global,
)
from zerobatch.jax.shards import DataConfig, ShardDataset, get_datasets

__all__ = [
    "DataConfig",
    "GlobalSteps",
    "JaxOutput",
    "ShardDataset",
    "check_layout",
    "check_sharding",
    "get_datasets",
    "local_box",
    "local_rows",
    "row_sharding",
    "to_global",
]
