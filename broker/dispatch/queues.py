"""Names of the dispatchers' Celery queues, derived from the tree's shape."""

from __future__ import annotations


def dispatcher_names(depth: int, branching: int) -> list[str]:
    """Names of a tree's dispatchers, root first: d0, d0.0, d0.1, d0.0.0, ..."""
    names, level = ["d0"], ["d0"]
    for _ in range(1, depth):
        level = [f"{parent}.{index}" for parent in level for index in range(branching)]
        names.extend(level)
    return names


def dispatcher_queues(depth: int, branching: int) -> list[str]:
    """The queues a worker must consume to serve the whole tree."""
    return [f"dispatcher.{name}" for name in dispatcher_names(depth, branching)]
