"""The compiled core: modules built by Cython from their unchanged Python sources into
extension modules, and imported in their place when built.

The policy core runs per request in the gateway and per simulated request in ``headrace sim``;
compiled, the same code runs its decisions with less interpreter overhead. Nothing else
changes: the same source, the same decisions (``tests/loadgen/sim/test_sim_identity.py`` holds either way).

- Each package names its own compiled modules: its ``__init__`` calls :func:`declare` before it
  imports any of them (``gateway.policy``: the scheduler; ``loadgen.sim``: the simulator's
  event loop; ``loadgen``: the load statistics). Importing a package that declares none
  changes nothing.
- ``headrace compile`` (:mod:`deploy.compile_cli`) builds what is missing (``./run.sh`` does,
  when Cython and a C compiler are there); without it headrace runs as pure Python.
- A built module is named by a digest of its source (and of Python's and Cython's versions), so
  an edited source is imported as Python until it is built again: never a stale build.
- ``HEADRACE_COMPILED=0`` imports the pure Python sources; ``HEADRACE_COMPILED_DIR`` moves the
  builds (default ``~/.cache/headrace/compiled``).

It sits in the bottom layer so that the sans-IO policy core can declare its modules here
without importing the rest of the gateway.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

# pure Python semantics: annotations are documentation, never C types
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}
_ROOT = Path(__file__).resolve().parent.parent  # the directory holding the packages


def enabled() -> bool:
    return os.environ.get("HEADRACE_COMPILED", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    d = os.environ.get("HEADRACE_COMPILED_DIR")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "headrace" / "compiled"


def source_of(name: str) -> Path:
    return _ROOT.joinpath(*name.split(".")).with_suffix(".py")


def artifact(name: str, source: Path, cython_version: str | None = None) -> Path:
    """Where the build of ``source`` (module ``name``) is kept: named by a digest of it."""
    h = hashlib.sha256(source.read_bytes())
    h.update(f"{sys.implementation.cache_tag}|{cython_version or _cython_version(cache_dir())}|{DIRECTIVES}".encode())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_dir() / f"{name}-{h.hexdigest()[:20]}{suffix}"


@functools.cache
def _cython_version(builds: Path) -> str:
    """The Cython the builds in ``builds`` came from, as :func:`build` recorded it (so importing
    needs no Cython); read once per process, not once per module imported."""
    stamp = builds / "cython-version"
    return stamp.read_text().strip() if stamp.exists() else "none"


_DECLARED: dict[str, None] = {}  # every declared module, in the order declared


class _Finder:
    """Imports a declared module from its build when one matches its source."""

    def find_spec(self, name: str, path: object = None, target: object = None):  # noqa: ANN201
        if name not in _DECLARED:
            return None
        try:
            so = artifact(name, source_of(name))
        except OSError:
            return None
        if not so.exists():
            return None
        loader = importlib.machinery.ExtensionFileLoader(name, str(so))
        return importlib.util.spec_from_file_location(name, so, loader=loader)


_FINDER = _Finder()


def declare(package: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """Declare the modules ``names`` of ``package`` (their names within it) compiled: from now
    on each is imported from its build when one matches its source (the finder goes first in
    the import system, once; not with ``HEADRACE_COMPILED=0``). A package calls it in its
    ``__init__`` before it imports any of them. Returns their full names."""
    full = tuple(f"{package}.{n}" for n in names)
    _DECLARED.update(dict.fromkeys(full))
    if enabled() and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return full


def declared() -> tuple[str, ...]:
    """Every module declared compiled so far (by the packages imported so far)."""
    return tuple(_DECLARED)


def compiled(module: object) -> bool:
    """Whether an imported module is its build (not its Python source)."""
    return isinstance(getattr(module, "__spec__", None) and module.__spec__.loader,
                      importlib.machinery.ExtensionFileLoader)


def build(modules: tuple[str, ...], jobs: int | None = None, log=print) -> list[str]:  # noqa: ANN001
    """Build each of ``modules`` whose source has no build yet; returns those built.
    Raises ImportError without Cython, and what the C compiler raises when it fails."""
    from Cython import __version__ as version  # NOTE: the compiler itself only when there is work

    out = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "cython-version").write_text(version)
    _cython_version.cache_clear()
    dests = {n: artifact(n, source_of(n), version) for n in modules}
    todo = [n for n, dest in dests.items() if not dest.exists()]
    if not todo:
        return []
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    log(f"compiling {len(todo)} module(s) of the core with Cython {version} ...")
    jobs = jobs or os.cpu_count() or 1
    quiet = ["-w"] if os.name == "posix" else []  # the generated C's warnings are Cython's business
    with tempfile.TemporaryDirectory(prefix="headrace-compile-") as tmp:
        cwd = os.getcwd()
        os.chdir(_ROOT)  # cythonize mirrors relative source paths under build_dir, which the C build reads
        try:
            exts = cythonize([Extension(n, [str(source_of(n).relative_to(_ROOT))], extra_compile_args=quiet)
                              for n in todo],
                             build_dir=str(Path(tmp) / "c"), compiler_directives=DIRECTIVES,
                             quiet=True, nthreads=jobs)
            cmd = build_ext(Distribution({"ext_modules": exts, "script_name": "profiles.compiled"}))
            cmd.build_lib, cmd.build_temp, cmd.parallel = str(Path(tmp) / "lib"), str(Path(tmp) / "o"), jobs
            cmd.ensure_finalized()
            cmd.run()
            built = {n: Path(cmd.get_ext_fullpath(n)) for n in todo}
        finally:
            os.chdir(cwd)
        for n in todo:
            part = dests[n].with_name(dests[n].name + ".part")
            shutil.copyfile(built[n], part)
            part.replace(dests[n])  # whole or absent: a concurrent import never sees half a file
    return todo

