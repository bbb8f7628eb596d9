"""convert_chat against transformers' apply_chat_template on a locally trained tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zerobatch import FormatError, Loader, open_dataset
from zerobatch.convert.chat import CHATML, ChatTemplate, convert_chat, encode_conversation

_TEXT = ("hello there how are you today I am fine thanks what is the weather like it is "
         "sunny and warm tell me a joke why did the chicken cross the road to get to the "
         "other side abab abab abab")
WORDS = _TEXT.split()
SPECIAL = ["<|im_start|>", "<|im_end|>", "<unk>"]
LLAMA_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'system' %}{{ '<<SYS>>' + message['content'] + '<</SYS>>' }}"
    "{% else %}{% generation %}{{ ' ' + message['content'] + eos_token }}{% endgeneration %}"
    "{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = np.random.default_rng(0)
    text = [" ".join(rng.choice(WORDS, 12)) for _ in range(400)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[*SPECIAL, "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _conversations(count: int, seed: int) -> list[list[dict[str, str]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        turns = []
        if rng.random() < 0.3:
            turns.append({"role": "system", "content": " ".join(rng.choice(WORDS, 4))})
        for _ in range(int(rng.integers(1, 4))):
            turns.append({"role": "user", "content": " ".join(rng.choice(WORDS, 5))})
            turns.append({"role": "assistant",
                          "content": " ".join(rng.choice(WORDS, int(rng.integers(1, 9))))})
        out.append(turns)
    return out


def _jsonl(path: Path, conversations: list) -> Path:
    path.write_text("".join(json.dumps({"messages": c, "id": i}) + "\n"
                            for i, c in enumerate(conversations)))
    return path


@pytest.mark.parametrize("template", ["chatml", "llama_like"])
def test_same_ids_and_mask_as_transformers(tokenizer_file, tmp_path, template):
    from transformers import PreTrainedTokenizerFast

    conversations = _conversations(25, 1)
    source = CHATML
    template_path = None
    if template == "llama_like":  # given as a tokenizer_config.json
        source = LLAMA_LIKE.replace("{{ bos_token }}", "<s>").replace("eos_token", "'</s>'")
        template_path = tmp_path / "tokenizer_config.json"
        template_path.write_text(json.dumps({"chat_template": source}))
    result = convert_chat(_jsonl(tmp_path / "chat.jsonl", conversations), tmp_path / "data",
                          tokenizer=tokenizer_file, template=template_path, quiet=True)
    assert result.conversations == 25 and result.boundary_merges == 0
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    hf.chat_template = source
    docs = open_dataset(tmp_path / "data").documents()
    batch = docs.read(np.arange(len(docs)))
    for i, messages in enumerate(conversations):
        want = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        assert batch["input_ids"][i].tolist() == list(want["input_ids"])
        assert batch["loss_mask"][i].tolist() == list(want["assistant_masks"])
        assert sum(want["assistant_masks"]) > 0
        spans = batch["metadata"][i]
        mask = np.zeros(len(want["input_ids"]), int)
        for start, end, kind in spans:
            assert kind == "assistant"
            mask[start:end] = 1
        assert mask.tolist() == list(want["assistant_masks"])


def test_packed_conversations_train_on_assistant_tokens(tokenizer_file, tmp_path):
    convert_chat(_jsonl(tmp_path / "chat.jsonl", _conversations(60, 2)), tmp_path / "data",
                 tokenizer=tokenizer_file, quiet=True)
    docs = open_dataset(tmp_path / "data").documents()
    by_spans = docs.packed(128, window=16, loss_spans="assistant", labels="aligned")
    by_field = docs.packed(128, window=16, loss_mask="loss_mask", labels="aligned")
    im_start = json.loads(tokenizer_file.read_text())["added_tokens"][0]["id"]
    rows = 0
    for a, b in zip(Loader(by_spans, 4, drop_last=False, output="numpy", num_threads=0),
                    Loader(by_field, 4, drop_last=False, output="numpy", num_threads=0),
                    strict=True):
        assert (a["labels"] == b["labels"]).all()
        assert not (a["labels"] == im_start).any()  # no loss on the template's tokens
        rows += int((~a["padding"]).sum())
    assert rows == len(by_spans)


def test_boundary_inside_a_token_is_detected(tokenizer_file):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    assert len(tok.encode("abab", add_special_tokens=False).ids) < 4  # 'ab' merged
    template = ChatTemplate("{% for m in messages %}{{ 'a' }}{% generation %}"
                            "{{ m['content'] }}{% endgeneration %}{% endfor %}")
    _, _, _, same = encode_conversation(template, tok, [{"role": "assistant",
                                                          "content": "bab"}])
    assert not same
    _, mask, _, same = encode_conversation(ChatTemplate(), tok, [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert same and sum(mask) > 0


def test_malformed_lines_name_file_and_line(tokenizer_file, tmp_path):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    for bad, message in [("{not json", "malformed JSON"),
                         ('{"text": "hi"}', "expected"),
                         ('{"messages": [{"role": "user"}]}', r"messages\[0\]")]:
        path = tmp_path / "bad.jsonl"
        path.write_text(f"{good}\n\n{bad}\n")
        with pytest.raises(FormatError, match=f"line 3: {message}") as info:
            convert_chat(path, tmp_path / "out", tokenizer=tokenizer_file, quiet=True)
        assert "bad.jsonl" in str(info.value)
    path.write_text(good + "\n")
    with pytest.raises(FormatError, match="line 1: the chat template failed"):
        convert_chat(path, tmp_path / "out2", tokenizer=tokenizer_file, quiet=True,
                     template=str(_template(tmp_path, "{{ raise_exception('no') }}")))


def _template(folder: Path, text: str) -> Path:
    path = folder / "t.jinja"
    path.write_text(text)
    return path


def test_cli_convert_chat(tokenizer_file, tmp_path, capsys):
    from zerobatch.cli import main

    path = _jsonl(tmp_path / "chat.jsonl", _conversations(5, 3))
    assert main(["convert", "--chat", str(path), "-o", str(tmp_path / "data"), "--tokenizer",
          str(tokenizer_file), "--quiet"]) == 0
    assert len(open_dataset(tmp_path / "data").documents()) == 5
