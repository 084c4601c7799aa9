"""The garbage collector of the long-running server processes (web and tree workers).

A web process holding five hundred agents' sockets tracks a quarter of a million
objects, and CPython's full collections walk all of them while holding the GIL: in
`bench/fleet.py` each took 100 to 210 ms and the two web processes paused 3.5 s a
minute, every socket of a process waiting meanwhile. Most of those objects were built
at start (Django, the modules, the URL and template caches) and live as long as the
process: `gc.freeze()` once started keeps the collector from walking them again.

The collector's thresholds stay CPython's: raising them made collections rarer, but
garbage that holds resources waits for them. Django under ASGI opens a database
connection in each request's own thread, and only the collector closes it after the
thread ends: with rarer collections, PostgreSQL ran out of connections.
"""

from __future__ import annotations

import gc


def tune_garbage_collector() -> None:
    """Call once the process has started: what exists now is never walked again."""
    gc.collect()  # what start-up left behind is freed, not frozen
    gc.freeze()
