"""A tiny model trained by Lightning on two zerobatch routes at once, for
tests/test_lightning.py (run as a script, alone or under torchrun).

``train_dataloader()`` returns ``{"loader": Loader, "workers":
zerobatch.torch.DataLoader(Loader, num_workers=W)}``: the Loader itself (the
documented way) and the worker DataLoader (the stateful-DataLoader route),
each checkpointed by Lightning through its ``state_dict``. The Loaders are
built in the module's ``__init__``, before the process group exists. Each
training step appends ``{"loader": ids, "workers": ids}`` to ``--log`` +
``.RANK`` (a window's id is its first token // seq_len: the corpus is
``arange``). ``--kill-at N`` SIGKILLs every rank after step N; ``--resume
PATH`` is ``trainer.fit(ckpt_path=PATH)``. Several ``--train`` runs fork from
one process, so Lightning is imported once.
"""

from __future__ import annotations

import json
import os
import signal

import lightning as L
import torch
from training_runs import run_each  # this folder: the scripts run as files

from zerobatch import Loader, open_dataset
from zerobatch.torch import DataLoader

SEQ_LEN, BATCH = 8, 4


class Module(L.LightningModule):
    def __init__(self, data: str, workers: int, log: str) -> None:
        super().__init__()
        windows = open_dataset(data).windows(SEQ_LEN)
        # reader threads beside the other route's DataLoader workers, forked from here
        self.loader = Loader(windows, BATCH, seed=1)
        self.data = DataLoader(Loader(windows, BATCH, seed=2), num_workers=workers)
        self.layer = torch.nn.Linear(SEQ_LEN, 1)
        self.log_path = log

    def train_dataloader(self):
        return {"loader": self.loader, "workers": self.data}

    def training_step(self, batch, index):
        ids = {name: (b["input_ids"][:, 0] // SEQ_LEN).tolist() for name, b in batch.items()}
        with open(f"{self.log_path}.{self.global_rank}", "a") as log:
            log.write(json.dumps(ids) + "\n")
        x = batch["loader"]["input_ids"].float() + batch["workers"]["input_ids"].float()
        return self.layer(x / 1000).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Killer(L.Callback):
    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def train(data: str, *, out: str, log: str, steps: int, save_every: int, workers: int,
          kill_at: int | None = None, resume: str | None = None) -> None:
    module = Module(data, workers, log)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=out, every_n_train_steps=save_every, save_top_k=-1, filename="{step}")
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's, when it started us
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=processes,
                        strategy="ddp" if processes > 1 else "auto",
                        callbacks=[checkpoints, Killer(kill_at)], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, use_distributed_sampler=False)
    trainer.fit(module, ckpt_path=resume)


def main() -> None:
    run_each(train)


if __name__ == "__main__":
    main()
