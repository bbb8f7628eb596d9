"""The ``zerobatch`` command: inspect, verify and benchmark datasets and files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from zerobatch.errors import FormatError

__all__ = ["main"]


def _inspect(path: Path) -> str:
    """A table describing ``path``: a ``.batch`` file, a batch shard folder,
    a token-stream dataset or a tensor file (detected from its bytes)."""
    from zerobatch import batch_loader, stream

    if stream.is_dataset(path):
        return stream.describe(path)
    if path.is_dir() or batch_loader.is_batch_file(path):
        return batch_loader.describe(path)
    from zerobatch import tensors

    if tensors.is_tensor_file(path):
        return tensors.describe(path)
    raise FormatError(
        "not a file zerobatch knows (LLMBATCH, dataset folder, tensor file)", path=path
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerobatch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="print a file's header and derived sizes")
    inspect.add_argument("path", type=Path)
    verify = commands.add_parser("verify", help="check a dataset's checksums and structure")
    verify.add_argument("path", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "inspect":
            print(_inspect(args.path))
        elif args.command == "verify":
            from zerobatch import stream

            problems = stream.verify(args.path)
            print(stream.format_problems(args.path, problems))
            return 1 if problems else 0
    except (FormatError, OSError) as error:
        print(f"zerobatch {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
