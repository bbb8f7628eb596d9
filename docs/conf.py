"""Sphinx configuration of zerobatch's documentation site (``make docs``).

The site is the Markdown pages of the repository (through MyST) and an API
reference built from the docstrings by autodoc. The reference has one page per
public module (no part of its dotted name starts with an underscore), written
into ``docs/api/`` (ignored by git) at every build, so a new module appears
without an edit here. Each public object is documented once, on the page of the
module that defines it (or, for one defined in a private module, the shortest
public module that exports it); every other module that exports it lists it as
a link there.

References in docstrings (``:class:`Batch```, ``:meth:`Position.state_dict```)
are checked: ``make test`` builds with ``-n -W``, so a reference to a zerobatch
name that does not exist fails the build. A short name resolves when exactly
one documented object ends with it. Names outside zerobatch (NumPy, torch, the
standard library: there is no network for intersphinx) and private names are
shown as code without a link.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

from sphinx.ext.napoleon import Config
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.pycode import ModuleAnalyzer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the tree being built, never an installed copy

import zerobatch  # noqa: E402

project = "zerobatch"
author = "the zerobatch authors"
copyright = "the zerobatch authors; Apache-2.0"

extensions = ["sphinx.ext.autodoc", "myst_parser"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns: list[str] = []
html_theme = "furo"
html_title = "zerobatch"
html_copy_source = False
myst_heading_anchors = 4
nitpicky = True
suppress_warnings = ["misc.highlighting_failure"]  # a "..." in a JSON example is fine
autodoc_member_order = "bysource"
autodoc_typehints = "signature"


# -- the API reference pages -------------------------------------------------------


def public_modules() -> list[str]:
    """Every public module of the package, the package first."""
    names = ["zerobatch"]
    for info in pkgutil.walk_packages(zerobatch.__path__, "zerobatch."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def _module_level(module_name: str) -> list[ast.stmt]:
    try:
        return ast.parse(inspect.getsource(importlib.import_module(module_name))).body
    except (OSError, TypeError):
        return []


def origin(module_name: str, name: str) -> tuple[str, str]:
    """Where ``module_name.name`` is defined: (module, name there). Classes and
    functions say so themselves; data is followed through ``from X import``."""
    obj = getattr(importlib.import_module(module_name), name)
    if inspect.ismodule(obj):
        return obj.__name__, ""
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return getattr(obj, "__module__", module_name), obj.__qualname__
    for node in _module_level(module_name):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return origin(node.module, alias.name)
    return module_name, name


def homes(modules: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """(module, name) of every exported name -> (module, name) it is documented as:
    where it is defined when that module is public and exports it, else the
    shortest public module that exports it."""
    places: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for module_name in modules:
        for name in getattr(importlib.import_module(module_name), "__all__", ()):
            places.setdefault(origin(module_name, name), []).append((module_name, name))
    found = {}
    for (defined, defined_name), exported in places.items():
        home = ((defined, defined_name) if (defined, defined_name) in exported
                else min(exported, key=lambda place: (len(place[0]), place)))
        found.update(dict.fromkeys(exported, home))
    return found


def _directive(obj: Any) -> list[str]:
    if inspect.isroutine(obj):
        return ["autofunction"]
    if not inspect.isclass(obj):
        return ["autodata"]
    # members inherited from a zerobatch base class are this class's API too
    outside = [c.__name__ for c in obj.__mro__[1:] if not c.__module__.startswith("zerobatch")]
    if len(outside) < len(obj.__mro__) - 1:
        return ["autoclass", "   :members:", f"   :inherited-members: {', '.join(outside)}"]
    return ["autoclass", "   :members:"]


def write_api_pages(folder: Path) -> dict[str, str]:
    """Write one page per public module into ``folder``; returns the aliases:
    ``module.name`` -> the full name it is documented under."""
    modules = public_modules()
    home = homes(modules)
    aliases: dict[str, str] = {}
    folder.mkdir(exist_ok=True)
    for stale in folder.glob("*.rst"):
        stale.unlink()
    for module_name in modules:
        module = importlib.import_module(module_name)
        lines = [module_name, "=" * len(module_name), "", f".. automodule:: {module_name}", ""]
        elsewhere = []
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                elsewhere.append(f"- ``{name}``: :mod:`{obj.__name__}`")
                continue
            target = ".".join(home[(module_name, name)])
            if home[(module_name, name)] != (module_name, name):
                aliases[f"{module_name}.{name}"] = target
                elsewhere.append(f"- ``{name}``: :py:obj:`{target}`")
                continue
            directive, *options = _directive(obj)
            lines += [f".. {directive}:: {target}", *options, ""]
            DATA[target] = origin(module_name, name)
        if elsewhere:
            lines += [".. rubric:: Also exported here", "", *elsewhere, ""]
        (folder / f"{module_name}.rst").write_text("\n".join(lines))
    toc = ["API reference", "=============", "",
           "One page per public module; each name is documented where it is defined.", "",
           ".. toctree::", "   :maxdepth: 1", ""]
    toc += [f"   {name}" for name in modules]
    (folder / "index.rst").write_text("\n".join(toc) + "\n")
    return aliases


DATA: dict[str, tuple[str, str]] = {}  # documented full name -> where it is defined
ALIASES = write_api_pages(Path(__file__).parent / "api")


# -- references in docstrings -----------------------------------------------------


def _is_external(target: str) -> bool:
    """Whether ``target`` names a builtin or another package's object."""
    first = target.split(".", 1)[0].split("[", 1)[0]
    if first == "zerobatch" or not first.isidentifier():
        return False
    if first in ("np", "npt") or hasattr(builtins, first):
        return True
    try:
        return importlib.util.find_spec(first) is not None
    except (ImportError, ValueError):
        return False


def _resolve(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve what Sphinx could not: zerobatch aliases and unique short names;
    external and private names become code without a link."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    if _is_external(target) or any(part.startswith("_") and not part.startswith("__")
                                   for part in target.split(".")):
        return contnode
    domain = env.get_domain("py")
    found = [full + target[len(alias):] for alias, full in ALIASES.items()
             if target == alias or target.startswith(alias + ".")]  # zerobatch.Loader
    found = [name for name in found if name in domain.objects]
    if not found:
        found = sorted(name for name, entry in domain.objects.items()
                       if name.endswith("." + target) and not entry.aliased)
    if len(found) != 1:
        return None  # unknown or ambiguous: Sphinx warns, and -W fails the build
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], found[0],
                               node, contnode)


# -- docstring sections --------------------------------------------------------------

HELP_TEXT = {"zerobatch.cli"}  # docstrings that are argparse's --help text: shown as written
_GOOGLE = Config(napoleon_numpy_docstring=False, napoleon_use_rtype=False)


def _sections(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """``Args:`` and ``Returns:`` sections (Google style) become field lists. The
    first line of an attribute's or a property's docstring is prose here, not
    napoleon's ``type: text``, so those are left as written; a constant's is the
    string under its assignment where it is defined (or none)."""
    if name in HELP_TEXT:
        lines[:] = ["::", "", *(f"    {line}" for line in lines)]
    elif what == "data":  # the docstring under its assignment, never its type's
        module_name, attribute = DATA.get(name, name.rpartition(".")[::2])
        docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        lines[:] = list(docs.get(("", attribute), []))
    elif what not in ("attribute", "property"):
        parsed = GoogleDocstring(lines, _GOOGLE, app, what, name, obj, options).lines()
        # napoleon escapes the stars of only the first of "*args, **kwargs"
        lines[:] = [re.sub(r"^(\s*:param )(\*{1,2})(?=\w)",
                           lambda m: m.group(1) + "\\*" * len(m.group(2)), line)
                    for line in parsed]


def setup(app: Any) -> None:
    app.connect("autodoc-process-docstring", _sections)
    app.connect("missing-reference", _resolve)
