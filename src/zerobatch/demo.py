"""The main job: the whole data path on the Python standard library's sources.

1. Train a byte-level BPE tokenizer (``tokenizers``) on the sources; no download.
2. ``convert`` them: document metadata = the file path; span metadata = each
   function's and class's qualified name over its lines (found with ``ast``).
3. Train a small GPT through ``zerobatch.Loader`` (global shuffle, prefetch
   threads); print the loss and the share of step time spent waiting for data.
4. Checkpoint model + loader state, SIGKILL a training process mid-run, resume
   it, and check it trained on exactly the observations of an uninterrupted run.
5. Print one training window with the code spans it contains, decoded.
6. Write the loss curve to ``demo-output/loss.png``.

Run with ``make demo`` or ``python -m zerobatch.demo``.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import multiprocessing
import os
import signal
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["code_spans", "corpus_files", "main"]

EOS = "<|endoftext|>"
LOG_EVERY = 20


def corpus_files(limit_bytes: int) -> list[Path]:
    """Standard-library ``.py`` files in a fixed order, about ``limit_bytes`` in all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        files.append(path)
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    return files


def code_spans(text: str) -> list[dict[str, Any]]:
    """``{start, end, value}`` in characters: each function's and class's
    qualified name over its whole lines (nested ones overlap their parents)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    line_starts = [0]
    for line in text.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans: list[dict[str, Any]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                end_line = child.end_lineno or child.lineno
                start = line_starts[child.lineno - 1]
                end = line_starts[min(end_line, len(line_starts) - 1)]
                if end > start:
                    spans.append({"start": start, "end": end, "value": name})
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def _write_corpus(files: list[Path], path: Path) -> int:
    root = Path(sysconfig.get_paths()["stdlib"])
    spans = 0
    with open(path, "w", encoding="utf-8") as out:
        for file in files:
            text = file.read_text(encoding="utf-8", errors="replace")
            found = code_spans(text)
            spans += len(found)
            out.write(json.dumps({"text": text, "path": str(file.relative_to(root)),
                                  "spans": found}) + "\n")
    return spans


def _train_tokenizer(files: list[Path], path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train([str(f) for f in files], trainer)
    tokenizer.save(str(path))


def _model(vocab: int, seq_len: int) -> Any:
    import torch
    from torch import nn

    class TinyGPT(nn.Module):
        mask: torch.Tensor  # a registered buffer: the causal attention mask

        def __init__(self, width: int = 96, layers: int = 2, heads: int = 4) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab, width)
            self.positions = nn.Embedding(seq_len, width)
            layer = nn.TransformerEncoderLayer(
                width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
            )
            self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(width, vocab)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            n = ids.shape[1]
            x = self.tokens(ids) + self.positions.weight[:n]
            return self.head(self.body(x, mask=self.mask[:n, :n], is_causal=True))

    return TinyGPT()


def _save(path: Path, state: dict[str, Any]) -> None:
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(
    dataset: Path, *, steps: int, seq_len: int, batch_size: int, log: Path,
    checkpoint: Path | None = None, checkpoint_every: int = 0, resume: bool = False,
    quiet: bool = False,
) -> dict[str, float]:
    """Train for ``steps`` steps in total; append one JSON line per step to
    ``log`` (step, loss, the observation ids). Returns seconds: of the steps
    after the first, of waiting for data in them, and of waiting for the first."""
    import torch
    import torch.nn.functional as F

    from zerobatch import Loader
    from zerobatch.stream import Dataset, open_dataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = open_dataset(dataset)
    assert isinstance(ds, Dataset) and ds.manifest.tokenizer is not None
    vocab = int(ds.manifest.tokenizer.vocab_size or 0)
    windows = ds.windows(seq_len)
    model = _model(vocab, seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loader = Loader(windows, batch_size, seed=1234, shuffle=True, rank=0, world_size=1,
                    prefetch=4, num_threads=2, output="batch", epochs=None)
    step = 0
    if resume and checkpoint is not None:
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
    waited, first_wait, started = 0.0, 0.0, time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        batches: Iterator[Any] = iter(loader)
        while step < steps:
            fetch = time.perf_counter()
            batch = next(batches)
            if first_wait == 0.0:  # thread start, file opening, kernel compilation
                first_wait = time.perf_counter() - fetch
                started = time.perf_counter()
            else:
                waited += time.perf_counter() - fetch
            inputs = torch.from_numpy(batch["input_ids"])
            labels = torch.from_numpy(batch["labels"])
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            ids = [int(i) for i in batch.meta.global_indexes]
            out.write(json.dumps({"step": step, "loss": loss.item(), "ids": ids}) + "\n")
            out.flush()
            if not quiet and (step % LOG_EVERY == 0 or step == 1):
                print(f"  step {step:4d}  loss {loss.item():.3f}", flush=True)
            if checkpoint is not None and checkpoint_every and step % checkpoint_every == 0:
                _save(checkpoint, {"model": model.state_dict(), "optimizer":
                                   optimizer.state_dict(), "loader": loader.state_dict(),
                                   "step": step})
    loader.close()
    ds.close()
    return {"seconds": time.perf_counter() - started, "waited": waited,
            "first_wait": first_wait}


def _read_log(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # the line a SIGKILL cut short
            break
    return out


def _train_process(args: argparse.Namespace, log: Path, checkpoint: Path,
                   resume: bool) -> multiprocessing.process.BaseProcess:
    """A training process, forked from this one (no second start-up of torch)."""
    kwargs = dict(steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size, log=log,
                  checkpoint=checkpoint, checkpoint_every=args.checkpoint_every, resume=resume,
                  quiet=True)
    child = multiprocessing.get_context("fork").Process(
        target=train, args=(args.out / "stdlib",), kwargs=kwargs)
    child.start()
    return child


def _kill_and_resume(args: argparse.Namespace, reference: list[list[int]]) -> bool:
    """Train in a child, SIGKILL it after its second checkpoint, resume from the
    checkpoint in a new child; compare the observations with ``reference``."""
    import torch

    log, checkpoint = args.out / "killed.jsonl", args.out / "checkpoint.pt"
    resumed_log = args.out / "resumed.jsonl"
    for path in (log, checkpoint, resumed_log):
        path.unlink(missing_ok=True)
    child = _train_process(args, log, checkpoint, resume=False)
    kill_at = 2 * args.checkpoint_every + args.checkpoint_every // 2
    while len(_read_log(log)) < kill_at and child.is_alive():
        time.sleep(0.02)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    saved = int(torch.load(checkpoint, weights_only=False)["step"])
    done = len(_read_log(log))
    print(f"SIGKILLed the training process at step {done}; last checkpoint: step {saved}")
    child = _train_process(args, resumed_log, checkpoint, resume=True)
    child.join()
    if child.exitcode != 0:
        raise RuntimeError("the resumed training process failed")
    seen = [r["ids"] for r in _read_log(log)[:saved]] + [r["ids"] for r in
                                                        _read_log(resumed_log)]
    same = seen == reference
    print(f"resumed from step {saved} to step {args.steps}: the {len(seen)} batches trained on "
          f"{'EQUAL' if same else 'DIFFER FROM'} the uninterrupted run's "
          f"({sum(map(len, seen)):,} observations compared)")
    return same


def _show_window(dataset: Path, tokenizer: Path, seq_len: int) -> None:
    from tokenizers import Tokenizer

    from zerobatch.stream import Dataset, open_dataset

    tok = Tokenizer.from_file(str(tokenizer))
    with open_dataset(dataset) as ds:
        assert isinstance(ds, Dataset)  # written by convert: a manifest, not .npy files
        windows = ds.windows(seq_len, columns=("input_ids", "metadata", "document_metadata"))
        for index in range(len(windows) // 3, len(windows)):
            batch = windows.read([index])
            documents = batch["document_metadata"][0]
            spans = [span for span in batch["metadata"][0] if span not in documents]
            if len(spans) >= 2:
                break
        ids = batch["input_ids"][0]
        print(f"window {index} ({seq_len} tokens) and the code spans it contains:")
        for start, end, value in documents:
            print(f"  tokens [{start:3d}, {end:3d})  file {value['path']}")
        for start, end, name in spans:
            text = tok.decode([int(i) for i in ids[start:end]])
            print(f"  tokens [{start:3d}, {end:3d})  {name}")
            for line in text.splitlines()[:3]:
                print(f"      | {line}")


def _plot(losses: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(range(1, len(losses) + 1), losses)
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss")
    axes.set_title("TinyGPT on the Python standard library, through zerobatch.Loader")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m zerobatch.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--corpus-bytes", type=int, default=3_000_000)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--checkpoint-every", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    return parser


def main(argv: list[str] | None = None) -> bool:
    """Run the demo; returns whether the resume check passed."""
    args = _parser().parse_args(argv)
    dataset = args.out / "stdlib"
    import shutil

    from zerobatch.convert import convert

    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dataset, ignore_errors=True)
    started = time.perf_counter()
    files = corpus_files(args.corpus_bytes)
    tokenizer = args.out / "tokenizer.json"
    _train_tokenizer(files, tokenizer, args.vocab_size)
    print(f"1. trained a byte-level BPE tokenizer ({args.vocab_size} ids) on {len(files)} "
          f"standard-library files in {time.perf_counter() - started:.1f} s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # convert forks its workers
    started = time.perf_counter()
    corpus = args.out / "stdlib.jsonl"
    spans = _write_corpus(files, corpus)
    result = convert(corpus, dataset, tokenizer=tokenizer, metadata_fields=["path"],
                     spans_field="spans", workers=args.workers, task_bytes=1 << 20, quiet=True)
    print(f"2. converted them with {spans:,} function/class spans (ast): {result.documents:,} "
          f"documents, {result.tokens:,} tokens, {result.tasks} tasks on {args.workers} "
          f"workers, in {time.perf_counter() - started:.1f} s")
    import torch

    print(f"3. training a small GPT for {args.steps} steps through zerobatch.Loader "
          f"(global shuffle, 2 prefetch threads; uniform guess: loss "
          f"{math.log(result.tokens and args.vocab_size):.2f})")
    log = args.out / "uninterrupted.jsonl"
    log.unlink(missing_ok=True)
    facts = train(dataset, steps=args.steps, seq_len=args.seq_len,
                  batch_size=args.batch_size, log=log)
    records = _read_log(log)
    losses = [r["loss"] for r in records]
    share = facts["waited"] / max(facts["seconds"], 1e-9)
    print(f"   loss {losses[0]:.3f} -> {losses[-1]:.3f}; steps 2..{len(losses)} took "
          f"{facts['seconds']:.1f} s, {100 * share:.2f}% of it waiting for data "
          f"({facts['waited'] / max(1, len(losses) - 1) * 1e3:.2f} ms per step; the first "
          f"batch {facts['first_wait']:.2f} s: threads, files, kernels; torch "
          f"{torch.__version__})")
    print("4. kill and resume:")
    same = _kill_and_resume(args, [r["ids"] for r in records])
    print("5.", end=" ")
    _show_window(dataset, tokenizer, args.seq_len)
    _plot(losses, args.out / "loss.png")
    print(f"6. wrote the loss curve to {args.out / 'loss.png'}")
    return same


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
