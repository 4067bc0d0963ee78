"""The export's progress lines: one numbered step at a time, with its timing and peak RSS."""

from __future__ import annotations

import platform
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if platform.system() == "Darwin" else 1024), 1)


class Steps:
    """Step-by-step progress lines with timings (plain prints; no extra dependency)."""

    def __init__(self, verbose: bool = True):
        self.verbose = verbose
        self.n = 0

    @contextmanager
    def run(self, title: str) -> Iterator[None]:
        self.n += 1
        self.say(f"[{self.n}] {title} ...")
        start = time.perf_counter()
        ok = False
        try:
            yield
            ok = True
        finally:
            self.say(
                f"    {'done' if ok else 'FAILED'} in {time.perf_counter() - start:.2f}s "
                f"(peak RSS so far {peak_rss_mb():.0f} MiB)"
            )

    def say(self, text: str) -> None:
        if self.verbose:
            print(text, flush=True)
