"""``zerobatch convert``, ``inspect --plot``, ``bench`` and errors from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zerobatch.cli import main
from zerobatch.stream import open_dataset

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    rows = [{"text": f"document {i} " + "word " * (i % 50 + 1), "url": f"u{i}"}
            for i in range(300)]
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["convert", str(folder / "in.jsonl"), "-o", str(folder / "ds"),
                 "--tokenizer", "bytes", "--metadata-field", "url", "--workers", "1",
                 "--quiet"]) == 0
    return folder / "ds"


def test_convert_writes_the_dataset(dataset: Path) -> None:
    with open_dataset(dataset) as ds:
        assert ds.num_documents == 300
        docs = ds.documents().read([7])
        text = "document 7 " + "word " * 8
        assert docs["input_ids"][0].tolist() == [*text.encode(), 256]
        assert docs["metadata"][0].tolist() == [(0, len(text) + 1, {"url": "u7"})]


def test_inspect_plot_writes_a_png(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(dataset), "--plot", str(tmp_path / "d.png")]) == 0
    assert "token-stream dataset" in capsys.readouterr().out
    from PIL import Image

    data = (tmp_path / "d.png").read_bytes()
    assert data.startswith(PNG_MAGIC)
    with Image.open(tmp_path / "d.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size == (1100, 400)


def test_bench_prints_the_ratio(dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(dataset), "--seq-len", "64", "--batch-size", "4",
                 "--seconds", "0.05"]) == 0
    out = capsys.readouterr().out
    ratio = float(out.split("ratio")[1].split()[0])
    assert ratio > 0 and "share of NumPy" in out and "np.memmap gather + int64 cast" in out
    assert "document_masking=True" in out and "tuned settings     Loader(..., num_threads=" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["convert", "missing.jsonl", "-o", "x", "--tokenizer", "bytes"], "does not exist"),
    (["convert", "{src}", "-o", "x", "--tokenizer", "nope.json"], "no tokenizer file"),
    (["convert", "{src}", "-o", "x", "--tokenizer", "bytes", "--executor", "ray://a"],
     "--executor must be dask"),
    (["inspect", "{src}", "--plot", "p.png"], "not a file zerobatch knows"),
    (["bench", "{src}"], "bench needs a token-stream dataset"),
    (["bench", "{ds}", "--seq-len", "100000"], "fewer than batch_size"),
])
def test_user_mistakes_exit_with_one_line(
    dataset: Path, tmp_path: Path, argv: list[str], message: str,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.txt"
    src.write_text("hello")
    assert main([a.format(src=src, ds=dataset) for a in argv]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


@pytest.mark.parametrize(("name", "content", "options", "message"), [
    ("deep.jsonl", b'{"text": "a"}\n{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", [],
     "deep.jsonl: field 'line 2': JSON nested too deeply"),
    ("notzstd.jsonl.zst", b'{"text": "not compressed"}\n', [],
     "notzstd.jsonl.zst: field 'line 1': cannot decompress the file from here on: not zstd"),
    ("big.jsonl", b'{"text": "a", "n": %d}\n' % 2**70, ["--metadata-field", "n"],
     "big.jsonl: field 'line 1': metadata cannot be stored"),
    ("in.jsonl", b'{"text": "a"}\n', ["--format", "batch", "--seq-len", "0", "--batch-size",
                                      "2"], "seq_len (--seq-len) must be a positive integer"),
])
def test_hostile_inputs_exit_with_one_line(
    tmp_path: Path, name: str, content: bytes, options: list[str], message: str,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What once printed a traceback: one line naming the file and line (or the
    argument) and what to do, exit status 1, no dataset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_bytes(content)
    assert main(["convert", name, "-o", "out", "--tokenizer", "bytes", "--workers", "1",
                 "--quiet", *options]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert "--skip-bad" in lines[0] or "seq_len" in lines[0]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_output_that_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the fuzzer: a stream output that is a file (a .batch written
    there) failed only after tokenizing, with a bare "[Errno 17] File exists"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "out").write_bytes(b"not a folder")
    assert main(["convert", "in.jsonl", "-o", "out", "--tokenizer", "bytes", "--quiet"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["zerobatch convert: out is a file; a dataset is a folder: choose another "
                     "output or remove it"]
    assert not (tmp_path / ".out.convert").exists()


def test_a_bad_input_line_in_a_real_process(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n{"text": \n')
    done = subprocess.run([sys.executable, "-m", "zerobatch.cli", "convert", "in.jsonl", "-o",
                           "out", "--tokenizer", "bytes", "--workers", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "zerobatch convert: in.jsonl: field 'line 2': malformed JSON")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_help_has_an_example_per_command(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("convert", "inspect", "verify", "bench"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0
        assert f"example:\n  zerobatch {command} " in capsys.readouterr().out


def test_distributions_memory_is_bounded_by_the_sample(tmp_path: Path) -> None:
    """Valid files with ids near 2**32: counting once asked for a bincount over
    the id range (16-30 GiB); now memory follows the tokens sampled."""
    import tracemalloc

    import numpy as np

    from zerobatch.llmbatch import write_batch_file
    from zerobatch.stream import StreamWriter
    from zerobatch.tools import distributions

    ids = np.array([2**32 - 1, 2**32 - 1, 5, 2**31, 7, 5], dtype=np.int64)
    with StreamWriter(tmp_path / "ds", token_dtype="<u4") as writer:
        writer.add_document(ids[:4])
        writer.add_document(ids[4:])
    write_batch_file(tmp_path / "b.batch", np.tile(ids, 4).reshape(4, 6).astype(np.uint32),
                     2, 6, 0)
    for path, scale, lengths in ((tmp_path / "ds", 1, [4, 2]), (tmp_path / "b.batch", 4, None)):
        tracemalloc.start()
        try:
            dist = distributions(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak
        assert dist.ids.tolist() == [5, 7, 2**31, 2**32 - 1]
        assert dist.counts.tolist() == [2 * scale, scale, scale, 2 * scale]
        assert dist.sampled == 6 * scale
        assert (None if dist.lengths is None else dist.lengths.tolist()) == lengths
    assert main(["inspect", str(tmp_path / "ds"), "--plot", str(tmp_path / "d.png")]) == 0
    assert (tmp_path / "d.png").read_bytes().startswith(PNG_MAGIC)


def test_error_naming_a_path_with_a_newline_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the fifth fuzz round: an input name holding a newline made the
    error two lines. The message escapes it: one line, the name still readable."""
    status = main(["convert", str(tmp_path / "\n.jsonl"), "-o", str(tmp_path / "out"),
                   "--tokenizer", "bytes", "--workers", "1", "--quiet"])
    err = capsys.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and err.startswith("zerobatch convert: "), err
    assert "\\n.jsonl" in err


@pytest.mark.parametrize("option", ["--metadata\nfield", "--worke\u2028rs", "--x\x85y"])
def test_a_usage_error_naming_a_line_break_is_one_line(
    tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the eighth fuzz round: an unknown option holding a line break
    made argparse's usage error two lines. It is escaped: usage, then one error."""
    with pytest.raises(SystemExit) as exit_:
        main(["convert", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out"),
              "--tokenizer", "bytes", option, "url"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if not line.startswith(("usage:", " "))]
    shown = option.encode("unicode_escape").decode()
    assert errors == [f"zerobatch: error: unrecognized arguments: {shown} url"], lines


def _word_level(path: Path, vocab: dict[str, int]) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_a_tokenizer_that_fails_to_encode_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the eighth fuzz round: a WordLevel tokenizer without its unknown
    token loads, then raises a bare ``Exception`` on the first unknown word.
    The error names the tokenizer and the input file; no dataset is left."""
    tok = _word_level(tmp_path / "tok.json", {"doc": 0, "</s>": 1})
    (tmp_path / "in.jsonl").write_text('{"text": "doc doc"}\n{"text": "doc other"}\n')
    status = main(["convert", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out"),
                   "--tokenizer", str(tok), "--workers", "1", "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"zerobatch convert: {tok}: field 'tokenizer': the tokenizer "
                               f"'tok' failed on documents of {tmp_path / 'in.jsonl'} (")
    assert "Missing [UNK] token" in lines[0] and lines[0].endswith("check or replace it")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_tokenizer_file_changed_between_two_converts_is_read_again(tmp_path: Path) -> None:
    """The fuzzer's other half of that escape: one process kept the encoder of
    a tokenizer path, so a file edited between two converts was ignored (the
    first one's tokens, silently). The encoder is keyed by the file's bytes."""
    (tmp_path / "in.jsonl").write_text('{"text": "a b"}\n')
    ids = []
    for run, vocab in enumerate(({"[UNK]": 0, "a": 1, "b": 2, "</s>": 3},
                                 {"[UNK]": 0, "a": 5, "b": 4, "</s>": 3, "x": 1, "y": 2})):
        tok = _word_level(tmp_path / "tok.json", vocab)
        assert main(["convert", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / f"out{run}"),
                     "--tokenizer", str(tok), "--workers", "1", "--quiet"]) == 0
        with open_dataset(tmp_path / f"out{run}") as ds:
            ids.append(ds.documents().read([0])["input_ids"][0].tolist())
    assert ids == [[1, 2, 3], [5, 4, 3]]


def test_a_worker_refuses_a_tokenizer_file_changed_after_the_convert_began(
        tmp_path: Path) -> None:
    """A convert's workers (other processes: Dask, a pool) load the tokenizer
    from its path. One edited after the job began would have given its shards
    another tokenizer's ids; the worker compares the file with the digest the
    job recorded and raises, naming the file."""
    from zerobatch import FormatError
    from zerobatch.convert import encoders

    tok = _word_level(tmp_path / "tok.json", {"[UNK]": 0, "a": 1, "</s>": 2})
    spec = encoders.resolve_tokenizer(str(tok), tmp_path)
    encoders._CACHE.clear()  # as in a fresh worker process
    assert spec.build().encode(["a a"])[0].ids.tolist() == [1, 1]
    encoders._CACHE.clear()
    _word_level(tok, {"[UNK]": 0, "a": 7, "</s>": 2})
    with pytest.raises(FormatError, match="changed while the convert ran") as raised:
        spec.build()
    assert str(tok) in str(raised.value) and "tokenizer" in str(raised.value)
    tok.unlink()
    with pytest.raises(FormatError, match="moved or deleted"):
        spec.build()
