"""Where a process of the stack spends its CPU during a phase of a benchmark: py-spy
samples it (without stopping it, 100 times a second, idle threads left out) and the
top frames are printed, by their own samples and by the samples under them.

    with profiled({"web": pid, "worker": pid}, "rounds") as profiles:
        ...the phase...
    print_top_frames(profiles)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = 12
# "function (path/to/module.py:123)": the line is left out, to sum a function's samples.
FRAME = re.compile(r"^(?P<function>.*?) \((?P<path>.*?)(?::\d+)?\)$")


@dataclass
class Profile:
    """One process's samples during a phase (py-spy's raw format: one stack a line,
    root first, with its count)."""

    name: str
    phase: str
    output: Path
    process: subprocess.Popen

    def stacks(self) -> Counter:
        found: Counter = Counter()
        if self.output.exists():
            for line in self.output.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if stack and count.isdigit():
                    found[tuple(_frame_name(f) for f in stack.split(";"))] += int(count)
        return found


def _frame_name(frame: str) -> str:
    match = FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["path"]
    for prefix in (str(ROOT) + "/", "site-packages/"):
        path = path.split(prefix, 1)[-1]
    return f"{match['function']} ({path})"


@contextlib.contextmanager
def profiled(pids: dict[str, int], phase: str):
    """py-spy on each of `pids` ({name: pid}) while the block runs; the profiles."""
    folder = ROOT / "var" / "bench" / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    py_spy = str(Path(sys.executable).parent / "py-spy")
    profiles = []
    for name, pid in pids.items():
        output = folder / f"{phase}-{name}.txt"
        output.unlink(missing_ok=True)
        argv = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--nonblocking",
                "--gil", "--rate", "250", "--output", str(output)]  # fmt: skip
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        profiles.append(Profile(name, phase, output, subprocess.Popen(argv, **quiet)))
    try:
        yield profiles
    finally:
        for profile in profiles:  # py-spy writes its output when interrupted
            with contextlib.suppress(ProcessLookupError):
                os.kill(profile.process.pid, signal.SIGINT)
        for profile in profiles:
            profile.process.wait(timeout=60)


def top_frames(stacks: Counter) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """All the samples, and the TOP frames by own samples and by samples under them
    (a frame counted once per stack, however often it recurs)."""
    own, under = Counter(), Counter()
    for stack, count in stacks.items():
        own[stack[-1]] += count
        for frame in set(stack):
            under[frame] += count
    return sum(stacks.values()), own.most_common(TOP), under.most_common(TOP + 8)


def print_top_frames(profiles: list[Profile]) -> None:
    for profile in profiles:
        total, own, under = top_frames(profile.stacks())
        print(f"profile of {profile.name} in {profile.phase}: {total} samples "
              f"({profile.output.relative_to(ROOT)})")  # fmt: skip
        if not total:
            continue
        print("  own time:")
        for frame, count in own:
            print(f"    {count * 100 / total:5.1f} %  {frame}")
        print("  under (inclusive):")
        for frame, count in under:
            print(f"    {count * 100 / total:5.1f} %  {frame}")
