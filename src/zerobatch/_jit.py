"""``njit`` for zerobatch's kernels, loading them from Numba's on-disk cache
without the whole compiler.

Numba's ``FunctionCache.load_overload`` refreshes the CPU target before it
loads a cached kernel: it imports every typing and lowering registry Numba
has (NumPy's linear algebra among them, which imports ``scipy.linalg`` to
find a BLAS). In a fresh process that is 0.2-0.4 s and tens of MiB before the
first batch, though a cached kernel is machine code that needs none of it:
only Numba's runtime (NRT, for the arrays a kernel allocates). Every process
pays it: each torchrun rank, each spawned DataLoader worker.

Kernels decorated here load with the runtime alone. A kernel that is not in
the cache compiles as usual (Numba's compiler refreshes the target itself),
and a load that fails for any reason falls back to Numba's own path, so the
result never differs from ``numba.njit``'s.

Kernels reached by a first batch must not call NumPy functions that Numba
implements in ``numba.np.arraymath`` (``np.searchsorted``, ``np.cumsum``, ...):
rebuilding such a kernel imports that module, and with it SciPy. Use the
project's own loops (``stream._kernels.count_at_or_below``);
``tests/test_jit.py`` checks a fresh process's first batches.

A fresh process pays five more things on a kernel's first call that a
cached kernel does not need, and kernels decorated here skip them:

- Numba's runtime compiles its own LLVM module (reference counts, atomics;
  30-45 ms) in every process. It is compiled once and kept beside the
  kernels' cache entries, keyed by Numba's and LLVM's versions and the CPU.
- Typing an argument array asks ``np.ma`` whether it is a masked array, and
  ``np.ma`` is imported for that (15-20 ms). A plain ``ndarray`` is typed
  here, as Numba types it, without that import.
- A cached kernel's environments (one per function it inlined, Numba's
  own overloads of ``np.empty`` among them) are rebuilt by importing each
  function's module for its globals: ``numba.np.arrayobj`` and what it
  imports cost 25-35 ms. Those globals are read only by object-mode code,
  which Numba's overloads have none of, so a Numba module that is not yet
  imported gets an environment of its name alone (a module of any other
  package, or one imported already, gets its own globals, as in Numba).
- Loading a kernel parses its LLVM bitcode (kept to link it into kernels
  compiled later) and lists the module's symbols: 4-6 ms a kernel, for
  code that runs from the object file alone. Kernels loaded here parse it
  when something links them (``_DeferredLibrary``), and their entry points
  are known from the function's descriptor.
- The first call of a kernel without a signature loads every installed
  package's Numba extensions (an ``importlib.metadata`` scan of every
  distribution: 10-16 ms here, more in a larger environment). A kernel found
  in the cache is loaded without them; one that must compile goes through
  Numba's own path, extensions included.

Numba stamps a cache entry with the mtime and size of the kernel's own file
only, though the machine code holds every callee it inlined and every global
it read, from any module: edit a callee's module alone (a git pull, a
checkout) and the caller kept its old code. Entries made here are stamped
with every ``.py`` file of the kernel's top-level package, so any change to
the package compiles its kernels again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import llvmlite
import numba
import numpy as np
from numba.core import config as _numba_config
from numba.core import errors, registry, types
from numba.core.caching import FunctionCache, IndexDataCacheFile
from numba.core.codegen import JITCodeLibrary as _JITCodeLibrary
from numba.core.compiler_lock import global_compiler_lock
from numba.core.dispatcher import Dispatcher
from numba.core.typing.typeof import Purpose, typeof
from numba.np import numpy_support

__all__ = ["njit"]

# Numba's own classes and settings, untyped for mypy (Numba has no stubs)
CPUDispatcher: Any = registry.CPUDispatcher
JITCodeLibrary: Any = _JITCodeLibrary
config: Any = _numba_config

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def _package_stamp(root: str) -> str:
    """A digest of the path, mtime and size of every ``.py`` file under ``root``."""
    stamps = []
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                stat = os.stat(path)
                stamps.append(f"{os.path.relpath(path, root)}:{stat.st_mtime_ns}:{stat.st_size}")
    return hashlib.blake2b("\n".join(stamps).encode(), digest_size=16).hexdigest()


def _package_root(py_function: Callable[..., Any]) -> str | None:
    """The folder of ``py_function``'s top-level package, or None (a script's)."""
    module = sys.modules.get(py_function.__module__.partition(".")[0])
    paths = getattr(module, "__path__", None)
    return None if not paths else str(next(iter(paths)))


class _KernelCache(FunctionCache):
    """Numba's per-function cache, loading an entry with the runtime only; its
    entries are stamped with the whole package's sources (the module docstring)."""

    def __init__(self, py_function: Callable[..., Any]) -> None:
        super().__init__(py_function)
        self._root = _package_root(py_function)
        if type(self._cache_file) is IndexDataCacheFile:  # same layout: only a method differs
            self._cache_file.__class__ = _KernelCacheFile

    def _stamp(self) -> None:
        """Stamp the entries with the package's sources: on the first load or
        save, not at import (the package's files are stat-ed once a process)."""
        if self._root is not None:
            cache_file = self._cache_file
            cache_file._source_stamp = (cache_file._source_stamp, _package_stamp(self._root))
            self._root = None

    def save_overload(self, sig: Any, data: Any) -> None:
        self._stamp()
        super().save_overload(sig, data)

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        self._stamp()
        try:
            _initialize_runtime(target_context, self._cache_path)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:  # an entry this path cannot rebuild: Numba's own load
            return super().load_overload(sig, target_context)

    def _load_overload(self, sig: Any, target_context: Any) -> Any:
        """Numba's ``Cache._load_overload``, rebuilt by ``_rebuild``."""
        if not self._enabled:
            return None
        data = self._cache_file.load(self._index_key(sig, target_context.codegen()))
        return None if data is None else _rebuild(target_context, *data)


def _rebuild(target_context: Any, libdata: Any, fndesc: Any, env: Any, signature: Any,
             objectmode: bool, lifted: Any, typeann: Any, reload_init: Any,
             referenced_envs: Any) -> Any:
    """Numba's ``CompileResult._rebuild`` of a cache entry, with the library
    made as a ``_DeferredLibrary``."""
    from numba.core import compiler

    result_type: Any = compiler.CompileResult
    name, kind, (object_code, shared_bitcode) = libdata  # unpacked before any side effect
    if kind != "object" or objectmode:
        raise ValueError(f"a {kind!r} entry (object mode {objectmode}): Numba's own load")
    for function in reload_init or ():
        function()
    codegen = target_context.codegen()
    library = _DeferredLibrary(codegen, name)
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._deferred_bitcode = shared_bitcode
    library._finalize_final_module()  # the object code is loaded here
    codegen._engine._defined_symbols.update(  # what get_executable and callers look up
        (fndesc.llvm_func_name, fndesc.llvm_cpython_wrapper_name))
    entry_point = target_context.get_executable(library, fndesc, env)
    result = result_type(
        target_context=target_context, typing_context=target_context.typing_context,
        library=library, environment=env, entry_point=entry_point, fndesc=fndesc,
        type_annotation=typeann, signature=signature, objectmode=objectmode, lifted=lifted,
        typing_error=None, call_helper=None, metadata=None, reload_init=reload_init,
        referenced_envs=referenced_envs)
    for each in referenced_envs:
        codegen.set_env(each.env_name, each)
    return result


class _DeferredLibrary(JITCodeLibrary):
    """A cached kernel's code library whose shared bitcode is parsed, and its
    symbols listed, when it is first linked or serialized (Numba's parses
    both on load); until then its object code alone runs."""

    _deferred_bitcode: bytes | None = None

    def _get_module_for_linking(self) -> Any:
        bitcode = self._deferred_bitcode
        if bitcode is not None:
            from llvmlite import binding

            self._shared_module = binding.parse_bitcode(bitcode)
            self._codegen._engine._load_defined_symbols(self._shared_module)
            self._deferred_bitcode = None
        return super()._get_module_for_linking()


class _KernelCacheFile(IndexDataCacheFile):
    """Numba's index and data files of a kernel, whose entries are unpickled
    with ``_rebuild_environment`` for Numba's ``_rebuild_env``."""

    def _load_data(self, name: str) -> Any:
        with open(self._data_path(name), "rb") as file:
            return _EnvironmentUnpickler(file).load()


class _EnvironmentUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "numba.core.environment" and name == "_rebuild_env":
            return _rebuild_environment
        return super().find_class(module, name)


def _rebuild_environment(module: str, consts: list[Any], env_name: str) -> Any:
    """Numba's ``_rebuild_env``, except that a Numba module not imported yet is
    not imported for its globals (the module docstring)."""
    from numba.core.environment import Environment, _rebuild_env, lookup_environment

    if module in sys.modules or not module.startswith("numba."):
        return _rebuild_env(module, consts, env_name)
    found = lookup_environment(env_name)
    if found is not None:
        return found
    environment = Environment({"__name__": module})  # what Numba reads to pickle it again
    environment.consts[:] = consts
    environment.env_name = env_name
    Environment._memo[env_name] = environment
    return environment


def _initialize_runtime(target_context: Any, folder: str) -> None:
    """``rtsys.initialize``, with the runtime's compiled module read from
    ``folder`` (and written there the first time): Numba's own compiles it in
    every process. Numba's own path where NRT debugging is on."""
    from llvmlite import binding
    from numba.core.runtime import _nrt_python, nrtdynmod, rtsys  # type: ignore[attr-defined]

    if rtsys._init:
        return
    if config.DEBUG_NRT:
        rtsys.initialize(target_context)
        return
    with global_compiler_lock:
        if rtsys._init:
            return
        if config.NRT_STATS:
            _nrt_python.memsys_enable_stats()
        for name, address in _nrt_python.c_helpers.items():  # as rtsys.initialize does
            binding.add_symbol(name if name.startswith("_") else "NRT_" + name, address)
        codegen = target_context.codegen()
        key = repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple()))
        path = os.path.join(folder, "zerobatch-runtime-"
                            + hashlib.blake2b(key.encode(), digest_size=8).hexdigest() + ".nbr")
        state = _read_runtime(path, key)
        if state is not None:
            library = codegen.unserialize_library(state)
        else:  # nrtdynmod.compile_nrt_functions, keeping the machine code
            module, library = nrtdynmod.create_nrt_module(target_context)
            library.enable_object_caching()
            library.add_ir_module(module)
            library.finalize()
            _write_runtime(path, key, library.serialize_using_object_code())
        rtsys._library = library
        rtsys._init = True


def _read_runtime(path: str, key: str) -> Any:
    """The serialized runtime library saved at ``path`` for ``key``, or None
    (no file, another key, or a file this cannot read)."""
    try:
        with open(path, "rb") as file:
            saved_key, state = pickle.load(file)
    except Exception:
        return None
    if saved_key != key or not (isinstance(state, tuple) and len(state) == 3
                                and state[1] == "object"):
        return None
    return state


def _write_runtime(path: str, key: str, state: Any) -> None:
    """Save ``state`` for ``key`` at ``path`` atomically; nothing if the folder
    is not writable (every process then compiles the runtime, as Numba does)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as file:
            pickle.dump((key, state), file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def _array_type(val: Any) -> Any:
    """Numba's type of a plain ``ndarray``, or of a tuple of them and numbers
    (tuples nested), as ``numba.typeof`` gives it; None for anything else
    (Numba's own typeof then)."""
    if type(val) is np.ndarray:  # exactly: a subclass may be a masked array
        try:
            dtype = numpy_support.from_dtype(val.dtype)
        except errors.NumbaNotImplementedError:
            return None
        return types.Array(dtype, val.ndim, numpy_support.map_layout(val),
                           readonly=not val.flags.writeable)
    if type(val) is tuple and val:
        members = [_number_type(v) if type(v) in _NUMBERS or isinstance(v, np.number)
                   else _array_type(v) for v in val]
        return None if None in members else types.BaseTuple.from_types(members, tuple)
    return None


_NUMBERS = (int, float, bool, complex)


def _number_type(val: Any) -> Any:
    """Numba's type of a number (no array inside: Numba's typeof is cheap), or None."""
    try:
        return typeof(val, Purpose.argument)
    except ValueError:  # an int past 64 bits
        return None


class _LightDispatcher(CPUDispatcher):
    """Numba's CPU dispatcher, typing a plain array without ``np.ma`` and
    loading a cached kernel without the extensions' entry points (the module
    docstring); anything else goes through Numba's own methods."""

    def typeof_pyval(self, val: Any) -> Any:
        found = _array_type(val)
        if found is None:
            return super().typeof_pyval(val)
        self._types_active_call.add(found)
        return found

    def _compile_for_args(self, *args: Any, **kws: Any) -> Any:
        if not kws and isinstance(self._cache, _KernelCache):
            try:
                signature = tuple(self.typeof_pyval(a) for a in args)
            finally:
                self._types_active_call.clear()
            if types.pyobject not in signature:
                entry_point = self._load_cached(signature)
                if entry_point is not None:
                    return entry_point
        return super()._compile_for_args(*args, **kws)

    def _load_cached(self, signature: tuple[Any, ...]) -> Any:
        """The entry point of ``signature`` from the cache (what
        ``Dispatcher.compile`` does on a cache hit), or None where it is not there."""
        with global_compiler_lock:
            existing = self.overloads.get(signature)
            if existing is not None:
                return existing.entry_point
            if not self._can_compile:
                return None
            result = self._cache.load_overload(signature, self.targetctx)
            if result is None or result.objectmode:
                return None
            self._cache_hits[signature] += 1
            self.targetctx.insert_user_function(result.entry_point, result.fndesc,
                                                [result.library])
            self.add_overload(result)
            return result.entry_point


def njit(signature: Any = None, **options: Any) -> Any:
    """``numba.njit`` with the light cache load above when ``cache=True``:
    ``@njit``, ``@njit(cache=True, nogil=True)``, or with a signature (or a
    list of them), compiled (or loaded) when decorated, as Numba does."""
    if callable(signature):
        return njit(**options)(signature)
    signatures = [] if signature is None else (
        signature if isinstance(signature, list) else [signature])

    def decorate(py_function: F) -> Any:
        # cache=False here: Numba's own cache would be made (a file written to
        # check the folder) and replaced at once
        dispatcher = numba.njit(**{**options, "cache": False})(py_function)
        if not isinstance(dispatcher, Dispatcher):  # NUMBA_DISABLE_JIT: the function itself
            return dispatcher
        if options.get("cache"):
            # Numba's own slot for it (what Dispatcher.enable_caching sets)
            dispatcher._cache = _KernelCache(py_function)  # type: ignore[attr-defined]
            if type(dispatcher) is CPUDispatcher:  # same layout: only methods differ
                dispatcher.__class__ = _LightDispatcher
        for each in signatures:
            dispatcher.compile(each)
        if signatures:
            dispatcher.disable_compile()
        return dispatcher

    return decorate
