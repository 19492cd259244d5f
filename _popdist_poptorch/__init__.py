"""The opt-in PopTorch module names: ``import poptorch`` answers with the project's modules.

With ``POPDIST_POPTORCH_MODULES=1`` in a process's environment (``poprun --poptorch-modules``
sets it for every instance), a PopTorch program or library runs with no change at all:
``poptorch``, ``poptorch.optim``, ``poptorch.enums``, ``poptorch._impl``, ``popart`` (and the
rest of :data:`MODULES`) are the project's modules themselves, ``find_spec("poptorch")``
finds them and ``importlib.metadata.version("poptorch")`` answers :data:`METADATA_VERSION`.

How it is wired:

- the project's wheel (and its editable install) puts :data:`PTH_NAME` in site-packages
  (the build backend, :mod:`_popdist_poptorch.backend`, adds it). Its one line,
  :data:`PTH_LINE`, reads the variable and imports this module only when it is set to
  anything but ``0``, so a process that does not ask imports nothing for it
  (``benchmarks/import_cost.py`` measures the line);
- :func:`install` puts :class:`Finder` first on ``sys.meta_path``. It answers the PopTorch
  names with *the project's module objects* (no second copy: ``poptorch.trainingModel is
  popdist_torch.trainingModel``), imports nothing before the name is imported, and supplies
  the ``poptorch`` distribution's metadata (no dist-info on disk: pip sees nothing);
- a real PopTorch (a ``poptorch`` or ``popart`` module on ``sys.path``) wins: the finder steps
  aside for both names, with one line on stderr saying so.

This module is stdlib-only and imports nothing of the project until a PopTorch name is
imported. The project never publishes a distribution named ``poptorch`` or ``popart``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

__all__ = [
    "METADATA_VERSION",
    "MODULES",
    "POPTORCH_API",
    "PTH_LINE",
    "PTH_NAME",
    "VARIABLE",
    "VERSION",
    "Finder",
    "asked",
    "install",
    "installed",
    "real_install",
]

#: The variable that asks for the names (``popdist.env.POPTORCH_MODULES`` is the same name).
VARIABLE = "POPDIST_POPTORCH_MODULES"

#: The file the wheel puts in site-packages, and its one line (``site`` runs lines that start
#: with ``import``). The name sorts after setuptools' ``__editable__.*.pth``, which puts an
#: editable checkout on ``sys.path`` first.
PTH_NAME = "popdist-poptorch-modules.pth"
PTH_LINE = (
    f"import os; os.environ.get({VARIABLE!r}, '0') not in ('', '0') and "
    "__import__('_popdist_poptorch').install()\n"
)

#: The PopTorch release whose public API the project follows (docs/poptorch-names.md).
POPTORCH_API = "3.3.0"
#: The project's version (``poprun.__version__``, the distribution ``popdist-open``).
_PROJECT = "0.1.0"
#: ``poptorch.__version__`` in PopTorch's own form, ``<release>-<snapshot>``
#: (PopTorch's is ``"3.3.0-5cd2f910b9"``): here the snapshot names the project.
VERSION = f"{POPTORCH_API}-popdist.{_PROJECT}"
#: The ``poptorch`` distribution's version, as PopTorch's wheel writes it (``X.Y.Z+build``):
#: PEP 440, so ``require_version("poptorch>=3.3")`` compares it.
METADATA_VERSION = f"{POPTORCH_API}+popdist.{_PROJECT}"

#: The PopTorch module names and the project's module that answers each. Any other
#: ``poptorch.X`` is the project's ``popdist_torch.X`` where that module exists (so nothing
#: under ``poptorch`` ever loads a second copy of a project module), else not found.
MODULES: Mapping[str, str] = {
    "poptorch": "popdist_torch",
    "poptorch.optim": "popdist_torch.optim",
    "poptorch.enums": "popdist_torch.enums",
    "poptorch.options": "popdist_torch.options",
    "poptorch.profiling": "popdist_torch.surface.profiling",
    "poptorch._impl": "popdist_torch.surface.impl",
    "poptorch._poplar_executor": "popdist_torch.execution.executor",
    "poptorch.poptorch_core": "popdist_torch.surface.toplevel",
    "popart": "popdist_torch.popart",
}
_TOP = ("poptorch", "popart")
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def asked(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``environ`` (default ``os.environ``) asks for the names: ``1`` (or true, yes, on).

    The words are :func:`popdist.env.read_poptorch_modules`'s; a value that is neither on
    nor off says so on stderr and leaves the names off.
    """
    raw = (os.environ if environ is None else environ).get(VARIABLE, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value not in _OFF:
        sys.stderr.write(
            f"popdist: {VARIABLE}={raw!r} is not 1 or 0: the PopTorch names stay off\n"
        )
    return False


def real_install(name: str) -> str | None:
    """Where a real ``poptorch``/``popart`` module is on ``sys.path`` (``None``: there is none)."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(name, sys.path)
    if spec is None or spec.origin is None:
        return None  # a folder of that name without ``__init__.py`` is no PopTorch
    return spec.origin


class _Alias:
    """The loader of one PopTorch name: the project's module object itself, untouched."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: Any = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib

        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the alias's spec on the module: give it its own back, so
        # that ``popdist_torch.__spec__`` (and find_spec("popdist_torch")) stay the project's.
        module.__spec__ = self._spec


class Finder:
    """On ``sys.meta_path``: answers the PopTorch names and the ``poptorch`` metadata."""

    def __init__(self) -> None:
        self._told = False

    def _real(self) -> str | None:
        """A real PopTorch's place, once said on stderr (``None``: the names are ours)."""
        for name in _TOP:
            where = real_install(name)
            if where is not None:
                if not self._told:
                    self._told = True
                    sys.stderr.write(
                        f"popdist: {VARIABLE} is set but a real {name} is installed ({where}): "
                        "import poptorch and import popart give it, not popdist_torch\n"
                    )
                return where
        return None

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        top = name.partition(".")[0]
        if top not in _TOP or self._real() is not None:
            return None
        from importlib.machinery import ModuleSpec

        mapped = MODULES.get(name)
        if name in _TOP:
            if mapped is None:
                return None
            alias: Any = _Alias(mapped)
            return ModuleSpec(name, alias, is_package=name == "poptorch")
        if top != "poptorch":
            return None  # popart is a module, not a package
        import importlib.util

        target_name = mapped or f"popdist_torch.{name.partition('.')[2]}"
        try:
            found = importlib.util.find_spec(target_name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return None
        loader: Any = _Alias(target_name)  # a Loader by its two methods (no importlib.abc import)
        return ModuleSpec(name, loader, is_package=found.submodule_search_locations is not None)

    def find_distributions(self, context: Any = None) -> Iterator[Any]:
        """The ``poptorch`` distribution, when asked for it by name on ``sys.path``."""
        name = getattr(context, "name", None)
        if not name or "path" in vars(context):
            return iter(())
        if name.replace("_", "-").replace(".", "-").lower() != "poptorch" or self._real():
            return iter(())
        return iter((_distribution(),))

    def invalidate_caches(self) -> None:
        """Nothing cached (``importlib.invalidate_caches`` calls every finder's)."""


_METADATA = f"""\
Metadata-Version: 2.1
Name: poptorch
Version: {METADATA_VERSION}
Summary: PopTorch's module names, answered by popdist-open's popdist_torch (POPDIST_POPTORCH_MODULES=1)
"""


def _distribution() -> Any:
    import importlib.metadata

    class PoptorchNames(importlib.metadata.Distribution):
        """The ``poptorch`` metadata; no files (pip lists and uninstalls nothing)."""

        def read_text(self, filename: str) -> str | None:
            return _METADATA if filename in ("METADATA", "PKG-INFO") else None

        def locate_file(self, path: Any) -> Any:
            import pathlib

            return pathlib.Path(__file__).parent / str(path)

    return PoptorchNames()


_finder: Finder | None = None


def install() -> Finder | None:
    """Put :class:`Finder` first on ``sys.meta_path`` when :func:`asked` (idempotent)."""
    global _finder
    if not asked():
        return None
    if _finder is None:
        _finder = Finder()
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return _finder


def installed() -> bool:
    """Whether the finder is on ``sys.meta_path`` (the names answer unless a real PopTorch wins)."""
    return _finder is not None and _finder in sys.meta_path
