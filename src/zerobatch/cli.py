"""The ``zerobatch`` command: convert texts into datasets; inspect, verify and
benchmark datasets and files.

examples:
  zerobatch convert corpus/*.jsonl.zst -o data --tokenizer tokenizer.json
  zerobatch convert megatron/corpus_text_document -o data   # peer tokens, copied
  zerobatch inspect data --plot data.png
  zerobatch verify data
  zerobatch bench data --seq-len 2048
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from zerobatch.errors import FormatError

__all__ = ["main"]


def _inspect(location: str) -> str:
    """A table describing ``location``: a ``.batch`` file, a batch shard folder,
    a token-stream dataset or a tensor file (detected from its bytes). Object
    store URLs are read with the cloud's environment variables."""
    from zerobatch import llmbatch, peers, stream
    from zerobatch.storage import is_url

    if (is_url(location) or not stream.is_dataset(location)) and peers.detect_path(location):
        with peers.open_peer(location) as dataset:  # Megatron, datatrove, LitData, HF files
            return dataset.describe()
    if is_url(location):
        return _inspect_url(location)
    path = Path(location)
    if stream.is_dataset(path):
        return stream.describe(path)
    if path.is_dir() or llmbatch.is_batch_file(path):
        return llmbatch.describe(path)
    from zerobatch import tensors

    if tensors.is_tensor_file(path):
        return tensors.describe(path)
    raise FormatError(
        "not a file zerobatch knows (LLMBATCH, dataset folder, tensor file)", path=path
    )


def _mixture_file(location: str) -> bool:
    from zerobatch.mixture.spec import is_mixture_file

    return is_mixture_file(location)


@contextmanager
def _executor(spec: str | None) -> Iterator[cf.Executor | None]:
    """None (the default process pool), or a Dask cluster's executor for
    ``dask://HOST:PORT``."""
    if spec is None:
        yield None
        return
    if not spec.startswith("dask://"):
        raise ValueError(f"--executor must be dask://HOST:PORT, got {spec!r}")
    try:
        from distributed import Client
    except ImportError:
        raise ValueError("--executor dask://... needs the dask extra: "
                         "pip install 'zerobatch[dask]'") from None
    address = "tcp://" + spec.removeprefix("dask://")
    try:
        client = Client(address, timeout=10)
    except OSError as error:
        raise OSError(f"cannot reach the Dask scheduler at {address} ({error})") from None
    with client:
        yield client.get_executor()


_PEER_INAPPLICABLE: tuple[tuple[str, Any, str], ...] = (
    ("tokenizer", None, "--tokenizer"), ("chat", False, "--chat"),
    ("chat_template", None, "--chat-template"), ("text_field", "text", "--text-field"),
    ("metadata_field", [], "--metadata-field"), ("spans_field", None, "--spans-field"),
    ("no_eos", False, "--no-eos"), ("eos", None, "--eos"), ("format", "stream", "--format"),
    ("seq_len", None, "--seq-len"), ("batch_size", None, "--batch-size"), ("seed", 0, "--seed"),
    ("workers", None, "--workers"), ("executor", None, "--executor"),
    ("skip_bad", False, "--skip-bad"), ("task_mb", 64.0, "--task-mb"))
"""Options of ``convert`` that tokenizing texts uses and copying a peer dataset cannot."""


def _peer_input(args: argparse.Namespace) -> str | None:
    """The peer format of ``convert``'s input (Megatron, datatrove, LitData, MDS,
    HF, or ``--input-format``), or None for texts. Raises ``ValueError`` for
    several inputs with a peer one, or an option that cannot apply."""
    from zerobatch import peers

    found = args.input_format
    if found is None and len(args.inputs) == 1:
        try:
            found = peers.detect_path(args.inputs[0])
        except (FormatError, OSError, ValueError):
            found = None  # not a peer dataset: the texts path reports what is wrong
    if found is None:
        if args.input_option:
            raise ValueError("--input-option applies to a peer dataset input (--input-format)")
        return None
    if len(args.inputs) != 1:
        raise ValueError(f"a {found} dataset is converted alone: give one input per convert")
    given = [flag for name, default, flag in _PEER_INAPPLICABLE
             if getattr(args, name) != default]
    if given:
        raise ValueError(f"{args.inputs[0]} is a {found} dataset: its tokens are copied as "
                         f"they are (no tokenizing), so {', '.join(given)} cannot apply; "
                         "drop them")
    return found


def _input_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``--input-option KEY=VALUE`` pairs as format options (integer values as ints)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--input-option takes KEY=VALUE, got {pair!r}")
        options[key] = int(value) if value.lstrip("-").isdecimal() else value
    return options


def _convert_peer(args: argparse.Namespace, format: str) -> None:
    """Copy the peer dataset ``args.inputs[0]`` into a native one (no tokenizing)."""
    from zerobatch import peers

    with peers.open_peer(args.inputs[0], format, **_input_options(args.input_option)) as ds:
        count = peers.copy_to_stream(ds, args.output)
        if not args.quiet:
            print(f"copied {count:,} documents, {ds.num_tokens:,} tokens "
                  f"({ds.format}) into {args.output}")


def _convert(args: argparse.Namespace) -> None:
    from zerobatch.convert import convert

    peer = _peer_input(args)
    if peer is not None:
        _convert_peer(args, peer)
        return
    if args.tokenizer is None:
        raise ValueError("--tokenizer is required to convert texts (a tokenizers JSON file, "
                         "a folder holding tokenizer.json, or 'bytes')")

    if args.chat:  # conversations: rendered with a chat template, assistant turns take the loss
        from zerobatch.convert.chat import convert_chat

        convert_chat(args.inputs, args.output, tokenizer=args.tokenizer,
                     template=args.chat_template, quiet=args.quiet)
        return

    with _executor(args.executor) as executor:
        convert(args.inputs, args.output, tokenizer=args.tokenizer, text_field=args.text_field,
                metadata_fields=args.metadata_field, spans_field=args.spans_field,
                append_eos=not args.no_eos, eos=args.eos, format=args.format,
                seq_len=args.seq_len, batch_size=args.batch_size, seed=args.seed,
                workers=args.workers, executor=executor, skip_bad=args.skip_bad,
                task_bytes=int(args.task_mb * 2**20), quiet=args.quiet)


def _eos(text: str) -> int | str:
    return int(text) if text.isdecimal() else text


def _command(commands: Any, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, help=summary, description=f"{summary}\n\nexample:\n  "
                               f"{example}", formatter_class=argparse.RawDescriptionHelpFormatter)


def _inspect_url(url: str) -> str:
    from zerobatch import stream

    return stream.describe(url)


_LINE_BREAKS = {ord(c): c.encode("unicode_escape").decode()
                for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}  # str.splitlines'


def _one_line(message: str) -> str:
    """``message`` on one line: a line break in it (an argument's) shown escaped."""
    return message.translate(_LINE_BREAKS)


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, like every other error
    of the command (an argument holding a line break is shown escaped)."""

    def error(self, message: str) -> NoReturn:
        super().error(_one_line(message))


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zerobatch", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    convert = _command(
        commands, "convert", "tokenize JSONL, Parquet, Arrow or text files into a dataset, or "
        "copy a Megatron, datatrove, LitData, MDS, OLMo or HF token dataset into one",
        "zerobatch convert 'corpus/*.jsonl.gz' -o data --tokenizer tokenizer.json "
        "--metadata-field url --workers 8")
    convert.add_argument("inputs", nargs="+", help="files, globs or folders; or s3:// gs:// "
                         "az:// objects, prefixes or globs (credentials from the cloud's "
                         "environment variables)")
    convert.add_argument("-o", "--output", required=True,
                         help="the dataset folder or prefix URL (or a local .batch file with "
                         "--format batch)")
    convert.add_argument("--tokenizer",
                         help="a tokenizers JSON file, a folder holding tokenizer.json, "
                              "or 'bytes' (required for texts; a peer dataset's tokens are "
                              "copied as they are)")
    convert.add_argument("--input-format", choices=("megatron", "datatrove", "hf", "litdata",
                                                    "mds", "olmo"),
                         help="read the input as this peer format (detected by default; "
                         "OLMo's raw arrays need it)")
    convert.add_argument("--input-option", action="append", default=[], metavar="KEY=VALUE",
                         help="a peer format option, e.g. dtype=uint32 and eos_id=0 for OLMo, "
                         "column=tokens for MDS")
    convert.add_argument("--chat", action="store_true",
                         help='JSONL of {"messages": [...]}: render with a chat template, '
                         "store a loss_mask field and assistant spans")
    convert.add_argument("--chat-template", help="a .jinja file or a tokenizer_config.json "
                         "(default: ChatML)")
    convert.add_argument("--text-field", default="text")
    convert.add_argument("--metadata-field", action="append", default=[],
                         help="a field stored as document metadata (repeatable)")
    convert.add_argument("--spans-field", help="a field of [{start, end, value}] "
                                               "character annotations")
    convert.add_argument("--no-eos", action="store_true", help="do not append an EOS token")
    convert.add_argument("--eos", type=_eos, help="the EOS id or token (default: found)")
    convert.add_argument("--format", choices=("stream", "batch"), default="stream")
    convert.add_argument("--seq-len", type=int, help="record length for --format batch")
    convert.add_argument("--batch-size", type=int, help="batch size for --format batch")
    convert.add_argument("--seed", type=int, default=0, help="write seed for --format batch")
    convert.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    convert.add_argument("--executor", help="dask://HOST:PORT: run tasks on a Dask cluster")
    convert.add_argument("--skip-bad", action="store_true",
                         help="count and skip bad records instead of stopping")
    convert.add_argument("--task-mb", type=float, default=64.0,
                         help="input megabytes per task (default 64)")
    convert.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    inspect = _command(commands, "inspect", "print a file's header and derived sizes",
                       "zerobatch inspect data --plot data.png")
    inspect.add_argument("path", help="a file, folder, or s3:// gs:// az:// URL")
    inspect.add_argument("--plot", type=Path, metavar="FILE.png",
                         help="also write document-length and token-frequency plots (a "
                              "mixture file: each source's share over the run)")
    inspect.add_argument("--seq-len", type=int,
                         help="a mixture file: read windows of this many tokens (default: "
                              "documents)")
    inspect.add_argument("--length", type=int,
                         help="a mixture file: its length in observations (default: until "
                              "the first source ends its first pass)")
    verify = _command(commands, "verify", "check a dataset's checksums and structure",
                      "zerobatch verify data")
    verify.add_argument("path", help="a dataset folder or s3:// gs:// az:// URL, a .batch "
                        "file or shard folder, or a folder of .npy files")
    verify.add_argument("--dtype", default="int64", choices=("int64", "int32"),
                        help="for .batch files and .npy folders: the output dtype every "
                             "token id must fit (default int64)")
    bench = _command(commands, "bench", "time the README's Loader (defaults, document "
                     "masking, tuned) against np.memmap on this dataset",
                     "zerobatch bench data --seq-len 2048 --batch-size 32")
    bench.add_argument("path", type=Path)
    bench.add_argument("--seq-len", type=int, default=2048)
    bench.add_argument("--batch-size", type=int, default=32)
    bench.add_argument("--seconds", type=float, default=1.0, help="per timed pass")
    serve = _command(commands, "serve", "serve a dataset's batches over ZeroMQ (BatchServer)",
                     "zerobatch serve data --seq-len 2048 --bind tcp://127.0.0.1:5555")
    serve.add_argument("path", help="dataset folder or URL")
    serve.add_argument("--bind", default="tcp://127.0.0.1:5555", help="address to listen on")
    serve.add_argument("--seq-len", type=int,
                       help="windows of this many tokens (default: one per document)")
    serve.add_argument("--curve-keys", type=Path, help="the server's zmq.auth secret key file")
    serve.add_argument("--insecure", action="store_true",
                       help="allow a non-loopback address without CURVE keys")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "convert":
        _convert(args)
    elif args.command == "inspect" and _mixture_file(args.path):
        from zerobatch.mixture import Mixture, spec

        options = {"length": args.length} if args.length else {"max_passes": 1}
        mixture = Mixture.from_file(args.path, seq_len=args.seq_len, **options)
        print(spec.describe_text(mixture))
        if args.plot is not None:
            spec.plot_shares(mixture, args.plot)
            print(f"wrote {args.plot}")
    elif args.command == "inspect":
        print(_inspect(args.path))
        if args.plot is not None:
            from zerobatch.tools import distributions, plot

            plot(distributions(args.path), args.plot, title=str(args.path))
            print(f"wrote {args.plot}")
    elif args.command == "verify":
        from zerobatch import peers, stream
        from zerobatch.llmbatch import is_batch_file
        from zerobatch.llmbatch.verify import verify as verify_batches
        from zerobatch.storage import is_url
        from zerobatch.stream.npy import is_npy_folder, verify_npy

        local = not is_url(args.path)
        if local and (is_batch_file(args.path) or (args.path.endswith(".batch")
                                                   and os.path.isfile(args.path))):
            problems = verify_batches(args.path, dtype=args.dtype)
        elif local and is_npy_folder(args.path):
            problems = verify_npy(args.path, dtype=args.dtype)
        elif (is_url(args.path) or not stream.is_dataset(args.path)) \
                and peers.detect_path(args.path):
            with peers.open_peer(args.path) as dataset:  # peer files: their own checks
                problems = dataset.verify()
        else:
            problems = stream.verify(args.path)
        print(stream.format_problems(args.path, problems))
        return 1 if problems else 0
    elif args.command == "bench":
        from zerobatch.tools import bench

        print(bench(args.path, seq_len=args.seq_len, batch_size=args.batch_size,
                    seconds=args.seconds).table())
    elif args.command == "serve":
        from zerobatch.service.batches import serve_dataset

        serve_dataset(args.path, args.bind, seq_len=args.seq_len, curve_keys=args.curve_keys,
                      insecure=args.insecure)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _build_parser().parse_args(argv)
    try:
        return _run(args)
    except (FormatError, OSError, ValueError, TypeError) as error:
        print(f"zerobatch {args.command}: {_one_line(str(error))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"zerobatch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
