"""One JSON line per thing that happens, on standard output (journald, or any
collector, takes them as they are)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Callable, Optional, TextIO

# Where lines go; None: nowhere (many agents in one process, as the demo's fleet runs).
_stream: Optional[TextIO] = sys.stdout


def emit(event: str, /, **fields) -> None:
    """Write one line: {"at": ISO time, "event": event, ...fields}."""
    if _stream is None:
        return
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1000):03d}Z"
    line = json.dumps({"at": at, "event": event, **fields}, default=str)
    _stream.write(line + "\n")
    _stream.flush()


def send_to(stream: Optional[TextIO]) -> None:
    """Send the lines to `stream` (None: drop them)."""
    global _stream
    _stream = stream


class JsonLines(logging.Handler):
    """The protocol library's warnings (connection lost...) as lines too."""

    def __init__(self, write: Callable[..., None] = emit) -> None:
        super().__init__(logging.INFO)
        self.write = write

    def emit(self, record: logging.LogRecord) -> None:
        self.write(record.levelname.lower(), message=record.getMessage(), logger=record.name)


def capture_library_logs() -> None:
    """Route sn_agent's own logging (the protocol library's) into the lines."""
    logger = logging.getLogger("sn_agent")
    logger.addHandler(JsonLines())
    logger.setLevel(logging.INFO)
    logger.propagate = False
