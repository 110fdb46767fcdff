"""CPU limits for benchmark processes: a cgroup of the v1 cpu controller with a CFS quota.

:class:`CpuLimit` is what a container's ``limits.cpu`` is: the processes in the group share
``cores`` of CPU time in each 100 ms period. A process joins as it starts (:meth:`CpuLimit.prefix`:
a shell writes its pid into the group, then execs the command, so the pid stays the command's
own) or once running (:meth:`CpuLimit.add`, with its descendants). The quota can change while
the group is in use (:meth:`CpuLimit.set_quota`; ``None`` lifts it). Needs root.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from benchmarks.support.machine import cpu_seconds

ROOT: Final = Path("/sys/fs/cgroup/cpu")


def available() -> str | None:
    """None when CPU limits can be set here; else why not."""
    if not (ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {ROOT}"
    if os.geteuid() != 0:
        return "setting a cgroup's CPU quota needs root"
    return None


@dataclass(frozen=True, slots=True)
class Throttling:
    """The group's ``cpu.stat``: CFS periods, those in which the quota ran out, time held back."""

    periods: int = 0
    throttled: int = 0
    throttled_s: float = 0.0

    def __sub__(self, other: Throttling) -> Throttling:
        return Throttling(
            self.periods - other.periods,
            self.throttled - other.throttled,
            self.throttled_s - other.throttled_s,
        )

    @property
    def share(self) -> float:
        """Of the periods in which the group ran, the share that hit the quota."""
        return self.throttled / self.periods if self.periods else 0.0


class CpuLimit:
    """One cgroup under the cpu controller with ``cores`` of CPU (``None``: no limit)."""

    def __init__(self, cores: float | None, name: str = "") -> None:
        problem = available()
        if problem is not None:
            raise SystemExit(f"a CPU limit cannot be set: {problem}")
        self.group = ROOT / f"bulk-recorder-bench-{os.getpid()}{'-' + name if name else ''}"
        self.group.mkdir(exist_ok=True)
        self.cores: float | None = None
        self.set_quota(cores)

    def set_quota(self, cores: float | None) -> None:
        period = int((self.group / "cpu.cfs_period_us").read_text())
        quota = -1 if cores is None else max(1000, int(cores * period))
        (self.group / "cpu.cfs_quota_us").write_text(str(quota))
        self.cores = cores

    def set_shares(self, shares: int) -> None:
        """The group's weight against its siblings (a process outside any group weighs 1024):
        on a busy machine a high weight gets the group its quota whenever it can use it."""
        (self.group / "cpu.shares").write_text(str(shares))

    def prefix(self) -> list[str]:
        """Argv to put before a command so that it runs in the group from its first instruction."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.group)]

    def add(self, pid: int, *, descendants: bool = True) -> list[int]:
        """Move a running process (its every thread) into the group, with its descendants
        unless told not to."""
        moved = [pid, *(_descendants(pid) if descendants else [])]
        for each in moved:
            with contextlib.suppress(ProcessLookupError, OSError):
                (self.group / "cgroup.procs").write_text(str(each))
        return moved

    def pids(self) -> list[int]:
        text = (self.group / "cgroup.procs").read_text()
        return [int(line) for line in text.split()]

    def cpu_seconds(self) -> float:
        """User + system seconds of the processes in the group now (from /proc)."""
        return sum(cpu_seconds(pid) for pid in self.pids())

    def throttling(self) -> Throttling:
        stat = dict(line.split() for line in (self.group / "cpu.stat").read_text().splitlines())
        return Throttling(
            int(stat.get("nr_periods", 0)),
            int(stat.get("nr_throttled", 0)),
            int(stat.get("throttled_time", 0)) / 1e9,
        )

    def close(self) -> float:
        """Remove the group (a process still in it goes back to the root group); the seconds
        its quota held its processes back."""
        held = self.throttling().throttled_s
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, OSError):
                (ROOT / "cgroup.procs").write_text(str(pid))
        self.group.rmdir()
        return held


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                children = (task / "children").read_text().split()
                found += [int(c) for c in children]
                todo += [int(c) for c in children]
    return found
