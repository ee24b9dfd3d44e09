"""Run a callback right after a module is first imported, so gpuscope never imports torch before the user's
script does (a script may set OMP_NUM_THREADS or CUDA_VISIBLE_DEVICES before ``import torch``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            # Put the real loader back (under every watcher's wrapper), so nothing of gpuscope stays on the module.
            real = self._loader
            while isinstance(real, _NotifyingLoader):
                real = real._loader
            if module.__spec__ is not None:
                module.__spec__.loader = real
            module.__loader__ = real
        self._callback()


class ImportWatch(importlib.abc.MetaPathFinder):
    """A one-shot finder: when ``name`` is imported, calls ``before`` (if given) as its import begins and
    ``callback`` once its module has run."""

    def __init__(self, name: str, callback: Callable[[], None], before: Callable[[], None] | None = None) -> None:
        self.name = name
        self._callback = callback
        self._before = before

    def install(self) -> None:
        """Start watching (calls back at once if the module is already imported)."""
        if self.name in sys.modules:
            self._callback()
        else:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        """Stop watching; harmless if already fired or removed."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        self.remove()  # one shot; also keeps the lookup below from finding us again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            if self._before is not None:
                self._before()
            spec.loader = _NotifyingLoader(spec.loader, self._callback)  # type: ignore[arg-type]
        return spec
