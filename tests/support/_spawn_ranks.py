"""A child of torch.multiprocessing.spawn for tests/test_torch_adapter.py: it
gets a Loader built in the parent before any process group existed, joins a
gloo group of ``world_size`` on 127.0.0.1, and writes the observations it reads."""

from __future__ import annotations

import json

import torch.distributed as dist

from zerobatch import Loader


def read_share(rank: int, loader: Loader, world_size: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    ids = [int(i) for batch in loader for i in batch["index"]]
    with open(f"{out}.{rank}", "w") as file:
        json.dump({"rank": loader.rank, "world_size": loader.world_size, "ids": ids}, file)
    dist.destroy_process_group()
