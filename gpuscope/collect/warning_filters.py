"""A warnings filter of gpuscope's own, put in front of the script's and taken out again without bumping the filters'
version (``warnings.filterwarnings`` and ``warnings.catch_warnings`` would): a new version clears every module's
registry of warnings already shown, and the script's once-per-line warnings would show again (a DataLoader-fed LSTM's
dropout warning shown 8 times, once after each of the trace window's profiler calls). Sound where the filter leaves
no registry entry ("always", "ignore") and, for "always", matches only a message of gpuscope's making: a warning
already shown is still found in its registry, one not yet shown is still shown the first time it comes outside."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

Filter = tuple[Any, ...]


def put_in_front(action: str, message: str, category: type[Warning] = Warning) -> Filter:
    """A filter of ``action`` for warnings whose text begins with ``message``, first in ``warnings.filters``."""
    entry = (action, re.compile(re.escape(message), re.I), category, None, 0)  # as filterwarnings makes it
    warnings.filters.insert(0, entry)
    return entry


def take_out(entry: Filter | None) -> None:
    """Take ``entry`` out of ``warnings.filters``, and only it (the script may have added its own since)."""
    for i, f in enumerate(warnings.filters):
        if f is entry:
            del warnings.filters[i]
            return


@contextmanager
def ignored(message: str = "", category: type[Warning] = Warning) -> Iterator[None]:
    """Warnings of ``category`` whose text begins with ``message`` (every one, by default) ignored in the block: for
    gpuscope's own work in the script's process, where torch's notes to gpuscope are not the user's business."""
    entry = put_in_front("ignore", message, category)
    try:
        yield
    finally:
        take_out(entry)
