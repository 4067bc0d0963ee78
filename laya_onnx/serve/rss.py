"""Memory given back after requests, judged by what the process holds (RSS), not by a pass estimate.

A request can leave the process holding far more than at idle without any large pass: the
parsed body of a 2 MiB request, a 1.9 MB instruction tokenized once, a batch's encoded rows.
Python frees those objects, but glibc keeps the freed pages (its mmap threshold grows after big
blocks are freed, so later big blocks land on the heap) and the process's RSS stays at its peak.

`MemoryKeeper.after_request()` runs after every decision request: when the RSS is more than
`RELEASE_MARGIN` above what it was after the last release (the idle baseline at first), it
collects garbage and trims the C heap (`malloc_trim`) in a thread, then remembers the RSS that
is left. A process that cannot give memory back therefore does not pay for a release after
every request; one that grows again by the margin releases again. Linux only (elsewhere: no-op).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os

from laya_onnx.core.session import trim_heap

log = logging.getLogger("laya_onnx.serve")

#: Growth above the RSS left by the last release (the idle baseline at first) that triggers one.
RELEASE_MARGIN = 64 * 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's RSS from /proc/self/statm, or None where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def release() -> None:
    """Collect garbage and hand the C heap's free pages back to the OS."""
    gc.collect()
    trim_heap()


class MemoryKeeper:
    """One per app, on its loop: `start()` once serving, `after_request()` after each decision."""

    def __init__(self, margin: int = RELEASE_MARGIN):
        self.margin = margin
        #: RSS when the app started serving (None before `start`, or off /proc).
        self.baseline: int | None = None
        #: RSS left after the last release (the baseline at first).
        self.floor: int | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.baseline = self.floor = resident_bytes()

    def after_request(self) -> None:
        """Start a release in the background when the RSS has grown by the margin."""
        if self.floor is None or (self._task is not None and not self._task.done()):
            return
        now = resident_bytes()
        if now is not None and now - self.floor > self.margin:
            self._task = asyncio.get_running_loop().create_task(self._release(now))

    async def _release(self, before: int) -> None:
        await asyncio.to_thread(release)
        after = resident_bytes() or before
        self.floor = after
        log.info("gave memory back after a request: RSS %d -> %d MiB", before >> 20, after >> 20)
