"""Packed rows (zerobatch.packing): exactness, the varlen contract, resume, kills, a real model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from zerobatch import Loader, StreamWriter, open_dataset
from zerobatch import _packing_kernels as pk
from zerobatch.packing import PackedRows
from zerobatch.storage import LocalStorage

from support.resumed_loops import kill_and_resume, packing_loop  # isort: skip

DOCS = 240


def _write(folder: Path, lengths: list[int], seed: int) -> Path:
    """Documents of ``lengths``: random tokens, a per-token ``loss_mask`` field
    and spans (0, n // 2, "user"), (n // 2, n, "assistant")."""
    rng = np.random.default_rng(seed)
    with StreamWriter(folder, fields={"loss_mask": "u1"}, metadata="json",
                      shard_tokens=2000) as writer:
        for n in lengths:
            half = n // 2
            mask = np.zeros(n, np.uint8)
            mask[half:] = 1
            spans = [(half, n, "assistant")] + ([(0, half, "user")] if half else [])
            writer.add_document(rng.integers(1, 60000, n), fields={"loss_mask": mask},
                                spans=spans)
    return folder


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three length distributions: short lognormal, long-tailed (documents up to
    several rows long), and uniform."""
    rng = np.random.default_rng(5)
    root = tmp_path_factory.mktemp("packing")
    shapes = {
        "lognormal": np.clip(rng.lognormal(2.5, 0.8, DOCS), 1, 200).astype(int),
        "long": np.clip(rng.lognormal(3.5, 1.2, DOCS), 1, 600).astype(int),
        "uniform": rng.integers(1, 64, DOCS),
    }
    return {name: _write(root / name, [int(n) for n in lengths], i)
            for i, (name, lengths) in enumerate(shapes.items())}


def _epoch(packed: PackedRows, batch: int, world: int, seed: int, **kw: Any
           ) -> list[list[dict[str, Any]]]:
    """Every rank's batches of one epoch (drop_last=False): [rank][step]."""
    return [list(Loader(packed, batch, rank=r, world_size=world, seed=seed, output="numpy",
                        drop_last=False, num_threads=0, **kw)) for r in range(world)]


def _expected_pieces(lengths: np.ndarray, seq_len: int, policy: str) -> Counter:
    pieces: Counter = Counter()
    for doc, n in enumerate(lengths.tolist()):
        if n <= seq_len:
            pieces[(doc, 0, n)] += 1
        elif policy == "split":
            for at in range(0, n, seq_len):
                pieces[(doc, at, min(seq_len, n - at))] += 1
        elif policy == "truncate":
            pieces[(doc, 0, seq_len)] += 1
    return pieces


def _check_rows(batch: dict[str, Any], tokens: Any, seq_len: int, masks: Any) -> Counter:
    """Check one collated numpy batch against the documents; returns its
    (doc, start, size) pieces outside padding rows."""
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    cu, seq_idx, docs = batch["cu_seqlens"], batch["seq_idx"], batch["doc_ids"]
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == ids.size
    assert isinstance(batch["max_seqlen"], int) and batch["max_seqlen"] == np.diff(cu).max()
    flat_pos, flat_seg = pos.reshape(-1), seq_idx.reshape(-1)
    for s in range(cu.shape[0] - 1):  # cu_seqlens, seq_idx and position_ids agree
        assert (flat_seg[cu[s]:cu[s + 1]] == s).all()
        assert (flat_pos[cu[s]:cu[s + 1]] == np.arange(cu[s + 1] - cu[s])).all()
    got: Counter = Counter()
    for b in range(ids.shape[0]):
        at = 0
        for k, doc in enumerate(docs[b].tolist()):
            begin = int(batch["_starts"][b][k])
            size = int(batch["_sizes"][b][k])
            assert at + size <= seq_len
            piece = tokens[doc][begin:begin + size]
            assert (ids[b, at:at + size] == piece).all()
            want = np.full(size, -100)
            take = masks[doc][begin + 1:begin + size] != 0
            want[:-1] = np.where(take, piece[1:], -100)  # shifted: -100 at each piece's end
            if batch["padding"][b]:
                want[:] = -100
            assert (labels[b, at:at + size] == want).all()
            if not batch["padding"][b]:
                got[(doc, begin, size)] += 1
            at += size
        assert (labels[b, at:] == -100).all() and (ids[b, at:] == 0).all()
    return got


def _collated(packed: PackedRows, batch: int, world: int, seed: int) -> list[dict[str, Any]]:
    """Every rank's collated batches with their raw pieces, in rank-major order."""
    out = []
    for r in range(world):
        loader = Loader(packed, batch, rank=r, world_size=world, seed=seed, output="batch",
                        drop_last=False, num_threads=1)
        source = loader._source
        for raw in loader:
            cols = source.collate(raw, "numpy")
            cols["_starts"] = raw["doc_starts"]
            cols["_sizes"] = raw["seqlens"]
            cols["_ids"] = raw.meta.global_indexes
            out.append(cols)
    return out


_QUICK = [Phase.explicit, Phase.reuse, Phase.generate]  # failures print unshrunk, fast

@settings(max_examples=12, deadline=None, phases=_QUICK)
@given(corpus=st.sampled_from(["lognormal", "long", "uniform"]), seq_len=st.integers(8, 96),
       window=st.integers(8, 120), policy=st.sampled_from(["split", "truncate", "drop"]),
       world=st.integers(1, 4), batch=st.integers(1, 5), seed=st.integers(0, 2**32))
def test_every_document_once_per_epoch(corpora, corpus, seq_len, window, policy, world, batch,
                                       seed):
    docs = open_dataset(corpora[corpus]).documents()
    packed = docs.packed(seq_len, window=window, policy=policy, loss_mask="loss_mask")
    lengths = docs.lengths(np.arange(len(docs)))
    everything = docs.read(np.arange(len(docs)))
    tokens, masks = everything["input_ids"], everything["loss_mask"]
    got: Counter = Counter()
    batches = _collated(packed, batch, world, seed)
    for cols in batches:
        got += _check_rows(cols, tokens, seq_len, masks)
    assert got == _expected_pieces(lengths, seq_len, policy)
    # identical on every run and with threads: the same rows again
    again = _collated(packed.with_order(seed, True), batch, world, seed)
    assert [c["_ids"].tolist() for c in again] == [c["_ids"].tolist() for c in batches]
    d = packed.with_order(seed, True).describe()
    placed = sum(size for (_, _, size) in got.elements())
    assert d["tokens"] == placed and d["rows"] * seq_len - d["padding_tokens"] == placed
    if policy == "drop":
        assert d["dropped_documents"] == int((lengths > seq_len).sum())
        assert d["dropped_tokens"] == int(lengths[lengths > seq_len].sum())
    elif policy == "truncate":
        assert d["dropped_tokens"] == int((lengths[lengths > seq_len] - seq_len).sum())
    else:
        assert d["dropped_tokens"] == 0


@settings(max_examples=10, deadline=None, phases=_QUICK)
@given(corpus=st.sampled_from(["lognormal", "long"]), window=st.integers(8, 60),
       world=st.integers(1, 3), world2=st.integers(1, 3), batch=st.integers(1, 4),
       batch2=st.integers(1, 4), stop=st.integers(0, 200), drop_last=st.booleans(),
       seed=st.integers(0, 2**32))
def test_resume_anywhere_with_another_world_size(corpora, corpus, window, world, world2, batch,
                                                 batch2, stop, drop_last, seed):
    packed = open_dataset(corpora[corpus]).documents().packed(24, window=window)

    def run(loaders: list[Loader], steps: int | None) -> list[int]:
        rows: list[int] = []
        iterators = [iter(loader) for loader in loaders]
        step = 0
        while steps is None or step < steps:  # take a step only when it counts
            batches = [next(it, None) for it in iterators]
            if batches[0] is None:
                assert all(b is None for b in batches)
                break
            for b in batches:
                keep = ~b["padding"] if "padding" in b.fields else slice(None)
                rows += np.asarray(b.meta.global_indexes)[keep].tolist()
            step += 1
        return rows

    def loaders(w: int, b: int) -> list[Loader]:
        return [Loader(packed, b, rank=r, world_size=w, seed=seed, output="batch",
                       drop_last=drop_last, num_threads=0, epochs=1) for r in range(w)]

    whole = run(loaders(world, batch), None)
    first = loaders(world, batch)
    steps = stop % len(first[0])  # a point inside epoch 0
    before = run(first, steps)
    state = first[0].state_dict()
    assert all(loader.state_dict() == state for loader in first)
    assert json.loads(json.dumps(state)) == state
    second = loaders(world2, batch2)
    for loader in second:
        loader.load_state_dict(state)
    after = [row for row in run(second, None) if row >> 46 == 0]  # epoch 0's rows
    assert len(before + after) == len(set(before + after))  # no row twice
    if drop_last:  # the resumed run drops less than one of its steps at the end
        every = run(loaders(1, 1), None)
        assert set(before + after) <= set(every)
        assert len(every) - len(before + after) < world2 * batch2
    else:
        assert sorted(before + after) == sorted(whole)


def test_resume_repacks_one_window(corpora):
    """A state mid-window names that window; a resumed loader packs only it
    (and the windows it then reads)."""
    packed = open_dataset(corpora["lognormal"]).documents().packed(32, window=20)
    loader = Loader(packed, 3, seed=4, output="batch", num_threads=0)
    it = iter(loader)
    for _ in range(9):
        next(it)
    state = loader.state_dict()
    assert state["window_documents"] % 20 == 0 and state["window_documents"] > 0
    assert state["consumed"] == 27
    fresh = open_dataset(corpora["lognormal"]).documents().packed(32, window=20)
    resumed = Loader(fresh, 3, seed=4, output="batch", num_threads=0)
    resumed.load_state_dict(state)
    nxt = next(iter(resumed))
    assert next(it).meta.global_indexes.tolist() == nxt.meta.global_indexes.tolist()
    bound = resumed._source
    assert {w for (_, w) in bound._cache} <= {state["window_documents"] // 20,
                                              state["window_documents"] // 20 + 1}


def test_rows_fit_and_padding_low_on_realistic_lengths():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.0, 0.9, 8192), 16, 8192).astype(np.int64)
    _doc, _start, size, _stats = pk.make_pieces(lengths, 4096, pk.SPLIT)
    row_of, rows = pk.best_fit_decreasing(size, 4096)
    fill = np.bincount(row_of, weights=size, minlength=rows)
    assert fill.max() <= 4096
    assert 1 - fill.sum() / (rows * 4096) < 0.01


def test_best_fit_matches_a_plain_implementation():
    rng = np.random.default_rng(1)
    for _ in range(30):
        seq_len = int(rng.integers(4, 50))
        sizes = rng.integers(1, seq_len + 1, int(rng.integers(0, 60)))
        row_of, rows = pk.best_fit_decreasing(sizes, seq_len)
        room: list[int] = []  # a plain best-fit decreasing: any row of least room
        for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
            fits = [r for r in range(len(room)) if room[r] >= sizes[i]]
            if fits:
                r = min(fits, key=lambda r: room[r])
            else:
                r = len(room)
                room.append(seq_len)
            room[r] -= int(sizes[i])
        # rows of equal room are interchangeable: the fills agree whatever the ties
        assert rows == len(room)
        fill = np.bincount(row_of, weights=sizes, minlength=rows) if len(sizes) else []
        assert sorted(np.asarray(fill).tolist()) == sorted(seq_len - r for r in room)


def test_loss_spans_equal_the_loss_mask_field(corpora):
    docs = open_dataset(corpora["long"]).documents()
    by_field = docs.packed(40, window=16, loss_mask="loss_mask", labels="aligned")
    by_spans = docs.packed(40, window=16, loss_spans="assistant", labels="aligned")
    a = Loader(by_field, 4, seed=3, output="numpy", num_threads=0)
    b = Loader(by_spans, 4, seed=3, output="numpy", num_threads=0)
    for x, y in zip(a, b, strict=True):
        assert (x["labels"] == y["labels"]).all() and (x["input_ids"] == y["input_ids"]).all()
        starts = x["position_ids"] == 0
        assert (x["labels"][starts] == -100).all()  # aligned: -100 at every segment start


def test_torch_output_and_fixed_shape(corpora):
    import torch

    packed = open_dataset(corpora["uniform"]).documents().packed(
        64, window=32, attention_mask=True, cu_seqlens_size=40)
    batch = next(iter(Loader(packed, 4, output="torch", num_threads=0)))
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["cu_seqlens"].shape == (40,)
    assert isinstance(batch["max_seqlen"], int)
    assert batch["attention_mask"].dtype == torch.int64
    assert batch["seq_idx"].dtype == torch.int32 and batch["input_ids"].shape == (4, 64)
    jax_like = packed.collate(packed.read(Loader(packed, 4)._plan.indices(0, 0, 0)[0]), "jax")
    assert {"segment_ids", "positions"} <= set(jax_like) and "cu_seqlens" not in jax_like


def test_bad_input(corpora, tmp_path):
    docs = open_dataset(corpora["lognormal"]).documents()
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        docs.packed(0)
    with pytest.raises(ValueError, match="window must be >= 8"):
        docs.packed(16, window=3)
    with pytest.raises(ValueError, match=r"loss_spans='system'.*\['assistant', 'user'\]"):
        docs.packed(16, loss_spans="system")
    with pytest.raises(ValueError, match=r"loss_mask='weights' is not a per-token field.*"
                                         r"\['loss_mask'\]"):
        docs.packed(16, loss_mask="weights")
    with pytest.raises(ValueError, match="policy must be one of"):
        docs.packed(16, policy="wrap")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size"):
        Loader(docs.packed(16), 2, block_size=4)
    with StreamWriter(tmp_path / "plain") as writer:
        writer.add_document([1, 2, 3])
    with pytest.raises(ValueError, match="no span metadata"):
        open_dataset(tmp_path / "plain").documents().packed(16, loss_spans="assistant")
    state = Loader(docs.packed(16, window=8), 2).state_dict()
    with pytest.raises(ValueError, match="fingerprint"):
        Loader(docs.packed(16, window=16), 2).load_state_dict(state)
    with pytest.raises(ValueError, match="window_rows"):
        Loader(docs.packed(16, window=8), 2).load_state_dict(
            {**state, "consumed": 10, "window_documents": 8, "window_rows": 10**6})


def test_every_epoch_logged_with_its_losses(corpora, caplog):
    packed = open_dataset(corpora["long"]).documents().packed(32, window=16, policy="truncate")
    with caplog.at_level("INFO", logger="zerobatch.packing"):
        list(Loader(packed, 4, epochs=2, output="batch", num_threads=0))
    lines = [r.getMessage() for r in caplog.records if r.name == "zerobatch.packing"]
    assert [line.split(":")[0] for line in lines] == ["zerobatch packing, epoch 0",
                                                     "zerobatch packing, epoch 1"]
    d = packed.describe(1)
    assert f"{d['dropped_tokens']} tokens dropped" in lines[1] and d["dropped_tokens"] > 0


def test_sigkill_fine_tuning_resumes_exactly(corpora, tmp_path):
    folder = corpora["long"]
    reference = tmp_path / "reference"
    reference.mkdir()
    packing_loop(folder, reference / "log", reference / "none.json", None)
    run = tmp_path / "run"
    run.mkdir()
    checkpoint = run / "checkpoint.json"
    kill_and_resume(packing_loop, (folder, run / "log", checkpoint), checkpoint,
                    run / "final.npy", seed=0, ahead=5)
    assert (run / "log").read_text() == (reference / "log").read_text()
    assert (np.load(run / "final.npy") == np.load(reference / "final.npy")).all()


@pytest.mark.parametrize("flatten", [False, True])
def test_real_model_same_loss_packed_and_padded(tmp_path, flatten):
    """A tiny Llama (built from a config) on a packed batch with position_ids
    (its padding-free path) gives the loss of the same documents one per row,
    padded, with an attention mask."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 30, 40)
    folder = tmp_path / "tiny"
    with StreamWriter(folder, fields={"loss_mask": "u1"}) as writer:
        for n in lengths:
            writer.add_document(rng.integers(1, 100, n),
                                fields={"loss_mask": rng.random(n) < 0.7})
    packed = open_dataset(folder).documents().packed(48, window=16, labels="aligned",
                                                     loss_mask="loss_mask")
    loader = Loader(packed, 3, seed=1, output="batch", num_threads=0)
    raw = next(iter(loader))
    cols = packed.collate(raw, "torch")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).double().eval()
    ids, labels, pos = cols["input_ids"].long(), cols["labels"], cols["position_ids"]
    if flatten:  # DataCollatorWithFlattening's layout: one row of every token
        ids, labels, pos = ids.reshape(1, -1), labels.reshape(1, -1), pos.reshape(1, -1)
    with torch.no_grad():
        packed_loss = model(input_ids=ids, position_ids=pos, labels=labels,
                            use_cache=False).loss
    # the same documents, one per row, right-padded
    starts, sizes, docs = raw["doc_starts"], raw["seqlens"], raw["doc_ids"]
    pieces = [(d, s, n) for b in range(len(raw)) for d, s, n in
              zip(docs[b].tolist(), starts[b].tolist(), sizes[b].tolist(), strict=True)]
    source = open_dataset(folder).documents().read([d for d, _, _ in pieces])
    width = max(n for _, _, n in pieces)
    rows = torch.zeros(len(pieces), width, dtype=torch.long)
    mask = torch.zeros(len(pieces), width, dtype=torch.long)
    plain = torch.full((len(pieces), width), -100, dtype=torch.long)
    for i, (_, s, n) in enumerate(pieces):
        tokens = torch.from_numpy(source["input_ids"][i][s:s + n].astype(np.int64))
        keep = torch.from_numpy(source["loss_mask"][i][s:s + n] != 0)
        rows[i, :n], mask[i, :n] = tokens, 1
        plain[i, :n] = torch.where(keep, tokens, torch.tensor(-100))
    with torch.no_grad():
        padded_loss = model(input_ids=rows, attention_mask=mask, labels=plain,
                            use_cache=False).loss
    assert torch.isfinite(packed_loss)
    assert abs(packed_loss.item() - padded_loss.item()) < 1e-9
    # the contract matters: without position_ids the rows' documents see each other
    with torch.no_grad():
        leaky = model(input_ids=ids, labels=labels, use_cache=False).loss
    assert abs(leaky.item() - padded_loss.item()) > 1e-6


@pytest.mark.parametrize("options", [{}, {"loss_mask": "loss_mask", "dtype": "int32"},
                                     {"loss_spans": "assistant"}])
def test_read_builds_what_from_columns_would(corpora, options):
    from zerobatch import Batch

    dtype = options.pop("dtype", "int64")
    packed = open_dataset(corpora["long"]).documents(dtype=dtype).packed(40, window=16,
                                                                          **options)
    ids = Loader(packed, 5, seed=9)._plan.rank_indices(0, 0, 0)[0]
    batch = packed.read(ids)
    again = Batch.from_columns(batch.to_numpy())
    assert list(batch.meta.field_schema) == list(again.meta.field_schema)
    for name, field in again.meta.field_schema.items():
        mine = batch.meta.field_schema[name]
        assert (mine.kind, np.dtype(mine.dtype), mine.item_shape) == \
            (field.kind, np.dtype(field.dtype), field.item_shape), name
        if field.lengths is not None:
            assert (mine.lengths == field.lengths).all()
    assert batch.meta.global_indexes.tolist() == ids.tolist()
    assert batch["input_ids"].dtype == np.dtype(dtype)


def test_loader_dataset_workers_yield_the_loaders_steps(corpora):
    import torch

    from zerobatch.torch import LoaderDataset

    packed = open_dataset(corpora["long"]).documents().packed(48, window=24,
                                                              loss_mask="loss_mask")
    want = [b["doc_ids"][0].tolist() for b in Loader(packed, 3, seed=1, output="torch",
                                                      num_threads=0)]
    dataset = LoaderDataset(Loader(packed, 3, seed=1, output="torch", num_threads=0))
    got = [b["doc_ids"][0].tolist() for b in
           torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)]
    assert got == want and len(got) == len(dataset)


def _same_columns(got: dict[str, Any], want: dict[str, Any]) -> None:
    import torch

    assert list(got) == list(want)
    for name, value in want.items():
        mine = got[name]
        if isinstance(value, tuple):  # torch doc_ids: (values, offsets)
            assert all(torch.equal(a, b) for a, b in zip(mine, value, strict=True)), name
        elif isinstance(value, torch.Tensor):
            assert mine.dtype == value.dtype and torch.equal(mine, value), name
        elif isinstance(value, np.ndarray):
            assert mine.dtype == value.dtype and np.array_equal(mine, value), name
        elif hasattr(value, "offsets"):  # Jagged doc_ids
            assert np.array_equal(mine.values, value.values), name
            assert np.array_equal(mine.offsets, value.offsets), name
        else:
            assert mine == value, name


@settings(max_examples=25, deadline=None, phases=_QUICK)
@given(corpus=st.sampled_from(["lognormal", "long", "uniform"]), seq_len=st.integers(4, 96),
       window=st.integers(8, 40), policy=st.sampled_from(["split", "truncate", "drop"]),
       labels=st.sampled_from(["shifted", "aligned"]), mask=st.booleans(),
       dtype=st.sampled_from(["int64", "int32", "stored"]), attention=st.booleans(),
       output=st.sampled_from(["numpy", "torch"]), batch=st.integers(1, 6),
       pad=st.booleans(), seed=st.integers(0, 5), start=st.integers(0, 40))
def test_read_collated_equals_read_then_collate(corpora, corpus, seq_len, window, policy,
                                                labels, mask, dtype, attention, output,
                                                batch, pad, seed, start):
    """The one-pass path (local files straight into the contract) gives exactly
    what read + collate give, for rows of one window and of several."""
    packed = open_dataset(corpora[corpus]).documents(dtype=dtype).packed(
        seq_len, window=window, policy=policy, labels=labels,
        loss_mask="loss_mask" if mask else None, attention_mask=attention,
        cu_seqlens_size=2 * batch * seq_len + 1 if attention else None, seed=seed)
    plan, _ = packed.bind_plan(batch, seed=seed)
    total = packed.rows(0)
    if total == 0:
        return
    first = min(start, total - 1)
    rows = [plan.rank_indices(0, (first + k) % total, 0, 1)[0][:1] for k in range(batch)]
    ids = np.concatenate(rows)
    padding = np.arange(batch) % 2 == 1 if pad else None
    _same_columns(packed.read_collated(ids, padding, output),
                  packed._read_then_collate(ids, padding, output))


_LAYOUTS = {  # record layouts read_contract compiles for: token dtype, fields
    "tokens": ("<u2", {}),
    "u4, a field, bool mask": ("<u4", {"weight": "<f4", "loss_mask": "|b1"}),
    "float mask": ("<u2", {"loss_mask": "<f4"}),
    "i2 mask": ("<u2", {"loss_mask": "<i2", "tag": "u1"}),
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_read_collated_over_record_layouts(tmp_path, layout):
    """The one-pass kernel reads each record layout (its token and mask fields
    at their offsets, any mask dtype: -0.0 and 256 are 0 and not 0 as numbers)
    exactly as read + collate, for both label conventions and every dtype,
    from a mapping (in place) and by pread (into its buffer)."""
    token_dtype, fields = _LAYOUTS[layout]
    rng = np.random.default_rng(7)
    with StreamWriter(tmp_path, token_dtype=token_dtype, fields=fields,
                      shard_tokens=700) as writer:
        for n in rng.integers(1, 90, 120).tolist():
            values = {name: rng.integers(0, 3, n).astype(dtype)
                      for name, dtype in fields.items()}
            if "loss_mask" in values and fields["loss_mask"] == "<f4":
                values["loss_mask"][rng.random(n) < 0.3] = -0.0
            if "loss_mask" in values and fields["loss_mask"] == "<i2":
                values["loss_mask"][rng.random(n) < 0.3] = 256
            writer.add_document(rng.integers(0, np.iinfo(token_dtype).max, n,
                                             dtype=np.int64), fields=values)
    mask = "loss_mask" if "loss_mask" in fields else None
    for labels, dtype, method in (("shifted", "int64", "mmap"), ("aligned", "int32", "pread"),
                                  ("shifted", "stored", "mmap")):
        storage = LocalStorage(tmp_path, method=method)  # read in place, or into a buffer
        packed = open_dataset(tmp_path, storage=storage).documents(dtype=dtype).packed(
            64, window=40, labels=labels, loss_mask=mask, seed=1)
        assert packed._direct() is not None
        plan, _ = packed.bind_plan(4, seed=1)
        padding = np.array([False, True, False, False])
        for consumed in range(0, packed.rows(0) - 4, 4):
            ids = plan.rank_indices(0, consumed, 0)[0]
            _same_columns(packed.read_collated(ids, padding),
                          packed._read_then_collate(ids, padding, "numpy"))


def test_read_collated_reads_rows_of_two_windows_in_one_pass(corpora, monkeypatch):
    """A step across two windows is read by the one-pass kernel too (its rows'
    pieces joined), equal to read then collate."""
    packed = open_dataset(corpora["long"]).documents().packed(
        48, window=24, loss_mask="loss_mask", labels="aligned")
    plan, _ = packed.bind_plan(4, seed=0)
    ids = plan.rank_indices(0, packed._window(0, 0).rows - 2, 0)[0]
    assert len(set((ids >> 23).tolist())) == 2
    want = packed._read_then_collate(ids, None, "numpy")
    monkeypatch.setattr(PackedRows, "_read_then_collate",
                        lambda *a, **k: pytest.fail("not one pass"))
    _same_columns(packed.read_collated(ids), want)


def test_loader_reads_collated_without_a_transform(corpora, monkeypatch):
    """With no transform the Loader reads and collates in one call; a
    transform gets the Batch that read returns, and the same columns follow."""
    packed = open_dataset(corpora["long"]).documents().packed(48, window=24,
                                                              loss_mask="loss_mask")
    direct = list(Loader(packed, 3, seed=1, output="numpy", num_threads=0))
    seen = []

    def transform(batch):
        seen.append(batch)
        return batch

    with monkeypatch.context() as m:
        m.setattr(PackedRows, "read_collated", lambda *a, **k: pytest.fail("not one pass"))
        slow = list(Loader(packed, 3, seed=1, output="numpy", num_threads=0,
                           transform=transform))
    assert len(seen) == len(slow) == len(direct) > 0
    for got, want in zip(direct, slow, strict=True):
        _same_columns(got, want)


@settings(max_examples=15, deadline=None, phases=_QUICK)
@given(corpus=st.sampled_from(["lognormal", "long"]), window=st.integers(8, 60),
       batch=st.integers(1, 5), world=st.integers(1, 3), drop_last=st.booleans(),
       before=st.integers(0, 40), steps=st.integers(0, 120))
def test_advance_equals_walking_step_by_step(corpora, corpus, window, batch, world,
                                             drop_last, before, steps):
    packed = open_dataset(corpora[corpus]).documents().packed(64, window=window)
    plan, _ = packed.bind_plan(batch, world_size=world, seed=3, drop_last=drop_last)
    position = (0, 0)
    for _ in range(before):
        position = plan.after(*position)
    walked = position
    for _ in range(steps):
        walked = plan.after(*walked)
    fresh, _ = packed.with_order(3, True).bind_plan(batch, world_size=world, seed=3,
                                                   drop_last=drop_last)
    assert fresh.advance(*position, steps) == walked
    assert plan.advance(*position, steps) == walked


@pytest.mark.parametrize("microbatch", [None, 2])
def test_jax_output_places_the_contract(corpora, microbatch):
    """Loader(packed, output=JaxOutput(...)): global arrays of JAX's names, each
    step's rows those of the numpy Loader, segment_ids/positions from its layout."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from zerobatch.jax import JaxOutput

    packed = open_dataset(corpora["long"]).documents().packed(
        32, window=24, loss_mask="loss_mask", labels="aligned")
    devices = np.array(jax.devices()[:8])
    if microbatch is None:
        sharding = NamedSharding(Mesh(devices.reshape(4, 2), ("dp", "tp")), P("dp", "tp"))
    else:
        sharding = NamedSharding(Mesh(devices.reshape(2, 2, 2), ("pp", "dp", "tp")),
                                 P("pp", "dp", "tp"))
    loader = Loader(packed, 4, seed=6, output=JaxOutput(sharding, microbatch=microbatch),
                    num_threads=1)
    reference = Loader(packed, 4, seed=6, output="numpy", num_threads=0)
    steps = list(loader)
    assert len(steps) == len(reference) > 2
    for got, want in zip(steps, reference, strict=True):
        assert sorted(got) == ["input_ids", "labels", "positions", "segment_ids"]
        assert got["input_ids"].sharding == sharding
        flat = {name: np.asarray(value).reshape(4, 32) for name, value in got.items()}
        for name in ("input_ids", "labels"):
            np.testing.assert_array_equal(flat[name], want[name])
        np.testing.assert_array_equal(flat["positions"], want["position_ids"])
        # segment_ids: 1, 2, ... per document within the row, 0 on the padding tail
        # (tokens are >= 1, padding is pad_id 0)
        real = want["input_ids"] != 0
        expect = want["seq_idx"] - want["seq_idx"][:, :1] + 1
        np.testing.assert_array_equal(flat["segment_ids"], np.where(real, expect, 0))
    resumed = Loader(packed, 4, seed=6, output=JaxOutput(sharding, microbatch=microbatch),
                     num_threads=0)
    state = Loader(packed, 4, seed=6, output="numpy")
    it = iter(state)
    next(it), next(it)
    resumed.load_state_dict(state.state_dict())
    rest = list(resumed)
    assert len(rest) == len(steps) - 2
    for got, want in zip(rest, steps[2:], strict=True):
        np.testing.assert_array_equal(np.asarray(got["input_ids"]), np.asarray(want["input_ids"]))


def test_batch_service_over_packed_rows(corpora):
    """BatchServer/BatchClient over packed rows: each rank's batches equal the
    Loader's, every document exactly once per epoch through the service, the
    states interchangeable, and a resume (with another world_size) exact."""
    import threading

    from zerobatch.service import BatchClient, BatchServer

    packed = open_dataset(corpora["long"]).documents().packed(64, window=24,
                                                              loss_mask="loss_mask")
    server = BatchServer(packed, "tcp://127.0.0.1:*")
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        options: dict[str, Any] = {"seed": 4, "world_size": 2, "output": "numpy",
                                   "drop_last": False, "epochs": 2}
        pieces: Counter = Counter()
        for rank in range(2):
            with BatchClient(server.address, 3, rank=rank, **options) as client:
                remote = list(client)
                state = client.state_dict()
            local_loader = Loader(packed, 3, rank=rank, num_threads=0, **options)
            local = list(local_loader)
            assert state == local_loader.state_dict()
            assert len(remote) == len(local) > 0
            for got, want in zip(remote, local, strict=True):
                assert list(got) == list(want)
                for name in ("input_ids", "labels", "position_ids", "cu_seqlens", "seq_idx",
                             "padding"):
                    np.testing.assert_array_equal(got[name], want[name])
                assert got["max_seqlen"] == want["max_seqlen"]
                for row in range(3):
                    if not got["padding"][row]:
                        for doc in got["doc_ids"][row].tolist():
                            pieces[doc] += 1
        lengths = open_dataset(corpora["long"]).documents().lengths(np.arange(DOCS))
        per_epoch = Counter({doc: 2 * max(1, -(-int(n) // 64)) for doc, n in enumerate(lengths)})
        assert pieces == per_epoch  # two epochs: every piece of every document twice
        # resume: two steps with world_size 2, then world_size 1 through the service
        with BatchClient(server.address, 3, rank=0, seed=4, world_size=2,
                         output="numpy") as client:
            steps = iter(client)
            next(steps), next(steps)
            state = client.state_dict()
        whole = Loader(packed, 3, seed=4, output="numpy", num_threads=0)
        whole.load_state_dict(state)
        with BatchClient(server.address, 3, seed=4, output="numpy") as client:
            client.load_state_dict(state)
            for got, want in zip(client, whole, strict=True):
                np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
                np.testing.assert_array_equal(got["labels"], want["labels"])
    finally:
        server.stop()
        thread.join(10)


def test_mixture_of_packed_sources(corpora):
    """Mixture of two packed sources (.mixable()): each pass of each source takes
    every document exactly once (or exactly its split pieces); a resume
    continues exactly; a PackedRows itself is refused with the hint."""
    from zerobatch import Mixture

    seq_len = 64
    sources = {name: open_dataset(corpora[name]).documents().packed(
        seq_len, window=24, loss_mask="loss_mask", seed=i) for i, name in
        enumerate(("long", "lognormal"))}
    with pytest.raises(ValueError, match="mixable"):
        Mixture(sources, {"long": 1.0, "lognormal": 1.0}, length=10)
    mixable = {name: rows.mixable() for name, rows in sources.items()}
    sizes = {name: len(rows) for name, rows in mixable.items()}
    mix = Mixture(mixable, {name: float(n) for name, n in sizes.items()}, seed=2,
                  max_passes=2, block_size=16)
    loader = Loader(mix, 4, output="numpy", num_threads=0, drop_last=False)
    batches = list(loader)
    seen: dict[str, list[list[int]]] = {name: [] for name in mixable}
    names = mix.names
    for batch in batches:
        columns = batch["doc_ids"]
        for row in range(len(batch["padding"])):
            if not batch["padding"][row]:
                seen[names[int(batch["source"][row])]].append(columns[row].tolist())
    for name, rows in seen.items():
        lengths = open_dataset(corpora[name]).documents().lengths(np.arange(DOCS))
        expected = Counter({d: -(-int(n) // seq_len) for d, n in enumerate(lengths)})
        first = Counter(d for row in rows[:sizes[name]] for d in row)
        assert first == expected, name  # pass 0: every piece exactly once
        second = Counter(d for row in rows[sizes[name]:] for d in row)
        assert not second - expected, name  # pass 1 (maybe cut by the stop): no repeat
    # resume mid-way, with another batch size: the rest equals the uninterrupted run
    again = Loader(mix, 4, output="numpy", num_threads=0, drop_last=False)
    steps = iter(again)
    for _ in range(5):
        next(steps)
    state = again.state_dict()
    resumed = Loader(Mixture(mixable, {name: float(n) for name, n in sizes.items()}, seed=2,
                             max_passes=2, block_size=16),
                     4, output="numpy", num_threads=0, drop_last=False)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(batches) - 5
    for got, want in zip(rest, batches[5:], strict=True):
        np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
        np.testing.assert_array_equal(got["labels"], want["labels"])
        np.testing.assert_array_equal(got["source"], want["source"])
