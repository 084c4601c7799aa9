"""Read a launcher process's output as it comes, and wait for lines in it."""

from __future__ import annotations

import re
import subprocess
import threading
import time


class ProcessOutput:
    """Collects the lines a process writes (stdout and stderr together) in a thread."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in iter(self.process.stdout.readline, b""):
            with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: str, *, timeout_s: float, after: int = 0) -> re.Match:
        """The first match of `pattern` in a line numbered `after` or later."""
        deadline = time.monotonic() + timeout_s
        checked = after
        with self._changed:
            while True:
                for line in self.lines[checked:]:
                    if match := re.search(pattern, line):
                        return match
                checked = max(checked, len(self.lines))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no line matched {pattern!r} in {timeout_s} s:\n{self}")
                self._changed.wait(min(remaining, 0.5))

    def matching(self, pattern: str, *, after: int = 0) -> list[str]:
        """Every line so far, from line `after`, that matches `pattern`."""
        with self._changed:
            return [line for line in self.lines[after:] if re.search(pattern, line)]

    def mark(self) -> int:
        """The number of lines so far, to look only at what comes next."""
        with self._changed:
            return len(self.lines)

    def __str__(self) -> str:
        with self._changed:
            return "\n".join(self.lines[-60:])
