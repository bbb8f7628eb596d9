"""A tiny GPT-2 (built from a config) trained by zerobatch.hf.Trainer: run by
tests/test_hf.py as a script, alone or under torchrun.

Each ``--train`` (a JSON object of the options below) is one training process.
With several, each runs in a child forked from this one, so torch and
transformers are imported once (the parent runs no torch op before forking).
A run's training steps each append one JSON line to its ``log`` (``.RANK``
added under torchrun): the step's input rows and its loss. ``kill_at: N``
SIGKILLs the process after step N; ``resume: true`` resumes from the last
checkpoint; ``plain: true`` also trains a copy of the model in a plain loop
over the same Loader's batches and writes its losses to ``log + ".plain"``.
"""

from __future__ import annotations

import json
import os
import signal

import torch
import transformers
from training_runs import run_each  # this folder: the scripts run as files
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

from zerobatch import Loader, open_dataset
from zerobatch.hf import Trainer

BATCH, SEQ_LEN = 4, 16


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=SEQ_LEN, n_embd=32, n_layer=1, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


class Killer(TrainerCallback):
    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    run_each(train)


def train(data: str, *, out: str, log: str, steps: int = 30, save_steps: int = 10,
          workers: int = 0, kill_at: int | None = None, resume: bool = False,
          plain: bool = False) -> None:
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    rank = int(os.environ.get("RANK", "-1"))
    log_path = log + (f".{rank}" if rank >= 0 else "")
    log_file = open(log_path, "a")  # noqa: SIM115 (open for the whole run, flushed each step)
    produced = []
    if resume and workers == 0:  # count the steps read: none may be replayed
        original = Loader.produce

        def counted(self, epoch, consumed):
            produced.append((epoch, consumed))
            return original(self, epoch, consumed)

        Loader.produce = counted  # type: ignore[method-assign]

    class Logged(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            log_file.write(json.dumps({"rows": inputs["input_ids"].tolist(),
                                       "loss": float(loss)}) + "\n")
            log_file.flush()
            return loss

    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH,
        learning_rate=1e-3, lr_scheduler_type="constant", weight_decay=0.0,
        save_strategy="steps", save_steps=save_steps, logging_strategy="no",
        report_to=[], dataloader_num_workers=workers, seed=0, use_cpu=True,
        disable_tqdm=True, optim="adamw_torch",
    )
    windows = open_dataset(data).windows(SEQ_LEN, labels="aligned")  # Hugging Face's
    trainer = Logged(model=model(), args=args, train_dataset=windows,
                     callbacks=[Killer(kill_at)])
    trainer.train(resume_from_checkpoint=True if resume else None)
    log_file.close()
    if resume and workers == 0:
        with open(log_path + ".produced", "w") as file:
            json.dump(produced, file)
    if plain:
        plain_loop(windows, steps, log + ".plain")


def plain_loop(windows, steps: int, path: str) -> None:
    """The same model trained in a plain loop over the same Loader's batches."""
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    losses = []
    loader = Loader(windows, BATCH, seed=0, epochs=None, rank=0, world_size=1)
    for _, batch in zip(range(steps), loader, strict=False):
        loss = net(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    with open(path, "w") as file:
        json.dump(losses, file)


if __name__ == "__main__":
    main()
