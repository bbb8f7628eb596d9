"""One rank of a torchrun job checkpointing zerobatch through
torch.distributed.checkpoint (DCP), for tests/test_dcp.py (run under torchrun).

Three data paths side by side, each an epoch of windows from ``--data``:
``loader`` (the Loader itself, iterated), ``workers`` (a
``zerobatch.torch.DataLoader`` over another Loader, with worker processes) and
``torchdata`` (torchdata's ``StatefulDataLoader`` over a ``LoaderDataset``, one
worker). The torchdata state is loaded back by torchdata itself when the step
(``batch_size * world_size``) is the one it was saved with, and by
``zerobatch.torch.DataLoader.load_state_dict`` otherwise (torchdata refuses it).
Each rank appends ``{"path", "ids", "saved"}`` lines to ``--record`` + ``.RANK``:
the windows of each step (a window's id is its first token // seq_len: the
corpus is ``arange``). ``--save-at K`` saves both after step K with DCP, runs
two more steps (not saved: the resume must read them again) and SIGKILLs
itself; ``--resume`` loads the checkpoint and runs to the end of the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchdata.stateful_dataloader import StatefulDataLoader

from zerobatch import Loader, open_dataset
from zerobatch.torch import DataLoader, LoaderDataset

SEQ_LEN = 8
SAVED_STEP = 4 * 6  # the killed job's ranks x batch_size (tests/test_dcp.py)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--save-at", type=int)
    parser.add_argument("--resume", action="store_true")
    options = parser.parse_args()
    dist.init_process_group("gloo")
    windows = open_dataset(options.data).windows(SEQ_LEN)
    # rank: torch.distributed. Its reader threads read the source the DataLoader
    # workers forked from this process read too (tests/test_fork.py's case).
    loader = Loader(windows, options.batch_size, seed=3, output="numpy")
    data = DataLoader(Loader(windows, options.batch_size, seed=4), num_workers=options.workers)
    stateful = StatefulDataLoader(LoaderDataset(Loader(windows, options.batch_size, seed=5)),
                                  batch_size=None, num_workers=1)
    torchdata: Any = stateful
    if options.resume:
        state = {"loader": loader, "workers": data, "torchdata": stateful.state_dict()}
        dcp.load(state, checkpoint_id=options.checkpoint)
        if options.batch_size * dist.get_world_size() == SAVED_STEP:
            stateful.load_state_dict(state["torchdata"])
        else:  # another step: torchdata refuses it, zerobatch's DataLoader converts it
            torchdata = DataLoader(Loader(windows, options.batch_size, seed=5), num_workers=1)
            torchdata.load_state_dict(state["torchdata"])
    log = open(f"{options.record}.{dist.get_rank()}", "a")  # noqa: SIM115 (flushed each step)
    paths = {"loader": iter(loader), "workers": iter(data), "torchdata": iter(torchdata)}
    state = {"loader": loader, "workers": data, "torchdata": stateful}
    step = 0
    while paths:
        for name in list(paths):
            batch = next(paths[name], None)
            if batch is None:
                del paths[name]
                continue
            ids = (batch["input_ids"][:, 0] // SEQ_LEN).tolist()
            saved = options.save_at is None or step < options.save_at
            log.write(json.dumps({"path": name, "ids": [int(i) for i in ids],
                                  "saved": saved}) + "\n")
            log.flush()
        step += 1
        if step == options.save_at:
            dcp.save(state, checkpoint_id=options.checkpoint)
        if options.save_at is not None and step == options.save_at + 2:
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)
    log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
