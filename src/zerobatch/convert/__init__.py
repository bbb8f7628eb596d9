"""Convert texts (JSONL, Parquet, Arrow, text files) into token datasets::

    from zerobatch.convert import convert
    convert("corpus/*.jsonl.zst", "dataset", tokenizer="tokenizer.json",
            metadata_fields=["url"], workers=8)

Work is split into tasks that write their own shards in parallel (a process
pool, or any ``concurrent.futures.Executor`` such as a Dask cluster's), then
joined by one ``combine``; the result is byte-identical for any worker count.
"""

from __future__ import annotations

from zerobatch.convert.api import ConvertResult, convert
from zerobatch.convert.encoders import ByteEncoder, resolve_tokenizer, token_dtype
from zerobatch.convert.tasks import map_spans

__all__ = ["ByteEncoder", "ConvertResult", "convert", "map_spans", "resolve_tokenizer",
           "token_dtype"]
