"""Memory given back after requests, judged by the process's RSS (serve/README.md#memory);
Linux only (elsewhere: no-op)."""

from __future__ import annotations

import asyncio
import gc
import logging

from laya_onnx.core.memory import process_rss
from laya_onnx.core.session import trim_heap

log = logging.getLogger("laya_onnx.serve")

#: Growth above the idle RSS (at startup) that triggers a release.
RELEASE_MARGIN = 64 * 1024 * 1024
#: Seconds between two releases at most (each collects garbage: a few ms to tens of ms).
RELEASE_INTERVAL = 5.0


class MemoryKeeper:
    """One per app, on its loop: `start()` once serving, `after_request()` after each decision."""

    def __init__(self) -> None:
        self.baseline: int | None = None
        self._last = -float("inf")  # loop time of the last release
        self._task: asyncio.Task[None] | None = None
        self._later: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.baseline = process_rss()["rss_bytes"]

    def after_request(self) -> None:
        """Release when the RSS is up by the margin; if one ran too recently, look again later."""
        if self.baseline is None or (self._task is not None and not self._task.done()):
            return
        now = process_rss()["rss_bytes"]
        if now is None or now - self.baseline <= RELEASE_MARGIN:
            return
        loop = asyncio.get_running_loop()
        wait = self._last + RELEASE_INTERVAL - loop.time()
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
        """Collect garbage and hand the C heap's free pages back to the OS, off the loop."""
        await asyncio.to_thread(gc.collect)
        await asyncio.to_thread(trim_heap)
        after = process_rss()["rss_bytes"] or before
        log.info("gave memory back after a request: RSS %d -> %d MiB", before >> 20, after >> 20)
