"""Progress reporting from stages to whoever is watching (the CLI's progress bars).

Core code calls `report(stage, advance, total)`; the CLI registers a listener. With no listener,
reporting is a no-op, so flows started from the Prefect UI pay nothing for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[str, int, int], None]  # (stage, advance, total)

_listeners: list[Listener] = []
_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def report(stage: str, advance: int, total: int) -> None:
    for listener in list(_listeners):
        listener(stage, advance, total)
