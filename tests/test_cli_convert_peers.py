"""``zerobatch convert`` with a peer dataset as input: its tokens (and
loss_mask) copied into a native dataset without tokenizing, through the
command line. Inputs written by the peers' own writers (datatrove's
TokenizedFile, datasets' save_to_disk) or as OLMo writes them (raw arrays);
MDS's is in test_peers_mds."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from datatrove.pipeline.tokens.tokenizer import TokenizedFile

from zerobatch import open_dataset
from zerobatch.cli import main
from zerobatch.peers import FORMATS


def _documents(path):
    with open_dataset(path) as ds:
        batch = ds.documents(dtype="stored").read(np.arange(ds.num_documents))
        return batch, ds.manifest.fields


def test_datatrove_with_loss_mask(tmp_path, capsys):
    rng = np.random.default_rng(5)
    file = TokenizedFile(str(tmp_path / "dt"), "000_tokenized.ds", save_loss_metadata=True,
                         token_size=4, save_final_metadata=True,
                         tokenizer_name_or_path="gpt2|test")
    documents, masks = [], []
    for _ in range(30):
        tokens = rng.integers(0, 200_000, int(rng.integers(1, 20)))
        mask = rng.random(tokens.shape[0]) < 0.6
        file.write(tokens.tolist(), mask)
        documents.append(tokens)
        masks.append(mask)
    file.close()
    assert main(["convert", str(tmp_path / "dt"), "-o", str(tmp_path / "out")]) == 0
    assert "copied 30 documents" in capsys.readouterr().out
    batch, fields = _documents(tmp_path / "out")
    assert "loss_mask" in fields
    for got, mask, want, want_mask in zip(batch["input_ids"], batch["loss_mask"], documents,
                                          masks, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
        np.testing.assert_array_equal(np.asarray(mask), want_mask.astype(np.uint8))


def test_hf_save_to_disk(tmp_path):
    rows = [[1, 2, 3], [7], [40_000, 5, 6, 9]]
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    datasets.Dataset.from_dict({"input_ids": rows}, features=features).save_to_disk(
        str(tmp_path / "hf"))
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    batch, _ = _documents(tmp_path / "out")
    assert [np.asarray(d).tolist() for d in batch["input_ids"]] == rows


def test_olmo_with_input_options(tmp_path):
    docs = [np.array([5, 6, 0], np.uint32), np.array([9, 0], np.uint32)]
    (tmp_path / "olmo").mkdir()
    np.concatenate(docs).tofile(tmp_path / "olmo" / "part-0-00000.npy")
    assert main(["convert", str(tmp_path / "olmo"), "-o", str(tmp_path / "out"), "--quiet",
                 "--input-format", "olmo", "--input-option", "dtype=uint32",
                 "--input-option", "eos_id=0"]) == 0
    batch, _ = _documents(tmp_path / "out")
    assert [np.asarray(d).tolist() for d in batch["input_ids"]] == [d.tolist() for d in docs]


def test_options_that_cannot_apply(tmp_path, capsys):
    docs = np.array([5, 6, 0], np.uint32)
    (tmp_path / "olmo").mkdir()
    docs.tofile(tmp_path / "olmo" / "a.npy")
    peer = ["--input-format", "olmo", "--input-option", "dtype=uint32"]
    assert main(["convert", str(tmp_path / "olmo"), "-o", str(tmp_path / "o1"),
                 "--tokenizer", "bytes", "--seq-len", "8", *peer]) == 1
    err = capsys.readouterr().err
    assert "is a olmo dataset" in err and "--tokenizer, --seq-len cannot apply" in err
    assert main(["convert", str(tmp_path / "olmo"), str(tmp_path / "olmo"), "-o",
                 str(tmp_path / "o2"), *peer]) == 1
    assert "one input per convert" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text("hello\n")
    assert main(["convert", str(tmp_path / "t.txt"), "-o", str(tmp_path / "o3")]) == 1
    assert "--tokenizer is required" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "t.txt"), "-o", str(tmp_path / "o4"),
                 "--tokenizer", "bytes", "--input-option", "dtype=uint32"]) == 1
    assert "--input-option applies" in capsys.readouterr().err
    # a digit to str.isdigit that int() refuses: the option's own check names it
    assert main(["convert", str(tmp_path / "olmo"), "-o", str(tmp_path / "o5"), *peer,
                 "--input-option", "eos_id=\u00b2"]) == 1
    assert "eos_id must be a non-negative int, got '\u00b2'" in capsys.readouterr().err
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 6))


def test_input_format_choices_are_the_peer_formats():
    from zerobatch.cli import _build_parser

    convert = _build_parser()._subparsers._group_actions[0].choices["convert"]  # type: ignore[union-attr]
    action = next(a for a in convert._actions if a.dest == "input_format")
    assert set(action.choices) == set(FORMATS)


@pytest.mark.parametrize("argv", [["--tokenizer", "bytes"], []])
def test_texts_still_convert(tmp_path, argv):
    (tmp_path / "t.jsonl").write_text('{"text": "hi"}\n')
    code = main(["convert", str(tmp_path / "t.jsonl"), "-o", str(tmp_path / "o"), "--quiet",
                 *argv])
    assert code == (0 if argv else 1)
