"""Memory given back after requests, judged by what the process holds (RSS), not by a pass estimate.

A request can leave the process holding far more than at idle without any large pass: the
parsed body of a 2 MiB request, a 1.9 MB instruction tokenized once, a batch's encoded rows.
Python frees those objects, but glibc keeps the freed pages (its mmap threshold grows after big
blocks are freed, so later big blocks land on the heap) and the process's RSS stays at its peak.

`MemoryKeeper.after_request()` runs after every decision request: when the RSS is more than
`RELEASE_MARGIN` above the idle RSS the app started with, it collects garbage and trims the C
heap (`malloc_trim`) in a thread — at most once every `RELEASE_INTERVAL` seconds, and once more
that long after the last request if the RSS is still up then, so a process left high by a burst
comes back down while idle. Linux only (elsewhere: no-op).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os

from laya_onnx.core.session import trim_heap

log = logging.getLogger("laya_onnx.serve")

#: Growth above the idle RSS (at startup) that triggers a release.
RELEASE_MARGIN = 64 * 1024 * 1024
#: Seconds between two releases at most (each collects garbage: a few ms to tens of ms).
RELEASE_INTERVAL = 5.0
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

    def __init__(self, margin: int = RELEASE_MARGIN, interval: float = RELEASE_INTERVAL):
        self.margin = margin
        self.interval = interval
        #: RSS when the app started serving (None before `start`, or off /proc).
        self.baseline: int | None = None
        self._last = -float("inf")  # loop time of the last release
        self._task: asyncio.Task[None] | None = None
        self._later: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.baseline = resident_bytes()

    def after_request(self) -> None:
        """Release when the RSS is up by the margin; if one ran too recently, look again later."""
        if self.baseline is None or (self._task is not None and not self._task.done()):
            return
        now = resident_bytes()
        if now is None or now - self.baseline <= self.margin:
            return
        loop = asyncio.get_running_loop()
        wait = self._last + self.interval - loop.time()
        if wait > 0:
            if self._later is None:
                self._later = loop.call_later(wait, self._look_again)
            return
        self._last = loop.time()
        self._task = loop.create_task(self._release(now))

    def _look_again(self) -> None:
        self._later = None
        self.after_request()

    async def _release(self, before: int) -> None:
        await asyncio.to_thread(release)
        after = resident_bytes() or before
        log.info("gave memory back after a request: RSS %d -> %d MiB", before >> 20, after >> 20)
