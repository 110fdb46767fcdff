"""The fault tests' SIGTERM reaches a service that has only just been started (a recorder
restarted after a SIGKILL, then stopped as the run ends): sent while the process is still
importing, before its handler is installed, it killed it with -15 and the orderly stop the test
asserts was never tried (tests/faults/test_chaos.py failed so under load)."""

from __future__ import annotations

import os
import signal

from tests.faults.conftest import catches


async def test_a_recorder_stopped_as_it_starts_still_stops_in_order(
    make_settings, recorders
) -> None:
    proc = await recorders.start(make_settings())
    assert proc.proc is not None
    assert not catches(proc.proc.pid, signal.SIGTERM)  # still starting: the race is set up
    assert await proc.terminate() == 0


def test_catches_reads_the_handlers_of_a_process() -> None:
    pid = os.getpid()
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        assert catches(pid, signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    assert not catches(pid, signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, previous)
