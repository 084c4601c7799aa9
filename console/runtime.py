"""Process-wide tuning of the long-running server processes: the garbage collector
(web and tree workers), and a debug message of Daphne's WebSocket layer (web, when
`bench.fleet --asgi daphne` runs Daphne in Uvicorn's place).

A web process holding five hundred agents' sockets tracks a quarter of a million
objects, and CPython's full collections walk all of them while holding the GIL: in
`bench/fleet.py` each took 100 to 280 ms and the two web processes paused 3.5 s a
minute, every socket of a process waiting meanwhile. Two standard remedies:
`gc.freeze()` once started, so that what was built at start (Django, the modules, the
URL and template caches), which lives as long as the process, is never walked again;
and a higher first threshold, so that young collections, and hence full ones, are
fewer (the garbage cycles they collect are few: requests leave little behind).

Garbage that holds a resource waits longer for the collector then. The one such kind
found: Django under ASGI left each request's database connection to the collector,
until console.middleware.CloseDatabaseConnections closed them.

autobahn, under Daphne, pretty-prints 29 settings for a debug message at every new
WebSocket connection, whether debug messages are logged or not: 0.3 ms each, 7% of a
web process's time while a fleet reconnects. It also colours the name of its send
method (with click) for a debug message at every frame it sends: 4% of a web process's
time during a fleet's rounds.
"""

from __future__ import annotations

import gc
import pprint
import sys
from functools import partial

# Allocations (net of deallocations) between young collections: CPython's default is
# 700. A collection of 50,000 young objects takes a few milliseconds.
YOUNG_THRESHOLD = 50_000
# Young collections per middle one, and middle ones per full one (CPython: 10, 10; a
# full one also waits until a quarter of the old objects are new).
MIDDLE_EVERY = 20
FULL_EVERY = 100


def tune_garbage_collector() -> None:
    """Call once the process has started: freeze what exists, collect less often."""
    gc.collect()  # what start-up left behind is freed, not frozen
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_EVERY, FULL_EVERY)


def skip_autobahn_debug_formatting() -> None:
    """Call once in a web process: under Daphne (which imported autobahn before the
    application), autobahn's WebSocket protocol formats its debug messages' settings
    only while its debug messages are logged. Under Uvicorn, nothing: autobahn is not
    imported (it and Twisted would cost a web process 40 MB)."""
    if "autobahn.websocket.protocol" not in sys.modules:
        return
    import autobahn.websocket.protocol as websocket_protocol

    websocket_protocol.pformat = _pformat_if_debugging
    websocket_protocol.hltype = partial(_hltype_if_debugging, websocket_protocol.hltype)


def _debugging() -> bool:
    import txaio  # autobahn's logging: imported only under Daphne

    return txaio.get_global_log_level() in {"debug", "trace"}


def _pformat_if_debugging(value, *args, **kwargs) -> str:
    if _debugging():
        return pprint.pformat(value, *args, **kwargs)
    return NOT_FORMATTED


def _hltype_if_debugging(hltype, value) -> str:
    return hltype(value) if _debugging() else NOT_FORMATTED


NOT_FORMATTED = "(not formatted: debug messages are off)"
