"""``zerobatch._jit``: a fresh process loads its cached kernels with Numba's
runtime alone, never importing Numba's whole compiler (nor SciPy through its
BLAS check), and reads the same batches as the process that compiled them.

Every first-batch case runs in two child processes, one after the other: the
first may compile what this process did not (and caches it), the second
loads every kernel from the cache. Both must print the batches this process
reads.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest
from numba.core.caching import FunctionCache

from zerobatch import Loader, StreamWriter, _jit, open_dataset
from zerobatch.mixture import Mixture

# Modules that a cache load must not import: Numba's lowering registries
# (``arraymath`` imports ``scipy.linalg``), SciPy's linear algebra, NumPy's
# masked arrays (Numba's typeof asks them), Numba's typed lists, and the
# modules of Numba's own overloads (``arrayobj``: an environment's globals).
HEAVY = ("numba.np.arraymath", "numba.np.linalg", "numba.np.npyimpl", "scipy.linalg",
         "numpy.ma", "numba.typed.typedlist", "numba.np.arrayobj", "numba.cpython.charseq")

CASES = {
    "windows": "ds.windows(64, document_masking=True)",
    "documents": "ds.documents()",
    "mixture": "Mixture({'a': ds.windows(64), 'b': other.windows(64)}, {'a': 0.7, 'b': 0.3},"
               " length=200)",
    "packed": "ds.documents().packed(96)",
}

_CHILD = """
import hashlib, json, sys
import numpy as np
from zerobatch import Loader, open_dataset
from zerobatch.mixture import Mixture
from numba.core import entrypoints
from numba.core.runtime import nrtdynmod
compiled = []
_create = nrtdynmod.create_nrt_module
nrtdynmod.create_nrt_module = lambda *a: compiled.append(1) or _create(*a)
ds, other = open_dataset(sys.argv[1]), open_dataset(sys.argv[2])
for case, source in {cases!r}.items():
    loader = Loader(eval(source), 4, seed=5, output="numpy")
    batches = [b for _, b in zip(range(3), loader, strict=False)]
    heavy = [m for m in {heavy!r} if m in sys.modules]
    print(json.dumps({{"case": case, "digest": digest(batches), "heavy": heavy,
                      "runtime compiled": len(compiled),
                      "extensions loaded": entrypoints._already_initialized}}))
"""


def digest(batches: list[Any]) -> str:
    """A hash of every column of ``batches`` (names, dtypes, values)."""
    h = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch.keys()):
            column = batch[name]  # an array, or a Jagged's values and offsets
            for part in ((column.values, column.offsets) if hasattr(column, "offsets")
                         else (column,)):
                value = np.ascontiguousarray(part)
                h.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
                h.update(value.tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("jit")
    rng = np.random.default_rng(3)
    paths = []
    for name, documents in (("one", 120), ("two", 60)):
        with StreamWriter(root / name, token_dtype="<u2") as writer:
            for _ in range(documents):
                writer.add_document(rng.integers(0, 50_000, int(rng.integers(1, 90)), np.uint16))
        paths.append(root / name)
    return paths[0], paths[1]


def test_a_fresh_process_loads_its_kernels_without_numbas_compiler(
        corpora: tuple[Path, Path]) -> None:
    one, two = corpora
    ds, other = open_dataset(one), open_dataset(two)
    expected = {}
    for case, source in CASES.items():
        loader = Loader(eval(source, {"Mixture": Mixture}, {"ds": ds, "other": other}), 4,
                        seed=5, output="numpy")
        expected[case] = digest([b for _, b in zip(range(3), loader, strict=False)])
    child = "import hashlib\nimport numpy as np\nfrom typing import Any\n" + inspect.getsource(
        digest) + _CHILD.format(cases=CASES, heavy=HEAVY)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    for run in ("compiles what is missing", "loads from the cache"):
        out = subprocess.run([sys.executable, "-c", child, str(one), str(two)], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr[-3000:]
        results = [json.loads(line) for line in out.stdout.strip().splitlines()[-len(CASES):]]
        assert [r["case"] for r in results] == list(CASES)
        for result in results:
            case = result["case"]
            assert result["digest"] == expected[case], (
                f"{case}: the child that {run} read other batches")
    for result in results:  # the second child's: modules accumulate, case by case
        assert result["runtime compiled"] == 0, "Numba's runtime was compiled, not loaded"
        assert not result["extensions loaded"], (
            f"{result['case']}: cached kernels loaded every package's Numba extensions")
        assert result["heavy"] == [], (
            f"{result['case']} (or a case before it): loading cached kernels imported "
            f"{result['heavy']}: a kernel on this path calls a NumPy function Numba implements "
            "in numba.np.arraymath, or the light load fell back to Numba's (see zerobatch._jit)")


def test_a_load_this_path_cannot_rebuild_is_left_to_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong in the light load, Numba's own load runs instead
    (and a kernel it cannot load either compiles)."""
    seen: list[Any] = []

    def fails(self: Any, sig: Any, target_context: Any) -> Any:
        raise RuntimeError("an entry the light load cannot rebuild")

    monkeypatch.setattr(_jit._KernelCache, "_load_overload", fails)
    monkeypatch.setattr(FunctionCache, "load_overload",
                        lambda self, sig, target_context: seen.append(sig))

    def twice(x: int) -> int:
        return 2 * x

    kernel = _jit.njit(twice, cache=True)
    assert isinstance(kernel._cache, _jit._KernelCache)
    assert kernel(21) == 42  # Numba's load found nothing: compiled
    # once from the light first call, once from Numba's compile that follows it
    assert [str(s) for s in seen] == ["(int64,)", "(int64,)"]


@pytest.mark.parametrize("value", [
    np.zeros(3), np.zeros((3, 4), np.uint16)[:, ::2], np.zeros((3, 4), order="F"),
    np.frombuffer(b"abcd", np.uint8), np.zeros(0, np.int8)[None], np.zeros(()),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]), np.zeros(2, dtype="<M8[s]"),
    np.zeros(2, dtype=object), np.zeros(2, dtype="<U3"),
    (np.zeros(2), np.zeros(2)), (np.zeros(2), np.zeros(2, np.int32)),
    (np.zeros(2), 3, 2.5, True, np.int32(4), np.float32(1), 2**63, (np.zeros(1), -2**40)),
], ids=lambda v: type(v).__name__)
def test_an_array_is_typed_as_numba_types_it(value: Any) -> None:
    assert _jit._array_type(value) == numba.typeof(value)


@pytest.mark.parametrize("value", [
    np.ma.masked_array([1, 2]), np.zeros(2).view(type("Subclass", (np.ndarray,), {})), (),
    (np.zeros(1), "text"), (np.zeros(1), 2**64), 3, [np.zeros(1)], (np.zeros(1), [1]),
], ids=lambda v: type(v).__name__)
def test_anything_else_is_left_to_numbas_typeof(value: Any) -> None:
    assert _jit._array_type(value) is None


def test_a_saved_runtime_is_used_only_for_its_own_key(tmp_path: Path) -> None:
    path = str(tmp_path / "runtime.nbr")
    assert _jit._read_runtime(path, "key") is None  # no file
    state = ("nrt", "object", (b"machine code", b"bitcode"))
    _jit._write_runtime(path, "key", state)
    assert _jit._read_runtime(path, "key") == state
    assert _jit._read_runtime(path, "another Numba, LLVM or CPU") is None
    Path(path).write_bytes(b"\x80\x05truncated")
    assert _jit._read_runtime(path, "key") is None
    _jit._write_runtime(str(tmp_path / "none" / "runtime.nbr"), "key", state)  # no folder: nothing
    assert os.listdir(tmp_path) == ["runtime.nbr"]


def test_a_signature_compiles_when_decorated_as_numba_does() -> None:
    kernel = _jit.njit("int64(int64)", cache=False)(lambda x: x + 1)
    assert [str(s) for s in kernel.signatures] == ["(int64,)"]
    assert kernel(1) == 2
    with pytest.raises(TypeError):
        kernel(1.5j)  # compiling another signature is off, as numba.njit(signature) leaves it


_CALLEE = "from zerobatch._jit import njit\n\n@njit(inline='always')\ndef value():\n    return {}\n"
_CALLER = """from zerobatch._jit import njit
from kernels.callee import value

@njit(cache=True)
def get():
    return value()
"""


def test_a_kernel_compiles_again_when_a_callees_module_changes(tmp_path: Path) -> None:
    """The caller's file is unchanged, its callee's module is edited: a cached
    caller must not keep the callee it inlined before. (With ``numba.njit``
    in the caller, numba 0.68 prints 1 at the end: its entries are stamped
    with the caller's file alone.)"""
    package = tmp_path / "kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "caller.py").write_text(_CALLER)
    callee = package / "callee.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}

    def get() -> int:
        out = subprocess.run([sys.executable, "-c", "from kernels.caller import get; print(get())"],
                             env=env, capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr[-3000:]
        return int(out.stdout.split()[-1])

    callee.write_text(_CALLEE.format(1))
    assert get() == 1  # compiled and cached
    assert get() == 1  # loaded from the cache
    callee.write_text(_CALLEE.format(2))
    later = callee.stat().st_mtime_ns + 10**9
    os.utime(callee, ns=(later, later))
    assert get() == 2


def test_an_environment_of_a_numba_module_not_imported_is_not_imported() -> None:
    from numba.core import types
    from numba.core.environment import Environment

    absent = "numba.zerobatch_absent_module"  # importing it would raise
    environment = _jit._rebuild_environment(absent, [1, "two"], "env-of-an-absent-module")
    assert absent not in sys.modules
    assert environment.globals == {"__name__": absent} and list(environment.consts) == [1, "two"]
    assert environment.can_cache()  # a caller that inlines it can still be cached
    assert _jit._rebuild_environment(absent, [], "env-of-an-absent-module") is environment
    assert Environment._memo["env-of-an-absent-module"] is environment
    imported = _jit._rebuild_environment("numba.core.types", [], "env-of-an-imported-module")
    assert imported.globals is vars(types)  # Numba's own rebuild: the module's globals
    with pytest.raises(ModuleNotFoundError):  # another package's module: imported, as Numba does
        _jit._rebuild_environment("zerobatch_absent_module", [], "env-of-another-package")


_LINKED = """from zerobatch._jit import njit
import numpy as np

@njit(cache=True)
def cached(x):
    return np.full(3, x).sum()

def compile_caller():
    @njit  # compiled in this process: links the cached kernel's library
    def caller(x):
        return cached(x) + 1
    return caller
"""


def test_a_kernel_compiled_later_links_a_cached_one(tmp_path: Path) -> None:
    """A loaded kernel's bitcode is parsed only when something links it: a
    kernel compiled in the same process that calls it must still link and run."""
    package = tmp_path / "linked"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernels.py").write_text(_LINKED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    code = ("from linked.kernels import cached, compile_caller\n"
            "from zerobatch import _jit\n"
            "print(cached(2), compile_caller()(5), cached._cache_hits[cached.signatures[0]],\n"
            "      type(cached.overloads[cached.signatures[0]].library).__name__)")
    outputs = []
    for _ in range(2):  # compiles and caches, then loads from the cache
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr[-3000:]
        outputs.append(out.stdout.split())
    assert outputs[0][:3] == ["6", "16", "0"]
    assert outputs[1] == ["6", "16", "1", "_DeferredLibrary"]
