"""What a load's arguments name: object-storage URLs among paths, and the names a filter keeps.
A leaf: _core (tensorlift.load), remote, _stream, _safe_open and the integrations import it, and
it imports none of them."""
from __future__ import annotations

import re
from typing import List


def is_object_url(path) -> bool:
    """True for s3:// and gs:// paths (object storage: docs/object-storage.md)."""
    return isinstance(path, str) and path.startswith(("s3://", "gs://"))


def select_names(names: List[str], filter) -> List[str]:
    """The names a tensorlift.load filter keeps, in order: all for None, those a regex (str)
    matches anywhere, those a predicate accepts, else those in the collection."""
    if filter is None:
        return names
    if isinstance(filter, str):
        rx = re.compile(filter)
        return [n for n in names if rx.search(n)]
    if callable(filter):
        return [n for n in names if filter(n)]
    wanted = set(filter)
    return [n for n in names if n in wanted]
