"""The command line the framework training scripts share: ``--data PATH`` and
one ``--train JSON`` per run; several runs fork from this one process, so the
framework is imported once. A run with ``kill_at`` must end by SIGKILL, every
other run must exit 0."""

from __future__ import annotations

import argparse
import json
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any


def run_each(train: Callable[..., Any]) -> None:
    """Parse the command line and call ``train(data, **run)`` for each run."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--train", action="append", type=json.loads, required=True)
    options = parser.parse_args()
    if len(options.train) == 1:
        train(options.data, **options.train[0])
        _leave_process_group()
        return
    for run in options.train:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                train(options.data, **run)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if killed != ("kill_at" in run) or (not killed and os.waitstatus_to_exitcode(status)):
            raise SystemExit(f"run {run} ended with status {status}")


def _leave_process_group() -> None:
    """Destroy the process group a framework made under torchrun. Left to the
    interpreter's exit, gloo's worker threads can still hold tensors while
    it is torn down: a rank then ends in SIGABRT ("terminate called without
    an active exception", pytorch/pytorch#190489), seen once in make test."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
