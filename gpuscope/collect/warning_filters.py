"""A warnings filter of gpuscope's own, put in front of the script's and taken out again without bumping the filters'
version (``warnings.filterwarnings`` would): a new version clears every module's registry of warnings already shown,
and the script's once-per-line warnings would show again. Sound where the filter matches only a message of
gpuscope's making that had no registry entry before: "always" and "ignore" leave none."""

from __future__ import annotations

import re
import warnings
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
