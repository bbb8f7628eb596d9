"""``convert_chat``: conversations (JSONL of ``{"messages": [...]}``) into a dataset
whose assistant turns carry the loss.

Each line is one conversation, ``{"messages": [{"role": ..., "content": ...},
...]}`` (other keys are ignored), the format of the Hugging Face ecosystem.
It is rendered with a chat template: Jinja text like the ``chat_template`` of
a ``tokenizer_config.json`` (pass that file, or a ``.jinja`` file), rendered
the way ``transformers`` renders it (a sandboxed environment, ``trim_blocks``
and ``lstrip_blocks``, ``raise_exception``, ``strftime_now`` and the
``{% generation %}`` block). The text inside ``{% generation %} ...
{% endgeneration %}`` is what the model learns to produce; :data:`CHATML`, the
default, wraps each assistant turn's content and its ``<|im_end|>`` in one.

The text is tokenized whole (no special tokens added), and a token takes the
loss when it overlaps a generation block, exactly as ``transformers``'
``apply_chat_template(..., return_assistant_tokens_mask=True)`` decides. Each
document stores the ids, a per-token field ``loss_mask`` (uint8, 1 = take the
loss) and a span ``(start, end, "assistant")`` per block, so
``documents().packed(seq_len, loss_mask="loss_mask")`` or
``loss_spans="assistant"`` trains on the assistant turns only.

A template's boundaries can fall inside a token (the last characters before a
block and its first ones merge into one token): the whole text's tokens are
compared with the tokens of its pieces cut at the block boundaries, and a
conversation where they differ is counted (``ChatResult.boundary_merges``)
and the first is logged with its file and line: there the mask follows the
whole text's tokens, as transformers' does.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from zerobatch.errors import FormatError

__all__ = ["CHATML", "ChatResult", "ChatTemplate", "convert_chat", "load_template"]

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The default template: ChatML, each assistant turn's content and ``<|im_end|>``
in a generation block."""

ASSISTANT = "assistant"
"""The kind of the spans that mark generation blocks."""

_log = logging.getLogger("zerobatch.convert")


def _generation_extension() -> type:
    """The jinja2 extension of ``{% generation %}``: records where each block's
    output starts and ends in the rendered text."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a plain attribute)

        def __init__(self, environment: Any) -> None:
            super().__init__(environment)
            self.rendered: list[str] | None = None
            self.blocks: list[tuple[int, int]] | None = None

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_block")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _block(self, caller: Any) -> str:
            text = caller()
            if self.rendered is not None and self.blocks is not None:
                start = sum(map(len, self.rendered))
                self.blocks.append((start, start + len(text)))
            return str(text)

        @contextmanager
        def tracking(self, rendered: list[str], blocks: list[tuple[int, int]]) -> Iterator[None]:
            self.rendered, self.blocks = rendered, blocks
            try:
                yield
            finally:
                self.rendered = self.blocks = None

    return Generation


class ChatTemplate:
    """A compiled chat template. ``render(messages)`` returns the text and the
    ``(start, end)`` characters of each generation block. Not thread-safe
    (one render at a time)."""

    def __init__(self, source: str = CHATML) -> None:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def strftime_now(format: str) -> str:
            return datetime.now().strftime(format)

        self.source = source
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=[_generation_extension(), "jinja2.ext.loopcontrols"])
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = strftime_now
        self._template = environment.from_string(source)
        self._tracker = next(e for e in environment.extensions.values()
                             if hasattr(e, "tracking"))

    def render(self, messages: Sequence[Any], **variables: Any
               ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and its generation blocks (character ranges)."""
        rendered: list[str] = []
        blocks: list[tuple[int, int]] = []
        with self._tracker.tracking(rendered, blocks):
            for piece in self._template.generate(messages=list(messages), **variables):
                rendered.append(piece)
        return "".join(rendered), blocks


def load_template(path: str | os.PathLike[str] | None) -> str:
    """A template's text: :data:`CHATML` for None; the ``chat_template`` of a
    ``tokenizer_config.json`` (a string, or the entry named ``"default"`` of a
    list of ``{name, template}``); else the file's text (``.jinja``)."""
    if path is None:
        return CHATML
    text = Path(path).read_text(encoding="utf-8")
    if not str(path).endswith(".json"):
        return text
    try:
        config = json.loads(text)
    except ValueError as error:
        raise FormatError(f"not JSON ({error})", path=path, field="chat_template") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str):
        raise FormatError("expected a chat_template string (or a list with a 'default' "
                          "entry)", path=path, field="chat_template")
    return template


@dataclass
class ChatResult:
    """What :func:`convert_chat` wrote."""

    conversations: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    boundary_merges: int = 0

    def summary(self) -> str:
        share = self.loss_tokens / self.tokens if self.tokens else 0.0
        return (f"{self.conversations} conversations, {self.tokens} tokens, "
                f"{100 * share:.1f}% take the loss; {self.boundary_merges} with a block "
                "boundary inside a token")


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    if path.suffix == ".zst":
        import zstandard

        with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as z:
            import io

            yield from enumerate(io.BufferedReader(z), start=1)
        return
    with opener(path, "rb") as file:
        yield from enumerate(file, start=1)


def _messages(path: Path, number: int, line: bytes) -> list[dict[str, Any]] | None:
    """The messages of one JSONL line (None: a blank line); FormatError naming
    the file and line otherwise."""
    if not line.strip():
        return None
    where = f"line {number}"
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        raise FormatError(f"{where}: malformed JSON ({error})", path=path,
                          field="messages") from None
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list) or not messages:
        raise FormatError(f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}, '
                          f"...]}}, got {str(value)[:80]!r}", path=path, field="messages")
    for i, message in enumerate(messages):
        if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)):
            raise FormatError(f"{where}: messages[{i}] must be an object with string 'role' "
                              f"and 'content', got {str(message)[:80]!r}", path=path,
                              field="messages")
    return messages


def encode_conversation(template: ChatTemplate, tokenizer: Any, messages: Sequence[Any]
                        ) -> tuple[list[int], list[int], list[tuple[int, int]], bool]:
    """(ids, loss mask, token spans of the generation blocks, whether the
    pieces cut at the blocks' boundaries tokenize like the whole text)."""
    text, blocks = template.render(messages)
    encoding = tokenizer.encode(text, add_special_tokens=False)
    ids = list(encoding.ids)
    mask = [0] * len(ids)
    spans = []
    for start, end in blocks:
        if end <= start:
            continue
        first = encoding.char_to_token(start)
        last = encoding.char_to_token(end - 1)
        if first is None:
            continue
        stop = len(ids) if last is None else last + 1
        for t in range(first, stop):
            mask[t] = 1
        spans.append((first, stop))
    cuts = sorted({0, len(text), *(c for block in blocks for c in block)})
    pieces: list[int] = []
    for a, b in itertools.pairwise(cuts):
        if b > a:
            pieces += tokenizer.encode(text[a:b], add_special_tokens=False).ids
    return ids, mask, spans, pieces == ids


def convert_chat(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str], *, tokenizer: Any, template: str | None = None,
    shard_tokens: int | None = None, quiet: bool = False,
) -> ChatResult:
    """Render, tokenize and write the conversations of ``inputs`` (JSONL files,
    plain, ``.gz`` or ``.zst``) to a new dataset at ``output``.

    Args:
        tokenizer: a ``tokenizers`` JSON file, a folder holding
            ``tokenizer.json``, or a ``tokenizers.Tokenizer``; its special
            tokens (``<|im_start|>``, ...) must be in it for ChatML.
        template: a ``.jinja`` file or a ``tokenizer_config.json`` (its
            ``chat_template``); None: :data:`CHATML`.
        shard_tokens: tokens per shard, at most (default: the writer's).

    A malformed line raises ``FormatError`` naming the file and the line.
    """
    from tokenizers import Tokenizer

    from zerobatch.convert.encoders import load_tokenizer
    from zerobatch.stream import StreamWriter
    from zerobatch.stream.writer import DEFAULT_SHARD_TOKENS

    if isinstance(tokenizer, Tokenizer):
        tok, name = tokenizer, "tokenizer"
    else:
        tok, _, name, _ = load_tokenizer(tokenizer)
    compiled = ChatTemplate(load_template(template))
    paths = [Path(inputs)] if isinstance(inputs, (str, os.PathLike)) else [Path(p) for p in inputs]
    vocab = tok.get_vocab_size(with_added_tokens=True)
    result = ChatResult()
    with StreamWriter(output, token_dtype="<u2" if vocab <= 65536 else "<u4",
                      fields={"loss_mask": "u1"}, metadata="json",
                      shard_tokens=shard_tokens or DEFAULT_SHARD_TOKENS,
                      tokenizer={"name": name, "vocab_size": vocab}) as writer:
        for path in paths:
            for number, line in _lines(path):
                messages = _messages(path, number, line)
                if messages is None:
                    continue
                try:
                    ids, mask, spans, same = encode_conversation(compiled, tok, messages)
                except Exception as error:
                    if isinstance(error, FormatError):
                        raise
                    raise FormatError(f"line {number}: the chat template failed ({error})",
                                      path=path, field="messages") from None
                if not ids:
                    raise FormatError(f"line {number}: the conversation renders to no "
                                      "tokens", path=path, field="messages")
                if not same:
                    if not result.boundary_merges:
                        _log.warning("%s, line %d: the text tokenizes differently across a "
                                     "generation block's boundary; the loss mask follows "
                                     "the whole text's tokens (counted in boundary_merges)",
                                     path, number)
                    result.boundary_merges += 1
                writer.add_document(ids, fields={"loss_mask": mask},
                                    spans=[(a, b, ASSISTANT) for a, b in spans])
                result.conversations += 1
                result.tokens += len(ids)
                result.loss_tokens += sum(mask)
    if not quiet:
        print(result.summary())
    return result
