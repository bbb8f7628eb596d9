"""The package's shape: every public name of today still imports, every public module
declares ``__all__``, and no two modules of ``src/`` import each other (directly or
around a loop).

``PUBLIC`` is the ``__all__`` of each public module (no path part starting with an
underscore) as of issue 20, written out as data: removing or renaming one of these
names breaks a user's import, so it fails here. A new name needs no entry; a moved
one keeps its old path working (a re-export, or a module ``__getattr__``).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import zerobatch

SRC = Path(__file__).resolve().parents[1] / "src"

PUBLIC: dict[str, str] = {  # module -> its public names, space-separated
    "zerobatch": (
        "Batch BatchMeta BlockShuffle Feistel FormatError Jagged Loader Plan Source StorageError "
        "StreamWriter combine open_dataset verify"
    ),
    "zerobatch.batch_format": (
        "BatchHeader DTYPE_CODES HEADER_SIZE MAGIC MANIFEST_FORMAT MANIFEST_NAME PAGE VERSION "
        "dtype_code read_header"
    ),
    "zerobatch.batch_loader": "BatchFileReader BatchNativeLoader describe is_batch_file",
    "zerobatch.batch_writer": "write_batch_dataset write_batch_file",
    "zerobatch.cli": "main",
    "zerobatch.columnar": "Batch BatchMeta FieldSchema Jagged",
    "zerobatch.columnar.batch": "Batch",
    "zerobatch.columnar.frames": "FORMAT VERSION decode encode",
    "zerobatch.columnar.jagged": "Jagged as_positions offsets_problem",
    "zerobatch.columnar.legacy": "SampleField SampleView Samples",
    "zerobatch.columnar.meta": "BatchMeta chunk_bounds",
    "zerobatch.columnar.schema": "Column DTYPES FieldSchema KINDS PerSampleShapes normalize_column",
    "zerobatch.columnar.views": "IndexList PartitionIds",
    "zerobatch.columnar.wire": "MAX_HEADER_BYTES expect pack read_array register_encoder unpack",
    "zerobatch.convert": (
        "ByteEncoder ConvertResult convert map_spans resolve_tokenizer token_dtype"
    ),
    "zerobatch.convert.api": "ConvertResult convert work_folder",
    "zerobatch.convert.encoders": (
        "BYTES ByteEncoder Encoded Encoder EncoderSpec HFEncoder resolve_tokenizer token_dtype"
    ),
    "zerobatch.convert.inputs": (
        "InputFile Record Task expand_inputs open_input plan_tasks read_records"
    ),
    "zerobatch.convert.tasks": "Job TaskStats map_spans run_task",
    "zerobatch.demo": "code_spans corpus_files main",
    "zerobatch.errors": "FormatError StorageError",
    "zerobatch.jax": (
        "DataConfig GlobalSteps ShardDataset check_layout check_sharding get_datasets local_box "
        "local_rows to_global"
    ),
    "zerobatch.jax.shards": "DataConfig ShardDataset get_datasets",
    "zerobatch.llmbatch": (
        "BatchFileReader BatchHeader BatchNativeLoader describe is_batch_file read_header "
        "write_batch_dataset write_batch_file"
    ),
    "zerobatch.llmbatch.format": (
        "BatchHeader DTYPE_CODES HEADER_SIZE MAGIC MANIFEST_FORMAT MANIFEST_NAME MANIFEST_VERSION "
        "MAX_MANIFEST_BYTES PAGE VERSION check_manifest dtype_code load_manifest manifest_bytes "
        "read_header read_manifest_format shard_name shard_path"
    ),
    "zerobatch.llmbatch.loader": "BatchNativeLoader",
    "zerobatch.llmbatch.reader": "BatchFileReader describe is_batch_file",
    "zerobatch.llmbatch.writer": "write_batch_dataset write_batch_file",
    "zerobatch.loader": "Loader Source fingerprint read_step resolve_rank",
    "zerobatch.plan": "Plan Planned Position STATE_VERSION epoch_seed rank_steps",
    "zerobatch.service": (
        "BatchClient BatchServer CurveKeys FieldStore FieldStoreServer FieldTable ServiceError"
    ),
    "zerobatch.service.batches": "BatchServer PLAN_KEYS serve_dataset",
    "zerobatch.service.client": "BatchClient",
    "zerobatch.service.fieldstore": "FieldStore FieldStoreServer FieldTable",
    "zerobatch.shuffle": "BlockShuffle DEFAULT_ROUNDS Feistel MAX_LENGTH",
    "zerobatch.source": "Source fingerprint read_indices read_step resolve_rank",
    "zerobatch.storage": (
        "LocalStorage OBJECT_SCHEMES ObjectStorage Storage is_url join local_path open_storage"
    ),
    "zerobatch.storage.blocks": "BLOCK_SIZE BlockCache BlockSource CACHE_BYTES CACHE_DIR_BYTES",
    "zerobatch.storage.local": (
        "LocalStorage METHODS MOUNTINFO NETWORK_FILE_SYSTEMS check_status file_system_type "
        "is_network prefetch_request read_request resolve_method"
    ),
    "zerobatch.storage.object": "COALESCE CREDENTIAL_VARIABLES ObjectStorage",
    "zerobatch.storage.opener": "open_storage",
    "zerobatch.storage.protocol": "Storage byte_view check_buffer",
    "zerobatch.storage.publish": (
        "AtomicFile LOCK LocalPublisher ObjectPublisher Publisher StagedFile fsync_folder "
        "publisher"
    ),
    "zerobatch.storage.url": "OBJECT_SCHEMES is_url join local_path open_storage",
    "zerobatch.stream": (
        "Dataset Documents NpyTokens NpyWindows Problem SpanTable Spans StreamWriter TokenWindows "
        "Tokenizer combine describe format_problems is_dataset open_dataset open_npy verify"
    ),
    "zerobatch.stream.combine": "combine",
    "zerobatch.stream.manifest": (
        "DOCS DOCUMENT_KIND FORMAT MANIFEST MAX_MANIFEST_BYTES META_DATA META_ID META_ID_DTYPE "
        "META_INDEX META_SPANS Manifest NO_METADATA OFFSET_DTYPE SPANS_VERSION SPAN_DTYPE "
        "SPAN_FIELDS SPAN_KIND Shard TOKEN TOKENS TOKEN_DTYPES Tokenizer VERSIONS check_sizes "
        "expected_sizes is_dataset manifest_bytes parse_manifest read_manifest record_dtype "
        "shard_name write_manifest"
    ),
    "zerobatch.stream.npy": "MAX_HEADER NpyTokens NpyWindows is_npy_folder open_npy",
    "zerobatch.stream.ranged": "IndexView RangedIndex",
    "zerobatch.stream.reader": "Dataset Documents TokenWindows open_dataset",
    "zerobatch.stream.serializers": (
        "BUILTIN Serializer get_serializer loads_many npy_loads serializer_name"
    ),
    "zerobatch.stream.spans": "SpanTable Spans",
    "zerobatch.stream.validate": (
        "covering_ids data_bytes docs_table index_table offsets run_ids span_rows spans_table"
    ),
    "zerobatch.stream.verify": "Problem describe format_problems verify",
    "zerobatch.stream.writer": "DEFAULT_SHARD_TOKENS StreamWriter",
    "zerobatch.tensors": (
        "BINTENSORS HEADER_LIMIT Header METADATA_LIMIT SAFETENSORS SafetensorError SliceError "
        "TensorInfo TensorNotFound TensorSlice TensorSpec checksum describe deserialize "
        "is_tensor_file load load_file safe_open save save_file save_with_checksum serialize "
        "serialize_file"
    ),
    "zerobatch.tensors.flax": (
        "SafetensorError TensorSpec deserialize load load_file safe_open save save_file serialize "
        "serialize_file"
    ),
    "zerobatch.tensors.format": (
        "ALIGNMENT BINTENSORS BINTENSORS_CODE BINTENSORS_ID DTYPES DType FORMATS HEADER_LIMIT "
        "Header LENGTH_SIZE MAX_DIMS METADATA_KEY METADATA_LIMIT SAFETENSORS SAFETENSORS_CODE "
        "SafetensorError SliceError TensorInfo TensorNotFound check_layout code_of_numpy detect "
        "encode_header numpy_dtype read_header read_header_at"
    ),
    "zerobatch.tensors.jax": (
        "SafetensorError TensorSpec deserialize load load_file safe_open save save_file serialize "
        "serialize_file"
    ),
    "zerobatch.tensors.numpy": (
        "SafetensorError TensorSpec deserialize load load_file safe_open save save_file serialize "
        "serialize_file"
    ),
    "zerobatch.tensors.torch": (
        "SafetensorError TensorSpec _filter_shared_not_shared _find_shared_tensors _is_complete "
        "_remove_duplicate_names deserialize load load_file load_model safe_open save save_file "
        "save_model serialize serialize_file storage_ptr storage_size"
    ),
    "zerobatch.tools": "Distributions bench distributions plot",
    "zerobatch.tools.bench": "BenchResult bench",
    "zerobatch.tools.stats": "Distributions distributions plot",
    "zerobatch.torch": "LoaderDataset",
    "zerobatch.varlen": "IGNORE_INDEX LABEL_MODES OUTPUTS segment_layout to_output varlen_columns",
}


def _public_modules() -> list[str]:
    names = ["zerobatch"]
    for info in pkgutil.walk_packages(zerobatch.__path__, "zerobatch."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_still_import(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in PUBLIC[module].split() if not hasattr(imported, name)]
    assert not missing, f"{module} no longer has {missing}: keep the old import path working"


def test_every_public_module_declares_all() -> None:
    problems = []
    for module in _public_modules():
        imported = importlib.import_module(module)
        names = getattr(imported, "__all__", None)
        if names is None:
            problems.append(f"{module}: no __all__")
            continue
        problems += [f"{module}.__all__ names {name!r}, which it does not define"
                     for name in names if not hasattr(imported, name)]
    assert not problems, "\n".join(problems)


# -- import cycles ------------------------------------------------------------------


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module under src/."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _targets(modules: dict[str, tuple[Path, bool]], name: str, package: bool,
             node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules of src/ that ``node`` (in module ``name``) imports."""
    if isinstance(node, ast.Import):
        targets = []
        for alias in node.names:
            target = alias.name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            targets += [target] if target else []
        return targets
    base = node.module or ""
    if node.level:
        parts = name.split(".") if package else name.split(".")[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    targets = []
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:  # from package import submodule
            targets.append(f"{base}.{alias.name}")
        elif base in modules:
            targets.append(base)
    return targets


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {imported module of src/: line}, for every import statement: at module
    level, under ``if TYPE_CHECKING:``, and inside functions, except in a module-level
    ``__getattr__`` (PEP 562: the lazy alias that keeps a moved name's old path working,
    run only when that old path is used)."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}

    def visit(name: str, package: bool, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, ast.FunctionDef) and child.name == "__getattr__"
                    and isinstance(node, ast.Module)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(modules, name, package, child):
                    if target != name:
                        graph[name].setdefault(target, child.lineno)
            visit(name, package, child)

    for name, (path, package) in modules.items():
        visit(name, package, ast.parse(path.read_text(), str(path)))
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    graph = import_graph()
    problems = []
    for component in cycles(graph):
        members = set(component)
        edges = [f"  {module} -> {target} (line {line})"
                 for module in component for target, line in sorted(graph[module].items())
                 if target in members]
        problems.append("import cycle between " + ", ".join(component) + ":\n"
                        + "\n".join(edges))
    assert not problems, ("\n".join(problems) + "\nBreak it: move the shared part into a "
                          "lower module, or type against a Protocol instead of importing")


def test_the_cycle_check_sees_cycles() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}, "e": {"e": 1}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert "zerobatch.storage.url" in graph["zerobatch.storage.opener"]  # module level
    assert "zerobatch.storage.protocol" in graph["zerobatch.storage.blocks"]
    assert "zerobatch.storage.opener" not in graph["zerobatch.storage.url"]  # __getattr__
    assert "zerobatch.columnar.meta" in graph["zerobatch.columnar"]  # package __init__
    assert "zerobatch.convert" in graph["zerobatch.cli"]  # inside a function
    assert "zerobatch.llmbatch" in graph["zerobatch.cli"]  # from zerobatch import llmbatch
