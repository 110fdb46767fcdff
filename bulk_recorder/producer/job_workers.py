"""The API's job workers: processes that validate job lines on the other cores.

``API_JOB_WORKERS`` processes (``spawn``ed: nothing of the API's sockets, pool or threads is
inherited) start with the first job upload and live until the API stops; its lifespan closes
them (:meth:`JobWorkers.close`, within the stop budget, killed past it). A worker ignores
SIGINT (the API handles the terminal's Ctrl-C and stops them itself) and, on Linux, is killed by
the kernel if the API process dies (``PR_SET_PDEATHSIG``), so none is left behind even by a
SIGKILL.

A worker that dies breaks the executor (``BrokenProcessPool`` for every block it held): the
uploads in progress validate those blocks on the loop instead (:func:`validate_block` is pure),
and the next block goes to a fresh set of workers. A job is therefore never refused or
half-written because a worker died.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from bulk_recorder.producer.job_blocks import Block, Validated, validate_block

log = logging.getLogger(__name__)

__all__ = ["JobWorkers"]

_PR_SET_PDEATHSIG = 1


def _worker_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # The API may have died while this worker was still starting (before the line above):
    # then no signal will come, and the worker is an orphan already.
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)


def _ready() -> bool:
    return True


class JobWorkers:
    """A process pool for :func:`validate_block`, started on first use; ``size`` 0: none (every
    block is validated on the loop)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False
        self.replaced = 0  # executors given up because a worker died

    def _current(self) -> ProcessPoolExecutor | None:
        if self.size == 0 or self._closed:
            return None
        if self._executor is None:
            started = time.perf_counter()
            self._executor = ProcessPoolExecutor(
                self.size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_init,
            )
            for _ in range(self.size):  # start them all now, not one per block in flight
                self._executor.submit(_ready)
            log.info(
                "%d job worker process(es) starting (%.3f s)",
                self.size,
                time.perf_counter() - started,
            )
        return self._executor

    async def validate(self, job_id: str, max_body_bytes: int, block: Block) -> Validated:
        """The block's answer, from a worker or, if none can take it, from this loop."""
        executor = self._current()
        if executor is not None:
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(
                    executor, validate_block, job_id, max_body_bytes, block
                )
            except BrokenProcessPool:
                self._broken(executor)
            except RuntimeError:  # "cannot schedule new futures after shutdown": stopping
                if not self._closed:
                    raise
        return validate_block(job_id, max_body_bytes, block)

    def _broken(self, executor: ProcessPoolExecutor) -> None:
        if self._executor is executor:
            log.warning("a job worker process died; validating its lines here, new workers next")
            self._executor = None
            self.replaced += 1
            executor.shutdown(wait=False, cancel_futures=True)

    def pids(self) -> list[int]:
        """The live workers' process ids (for tests and diagnostics)."""
        executor = self._executor
        processes = getattr(executor, "_processes", None) or {}
        return [p.pid for p in processes.values() if p.is_alive()]

    async def close(self, within_s: float) -> None:
        """Stop the workers: wait up to ``within_s`` for the blocks in hand, then kill."""
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is None:
            return
        processes = list((getattr(executor, "_processes", None) or {}).values())
        closing = asyncio.ensure_future(
            asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
        )
        done, _ = await asyncio.wait({closing}, timeout=max(0.0, within_s))
        if not done:
            log.warning("job workers still busy at the stop deadline; killing them")
            for process in processes:
                with contextlib.suppress(Exception):
                    process.kill()
            await asyncio.wait({closing}, timeout=5)
        log.info("job workers stopped")
